"""Mixtures of experts: routing (softmax, ggml_argsort's order, normalization), one expert's rows in
mul_mat_id's arithmetic, the slot-ordered sum, the engine's refusals and budget, and (-m oracle)
every MoE op against llama.cpp's own intermediate tensors (tools/moe_ops.py)."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGMLType
from ramforge.kernels import qmatmul as qm
from ramforge.kernels.batch import Batch
from ramforge.kernels.variants import TILED_FROM
from ramforge.kernels.matmul import matmul_reference
from ramforge.kernels.moe import argsort_desc, expert_matmul, guess_token, route, weighted_sum
from ramforge.kernels.registry import REGISTRY
from ramforge.memory import MemoryBudget
from ramforge.models.config import ConfigError
from ramforge.models.weights import ModelError
from tests.ggufpy import gguf_reader
from tests.test_inference import _edit
from tests.test_qmatmul import activation, weight

MOE_SPECS = ("qwen3moe", "qwen2moe", "llama-moe", "gpt-oss")

# ---- argsort: libstdc++'s std::sort, as ggml_argsort calls it --------------------------------

_SORT_CPP = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
int main() {                      // per line: n, then n floats -> their descending std::sort argsort
    int n;
    while (scanf("%d", &n) == 1) {
        std::vector<float> v(n);
        std::vector<int> o(n);
        for (int i = 0; i < n; i++) { scanf("%f", &v[i]); o[i] = i; }
        std::sort(o.begin(), o.end(), [&](int a, int b) { return v[a] > v[b]; });
        for (int i = 0; i < n; i++) printf("%d ", o[i]);
        printf("\n");
    }
}
"""


def _tie_heavy_rows(rng) -> list[np.ndarray]:
    rows = []
    for n in (1, 2, 7, 8, 16, 17, 33, 60, 64, 128, 300):
        for levels in (1, 2, 3, 7, 1 << 20):
            rows += [(rng.integers(0, levels, n) / 8).astype(np.float32) for _ in range(6)]
        rows += [np.arange(n, dtype=np.float32), np.arange(n, dtype=np.float32)[::-1].copy(),
                 (np.arange(n) % 3).astype(np.float32)]
    return rows


def test_argsort_orders_ties_as_libstdcxx(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the std::sort reference")
    exe = tmp_path / "sort"
    (tmp_path / "sort.cpp").write_text(_SORT_CPP)
    subprocess.run([cxx, "-O2", "-o", str(exe), str(tmp_path / "sort.cpp")], check=True)
    rows = _tie_heavy_rows(np.random.default_rng(7))
    text = "".join(f"{r.size} " + " ".join(repr(float(v)) for v in r) + "\n" for r in rows)
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(rows)
    for r, line in zip(rows, out):
        assert argsort_desc(r).tolist() == [int(v) for v in line.split()], f"n={r.size}: {r.tolist()[:20]}"


def test_argsort_is_a_descending_permutation():
    rng = np.random.default_rng(3)
    for n in (5, 16, 17, 128, 1000):
        v = (rng.integers(0, 5, n) / 4).astype(np.float32)
        o = argsort_desc(v)
        assert sorted(o.tolist()) == list(range(n)) and np.all(np.diff(v[o]) <= 0)
    few = np.array([1, 3, 3, 2, 3], np.float32)              # 16 or fewer: insertion sort keeps ties in order
    assert argsort_desc(few).tolist() == [1, 2, 4, 3, 0]


# ---- routing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n_expert,k", [(8, 2), (16, 4), (60, 4), (128, 8)])
@pytest.mark.parametrize("norm_w", [False, True])
def test_route_is_softmax_top_k(n_expert, k, norm_w):
    rng = np.random.default_rng(n_expert)
    logits = (rng.standard_normal((9, n_expert)) * 3).astype(np.float32)
    ids, wts = np.empty((9, k), np.int32), np.empty((9, k), np.float32)
    route(ids, wts, logits, norm_w)
    p = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert np.array_equal(ids, np.argsort(-p, axis=1, kind="stable")[:, :k])
    want = np.take_along_axis(p, ids, 1)
    if norm_w:
        want /= want.sum(1, keepdims=True)
        assert np.abs(wts.sum(1, dtype=np.float64) - 1).max() < 1e-6
    assert np.abs(wts / want - 1).max() < 2e-6


def test_route_validates():
    ok = np.zeros((2, 8), np.float32)
    with pytest.raises(RamforgeError, match="route"):
        route(np.empty((2, 9), np.int32), np.empty((2, 9), np.float32), ok, True)     # k > n_expert
    with pytest.raises(RamforgeError, match="dtypes"):
        route(np.empty((2, 2), np.int64), np.empty((2, 2), np.float32), ok, True)


@pytest.mark.parametrize("n_expert,k", [(8, 2), (60, 4), (128, 8)])
def test_the_next_layers_guess_is_the_top_k_of_its_router(n_expert, k):
    """guess_token (the read-ahead's guess for one token, models.moe._predict): the k experts with the
    highest logits of the router over the RMS-normed input, ascending; the naive reference in float64."""
    rng = np.random.default_rng(n_expert)
    n = 256
    for _ in range(20):
        x = rng.standard_normal(n).astype(np.float32) * 3
        norm = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        w = (rng.standard_normal((n_expert, n)) / np.sqrt(n)).astype(np.float32)
        got = guess_token(x, norm, 1e-6, w.reshape(-1), k, np.empty(n, np.float32), np.empty(n_expert, np.float32))
        xn = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * norm
        logits = w.astype(np.float64) @ xn
        want = np.argsort(-logits)[:k]
        if np.sort(-logits)[k - 1] - np.sort(-logits)[k] > -1e-4:   # a near tie at the k-th: either may win
            continue
        assert got.dtype == np.int64 and got.tolist() == sorted(want.tolist())
    with pytest.raises(RamforgeError, match="guess_token"):
        guess_token(x, norm[:-1], 1e-6, w.reshape(-1), k, np.empty(n, np.float32), np.empty(n_expert, np.float32))


# ---- one expert's rows, as mul_mat_id computes them -------------------------------------------

def _single_rows(t, raw, x, n_out, n_in):
    """Each row alone: the arithmetic a lone row gets (vec_dot, or a repacked type's gemv)."""
    y = np.empty((x.shape[0], n_out), np.float32)
    for r in range(x.shape[0]):
        qm.qmatmul(y[r:r + 1], x[r:r + 1], t, raw, n_out, n_in, batch=Batch(1, 0))
    return y


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ4_NL],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("n_out", [64, 36])         # rows a multiple of 8 (repacked where the type is) or not
@pytest.mark.parametrize("c", [1, 3, 5, 8, 13])
def test_expert_rows_take_mul_mat_id_arithmetic(t, n_out, c):
    n_in = 512
    raw = weight(t, n_out, n_in, seed=int(t) + n_out)
    x = activation(c, n_in, seed=c)
    y = expert_matmul(np.full((c, n_out), np.nan, np.float32), x, t, raw, n_out, n_in)
    qd = REGISTRY[t].qdot
    repacked = qd.repack is not None and n_out % 8 == 0
    if qd.tiled and not repacked and c >= TILED_FROM:
        want = qm.qmatmul(np.empty((c, n_out), np.float32), x, t, raw, n_out, n_in, batch=Batch(c, 0))   # tiled
    else:
        want = _single_rows(t, raw, x, n_out, n_in)          # gemv / vec_dot per row, never gemm or tinyBLAS
    assert np.array_equal(y, want)
    ref = matmul_reference(np.zeros((c, n_out), np.float32), x, t, raw, n_out, n_in)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def test_float_expert_rows_take_vec_dot():
    n_in, n_out, c = 512, 8, 6
    w = np.random.default_rng(1).standard_normal((n_out, n_in)).astype(np.float16)
    x = activation(c, n_in, seed=2)
    y = expert_matmul(np.empty((c, n_out), np.float32), x, GGMLType.F16, w.view(np.uint8).reshape(-1), n_out, n_in)
    for r in range(c):                                      # each row as the one-token (vec_dot) matmul computes it
        one = expert_matmul(np.empty((1, n_out), np.float32), x[r:r + 1], GGMLType.F16,
                            w.view(np.uint8).reshape(-1), n_out, n_in)
        assert np.array_equal(y[r], one[0])


@pytest.mark.parametrize("n", [1, 4, 9])          # the serial kernel (up to SERIAL_ROWS rows), the parallel one
def test_weighted_sum_adds_slot_by_slot(n):
    rng = np.random.default_rng(5)
    ex = rng.standard_normal((n, 3, 64)).astype(np.float32) * np.float32(1e3)
    w = rng.random((n, 3)).astype(np.float32)
    out = weighted_sum(np.empty((n, 64), np.float32), ex, w)
    want = ex[:, 0] * w[:, :1]
    for j in (1, 2):
        want = want + ex[:, j] * w[:, j:j + 1]               # float32 products, added in slot order
    assert np.array_equal(out, want)
    with pytest.raises(RamforgeError):
        weighted_sum(np.empty((n, 63), np.float32), ex, w)


# ---- models: refusals, budget, streaming -------------------------------------------------------

@pytest.fixture(scope="module", params=MOE_SPECS)
def moe_f16(request):
    from tools.make_models import ensure_model

    return ensure_model(request.param, "F16")


# the refusals rewrite the file with gguf-py (~8 s each, its vocabulary arrays): the first architecture
# in CI, every one with -m slow
@pytest.fixture(scope="module", params=[pytest.param(s, marks=[pytest.mark.slow] if i else [])
                                        for i, s in enumerate(MOE_SPECS)])
def moe_edit(request):
    from tools.make_models import ensure_model

    return ensure_model(request.param, "F16")


def _arch(path) -> str:
    from ramforge.gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        return f.metadata["general.architecture"]


def _refused(path, err, needle):
    b = MemoryBudget("2G")
    with pytest.raises(err, match=needle):
        Engine.load(path, n_ctx=64, budget=b)
    assert b.current == 0 and b.charges() == []


@pytest.mark.parametrize("used,needle", [(0, "between 1 and"), (99, "between 1 and")])
def test_expert_used_count_out_of_range_is_refused(tmp_path, moe_edit, used, needle):
    gguf = pytest.importorskip("gguf")
    arch = _arch(moe_edit)
    p = _edit(tmp_path, moe_edit, kv={f"{arch}.expert_used_count": (used, gguf.GGUFValueType.UINT32)})
    _refused(p, ConfigError, f"{arch}.expert_used_count = {used}: .*{needle} {arch}.expert_count")


def test_expert_count_is_required_by_qwen_moe(tmp_path):
    from tools.make_models import ensure_model

    p = _edit(tmp_path, ensure_model("qwen3moe", "F16"), kv={"qwen3moe.expert_count": (None, None)})
    _refused(p, ConfigError, "qwen3moe.expert_count is missing")


def test_experts_of_the_wrong_count_are_refused(tmp_path, moe_edit):
    gguf = pytest.importorskip("gguf")
    arch = _arch(moe_edit)
    name = "blk.1.ffn_up_exps.weight"
    p = _edit_tensor(tmp_path, moe_edit, name, lambda a: a[:-1])       # one expert short
    _refused(p, ModelError, rf"{name} .* holds \d+ experts .* {arch}.expert_count is \d+")
    del gguf


def test_router_of_the_wrong_shape_is_refused(tmp_path, moe_edit):
    name = "blk.0.ffn_gate_inp.weight"
    p = _edit_tensor(tmp_path, moe_edit, name, lambda a: a[:, :-32])   # rows 32 short of n_embd
    _refused(p, ModelError, rf"{name} has shape .*the router maps")


def test_dense_architectures_still_refuse_experts(tmp_path):
    gguf = pytest.importorskip("gguf")
    from tools.make_models import ensure_model

    from ramforge.errors import UnsupportedArch
    p = _edit(tmp_path, ensure_model("qwen3", "F16"), kv={"qwen3.expert_count": (8, gguf.GGUFValueType.UINT32)})
    _refused(p, UnsupportedArch, "qwen3.expert_count")


def _edit_tensor(tmp_path, src, name, fn):
    """A copy of GGUF `src` with tensor `name`'s array (numpy order: experts first) replaced by fn(array)."""
    gguf = pytest.importorskip("gguf")
    r = gguf_reader(src)
    out = tmp_path / "edited.gguf"
    w = gguf.GGUFWriter(out, r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), vt)
    for t in r.tensors:
        data = np.asarray(t.data)
        w.add_tensor(t.name, np.ascontiguousarray(fn(data)) if t.name == name else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("io", ["direct", "buffered", "mmap"])
def test_streamed_experts_give_the_resident_logits_and_the_planned_peak(moe_f16, io):
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import plan_for_budget

    toks = list(range(1, 40))
    with Engine.load(moe_f16, n_ctx=128, batch=64) as eng:
        want = eng.eval(toks, all_logits=True)
        assert eng.plan.verdict == "resident" and eng.weights.expert_cache is None
    with GGUFFile(moe_f16) as f:
        p0 = plan_for_budget(f, None, 128, batch=64)
        budgets = (p0.min_budget, p0.min_budget + (p0.resident_budget - p0.min_budget) // 3)
    for budget in budgets:
        b = MemoryBudget(budget)
        with Engine.load(moe_f16, n_ctx=128, budget=b, batch=64, io=io) as eng:
            p, k = eng.plan, eng.hp.n_expert_used
            assert p.verdict == "streaming" and p.experts_apart and p.expert_slots >= k
            got = eng.eval(toks, all_logits=True)
            c = eng.weights.expert_cache
            if io == "mmap":                      # mapped: experts are views of their layers
                assert c is None and b.peak <= p.planned_peak
            else:
                assert b.peak == p.planned_peak <= budget
                t = c.totals
                assert c.n_slots == p.expert_slots and t.misses > 0
                assert t.misses * c.slot_bytes // 2 < t.bytes_read <= (t.misses + t.prefetch_issued) * c.slot_bytes
        assert b.current == 0 and b.charges() == []
        assert np.array_equal(got, want), f"{io}, budget {budget:,}"
    assert budgets[0] < budgets[1]


def test_budget_below_the_moe_minimum_is_refused_naming_it(moe_f16):
    from ramforge.errors import BudgetTooSmall
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import plan_for_budget

    with GGUFFile(moe_f16) as f:
        p = plan_for_budget(f, None, 128)
    assert p.min_budget < p.resident_budget
    b = MemoryBudget(p.min_budget - 1)
    with pytest.raises(BudgetTooSmall, match=f"{p.min_budget:,}"):
        Engine.load(moe_f16, n_ctx=128, budget=b)
    assert b.current == 0 and b.charges() == []


# ---- llama.cpp's own intermediates (tools/moe_ops.py) -------------------------------------------

@pytest.mark.oracle
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M", "F16"])
@pytest.mark.parametrize("spec", [s for s in MOE_SPECS if s != "gpt-oss"])   # gpt-oss: its records, end to end
def test_moe_ops_equal_llama_cpp(spec, qtype):
    """Each MoE op, fed llama.cpp's inputs, gives llama.cpp's output bit for bit: every op on an
    AVX-512 build (the build ramforge reproduces), the build-independent ones on any x86 build."""
    pytest.importorskip("llama_cpp")
    from tools.moe_ops import check_model, llama_avx512

    every = llama_avx512()
    checked = 0
    layers = check_model(spec, qtype)
    for il, ops in layers.items():
        for op, (equal, diff, independent) in ops.items():
            if independent or every:
                assert equal == 1.0, f"{spec}:{qtype} layer {il} {op}: {100 * (1 - equal):.2f}% differ (max {diff:.3g})"
                checked += 1
    assert checked >= 3 * len(layers)                         # top-k, weights and the mixture at least


@pytest.mark.oracle
@pytest.mark.parametrize("spec", ["qwen3moe", "llama-moe"])
def test_a_prompt_of_two_ubatches_equals_llama_cpp(spec):
    """600 tokens: two ubatches of llama.cpp's 512, each a chunk here (plan.MOE_BATCHES), so every
    expert's rows take the arithmetic their count over the whole ubatch gives them (with 64-token chunks
    rows 21.. of this prompt differed). Every position's logits, bit for bit, on an AVX-512 build."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tools.make_models import ensure_model
    from tools.moe_ops import llama_avx512

    if not llama_avx512():
        pytest.skip("llama.cpp is not an AVX-512 build: its float steps differ from the ones ramforge reproduces")
    path = ensure_model(spec, "Q4_K_M")
    toks = [1] + [int(t) for t in np.random.default_rng(0).integers(100, 5000, 599)]
    llm = llama_cpp.Llama(str(path), n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
                          verbose=False)
    llm.eval(toks)
    want = np.array(llm.scores[:len(toks)], np.float32)
    with Engine.load(path, n_ctx=1024) as eng:
        assert eng.plan.batch == 512
        got = eng.eval(toks, all_logits=True, aligned=True)
    assert np.array_equal(got, want)


def test_chunks_shorter_than_a_ubatch_are_said(moe_f16):
    """Under a budget whose chunk is shorter than the ubatch, the plan notes it and a longer prompt warns."""
    import warnings

    from ramforge.errors import InexactWarning
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import UBATCH, plan_for_budget

    with GGUFFile(moe_f16) as f:
        whole = plan_for_budget(f, None, 1024)
        small = plan_for_budget(f, whole.min_budget + (4 << 20), 1024)
    assert whole.batch == UBATCH and not whole.notes
    assert small.batch < UBATCH and "whole ubatches" in small.notes[-1]
    toks = list(range(1, small.batch + 20))
    with Engine.load(moe_f16, n_ctx=1024, budget=MemoryBudget(whole.min_budget + (4 << 20))) as eng:
        with pytest.warns(InexactWarning, match=f"chunks of {small.batch}"):
            eng.eval(toks, aligned=True)
        eng.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            eng.eval(toks, aligned=True)                      # once per engine
    with Engine.load(moe_f16, n_ctx=1024) as eng, warnings.catch_warnings():
        warnings.simplefilter("error")
        eng.eval(toks, aligned=True)


def test_softmax_tail_and_shared_gate_use_libm_expf():
    """Fewer than 16 experts, and the one-wide shared gate, go through ggml's scalar tail: libm's expf
    of a float, which an exp in double rounded to float misses about once in 2000 values."""
    import ctypes

    from ramforge.kernels.moe import _softmax, shared_expert_gate

    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    expf = lambda v: np.float32(libm.expf(float(v)))        # noqa: E731
    rng = np.random.default_rng(7)
    for _ in range(2000):
        x = (rng.standard_normal(8) * 3).astype(np.float32)
        mx = x.max()
        e = np.array([expf(v - mx) for v in x], np.float32)
        total = sum(float(v) for v in e)
        want = e * np.float32(1.0 / total)
        got = np.empty(8, np.float32)
        _softmax(got, x)
        assert np.array_equal(got, want)
    g = (rng.standard_normal((4000, 1)) * 4).astype(np.float32)
    want = np.array([[v / (np.float32(1) + expf(-v)) / v] for v in g[:, 0]], np.float32)
    assert np.array_equal(shared_expert_gate(g.copy()), want)
    with pytest.raises(RamforgeError):
        shared_expert_gate(np.zeros((3, 2), np.float32))


# ---- gpt-oss: softmax-weight gating, the clamped SwiGLU, attention sinks -----------------------------

@pytest.mark.parametrize("n_expert,k", [(16, 4), (32, 4), (128, 4)])
def test_softmax_weight_gating_takes_the_top_logits_then_their_softmax(n_expert, k):
    from ramforge.kernels.moe import Gating, _softmax
    rng = np.random.default_rng(k + n_expert)
    logits = (rng.standard_normal((7, n_expert)) * 3).astype(np.float32)
    ids, wts = np.empty((7, k), np.int32), np.empty((7, k), np.float32)
    route(ids, wts, logits, False, Gating.SOFTMAX_WEIGHT)
    assert np.array_equal(ids, np.argsort(-logits, axis=1, kind="stable")[:, :k])
    for t in range(7):                    # exactly a k-wide ggml_soft_max of the chosen logits
        want = np.empty(k, np.float32)
        _softmax(want, logits[t, ids[t]].copy())
        assert np.array_equal(wts[t], want)
    p = np.exp(np.take_along_axis(logits, ids, 1).astype(np.float64))
    assert np.abs(wts / (p / p.sum(1, keepdims=True)) - 1).max() < 2e-6


def test_swiglu_oai_is_ggmls_scalar_formula_with_libm_expf():
    import ctypes

    from ramforge.kernels.ops import swiglu_oai
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    f = np.float32
    rng = np.random.default_rng(11)
    g, u = [(rng.standard_normal((5, 300)) * 6).astype(np.float32) for _ in range(2)]
    got = swiglu_oai(np.empty_like(g), g, u, 1.702, 7.0)
    for t in range(5):
        for i in range(300):
            x, y = min(g[t, i], f(7)), min(max(u[t, i], f(-7)), f(7))
            e = f(libm.expf(float(f(1.702) * -x)))
            assert got[t, i] == (x / (f(1) + e)) * (y + f(1))
    assert got.max() <= 7 * 8 and (g > 7).any() and (u > 7).any()   # clamped: at most limit * (limit + 1)
    with pytest.raises(RamforgeError):
        swiglu_oai(np.empty((5, 2), np.float32), g, u, 1.702, 7.0)


def test_attention_sinks_join_the_softmax_only():
    from ramforge.kernels.attention import attention
    rng = np.random.default_rng(3)
    n_head, n_kv, hd, n = 4, 2, 64, 6
    q = rng.standard_normal((n, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((n, n_kv, hd)).astype(np.float16)
    kc, vc = k.view(np.uint16).copy(), v.view(np.uint16).copy()
    plain = attention(np.empty((n, n_head, hd), np.float32), q, kc, vc, 0, 0.125)
    none = attention(np.empty((n, n_head, hd), np.float32), q, kc, vc, 0, 0.125,
                     sinks=np.full(n_head, -np.inf, np.float32))
    assert np.array_equal(plain, none)                       # a sink at -inf takes nothing
    sinks = np.array([0.0, 2.0, -1.0, 5.0], np.float32)
    got = attention(np.empty((n, n_head, hd), np.float32), q, kc, vc, 0, 0.125, sinks=sinks)
    qh = q.astype(np.float16).astype(np.float64)
    for t in range(n):
        for h in range(n_head):
            s = kc.view(np.float16)[:t + 1, h // 2].astype(np.float64) @ qh[t, h] * 0.125
            p = np.exp(s - max(s.max(), sinks[h]))
            p /= p.sum() + np.exp(sinks[h] - max(s.max(), sinks[h]))
            want = p @ vc.view(np.float16)[:t + 1, h // 2].astype(np.float64)
            assert np.abs(got[t, h] - want).max() < 2e-3 * (1 + np.abs(want).max())
    with pytest.raises(RamforgeError):
        attention(np.empty((n, n_head, hd), np.float32), q, kc, vc, 0, 0.125, sinks=np.zeros(3, np.float32))
