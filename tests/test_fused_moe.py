"""kernels.fused_moe: one token's k experts (gate, up, SwiGLU, down, the weighted sum) in two compiled
calls equal the expert-by-expert path (kernels.moe.expert_matmul, glu.swiglu, moe.weighted_sum) bit for
bit, for every type whose one-token rows are packed, in 1 or 2 threads, with experts addressed in a 3-D
tensor or scattered in a pool; a type without the packed path has no plan."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from ramforge.errors import InternalError
from ramforge.gguf.constants import GGMLType as G
from ramforge.kernels import fused_moe
from ramforge.kernels.moe import expert_matmul, weighted_sum
from ramforge.kernels.ops import swiglu
from ramforge.kernels.qmatmul import VECTOR
from ramforge.kernels.registry import kernels_for
from ramforge.kernels.repack import repack, repackable
from tests.test_qmatmul import weight

N_EMBD, N_FF, N_EXP, K = 512, 256, 6, 4
pytestmark = pytest.mark.skipif(not VECTOR, reason="RAMFORGE_PORTABLE: no packed one-token rows, no fused experts")


def _experts(t, n_out, n_in, seed):
    """n_exp experts of n_out rows, as one u8 array (a 3-D tensor's bytes) and one expert's byte size."""
    raw = np.concatenate([weight(t, n_out, n_in, seed + e) for e in range(N_EXP)])
    return raw, raw.size // N_EXP


def _reference(x, tg, g, tu, u, td, d, ids, wts):
    gb, ub, db = g.size // N_EXP, u.size // N_EXP, d.size // N_EXP
    ex = np.zeros((1, len(ids), N_EMBD), np.float32)
    for j, e in enumerate(ids):
        ge, ue, ye = (np.zeros((1, N_FF), np.float32), np.zeros((1, N_FF), np.float32),
                      np.zeros((1, N_EMBD), np.float32))
        expert_matmul(ge, x, tg, g[e * gb:(e + 1) * gb], N_FF, N_EMBD)
        expert_matmul(ue, x, tu, u[e * ub:(e + 1) * ub], N_FF, N_EMBD)
        swiglu(ge, ge, ue)
        expert_matmul(ye, ge, td, d[e * db:(e + 1) * db], N_EMBD, N_FF)
        ex[0, j] = ye[0]
    out = np.zeros((1, N_EMBD), np.float32)
    return weighted_sum(out, ex, wts.reshape(1, -1))


def _run(kern, x, raws, offs, wts):
    k = wts.size
    out = np.full((1, N_EMBD), np.nan, np.float32)
    ge, ue = np.empty((k, N_FF), np.float32), np.empty((k, N_FF), np.float32)
    ex = np.empty((k, N_EMBD), np.float32)
    return fused_moe.run(kern, x, raws, offs, wts, ge, ue, ex, out)


TYPES = [(G.Q4_K, G.Q4_K, G.Q6_K), (G.Q4_K, G.Q4_K, G.Q4_K), (G.Q8_0, G.Q8_0, G.Q8_0), (G.Q4_0, G.Q4_0, G.Q4_0),
         (G.Q5_K, G.Q5_K, G.Q6_K), (G.Q6_K, G.Q6_K, G.Q6_K), (G.Q2_K, G.Q3_K, G.Q4_K), (G.Q5_0, G.Q8_0, G.Q4_1),
         (G.IQ4_XS, G.IQ4_XS, G.Q6_K)]


def _repacked(t, raw, n_out, n_in):
    """Each expert's matrix of raw in kernels.repack's groups (a copy) and the group, or (raw, 0)."""
    if not repackable(t, (n_in, n_out)):
        return raw, 0
    raw, per = raw.copy(), raw.size // N_EXP
    reps = {repack(t, raw[e * per:(e + 1) * per], (n_in, n_out)) for e in range(N_EXP)}
    return raw, reps.pop()


CASES = [(ts, False) for ts in TYPES] + [(ts, True) for ts in TYPES if any(t in (G.Q4_0, G.Q4_K, G.Q8_0) for t in ts)]


@pytest.mark.parametrize("types,packed", CASES,
                         ids=lambda v: "-".join(t.name for t in v) if isinstance(v, tuple) else "repacked" if v else "")
@pytest.mark.parametrize("threads", [1, 2])
def test_experts_equal_the_expert_by_expert_path(types, threads, packed):
    """Every expert's rows (in file order, or repacked at load as llama.cpp repacks them) give the bits of
    the expert-by-expert path over the file-order rows."""
    tg, tu, td = types
    g, gb = _experts(tg, N_FF, N_EMBD, 1)
    u, ub = _experts(tu, N_FF, N_EMBD, 100)
    d, db = _experts(td, N_EMBD, N_FF, 200)
    (gp, rg), (up, ru), (dp, rd) = ((_repacked(t, r, o, i) if packed else (r, 0)) for t, r, o, i in
                                    ((tg, g, N_FF, N_EMBD), (tu, u, N_FF, N_EMBD), (td, d, N_EMBD, N_FF)))
    assert not packed or rg or ru or rd
    kern = fused_moe.plan(tg, tu, td, N_EMBD, N_FF, (rg, ru, rd))
    assert kern is not None
    assert (gb, ub, db) == kern.expert_bytes
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
    x[0, 32:64] = 0
    ids = np.array([4, 0, 5, 2], np.int64)
    wts = rng.uniform(0.05, 0.5, K).astype(np.float32)
    want = _reference(x, tg, g, tu, u, td, d, ids, wts)
    prev = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        got = _run(kern, x, (gp, up, dp), (ids * gb, ids * ub, ids * db), wts)
    finally:
        numba.set_num_threads(prev)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_experts_in_a_pool_of_slots():
    """The same experts scattered in a pool (an expert cache's slots, in another order) give the same bits."""
    tg, tu, td = G.Q4_K, G.Q4_K, G.Q6_K
    kern = fused_moe.plan(tg, tu, td, N_EMBD, N_FF)
    assert kern is not None
    g, gb = _experts(tg, N_FF, N_EMBD, 1)
    u, ub = _experts(tu, N_FF, N_EMBD, 100)
    d, db = _experts(td, N_EMBD, N_FF, 200)
    ids = np.array([3, 1, 4, 0], np.int64)
    x = np.random.default_rng(3).standard_normal((1, N_EMBD)).astype(np.float32)
    wts = np.array([0.4, 0.3, 0.2, 0.1], np.float32)
    want = _run(kern, x, (g, u, d), (ids * gb, ids * ub, ids * db), wts)
    slot_bytes = gb + ub + db + 64
    pool = np.zeros(slot_bytes * N_EXP, np.uint8)
    slot_of = {e: s for s, e in enumerate([5, 0, 2, 4, 1, 3])}
    for e in range(N_EXP):
        o = slot_of[e] * slot_bytes
        pool[o:o + gb] = g[e * gb:(e + 1) * gb]
        pool[o + gb:o + gb + ub] = u[e * ub:(e + 1) * ub]
        pool[o + gb + ub:o + gb + ub + db] = d[e * db:(e + 1) * db]
    base = np.array([slot_of[int(e)] * slot_bytes for e in ids], np.int64)
    got = _run(kern, x, (pool, pool, pool), (base, base + gb, base + gb + ub), wts)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_offsets_past_the_weights_are_refused():
    kern = fused_moe.plan(G.Q8_0, G.Q8_0, G.Q8_0, N_EMBD, N_FF)
    g, gb = _experts(G.Q8_0, N_FF, N_EMBD, 1)
    d, db = _experts(G.Q8_0, N_EMBD, N_FF, 2)
    ids = np.array([0, 1, 2, N_EXP], np.int64)              # one expert past the tensor
    x = np.ones((1, N_EMBD), np.float32)
    with pytest.raises(InternalError, match="offsets"):
        _run(kern, x, (g, g, d), (ids * gb, ids * gb, ids * db), np.ones(K, np.float32))


def test_a_type_without_packed_rows_has_no_plan():
    assert fused_moe.plan(G.MXFP4, G.MXFP4, G.MXFP4, N_EMBD, N_FF) is None
    assert kernels_for(G.MXFP4).qdot is not None            # (it has an integer dot, just not packed rows)


def _batch_reference(x, types, raws, sel):
    """ex f32[n * k, n_embd] by the expert-by-expert path (models.moe's loop): each expert's rows together."""
    (tg, tu, td), (g, u, d) = types, raws
    gb, ub, db = g.size // N_EXP, u.size // N_EXP, d.size // N_EXP
    n, k = sel.shape
    ex = np.zeros((n * k, N_EMBD), np.float32)
    for e in np.unique(sel):
        tok, slot = np.nonzero(sel == e)
        c = tok.size
        ge, ue, ye = (np.zeros((c, N_FF), np.float32), np.zeros((c, N_FF), np.float32),
                      np.zeros((c, N_EMBD), np.float32))
        xe = x[tok]
        expert_matmul(ge, xe, tg, g[e * gb:(e + 1) * gb], N_FF, N_EMBD)
        expert_matmul(ue, xe, tu, u[e * ub:(e + 1) * ub], N_FF, N_EMBD)
        swiglu(ge, ge, ue)
        expert_matmul(ye, ge, td, d[e * db:(e + 1) * db], N_EMBD, N_FF)
        ex[tok * k + slot] = ye
    return ex


def _batch(kern, x, raws, sel, types=None):
    n, k = sel.shape
    flat = sel.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int64)
    ids, counts = np.unique(flat, return_counts=True)
    e = ids.astype(np.int64)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ge, ue = np.empty((n * k, N_FF), np.float32), np.empty((n * k, N_FF), np.float32)
    ex = np.full((n * k, N_EMBD), np.nan, np.float32)
    gb, ub, db = kern.expert_bytes

    def down_alone(i, g):                                   # down's other arithmetic, as models.moe gives it
        y = np.zeros((g.shape[0], N_EMBD), np.float32)
        return expert_matmul(y, g, types[2], raws[2][e[i] * db:(e[i] + 1) * db], N_EMBD, N_FF)

    fused_moe.run_batch(kern, x, raws, (e * gb, e * ub, e * db), start, order // k, order, ge, ue, ex,
                        down_alone if types else None)
    return ex


@pytest.mark.parametrize("types", [TYPES[0], TYPES[2], TYPES[4], TYPES[5]], ids=lambda ts: "-".join(t.name for t in ts))
@pytest.mark.parametrize("n", [2, 5, 13])
def test_a_batch_of_experts_equals_the_expert_by_expert_path(types, n):
    """n tokens routed (with repeats, so an expert gets 1..n rows) through the batch kernels: each expert's
    rows as models.moe's loop computes them, where that is the one-token arithmetic (kern.up_rows etc.)."""
    kern = fused_moe.plan(*types, N_EMBD, N_FF)
    assert kern is not None and kern.up_act is not None
    raws = tuple(_experts(t, o, i, s)[0] for t, o, i, s in zip(types, (N_FF, N_FF, N_EMBD), (N_EMBD, N_EMBD, N_FF),
                                                               (1, 100, 200)))
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, N_EMBD)).astype(np.float32)
    sel = np.stack([rng.choice([0, 1, 2, 3, 5] if t % 2 else [0, 1, 4, 5], K, replace=False) for t in range(n)])
    counts = np.bincount(sel.reshape(-1))
    if counts.max() > kern.up_rows:
        with pytest.raises(InternalError, match="past the batch kernels"):
            _batch(kern, x, raws, sel, types)
        return
    if counts.max() > kern.down_rows:
        with pytest.raises(InternalError, match="past down's"):
            _batch(kern, x, raws, sel)
    want = _batch_reference(x, types, raws, sel)
    got = _batch(kern, x, raws, sel, types)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("n_exp,k", [(128, 8), (60, 4), (8, 2)])
@pytest.mark.parametrize("norm_w", [True, False])
def test_one_tokens_router_and_routing_in_one_call(n_exp, k, norm_w):
    """kernels.moe.router_token equals the F32 matmul (one token: ggml_vec_dot_f32) and route, bit for bit."""
    from ramforge.kernels.matmul import matmul
    from ramforge.kernels.moe import route, router_token

    rng = np.random.default_rng(n_exp + k)
    w = (rng.standard_normal((n_exp, N_EMBD)) * 0.05).astype(np.float32)
    x = rng.standard_normal((1, N_EMBD)).astype(np.float32)
    logits, ids, wts = np.zeros((1, n_exp), np.float32), np.zeros((1, k), np.int32), np.zeros((1, k), np.float32)
    matmul(logits, x, G.F32, w.view(np.uint8).reshape(-1), n_exp, N_EMBD)
    route(ids, wts, logits, norm_w)
    got_l, got_i, got_w = np.zeros_like(logits), np.zeros_like(ids), np.zeros_like(wts)
    router_token(got_i, got_w, got_l, x, w.reshape(-1), norm_w)
    np.testing.assert_array_equal(got_l.view(np.uint32), logits.view(np.uint32))
    np.testing.assert_array_equal(got_i, ids)
    np.testing.assert_array_equal(got_w.view(np.uint32), wts.view(np.uint32))
