"""ramforge against the recorded llama.cpp oracle, and the engine's refusals.

tools/oracle_report.compare replays llama.cpp's calls (the prompt in one decode with the record's
n_ubatch, then one decode per greedy token) and every model must give llama.cpp's logits at every
position, to the record's 4 decimals (max |dlogit| <= 1e-4 of the std of llama.cpp's logits), and
the same greedy continuation. The integer and float matmuls, attention, norms, RoPE and activations
reproduce the float steps of llama.cpp's x86 (AVX-512) build; a 1e-7 change anywhere would flip a
Q8 rounding and show up far above this bound.
Quantized synthetic models need llama_cpp to be built, so they are marked `oracle`.
"""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.errors import ContextLengthExceeded, RamforgeError, UnsupportedArch
from ramforge.models.config import ConfigError
from ramforge.models.weights import ModelError
from tests.ggufpy import gguf_reader
from tools.make_models import SPECS, reproducible_here
from tools.oracle_report import compare, model_path, records

FLOAT_TYPES = {"F32", "F16", "BF16"}
RECORDS = records()


# ramforge reproduces the rounding of llama.cpp's x86 AVX-512 build. Other builds sum in other
# lane orders (vector exp, softmax and float dots: 8 lanes on AVX2) and differ from it by far more
# than this file's bound (measured on the dense records: up to 0.04 of the logit std, AVX2 vs
# AVX-512); a record they made is checked op by op instead (tests/test_moe.py, tools/moe_ops.py)
# until it is re-recorded on an AVX-512 machine.
REPRODUCED_BUILD = "AVX512 = 1"


def _param(rec):
    m = rec["model"]
    marks = [pytest.mark.oracle] if m["source"] == "synthetic" and m["type"] not in FLOAT_TYPES else []
    if m["source"] != "synthetic":        # the real model's full record (~2 min): slow; in CI its prompts are
        marks.append(pytest.mark.slow)    # test_api's and test_streaming's, its logprobs test_logprobs'
    if REPRODUCED_BUILD not in rec["oracle"].get("system_info", ""):
        marks.append(pytest.mark.skip(reason=f"{m['id']} was recorded by a llama.cpp build without AVX-512, whose "
                                             "rounding ramforge does not reproduce; re-record it on an AVX-512 "
                                             f"machine: python tools/record_oracle.py {m['id']}"))
    if m["source"] == "synthetic" and not reproducible_here(SPECS[m.get("spec", m["arch"])]):
        marks.append(pytest.mark.skip(reason=f"this host's numpy rounds {m['id']}'s LongRoPE factors (float32 "
                                             "powers) otherwise than the recording host's AVX-512 numpy, so it "
                                             "builds another file than the recorded one; check it on an "
                                             "AVX-512 host"))
    return pytest.param(rec, id=m["id"], marks=marks)


@pytest.mark.parametrize("rec", [_param(r) for r in RECORDS])
def test_matches_llama_cpp_record(rec):
    with Engine.load(model_path(rec), n_ctx=rec["oracle"]["n_ctx"]) as eng:
        res = compare(rec, eng)
    m = rec["model"]
    for p in res.prompts:
        where = f"{m['id']} / {p.name}"
        assert p.tokens_equal, f"{where}: token ids differ from llama.cpp's"
        assert p.max_rel <= 1e-4, f"{where}: max |dlogit| = {p.max_rel:.2e} std; llama.cpp's logits exactly"
        assert p.top1_agree == p.positions, f"{where}: top-1 differs at {p.positions - p.top1_agree} positions"
        assert p.greedy_equal, f"{where}: greedy output diverged at step {p.diverged_at}"


# The float records made by another build (the MoE ones, recorded by an AVX2 llama.cpp) still check the
# whole forward pass end to end, to the size of the gap between builds: on the dense qwen2-tiny-f16
# record the AVX2 and AVX-512 builds differ by 2.3e-3 of the logit std. A wrong routing, weight or
# expert would be off by the logits' own scale. This does not replace the exact check above.
BUILD_GAP = 5e-3
OTHER_BUILD_FLOAT = [r for r in RECORDS if REPRODUCED_BUILD not in r["oracle"].get("system_info", "")
                     and r["model"]["type"] in FLOAT_TYPES]


@pytest.mark.parametrize("rec", OTHER_BUILD_FLOAT, ids=lambda r: r["model"]["id"])
def test_other_build_float_record_within_the_build_gap(rec):
    with Engine.load(model_path(rec), n_ctx=rec["oracle"]["n_ctx"]) as eng:
        res = compare(rec, eng)
    for p in res.prompts:
        where = f"{rec['model']['id']} / {p.name}"
        assert p.tokens_equal, f"{where}: token ids differ from llama.cpp's"
        assert p.max_rel <= BUILD_GAP, f"{where}: max |dlogit| = {p.max_rel:.2e} std, past the gap between builds"
        assert p.greedy_equal, f"{where}: greedy output diverged at step {p.diverged_at}"


# ---- refusals ---------------------------------------------------------------------------------

def _edit(tmp_path, src, kv=None, drop=(), rename=None):
    """A copy of GGUF `src` with metadata changed, tensors dropped or renamed (gguf-py as writer)."""
    gguf = pytest.importorskip("gguf")
    r = gguf_reader(src)
    arch = r.fields["general.architecture"].contents()
    out = tmp_path / "edited.gguf"
    w = gguf.GGUFWriter(out, arch)
    kv = kv or {}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in kv:
            continue
        vt = f.types[0]
        val = f.contents()
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, val, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, val, vt)
    for k, (v, vt) in kv.items():
        if v is not None:
            w.add_key_value(k, v, vt)
    for t in r.tensors:
        if t.name in drop:
            continue
        name = (rename or {}).get(t.name, t.name)
        w.add_tensor(name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])) if t.tensor_type > 1 else None,
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module")
def tiny(request):
    from tools.make_models import ensure_model

    return ensure_model("llama", "F16")


def test_unsupported_architecture_is_named(tmp_path, tiny):
    gguf = pytest.importorskip("gguf")
    p = _edit(tmp_path, tiny, kv={"general.architecture": ("falcon", gguf.GGUFValueType.STRING)})
    with pytest.raises(UnsupportedArch, match=r"'falcon'.*executable: bert, gemma-embedding, gemma2, gemma3, gpt-oss, "
                                              r"jina-bert-v2, llama, nomic-bert, phi3, qwen2, qwen2moe, qwen3, qwen3moe"):
        Engine.load(p)


def test_missing_tensor_is_named(tmp_path, tiny):
    p = _edit(tmp_path, tiny, drop={"blk.1.ffn_up.weight"})
    with pytest.raises(ModelError, match="blk.1.ffn_up.weight is missing"):
        Engine.load(p)


def test_unknown_tensor_is_refused(tmp_path, tiny):
    p = _edit(tmp_path, tiny, rename={"blk.0.ffn_up.weight": "blk.0.ffn_up_exps.weight"})
    with pytest.raises(ModelError, match="blk.0.ffn_up_exps.weight is not used"):
        Engine.load(p)


@pytest.mark.parametrize("key,value,needle", [
    ("llama.attention.head_count", 0, "head_count is 0"),
    ("llama.attention.head_count_kv", 3, "must be positive and divide"),
    ("llama.embedding_length", 128, "expected"),
    ("llama.rope.scaling.type", "ntk", r"'ntk' is not a RoPE scaling ramforge reproduces; reproduced: none, "
                                       r"linear, yarn, longrope"),
    ("llama.rope.scaling.type", "longrope", "reproduced only for phi3, not llama"),
    ("llama.rope.scaling.factor", -2.0, r"llama.rope.scaling.factor = -2.0: .* must be positive"),
    ("llama.rope.scale_linear", -1.0, r"llama.rope.scale_linear = -1.0: .* must be positive"),
    ("llama.rope.scaling.attn_factor", 0.0, r"llama.rope.scaling.attn_factor = 0.0: must be positive"),
    ("llama.rope.scaling.original_context_length", 0, "original_context_length = 0.0: must be a positive"),
    ("llama.rope.scaling.yarn_beta_fast", 0.5, r"yarn_beta_fast = 0.5 is below llama.rope.scaling.yarn_beta_slow"),
    ("llama.rope.scaling.yarn_beta_slow", -1.0, r"yarn_beta_slow = -1.0: must be positive"),
    ("llama.rope.scaling.yarn_ext_factor", 2.0, r"yarn_ext_factor = 2.0: must be in \[0, 1\]"),
])
def test_bad_hyperparameters(tmp_path, tiny, key, value, needle):
    gguf = pytest.importorskip("gguf")
    vt = {str: gguf.GGUFValueType.STRING, float: gguf.GGUFValueType.FLOAT32}.get(type(value), gguf.GGUFValueType.UINT32)
    p = _edit(tmp_path, tiny, kv={key: (value, vt)})
    with pytest.raises(RamforgeError, match=needle):
        Engine.load(p)


def test_yarn_without_a_factor_is_refused(tmp_path, tiny):
    gguf = pytest.importorskip("gguf")
    p = _edit(tmp_path, tiny, kv={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)})
    with pytest.raises(ConfigError, match=r"llama.rope.scaling.factor = 0.0: a RoPE scaling factor must be positive"):
        Engine.load(p)


def test_rope_scaling_resolves_as_llama_cpp():
    # llama-context.cpp's arguments to ggml_rope_ext, float32 steps: YaRN factor 4 gives attn_factor
    # mscale(4) / (1 + 0.1 ln 4) rounded twice (the mscale and its inverse), not exactly 1
    from ramforge.models.config import RopeScaling, rope_scaling

    kind, s = rope_scaling({"a.rope.scaling.type": "yarn", "a.rope.scaling.factor": 4.0,
                            "a.rope.scaling.original_context_length": 128}, "a", 512)
    f = np.float32
    m = f(f(0.1) * np.log(f(4.0))) + f(1.0)
    assert kind == RopeScaling.YARN and s.n_ctx_orig == 128
    assert (s.freq_scale, s.ext_factor, s.beta_fast, s.beta_slow) == (0.25, 1.0, 32.0, 1.0)
    assert s.attn_factor == f(m * f(f(1.0) / m))
    kind, s = rope_scaling({"a.rope.scaling.factor": 8.0}, "a", 512)        # no type: linear
    assert kind == RopeScaling.LINEAR and (s.freq_scale, s.ext_factor, s.attn_factor) == (0.125, 0.0, 1.0)
    assert s.n_ctx_orig == 512
    kind, s = rope_scaling({"a.rope.scaling.type": "none", "a.rope.scaling.factor": 8.0}, "a", 512)
    assert kind == RopeScaling.NONE and s.freq_scale == 1.0


def test_prompt_longer_than_context(tiny):
    with Engine.load(tiny, n_ctx=16) as eng:
        with pytest.raises(ContextLengthExceeded, match="16"):
            list(eng.generate(list(range(1, 12)), max_tokens=8))
        with pytest.raises(ContextLengthExceeded, match="20 new tokens exceed the context of 16"):
            eng.eval(list(range(1, 21)))
        assert list(eng.generate([1, 2, 3], max_tokens=4))            # still usable afterwards
    assert eng.budget.current == 0


def test_budget_is_released_on_close(tiny):
    from ramforge.memory import MemoryBudget

    b = MemoryBudget("1G")
    with Engine.load(tiny, n_ctx=64, budget=b):
        assert b.current > 0
    assert b.current == 0 and b.charges() == []
    with pytest.raises(RamforgeError, match="below this model's minimum"):
        Engine.load(tiny, n_ctx=64, budget=MemoryBudget("1M"))


@pytest.mark.parametrize("key,value,needle", [
    ("gemma2.attn_logit_softcapping", 0.0, r"gemma2.attn_logit_softcapping = 0.0: a soft-cap must be positive"),
    ("gemma2.final_logit_softcapping", -30.0, r"gemma2.final_logit_softcapping = -30.0: a soft-cap must be positive"),
])
def test_gemma2_bad_softcaps(tmp_path, key, value, needle):
    gguf = pytest.importorskip("gguf")
    from tools.make_models import ensure_model

    p = _edit(tmp_path, ensure_model("gemma2", "F16"), kv={key: (value, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ConfigError, match=needle):
        Engine.load(p)


def test_softcaps_only_where_llama_cpp_applies_them(tmp_path, tiny):
    # llama's graph has no soft-cap: a file asking for one is refused, not silently uncapped
    gguf = pytest.importorskip("gguf")
    p = _edit(tmp_path, tiny, kv={"llama.attn_logit_softcapping": (50.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(UnsupportedArch, match="llama.attn_logit_softcapping = 50.0 is not supported"):
        Engine.load(p)


def test_phi3_attends_past_its_sliding_window_as_llama_cpp(tmp_path):
    # llama.cpp reads phi3's attention.sliding_window and then turns the window off: the same logits
    gguf = pytest.importorskip("gguf")
    rec = next(r for r in RECORDS if r["model"]["id"] == "phi3-tiny-f16")
    p = _edit(tmp_path, model_path(rec), kv={"phi3.attention.sliding_window": (4, gguf.GGUFValueType.UINT32)})
    with Engine.load(p, n_ctx=rec["oracle"]["n_ctx"]) as eng:
        res = compare(rec, eng)
    assert all(r.max_rel <= 1e-4 and r.greedy_equal for r in res.prompts)


def test_phi3_needs_its_fused_projections(tmp_path):
    from tools.make_models import ensure_model

    p = _edit(tmp_path, ensure_model("phi3", "F16"), rename={"blk.1.attn_qkv.weight": "blk.1.attn_q.weight"})
    with pytest.raises(ModelError, match="blk.1.attn_q.weight is not used by ramforge.s phi3 forward pass"):
        Engine.load(p)
