"""tools/make_direct.py: quantized GGUFs written directly (no F16 pass). Small shapes of the real
presets: the file parses with ramforge's reader, each tensor has the type llama.cpp's quantizer
would give it, every block's scales are finite and give zero-mean weights of the intended std,
the bytes are deterministic, and the engine runs the file to finite logits; -m oracle: llama.cpp
loads the same files and its logits equal ramforge's (slow too: on 2 layers of the real shape)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.gguf.constants import GGMLType
from ramforge.gguf.reader import GGUFFile
from ramforge.kernels.dequant import dequantize
from tools import make_direct as md
from tools._fixtures import llama_cpp_or_none
from tools.make_models import expected_types, tensor_plan

SMALL = {"n_embd": 256, "n_head": 4, "n_head_kv": 2, "head_dim": 64}
CASES = {   # preset: (shape overrides, the quantized types the file must hold)
    "qwen3moe-30b-a3b": ({**SMALL, "n_ff_exp": 256, "n_expert": 16}, {"Q4_K", "Q6_K"}),
    "gpt-oss-20b": ({**SMALL, "n_ff": 256, "n_ff_exp": 256}, {"MXFP4", "Q8_0"}),
    "llama-3.1-8b": ({**SMALL, "n_ff": 512}, {"Q4_K", "Q6_K"}),
}


@pytest.fixture(scope="module", params=list(CASES))
def written(request, tmp_path_factory):
    shape, kinds = CASES[request.param]
    p = md.resolve(request.param, layers=2, shape=shape)
    out = md.write_direct(p, tmp_path_factory.mktemp("direct") / md.default_name(p), progress=False)
    return p, out, kinds


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_file_has_the_quantizers_types_and_shapes(written):
    p, out, kinds = written
    want = expected_types(p.spec, p.qtype, p.n_vocab)
    plan = {name: shape for name, shape, _ in tensor_plan(p.spec, p.n_vocab)}
    with GGUFFile(out) as f:
        md_ = f.metadata
        assert md_[f"{p.spec.arch}.block_count"] == 2
        assert md_[f"{p.spec.arch}.embedding_length"] == 256
        assert md_["general.file_type"] == md.FILE_TYPE[p.qtype]
        assert len(md_["tokenizer.ggml.tokens"]) == p.n_vocab
        assert {n: t.ggml_type.name for n, t in f.tensors.items()} == want
        assert {n: t.shape for n, t in f.tensors.items()} == plan
        assert f.data_offset + sum(-(-t.nbytes // 32) * 32 for t in f.tensors.values()) == f.size
    assert kinds <= set(want.values())


def test_vocab_padded_to_the_real_size_with_unused_tokens(written):
    p, out, _ = written
    with GGUFFile(out) as f:
        types = np.asarray(f.metadata["tokenizer.ggml.token_type"])
        tokens = f.metadata["tokenizer.ggml.tokens"]
    n_real = {"qwen2": 151936, "llama-bpe": 128256}[p.spec.vocab]
    assert len(types) == p.n_vocab >= n_real
    assert (types[n_real:] == md.TOKEN_UNUSED).all() and (types[:n_real] != md.TOKEN_UNUSED).all()
    assert len(set(tokens)) == len(tokens)


def _block_scales(t: str, raw: np.ndarray) -> np.ndarray:
    """The float scale fields of blocks (n, nbytes), as ggml reads them."""
    if t in ("Q4_K", "Q5_K"):
        return raw[:, 0:4].copy().view(np.float16).astype(np.float32)      # d, dmin
    if t == "Q6_K":
        return raw[:, 208:210].copy().view(np.float16).astype(np.float32)
    if t == "Q8_0":
        return raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    return np.ldexp(np.float32(1), raw[:, :1].astype(np.int32) - 127)      # MXFP4's E8M0


def test_block_scales_finite_and_weights_sane(written):
    p, out, _ = written
    with GGUFFile(out) as f:
        for name, shape, kind in tensor_plan(p.spec, p.n_vocab):
            t = f.tensors[name]
            if t.ggml_type == GGMLType.F32:
                x = f.read_tensor(t).view(np.float32)
                assert np.isfinite(x).all(), name
                if name.endswith("norm.weight"):
                    assert 0.9 < x.mean() < 1.1, name
                continue
            b = md.BLOCKS[t.ggml_type.name]
            n = min(t.nbytes // b.nbytes, 4096)
            raw = f.read_tensor(t, 0, n * b.nbytes)
            s = _block_scales(t.ggml_type.name, raw.reshape(n, b.nbytes))
            assert np.isfinite(s).all() and (s > 0).all(), name
            w = dequantize(t.ggml_type, raw)
            std = md.target_std(p.spec, name, shape, kind)
            assert np.isfinite(w).all(), name
            assert abs(w.mean()) < 0.05 * std + 3 * std / np.sqrt(w.size), (name, w.mean(), std)
            assert 0.8 * std < w.std() < 1.25 * std, (name, w.std(), std)
            if t.ggml_type == GGMLType.Q8_0:       # the quantizer's range: never -128
                assert not (raw.reshape(n, b.nbytes)[:, 2:] == 0x80).any()


def test_deterministic(written, tmp_path):
    p, out, _ = written
    again = md.write_direct(p, tmp_path / "again.gguf", progress=False)
    assert _sha(again) == _sha(out)


def test_engine_runs_it(written):
    p, out, _ = written
    with Engine.load(str(out), n_ctx=64, n_threads=1) as e:
        logits = e.eval([1, 2, 3], aligned=True)[-1]
    assert logits.shape == (p.n_vocab,) and np.isfinite(logits).all() and logits.std() > 0.1


def test_k4_scale_packing_roundtrips():
    rng = np.random.default_rng(0)
    sc, mn = rng.integers(0, 64, (50, 8)).astype(np.uint8), rng.integers(0, 64, (50, 8)).astype(np.uint8)
    q = md._pack_k4_scales(sc, mn)
    for j in range(8):                     # ggml's get_scale_min_k4
        if j < 4:
            d, m = q[:, j] & 63, q[:, j + 4] & 63
        else:
            d = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
            m = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
        assert (d == sc[:, j]).all() and (m == mn[:, j]).all()


def test_llama31_rope_freqs_are_the_converters():
    f = md.llama3_rope_freqs(md.PRESETS["llama-3.1-8b"].spec)
    assert f.shape == (64,) and f[0] == 1.0 and f[-1] == 8.0
    assert ((f[1:] - f[:-1]) >= 0).all() and 1 < f[(f > 1) & (f < 8)].mean() < 8


def test_unwritable_type_is_refused():
    with pytest.raises(ValueError, match="no direct writer"):
        md.scale_table("IQ2_XS", 0.02, np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown shape fields"):
        md.resolve("qwen3moe-30b-a3b", shape={"n_embed": 8})


# ---- against llama.cpp ------------------------------------------------------------------------

PROMPT = "The history of the printing press begins in the fifteenth century, when"
FORCED = " a goldsmith in Mainz combined movable metal type"
BUILD_GAP = 5e-3       # test_inference's gap between llama.cpp builds with and without AVX-512


def _llama_logits(path, threads: int = 1):
    """(prompt ids, forced ids, logits of every position: the prompt in one batch, then one step per forced id,
    and whether the build is AVX-512's (ramforge reproduces that one exactly))."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    lc = llama_cpp_or_none()
    if lc is None:
        pytest.skip("llama-cpp-python not importable")
    llm = lc.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, n_threads=threads, n_threads_batch=threads,
                   logits_all=True, verbose=False)
    try:
        toks = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        forced = llm.tokenize(FORCED.encode(), add_bos=False, special=False)[:4]
        llm.eval(toks)
        for t in forced:
            llm.eval([t])
        ref = np.array(llm.scores[:len(toks) + len(forced)], dtype=np.float32)
    finally:
        llm.close()
    return toks, forced, ref, "AVX512 = 1" in lc.llama_print_system_info().decode()


def _assert_logits_equal(path):
    toks, forced, ref, exact = _llama_logits(path)
    with Engine.load(str(path), n_ctx=256, n_threads=1) as e:
        assert e.tokenizer.encode(PROMPT) == toks
        e.ubatch = 256
        ours = np.concatenate([e.eval(toks, all_logits=True, aligned=True)] + [e.eval([t]) for t in forced])
    rel = float((np.abs(ours - ref).max(1) / ref.std(1)).max())
    assert rel <= (1e-4 if exact else BUILD_GAP), f"max |dlogit| = {rel:.2e} of the logit std"
    assert (ours.argmax(1) == ref.argmax(1)).all()


@pytest.mark.oracle
def test_logits_equal_llama_cpp(written):
    _assert_logits_equal(written[1])


@pytest.mark.oracle
@pytest.mark.slow
def test_logits_equal_llama_cpp_on_two_real_qwen3moe_layers(tmp_path):
    """The real per-layer shape (2048 wide, 128 experts of 768, vocab 151936): 1.2 GB."""
    p = md.resolve("qwen3moe-30b-a3b", layers=2)
    _assert_logits_equal(md.write_direct(p, tmp_path / md.default_name(p), progress=False))


# ---- --skew: routers fitted to a real model's published popularity and reuse -------------------------

SKEW_SHAPE = {**SMALL, "n_ff_exp": 256, "n_expert": 64}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    from tools.skew_router import SKEWS
    p = md.resolve("qwen3moe-30b-a3b", layers=2, shape=SKEW_SHAPE)
    d = tmp_path_factory.mktemp("skew")
    prof = SKEWS["qwen3-30b-a3b"]
    fits = md.write_skewed(p, d / md.default_name(p, prof.name), prof, progress=False)
    return p, d / md.default_name(p, prof.name), md.write_direct(p, d / md.default_name(p), progress=False), fits, prof


def test_skew_changes_only_the_routers(skewed):
    p, skew, plain, fits, prof = skewed
    assert skew.name.endswith("-skew-Q4_K_M.gguf") and sorted(fits) == [0, 1]
    with GGUFFile(skew) as a, GGUFFile(plain) as b:
        assert list(a.tensors) == list(b.tensors)
        assert prof.source in a.metadata["general.description"]
        for name, t in a.tensors.items():
            same = np.array_equal(a.read_tensor(t), b.read_tensor(b.tensors[name]))
            assert same != name.endswith("ffn_gate_inp.weight"), name
            if name.endswith("ffn_gate_inp.weight"):
                assert np.isfinite(a.read_tensor(t).view(np.float32)).all()


def test_skew_file_routes_the_calibration_texts_as_fitted(skewed, tmp_path):
    """The routers in the file are those fitted layer by layer: the engine, run on the calibration
    texts again, routes them with the popularity and reuse each layer's fit reported."""
    from ramforge.models import routing_trace
    from ramforge.models.routing_trace import Trace
    from tools.skew_router import CALIBRATION_TEXTS, popularity_reuse
    p, skew, plain, fits, prof = skewed
    with Engine.load(str(skew), n_ctx=1024, batch=1024, n_threads=1) as e:
        ids, segs = [], []
        for i, text in enumerate(CALIBRATION_TEXTS):
            more = e.tokenizer.encode(text, add_special=i == 0)
            segs.append(slice(len(ids), len(ids) + len(more)))
            ids += more
        routing_trace.attach(e, tmp_path / "cal.npz")
        e.eval(ids, outputs_all=True)
    t = Trace.load(tmp_path / "cal.npz")
    for il, f in fits.items():
        sel = t.ids[t.layer == il].astype(np.int64)
        M = np.zeros((len(sel), p.spec.n_expert), bool)
        np.put_along_axis(M, sel, True, axis=1)
        top40, reuse = np.mean([popularity_reuse(M[s]) for s in segs], axis=0)
        assert abs(top40 - f["top40"]) < 0.01 and abs(reuse - f["reuse"]) < 0.01, (il, top40, reuse, f)
        assert 0.0 <= f["g"] and 0.0 <= f["lam"]


def test_skew_refuses_a_model_without_a_plain_router(tmp_path):
    from tools.skew_router import SKEWS
    with pytest.raises(ValueError, match="needs a qwen3moe preset"):
        md.write_skewed(md.resolve("gpt-oss-20b", layers=1, shape=SMALL), tmp_path / "x.gguf",
                        SKEWS["qwen3-30b-a3b"], progress=False)
