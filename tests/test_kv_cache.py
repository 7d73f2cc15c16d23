"""The KV cache: its types (f16, q8_0, q4_0 for K and V), their rows and rotation, the refusals, the
front ends' options, and growth on demand under the budget."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ramforge.engine.engine import Engine, kv_types
from ramforge.errors import ContextLengthExceeded, KVBudgetExceeded, KVTypeError
from ramforge.kernels.kvquant import _fwht, dequantize_rows, rotate, rotation, store_rows
from ramforge.memory import MemoryBudget
from ramforge.kv.cache import CHUNK, KVCache
from ramforge.kv.types import bytes_per_position, kv_type, row_bytes
from tools.make_models import ensure_model


@pytest.fixture(scope="module")
def tiny():
    return ensure_model("llama", "F16")


# ---- types and refusals ------------------------------------------------------------------------

@pytest.mark.parametrize("value, name", [("f16", "f16"), ("Q8_0", "q8_0"), (" q4_0 ", "q4_0"), (1, "f16"),
                                         (8, "q8_0"), (2, "q4_0"), (np.int32(8), "q8_0"), ("8", "q8_0")])
def test_kv_type_names_and_ggml_ids(value, name):
    assert kv_type(value) == name


@pytest.mark.parametrize("value", ["q5_0", "f32", "bf16", "", 0, 3, True, None, 8.0])
def test_unknown_kv_type_is_refused(value):
    with pytest.raises(KVTypeError, match="unknown KV cache type"):
        kv_type(value)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_head_size_the_block_cannot_hold_is_refused(kind):
    assert row_bytes("f16", 48) == 96
    with pytest.raises(KVTypeError, match="head size of 48"):
        row_bytes(kind, 48)
    with pytest.raises(KVTypeError, match="head size of 80"):
        KVCache(MemoryBudget(), 1, 16, 1, 80, 64, type_k=kind)


def test_bytes_per_1k_tokens_meet_the_targets(tiny):
    """Measured: what the engine charges for 1,024 filled positions of each type."""
    per = {}
    for kind in ("f16", "q8_0", "q4_0"):
        with Engine.load(tiny, n_ctx=2048, type_k=kind, type_v=kind) as eng:
            assert eng.kv.nbytes == 0
            eng.eval(list(range(1, 1025)))
            per[kind] = eng.kv.nbytes * 1000 // 1024
            assert per[kind] == 1000 * bytes_per_position(3, 2, 64, 64, kind, kind) == eng.plan.kv_bytes_per_1k
    assert per["q8_0"] <= 0.55 * per["f16"] and per["q4_0"] <= 0.30 * per["f16"]


def test_env_and_explicit_types():
    assert kv_types(env={}) == ("f16", "f16")
    assert kv_types(env={"RAMFORGE_KV_TYPE": "q8_0"}) == ("q8_0", "q8_0")
    assert kv_types(env={"RAMFORGE_KV_TYPE": "q8_0,f16"}) == ("q8_0", "f16")
    assert kv_types("q4_0", None, env={"RAMFORGE_KV_TYPE": "q8_0"}) == ("q4_0", "q8_0")
    with pytest.raises(KVTypeError):
        kv_types(env={"RAMFORGE_KV_TYPE": "q3"})


def test_serve_reads_ollamas_variable():
    from ramforge.cli.console import kv_types_of
    assert kv_types_of(None, None, None, env={"OLLAMA_KV_CACHE_TYPE": "q8_0"}, ollama=True) == ("q8_0", "q8_0")
    assert kv_types_of(None, None, None, env={"OLLAMA_KV_CACHE_TYPE": "q8_0"}) == ("f16", "f16")     # serve only
    assert kv_types_of(None, None, None, env={"OLLAMA_KV_CACHE_TYPE": "q8_0", "RAMFORGE_KV_TYPE": "q4_0"},
                       ollama=True) == ("q4_0", "q4_0")
    assert kv_types_of("f16", None, "q4_0", env={"OLLAMA_KV_CACHE_TYPE": "q8_0"}, ollama=True) == ("f16", "q4_0")
    with pytest.raises(KVTypeError, match="OLLAMA_KV_CACHE_TYPE"):
        kv_types_of(None, None, None, env={"OLLAMA_KV_CACHE_TYPE": "iq4_nl"}, ollama=True)


def test_model_takes_llama_cpp_pythons_type_ids(tiny):
    from ramforge.generation.api import Model
    from ramforge.errors import InvalidArgument
    with Model(str(tiny), n_ctx=64, type_k=8, type_v=2) as m:
        assert (m.engine.kv.type_k, m.engine.kv.type_v, m.flash_attn) == ("q8_0", "q4_0", True)
    with pytest.raises(InvalidArgument, match="flash_attn"):
        Model(str(tiny), n_ctx=64, type_k="q8_0", flash_attn=False)
    with pytest.raises(KVTypeError):
        Model(str(tiny), n_ctx=64, type_v="q6_k")


def test_cli_plan_prints_kv_cost_and_longest_context(tiny):
    import json

    from click.testing import CliRunner

    from ramforge.cli import cli
    r = CliRunner().invoke(cli, ["plan", str(tiny), "--ram", "64M", "--ctx", "512", "--kv-type", "q4_0", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert (p["type_k"], p["type_v"]) == ("q4_0", "q4_0")
    assert p["kv_bytes_per_1k"] == 1000 * bytes_per_position(3, 2, 64, 64, "q4_0", "q4_0")
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import plan_for_budget
    with GGUFFile(tiny) as f:                         # max_ctx positions fit (smallest chunk), one more does not
        at = plan_for_budget(f, 64 << 20, p["max_ctx"], batch=1, type_k="q4_0", type_v="q4_0")
        past = plan_for_budget(f, 64 << 20, p["max_ctx"] + 1, batch=1, type_k="q4_0", type_v="q4_0")
    assert p["max_ctx"] > 512 and at.verdict != "insufficient" and at.kv_positions == p["max_ctx"]
    assert past.verdict == "insufficient" or past.kv_positions <= p["max_ctx"]
    r = CliRunner().invoke(cli, ["plan", str(tiny), "--ram", "64M", "--kv-type-v", "q8_0"])
    assert r.exit_code == 0 and "per 1k tokens" in r.output and "longest context" in r.output, r.output
    r = CliRunner().invoke(cli, ["plan", str(tiny), "--ram", "64M", "--kv-type", "q5_1"])
    assert r.exit_code != 0


# ---- rows: quantization as ggml, the rotation -----------------------------------------------------

def _q4_0_ref(x: np.ndarray) -> np.ndarray:
    # quantize_row_q4_0_ref, step by step in float32 (no fma)
    out = []
    for blk in x.reshape(-1, 32):
        i = int(np.argmax(np.abs(blk)))                 # the first of the largest magnitudes
        mx = blk[i] if np.abs(blk[i]) > 0 else np.float32(0)
        d = np.float32(mx / np.float32(-8))
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        q = np.minimum(15, ((blk * inv).astype(np.float32) + np.float32(8.5)).astype(np.float32).astype(np.int8))
        q = q.astype(np.uint8)
        out.append(np.concatenate([np.frombuffer(np.float16(d).tobytes(), np.uint8), q[:16] | (q[16:] << 4)]))
    return np.concatenate(out)


finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=64, max_size=64), st.sampled_from([1.0, 1e-3, 37.0]))
def test_q4_0_rows_as_ggml_reference(vals, scale):
    x = (np.asarray(vals, np.float32) * np.float32(scale)).reshape(1, 1, 64)
    dst = np.zeros((1, 1, row_bytes("q4_0", 64)), np.uint8)
    store_rows(dst, x, "q4_0", keys=False)                  # V rows of 64 are rotated: undo it to compare
    want = _q4_0_ref(rotate(x, 64).reshape(-1))
    assert np.array_equal(dst.reshape(-1), want)


@settings(max_examples=40, deadline=None)
@given(st.lists(finite, min_size=32, max_size=32))
def test_q8_0_rows_round_trip_within_half_a_step(vals):
    x = np.asarray(vals, np.float32).reshape(1, 1, 32)      # 32: no rotation (not a multiple of 64)
    x[0, 0, 0] = 1.0                                         # a scale f16 holds as a normal number
    dst = np.zeros((1, 1, 34), np.uint8)
    store_rows(dst, x, "q8_0", keys=True)
    back = dequantize_rows(dst.reshape(1, -1), 1, 32)
    d = np.abs(x).max() / 127
    assert np.all(np.abs(back - x.reshape(1, -1)) <= d * (0.5 + 127 * 2.0 ** -11))     # half a step, f16 scale


def test_rotation_sizes_as_llama_cpp():
    assert rotation("f16", 128, True) == 0 and rotation("q8_0", 96, True) == 0
    assert [rotation("q8_0", hd, True) for hd in (64, 128, 192, 256)] == [64, 128, 64, 256]
    assert [rotation("q4_0", hd, False) for hd in (64, 128, 256)] == [64, 64, 64]


@pytest.mark.parametrize("n", [64, 128, 256])
def test_fwht_is_the_orthonormal_hadamard_butterfly(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(3 * n).astype(np.float32)
    y = x.copy()
    _fwht(y, n)
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    want = (x.reshape(3, n).astype(np.float64) @ h.T) / np.sqrt(n)
    assert np.allclose(y.reshape(3, n), want, atol=1e-5)
    # the butterflies step by step in float32: bit for bit
    r = (x * (np.float32(1) / np.float32(np.sqrt(np.float32(n))))).reshape(3, n)
    span = 1
    while span < n:
        r = r.reshape(3, n // (2 * span), 2, span)
        u, v = r[:, :, 0, :].copy(), r[:, :, 1, :].copy()
        r[:, :, 0, :], r[:, :, 1, :] = u + v, u - v
        span *= 2
    assert np.array_equal(y, r.reshape(-1))


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_rows_equal_ggmls_own_quantizer(kind):
    from tools.ggml_ctypes import P, fn, libraries
    base, cpu = libraries()
    q = fn(cpu, "quantize_row_q8_0", None, [P, P, ctypes.c_int64]) if kind == "q8_0" else \
        fn(base, "quantize_row_q4_0_ref", None, [P, P, ctypes.c_int64])
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((50, 2, 128)) * rng.choice([1e-3, 1.0, 40.0], (50, 2, 1))).astype(np.float32)
    x[3] = 0                                                  # an all-zero row
    rb = row_bytes(kind, 128)
    ours = np.zeros((50, 2, rb), np.uint8)
    store_rows(ours, x, kind, keys=False)
    rot = rotate(x, rotation(kind, 128, False))
    want = np.zeros(50 * 2 * rb, np.uint8)
    q(rot.ctypes.data, want.ctypes.data, rot.size)
    assert np.array_equal(ours.reshape(-1), want)


# ---- growth on demand -------------------------------------------------------------------------------

def test_cache_is_charged_in_chunks_as_the_context_fills(tiny):
    b = MemoryBudget()
    with Engine.load(tiny, n_ctx=1024, budget=b, type_k="q8_0") as eng:
        per = eng.kv.bytes_per_pos
        assert eng.kv.nbytes == 0 and eng.plan.kv_bytes == 1024 * per
        eng.eval(list(range(1, 11)))
        assert eng.kv.nbytes == CHUNK * per
        eng.eval(list(range(1, CHUNK)))                        # 10 + 255 = 265 positions: two chunks
        assert eng.kv.nbytes == 2 * CHUNK * per
        eng.reset()
        eng.eval([1, 2, 3])                                     # a reset keeps the chunks charged
        assert eng.kv.nbytes == 2 * CHUNK * per
    assert b.current == 0


def test_budget_error_while_growing_names_the_position_and_leaks_nothing(tiny):
    b = MemoryBudget()
    ids = list(range(1, 301))
    with Engine.load(tiny, n_ctx=1024, budget=b, type_k="q4_0", type_v="q4_0") as ref:
        want = ref.eval(ids, all_logits=True)
    with Engine.load(tiny, n_ctx=1024, budget=b) as eng:
        b.limit = b.current + CHUNK * eng.kv.bytes_per_pos + 1    # room for one more chunk, not two
        eng.eval(ids[:200])
        before, tokens = b.current, list(eng.tokens)
        with pytest.raises(KVBudgetExceeded, match="at position 200") as e:
            eng.eval(ids[200:])
        assert (e.value.position, e.value.wanted) == (200, 300)
        assert b.current == before and eng.n_past == 200 and eng.tokens == tokens and eng.kv.capacity == CHUNK
        b.limit = None
        got = eng.eval(ids[200:], all_logits=True)           # the cache was not touched: it resumes
        eng.reset()
        f16 = eng.eval(ids, all_logits=True)
    assert np.array_equal(got, f16[200:])
    assert not np.array_equal(want, f16)                      # (q4_0 differs from f16: a different cache)
    assert b.current == 0


def test_context_length_is_still_checked_first(tiny):
    with Engine.load(tiny, n_ctx=16, type_k="q8_0") as eng:
        with pytest.raises(ContextLengthExceeded):
            eng.eval(list(range(1, 21)))
        assert eng.kv.nbytes == 0


def test_server_loads_models_with_the_configured_kv_types(tiny):
    from ramforge.server.common import ServerConfig
    from ramforge.server.manager import ModelManager, Target
    from ramforge.store.modelfile import ModelConfig
    m = ModelManager(ServerConfig(type_k="q8_0", type_v="q4_0"))._load(Target("tiny", str(tiny), ModelConfig()), 64)
    try:
        assert (m.engine.kv.type_k, m.engine.kv.type_v) == ("q8_0", "q4_0")
    finally:
        m.close()


def test_serve_refuses_a_bad_ollama_kv_type_before_starting(tiny, monkeypatch):
    from click.testing import CliRunner

    from ramforge.cli import cli
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q5_k")
    monkeypatch.delenv("RAMFORGE_KV_TYPE", raising=False)
    r = CliRunner().invoke(cli, ["serve", str(tiny), "--port", "0"])
    assert r.exit_code != 0 and "OLLAMA_KV_CACHE_TYPE" in (r.output + repr(r.exception))


def test_a_budget_short_of_the_whole_context_loads_and_fails_at_the_position(tiny):
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import plan_for_budget
    with GGUFFile(tiny) as f:
        whole = plan_for_budget(f, None, 512).min_budget
        p = plan_for_budget(f, whole - 200 * 1024, 512)
    assert p.verdict == "streaming" and p.n_ctx == 512 and p.kv_positions == CHUNK and p.planned_peak <= p.budget
    assert any("256 of the 512 positions" in n for n in p.notes) and CHUNK <= p.max_ctx < 512
    b = MemoryBudget(p.budget)
    with Engine.load(tiny, n_ctx=512, budget=b) as eng:
        assert eng.plan.kv_positions == CHUNK
        eng.eval(list(range(1, 201)))
        with pytest.raises(KVBudgetExceeded, match="at position 200") as e:
            eng.eval(list(range(1, 101)))
        assert e.value.position == 200 and eng.n_past == 200 and b.current <= b.limit
    assert b.current == 0
