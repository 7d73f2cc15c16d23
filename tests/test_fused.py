"""kernels.fused: a lone token through 1-3 weights of one input in one compiled call (each thread
quantizing it), with an RMSNorm before and a residual add or SwiGLU after, equals qmatmul and the
separate ops bit for bit, for every type that takes it, repacked or not, however the threads split
the rows; what it does not take it refuses, computing nothing."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.gguf.constants import GGMLType as G
from ramforge.kernels import fused
from ramforge.kernels.batch import Batch
from ramforge.kernels.ops import rms_norm, swiglu
from ramforge.kernels.qmatmul import qmatmul
from ramforge.kernels.repack import repack, repackable
from ramforge.models.weights import QTensor, add_rows, rows_of
from tests.test_qmatmul import INT_TYPES, _ids, weight

N_IN = 512
NOT_FUSED = {G.IQ4_NL, G.MXFP4}        # no packed-row intrinsic for their one-token variant: qmatmul alone


def _x(n_in: int = N_IN, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((1, n_in)).astype(np.float32)
    x[0, 32:64] = 0                                     # an all-zero Q8_0 block
    return x


def _ref(t, raw, x, n_out):
    y = np.zeros((1, n_out), np.float32)
    return qmatmul(y, x, t, raw, n_out, x.shape[1])


def _packed(t, raw, n_out, n_in=N_IN, rep=True):
    """(raw, repacked): the rows in repack.py's groups where the type takes them."""
    if rep and repackable(t, (n_in, n_out)):
        raw = raw.copy()
        return raw, repack(t, raw, (n_in, n_out))
    return raw, 0


def _same(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("t", INT_TYPES, ids=_ids(INT_TYPES))
def test_one_weight_equals_qmatmul(t):
    x = _x()
    for n_out in (37, 48):                             # a partial group of 8; whole groups (repacked)
        raw = weight(t, n_out, N_IN, 1)
        ref = _ref(t, raw, x, n_out)
        w, rep = _packed(t, raw, n_out)
        y = np.full((1, n_out), np.nan, np.float32)
        done = fused.matvecs(x, [(y, t, w, n_out, rep)])
        assert done == (t not in NOT_FUSED)
        assert _same(y, ref) if done else np.isnan(y).all()


GROUPS = [(G.Q4_K, G.Q4_K, G.Q6_K), (G.Q8_0, G.Q4_1, G.Q4_K), (G.Q4_0, G.Q5_K, G.Q4_0), (G.IQ4_XS, G.Q3_K)]


@pytest.mark.parametrize("types", GROUPS, ids=["+".join(t.name for t in g) for g in GROUPS])
def test_weights_of_one_input_equal_qmatmul_for_any_split(types):
    # mixed activation types (Q8_K with sub 32 / 16, Q8_0, Q8_1): each quantized once per thread
    x = _x(seed=2)
    ws = [(t, 64 + 16 * i, weight(t, 64 + 16 * i, N_IN, 10 + i)) for i, t in enumerate(types)]
    refs = [_ref(t, raw, x, n) for t, n, raw in ws]
    outs = [(np.full((1, n), np.nan, np.float32), t, *_packed_n(t, raw, n)) for t, n, raw in ws]
    plan = fused.fusable(x, outs)
    assert plan is not None
    for n_threads in (1, 2, 3, 7):                     # tasks of the row split, whatever the thread count
        for y, *_ in outs:
            y[...] = np.nan
        _call(plan, x, outs, n_threads)
        assert all(_same(y, r) for (y, *_), r in zip(outs, refs))


def _packed_n(t, raw, n_out):
    w, rep = _packed(t, raw, n_out)
    return w, n_out, rep


def _call(plan, x, outs, n_threads, norm=None, res=None):
    kernel, row_bytes = plan
    args = [(y, raw, rb) for (y, _, raw, _, _), rb in zip(outs, row_bytes)]
    args += [(fused._NONE_Y, fused._NONE_W, 1)] * (fused.MAX_WEIGHTS - len(args))
    src, nw, eps = norm if norm is not None else (fused._NONE_Y, fused._NONE_V, 0.0)
    kernel(x, *args[0][:2], *args[1][:2], *args[2][:2], args[0][2], args[1][2], args[2][2], n_threads, src, nw,
           np.float32(eps), res if res is not None else fused._NONE_Y)


@pytest.mark.parametrize("types,n_ff", [((G.Q4_K, G.Q4_K, G.Q6_K), 768), ((G.Q4_0, G.Q4_0, G.Q8_0), 544),
                                         ((G.Q5_K, G.IQ4_XS, G.Q3_K), 512), ((G.Q4_K, G.Q8_0, None), 40)],
                         ids=["Q4_K_M", "Q4_0", "mixed", "tail"])
def test_norm_swiglu_and_residual_equal_the_separate_ops(types, n_ff):
    # the FFN of a decode token: xb = rms_norm(x) * w; gate = silu(xb Wg) * (xb Wu); x += gate Wd
    # (40 rows: SwiGLU's tail past the last whole 16, libm's exp, in the last task)
    tg, tu, td = types
    eps = 1e-5
    rng = np.random.default_rng(5)
    src = rng.standard_normal((1, N_IN)).astype(np.float32)
    nw = rng.standard_normal(N_IN).astype(np.float32)
    wg, wu = weight(tg, n_ff, N_IN, 1), weight(tu, n_ff, N_IN, 2)
    xb = np.empty_like(src)
    rms_norm(xb, src, nw, eps)
    g, u = _ref(tg, wg, xb, n_ff), _ref(tu, wu, xb, n_ff)
    swiglu(g, g, u)
    for n_threads in (1, 2, 5):
        xb2, g2, u2 = (np.full(a.shape, np.nan, np.float32) for a in (xb, g, u))
        outs = [(g2, tg, *_packed_n(tg, wg, n_ff)), (u2, tu, *_packed_n(tu, wu, n_ff))]
        plan = fused.fusable(xb2, outs, norm=(src, nw, eps), epi=fused.Epilogue.SWIGLU)
        _call(plan, xb2, outs, n_threads, norm=(src, nw, eps))
        assert _same(xb2, xb) and _same(g2, g) and _same(u2, u)
        if td is None:
            continue
        wd = weight(td, N_IN, n_ff, 3)
        down = _ref(td, wd, g, N_IN)
        x, y = src.copy(), np.full((1, N_IN), np.nan, np.float32)
        outs = [(y, td, wd, N_IN, 0)]
        _call(fused.fusable(g2, outs, epi=fused.Epilogue.ADD, res=x), g2, outs, n_threads, res=x)
        assert _same(y, down) and _same(x, src + down)


def test_what_it_does_not_take_it_refuses_computing_nothing():
    x, t, n = _x(), G.Q4_K, 64
    raw = weight(t, n, N_IN, 1)
    y = np.full((1, n), np.nan, np.float32)
    assert fused.fusable(np.vstack([x, x]), [(np.zeros((2, n), np.float32), t, raw, n, 0)]) is None  # 2 tokens
    assert not fused.matvecs(x, [(y, t, raw, n, 0)], batch=Batch(4, 1))       # a row of a larger batch
    assert not fused.matvecs(x, [(y, t, raw[:-1], n, 0)])                      # the wrong size
    assert not fused.matvecs(x, [(y[:, :-1], t, raw, n, 0)])                   # the wrong shape
    assert not fused.matvecs(x, [(y, t, raw, n, 0)] * 4)                       # more than MAX_WEIGHTS
    assert not fused.matvecs(x, [(y, t, raw, n, 0)], vector=False)             # the portable kernels
    assert not fused.matvecs(x, [(y, t, raw, n, 0), (y, t, raw[:32 * 144], 32, 0)], epi=fused.Epilogue.SWIGLU)
    assert not fused.matvecs(x, [(y, t, raw, n, 0)], epi=fused.Epilogue.ADD)            # no residual given
    assert np.isnan(y).all()


def test_rows_of_and_add_rows_fall_back_to_the_same_result():
    # a lone token fused, two tokens (and a type fused.py refuses) through the separate ops: equal rows
    rng = np.random.default_rng(7)
    src = rng.standard_normal((2, N_IN)).astype(np.float32)
    nw = rng.standard_normal(N_IN).astype(np.float32)
    wg = QTensor("g", G.Q4_K, (N_IN, 256), weight(G.Q4_K, 256, N_IN, 1))
    wu = QTensor("u", G.IQ4_NL, (N_IN, 256), weight(G.IQ4_NL, 256, N_IN, 2))     # (not fused)
    wv = QTensor("v", G.Q6_K, (N_IN, 256), weight(G.Q6_K, 256, N_IN, 3))
    wd = QTensor("d", G.Q4_K, (256, N_IN), weight(G.Q4_K, N_IN, 256, 4))
    for up in (wv, wu):
        got = []
        for rows in (slice(0, 1), slice(0, 2)):
            s = src[rows]
            xb, g, u = np.empty_like(s), np.empty((s.shape[0], 256), np.float32), np.empty((s.shape[0], 256), np.float32)
            rows_of(xb, (wg, g), (up, u), norm=(s, nw, 1e-6), glu=True)
            x, y = s.copy(), np.empty_like(s)
            add_rows(x, wd, g, y)
            got.append((xb[0].copy(), g[0].copy(), x[0].copy()))
        assert all(_same(a, b) for a, b in zip(*got))


def test_an_output_over_the_input_runs_as_the_separate_ops():
    # every thread reads the input (or the norm's source) whole: where an output or the residual shares
    # its memory the kernel runs one task, in the separate ops' order, and gives their result
    rng = np.random.default_rng(9)
    a = rng.standard_normal((1, N_IN)).astype(np.float32)
    nw = rng.standard_normal(N_IN).astype(np.float32)
    w = QTensor("o", G.Q4_K, (N_IN, N_IN), weight(G.Q4_K, N_IN, N_IN, 1))
    ref = a.copy()
    rms_norm(ref, ref, nw, 1e-6)                         # in place
    y_ref = _ref(G.Q4_K, w.data, ref, N_IN)
    x = a.copy()
    y = np.empty_like(x)
    assert fused.matvecs(x, [(y, G.Q4_K, w.data, N_IN, 0)], norm=(x, nw, 1e-6))     # x = rms_norm(x) in place
    assert _same(x, ref) and _same(y, y_ref)
    x = a.copy()
    add_rows(x, w, x, x)                                 # x += x W^T, the product written over x first
    sep = a.copy()
    w.rows(sep, sep.copy())
    assert _same(x, sep + sep)


def test_warm_compiles_the_kernels_a_decode_takes():
    layer = {"attn_q": (G.Q4_K, 256, N_IN, 0), "attn_k": (G.Q4_K, 32, N_IN, 0), "attn_v": (G.Q6_K, 32, N_IN, 0),
             "attn_output": (G.Q4_K, N_IN, 256, 0), "ffn_gate": (G.Q4_K, 256, N_IN, 0),
             "ffn_up": (G.Q4_K, 256, N_IN, 0), "ffn_down": (G.Q6_K, N_IN, 256, 0)}
    assert fused.warm([layer]) == 9                    # 5 groups; Q4_K and Q6_K alone, plain and + residual
    kernel = fused._plan(((G.Q4_K, 256, N_IN, 0), (G.Q4_K, 32, N_IN, 0), (G.Q6_K, 32, N_IN, 0)), True,
                         fused.Prologue.NORM, fused.Epilogue.NONE).kernel
    assert kernel.signatures == [fused.signature()]
    assert fused.warm([{"attn_output": (G.Q4_K, N_IN, 100, 0)}]) == 0     # a shape qmatmul refuses: skipped


def test_held_kernels_run_as_the_separate_ops_until_ready():
    # a cold run (engine.warmup.Deferral) holds the fused kernels a worker compiles: fusable refuses them,
    # rows_of and add_rows take the separate ops (the same rows, bit for bit), until they are ready
    fused._plan.cache_clear()                            # fresh dispatchers: none compiled in this process
    fused._fused_kernel.cache_clear()
    rng = np.random.default_rng(11)
    src = rng.standard_normal((1, N_IN)).astype(np.float32)
    nw = rng.standard_normal(N_IN).astype(np.float32)
    wg, wu = (QTensor(n, G.Q4_K, (N_IN, 256), weight(G.Q4_K, 256, N_IN, s)) for n, s in (("g", 1), ("u", 2)))
    wd = QTensor("d", G.Q6_K, (256, N_IN), weight(G.Q6_K, N_IN, 256, 3))
    shapes = {"ffn_gate": (G.Q4_K, 256, N_IN, 0), "ffn_up": (G.Q4_K, 256, N_IN, 0), "ffn_down": (G.Q6_K, N_IN, 256, 0)}
    ks = fused.kernels([shapes])

    def layer():
        xb, g, u = np.empty_like(src), np.empty((1, 256), np.float32), np.empty((1, 256), np.float32)
        rows_of(xb, (wg, g), (wu, u), norm=(src, nw, 1e-6), glu=True)
        x, y = src.copy(), np.empty_like(src)
        add_rows(x, wd, g, y)
        return xb, g, x

    def plan(xb, g):
        return fused.fusable(xb, [(g, G.Q4_K, wg.data, 256, 0), (g.copy(), G.Q4_K, wu.data, 256, 0)],
                             norm=(src, nw, 1e-6), epi=fused.Epilogue.SWIGLU)

    fused.hold()
    try:
        held = layer()
        assert plan(held[0], held[1]) is None and all(not k.signatures for k in ks)     # nothing fused ran
        fused.ready(ks)
        assert plan(held[0], held[1]) is not None
        ready = layer()
        assert any(k.signatures for k in ks)             # now fused (loaded, or compiled here)
    finally:
        fused.unhold()
    assert all(_same(a, b) for a, b in zip(held, ready))
    fused.hold()                                         # what this process has compiled is never held
    try:
        assert plan(held[0], held[1]) is not None
    finally:
        fused.unhold()
