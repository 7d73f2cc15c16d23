"""The fixture tools: deterministic synthetic-model writer and the committed oracle records.

Needs gguf (dev extra) but not llama_cpp. The model-writing tests need the llama-spm vocab GGUF
(tools/fetch_vocab.py puts it in fixtures/cache/vocab, or set RAMFORGE_VOCAB_DIR); they skip without it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent

import gguf  # noqa: E402  (gguf-py, a dev dependency: pip install -e '.[dev]'; never skipped)
from tools import _fixtures  # noqa: E402
from tools import make_models as mm  # noqa: E402

ORACLE = sorted((REPO / "tests" / "fixtures" / "oracle").glob("*.json"))


def _vocab_or_skip() -> None:
    try:
        _fixtures.vocab_path("llama-spm")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_f16_model_is_deterministic_and_loadable(tmp_path):
    _vocab_or_skip()
    spec = mm.SPECS["llama"]
    a = mm.write_float_model(spec, "F16", tmp_path / "a" / "m.gguf")
    b = mm.write_float_model(spec, "F16", tmp_path / "b" / "m.gguf")
    assert _fixtures.sha256_file(a) == _fixtures.sha256_file(b)

    r = gguf.GGUFReader(a)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert kv["general.architecture"] == "llama"
    assert kv["llama.embedding_length"] == spec.n_embd
    assert kv["llama.block_count"] == spec.n_layer
    assert kv["llama.attention.head_count_kv"] == spec.n_head_kv
    assert kv["general.file_type"] == 1
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    assert n_vocab == kv["llama.vocab_size"] == 32000
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"

    plan = mm.tensor_plan(spec, n_vocab)
    assert [t.name for t in r.tensors] == [name for name, _, _ in plan]
    for t, (name, shape, kind) in zip(r.tensors, plan):
        want = gguf.GGMLQuantizationType.F32 if len(shape) == 1 else gguf.GGMLQuantizationType.F16
        assert t.tensor_type == want, name
        assert tuple(int(x) for x in reversed(t.shape)) == shape, name
    t = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    _, shape, kind = next(p for p in plan if p[0] == t.name)
    ref = mm.tensor_values(spec, t.name, shape, kind).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(t.data).reshape(shape), ref)


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_concurrent_build_never_replaces_a_published_model(tmp_path, monkeypatch, hard_links):
    # two pytest-xdist workers may build the same model at once: the first to finish names it, and the
    # second's copy is dropped, so a worker holding the first open never sees it change on disk (on a
    # file system without hard links too, where os.link fails with EPERM)
    if not hard_links:
        def no_link(src, dst):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(mm.os, "link", no_link)
    first, late, dst = tmp_path / "a.tmp", tmp_path / "b.tmp", tmp_path / "m.gguf"
    first.write_bytes(b"first")
    late.write_bytes(b"late")
    mm._publish(first, dst)
    st = dst.stat()
    mm._publish(late, dst)
    assert dst.read_bytes() == b"first" and (dst.stat().st_ino, dst.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_float_values_are_healthy():
    spec = mm.SPECS["qwen3"]
    q = mm.tensor_values(spec, "blk.0.attn_q.weight", (256, 256), "proj")
    n = mm.tensor_values(spec, "blk.0.attn_norm.weight", (256,), "norm")
    assert 0.04 < q.std() < 0.08 and 0.9 < n.mean() < 1.1
    assert not np.array_equal(q, mm.tensor_values(spec, "blk.1.attn_q.weight", (256, 256), "proj"))


def test_bf16_rounding_matches_gguf():
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32) * 7
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint16).reshape(x.shape)
    np.testing.assert_array_equal(mm.to_bf16_bits(x), ref)


def test_expected_types_follow_llama_cpp_mixtures():
    spec = mm.SPECS["llama"]
    t = mm.expected_types(spec, "Q4_K_M", 32000)
    assert t["output.weight"] == "Q6_K" and t["token_embd.weight"] == "Q4_K"
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q4_K", "Q4_K", "Q6_K"]
    assert mm.expected_types(mm.SPECS["qwen3"], "Q4_0", 151936)["token_embd.weight"] == "Q6_K"  # tied
    assert mm.expected_types(spec, "Q8_0", 32000)["output.weight"] == "Q8_0"


def test_lowbit_model_is_written_by_ggml_with_an_imatrix(tmp_path):
    """write_lowbit_model: deterministic, the planned types, general.file_type, values that
    dequantize (gguf.quants) near the F16 master, and llama.cpp loads it."""
    _vocab_or_skip()
    pytest.importorskip("llama_cpp")
    from tools import ggml_quant

    QT = gguf.GGMLQuantizationType
    with pytest.raises(ValueError, match="importance matrix"):
        ggml_quant.quantize_rows(np.ones((1, 256), np.float32), int(QT.IQ2_XXS))
    spec = mm.SPECS["llama"]
    f16 = mm.write_float_model(spec, "F16", tmp_path / "f16.gguf")
    a = mm.write_lowbit_model(f16, tmp_path / "a.gguf", "IQ2_XXS")
    b = mm.write_lowbit_model(f16, tmp_path / "b.gguf", "IQ2_XXS")
    assert _fixtures.sha256_file(a) == _fixtures.sha256_file(b)
    assert mm.file_tensor_types(a) == mm.expected_types(spec, "IQ2_XXS", 32000)
    assert set(mm.file_tensor_types(a).values()) == {"F32", "IQ2_XXS"}
    r, src = gguf.GGUFReader(a), gguf.GGUFReader(f16)
    assert r.fields["general.file_type"].contents() == mm.LOWBIT_FILE_TYPE["IQ2_XXS"] == 19
    assert [t.name for t in r.tensors] == [t.name for t in src.tensors]
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
    x = np.asarray(next(s for s in src.tensors if s.name == t.name).data, np.float32)
    y = gguf.quants.dequantize(np.asarray(t.data), QT.IQ2_XXS).reshape(x.shape)
    rel = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert 0.05 < rel < 0.6, rel              # 2-bit codebook: lossy, but near the master

    import llama_cpp
    m = llama_cpp.Llama(str(a), n_ctx=32, n_threads=1, verbose=False)
    m.eval(m.tokenize(b"Hello", add_bos=True))
    assert np.isfinite(np.asarray(m.scores[0])).all()


def test_quantized_model_without_llama_cpp_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RAMFORGE_FIXTURES", str(tmp_path))
    monkeypatch.setattr(mm, "llama_cpp_or_none", lambda: None)
    with pytest.raises(RuntimeError, match="llama-cpp-python"):
        mm.ensure_model("llama", "Q4_K_M")
    assert not any(tmp_path.rglob("*.gguf"))


@pytest.mark.parametrize("path", ORACLE, ids=[p.stem for p in ORACLE])
def test_oracle_record_is_consistent(path):
    rec = json.loads(path.read_text(encoding="utf-8"))
    assert rec["format"] == 1 and rec["model"]["id"] == path.stem
    assert len(rec["probe_ids"]) == 64 and len(set(rec["probe_ids"])) == 64
    for p in rec["prompts"]:
        lg, n = p["logits"], p["n_eval"]
        rows = n + len(p["gen_tokens"]) - 1
        assert n == len(p.get("tokens_special", p["tokens"]) if p["special"] else p["tokens"])
        assert len(lg["top_ids"]) == len(lg["top_vals"]) == len(lg["std"]) == len(lg["gap"]) == rows
        assert len(lg["probe"]) == len(lg["seq_maxdiff"]) == n
        for j, tok in enumerate(p["gen_tokens"]):   # greedy = argmax of the previous row
            assert lg["top_ids"][n - 1 + j][0] == tok
        assert all(v[0] >= v[-1] for v in lg["top_vals"])
