"""The mixture-of-experts FFN, as llama.cpp's build_moe_ffn (src/llama-graph.cpp), shared by qwen3moe,
qwen2moe, llama with experts (Mixtral) and gpt-oss.

For n rows xb (the FFN-normed hidden states):
  router logits = xb @ ffn_gate_inp^T [+ b]                (a plain matmul: the batch's arithmetic)
  sel, wts      = top-k of softmax(logits) (ggml_argsort order), normalized to sum 1 if norm_w;
                  gpt-oss: top-k of the logits, weights the softmax of those k (Gating.SOFTMAX_WEIGHT)
  per expert e, on the rows routed to it (mul_mat_id: the arithmetic its row count gets):
      ex[row, slot] = down_e(silu(gate_e(xb)) * up_e(xb))
      gpt-oss: down_e(swiglu_oai(gate_e(xb) + bg_e, up_e(xb) + bu_e)) + bd_e
  out = ex[:, 0] * w0 + ex[:, 1] * w1 + ...                 (slot by slot)
  qwen2moe adds the shared expert: out += down_s(silu(gate_s(xb)) * up_s(xb)) * sigmoid(xb . g)
llama.cpp counts an expert's rows over the whole ubatch; here over the rows of the chunk in hand, so a
ubatch longer than ramforge's chunk (plan.batch) can give an expert vec_dot here where llama.cpp,
counting 8+ rows across chunks, takes the tiled K-quant matmul.
"""
from __future__ import annotations

import numpy as np

from ..gguf.constants import GGMLType
from ..kernels import fused_moe
from ..kernels.batch import Batch
from ..kernels.matmul import matmul
from ..kernels.moe import expert_matmul, guess_token, route, router_token, shared_expert_gate, weighted_sum
from ..kernels.ops import rms_norm, swiglu, swiglu_oai
from ..profiling import timed
from . import routing_trace
from .weights import QTensor, expert_slice, rows_of

BIASES = ("ffn_gate_inp_bias", "ffn_gate_exps_bias", "ffn_up_exps_bias", "ffn_down_exps_bias")   # gpt-oss's
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0        # gpt-oss's clamped SwiGLU (LLM_FFN_SWIGLU_OAI_MOE)


def ffn(m, s, il: int, L, xb: np.ndarray, x: np.ndarray, batch: Batch | None = None) -> None:
    """xb f32[n, n_embd] <- layer il's mixture of experts of xb (plus its shared expert, if any).
    x f32[n, n_embd], the residual xb was normed from, predicts the next layer's experts (read ahead
    when they stream; the answer never depends on the guess). batch: the llama.cpp batch xb's rows
    belong to (kernels.batch), for the router's and the shared expert's matmuls."""
    hp, w = m.hp, m.weights
    n = xb.shape[0]
    logits, sel, wts = s.router[:n], s.sel[:n], s.wts[:n]      # f32[n, n_expert], i32[n, k], f32[n, k]
    ex = s.ex[:n]                                              # f32[n, k, n_embd]
    router, spec = L.ffn_gate_inp, m.arch.moe                  # spec: norm_w and gating (models.arch.MoEArch)
    if n == 1 and router.ggml_type == GGMLType.F32 and L.ffn_gate_inp_bias is None and batch in _ONE_TOKEN:
        _router_token(sel, wts, logits, xb, router.data.view(np.float32), spec.norm_w, spec.gating)
    else:
        router.rows(logits, xb, batch)
        if L.ffn_gate_inp_bias is not None:                    # gpt-oss: router, experts and down have biases
            logits += L.ffn_gate_inp_bias.data
        route(sel, wts, logits, spec.norm_w, spec.gating)
    routing_trace.record(m, il, sel)                           # --trace-routing (a no-op without a trace)
    biases = [_expert_bias(L, t) for t in BIASES[1:]]
    fuse = biases[0] is None                                   # an expert's rows in two compiled calls
    kern = _kernels(L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps) if fuse and w.expert_cache is None else None
    if n == 1 and kern is not None:                            # a lone token, its experts resident: all at once
        mix = s.xe[:1] if hp.n_ff_shexp else xb
        _token_experts(kern, L, s, xb, mix)
        if hp.n_ff_shexp:                                      # the shared expert reads xb: then mix + it
            shexp = _shared_expert(L, s, xb, n, batch)
            np.add(mix, shexp, out=xb)
        return
    experts = np.unique(sel) if n != 1 else np.sort(sel[0])    # ascending, as mul_mat_id's loop (a token's k
                                                               # picks are distinct; np.unique costs ~8 us)
    if n > 1 and kern is not None and kern.up_act is not None:  # a batch: its experts' rows at once, but those
        experts = _batch_experts(kern, L, s, xb, sel, ex.reshape(n * sel.shape[1], -1))   # of too many rows
    with w.experts(il, experts, n) as E:
        if E.wants_prediction():
            E.predict(_predict(w.predictors[il + 1], x, s.xe[:n], logits, hp, batch))
        if n == 1 and fuse and E.pool is not None:             # a lone token: the cached experts at once,
            _cached_experts(E, s, xb, ex[0])                   # then the misses as they arrive
        elif n > 1 and fuse and E.pool is not None:            # a batch: the cached ones, then the misses as
            _cached_batch(E, s, xb, sel, ex.reshape(n * sel.shape[1], -1))   # they arrive, at once
        for e, (gate, up, down) in E:                          # cached experts first: any order is exact
            tok, slot = np.nonzero(sel == e)                   # its rows: (token, slot), token-major
            c = tok.size
            if c == 1 and fuse and (kern := _kernels(gate, up, down)) is not None:   # k = 1, weight 1 (exact), ex = out
                ye, t = s.ye[:1], tok[0]
                _fused_experts(kern, xb[t:t + 1], (gate.data, up.data, down.data), _AT_ZERO, _ONE, s.ge[:1],
                               s.ue[:1], ye, ye)
                ex[t, slot[0]] = ye[0]
                continue
            xe, ge, ue, ye = s.xe[:c], s.ge[:c], s.ue[:c], s.ye[:c]
            np.take(xb, tok, axis=0, out=xe)
            _expert_rows(ge, xe, gate)
            _expert_rows(ue, xe, up)
            if biases[0] is None:
                swiglu(ge, ge, ue)
                _expert_rows(ye, ge, down)
            else:                                              # ggml_add_id after each mul_mat_id
                ge += biases[0][e]
                ue += biases[1][e]
                swiglu_oai(ge, ge, ue, OAI_ALPHA, OAI_LIMIT)
                _expert_rows(ye, ge, down)
                ye += biases[2][e]
            ex[tok, slot] = ye
    if hp.n_ff_shexp:                                          # qwen2moe's shared expert, gated
        shexp = _shared_expert(L, s, xb, n, batch)
        weighted_sum(xb, ex, wts)
        xb += shexp                                            # ... added to the mixture
    else:
        weighted_sum(xb, ex, wts)


def _shared_expert(L, s, xb: np.ndarray, n: int, batch: Batch | None) -> np.ndarray:
    """qwen2moe's shared expert of xb f32[n, n_embd], times its sigmoid gate, into s.ye[:n] (ffn_shexp_out)."""
    gate, up, g = s.gate[:n], s.up[:n], s.shgate[:n]           # f32[n, n_ff_shexp] x2, f32[n, 1]
    v = L.ffn_gate_inp_shexp.data                              # f32[n_embd]: a one-row F32 matmul
    matmul(g, xb, L.ffn_gate_inp_shexp.ggml_type, v.view(np.uint8), 1, v.size, batch=batch)
    shared_expert_gate(g)
    rows_of(xb, (L.ffn_gate_shexp, gate), (L.ffn_up_shexp, up), batch=batch)
    swiglu(gate, gate, up)
    shexp = L.ffn_down_shexp.rows(s.ye[:n], gate, batch)
    np.multiply(shexp, g, out=shexp)
    return shexp


_ONE_TOKEN = (None, Batch(1, 0))                              # batches in which a token is a batch of its own


@timed("router")
def _router_token(*args) -> None:
    router_token(*args)


_AT_ZERO = (np.zeros(1, np.int64),) * 3                      # one expert's rows, from its arrays' first byte
_ONE = np.ones(1, np.float32)


def _kernels(g, u, d, reps: tuple | None = None) -> fused_moe.ExpertKernels | None:
    """The expert kernels (kernels.fused_moe) for gate, up, down QTensors (3-D, or one expert's 2-D) or
    TensorInfos with their repacked groups reps, or None where their types take the expert-by-expert path.
    An expert's arithmetic depends on its row count alone (mul_mat_id), never on a batch view or layout."""
    reps = tuple(t.repacked for t in (g, u, d)) if reps is None else reps
    return fused_moe.plan(g.ggml_type, u.ggml_type, d.ggml_type, g.dims[0], g.dims[1], reps)


def _layouts(E) -> dict:
    """{repacked: (its groups, its expert kernels)} for the two layouts a cached expert lies in: repacked
    (the layer's groups), or in file order until its second use; kernels None where a layout has none."""
    tensors, reps = E.tensors, E.reps
    return {True: (reps, _kernels(*tensors, reps)), False: ((0, 0, 0), _kernels(*tensors, (0, 0, 0)))}


def _by_arrival(E, kerns: dict, run, ids=None) -> None:
    """run(kern, reps, these, offs) for the cache's picked experts (of ids) a batch at a time, a call per
    layout: those cached now, then the misses a batch of finished reads at a time (E.take_arrived); these:
    the experts' ids, offs i64[3, len(these)]: where their gate, up and down rows lie in E.pool. Each batch
    is released once run."""
    got = E.take_ready(ids)
    while True:
        try:
            for packed, these, offs in got.by_layout():
                reps, kern = kerns[packed]
                run(kern, reps, these, offs)
        finally:
            E.release()
        got = E.take_arrived(ids)
        if not got:
            return


def _cached_experts(E, s, xb: np.ndarray, ex0: np.ndarray) -> None:
    """ex0 f32[k, n_embd][j] = slot j's expert output (one token, xb f32[1, n_embd]) for the cache's experts
    (_by_arrival), two compiled calls over its pool a batch and layout; any left to E's loop."""
    kerns = _layouts(E)
    if any(kern is None for _, kern in kerns.values()):
        return
    slot_of = {e: j for j, e in enumerate(s.sel[0].tolist())}   # expert -> its slot (the k picks are distinct)

    def run(kern, reps, these: list[int], offs: np.ndarray) -> None:
        slots = [slot_of[e] for e in these]
        c = len(these)
        part = np.empty((c, ex0.shape[1]), np.float32)         # (then moved to their slots)
        _fused_experts(kern, xb, (E.pool,) * 3, (offs[0], offs[1], offs[2]), np.ones(c, np.float32), s.ge[:c],
                       s.ue[:c], part, s.ye[:1])
        ex0[slots] = part

    _by_arrival(E, kerns, run)


def _cached_batch(E, s, xb: np.ndarray, sel: np.ndarray, ex2: np.ndarray) -> None:
    """ex2 f32[n * k, n_embd][t * k + j] = slot j of token t's expert output (n tokens xb, routed sel
    i32[n, k]) for the picked experts of at most kern.up_rows rows, from the cache's pool (_by_arrival),
    each batch two compiled calls (fused_moe.run_batch) per layout. The experts of more rows are left to
    E's loop, as _batch_experts leaves them."""
    kerns = _layouts(E)
    if any(kern is None or kern.up_act is None for _, kern in kerns.values()):
        return
    flat = sel.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int64)   # pairs t * k + j by expert, token-major
    ids, counts = np.unique(flat, return_counts=True)
    start = np.zeros(ids.size + 1, np.int64)
    np.cumsum(counts, out=start[1:])
    small = set(ids[counts <= min(kern.up_rows for _, kern in kerns.values())].tolist())
    if small:
        def run(kern, reps, these: list[int], offs: np.ndarray) -> None:
            _pool_batch(kern, reps, E, s, xb, these, offs, (ids, start, order), sel.shape[1], ex2)

        _by_arrival(E, kerns, run, small)


def _pool_batch(kern, reps, E, s, xb: np.ndarray, these: list[int], offs: np.ndarray, routing: tuple, k: int,
                ex2: np.ndarray) -> None:
    """The experts these (ids) of one layout reps, their gate, up and down rows at offs i64[3, len(these)] in
    E.pool, through run_batch, their (token, slot) pairs from routing (ids, start, order: the picked experts
    ascending, where each one's pairs start in order, the pairs t * k + j sorted by expert)."""
    ids, start, order = routing
    i = np.searchsorted(ids, np.array(these))
    gstart = np.zeros(i.size + 1, np.int64)
    np.cumsum(start[i + 1] - start[i], out=gstart[1:])
    pairs = np.concatenate([order[start[j]:start[j + 1]] for j in i])
    pool, d = E.pool, E.tensors[2]
    per = d.nbytes // d.dims[2]

    def down_alone(m: int, ge: np.ndarray) -> np.ndarray:     # an expert of many rows: down's tiled matmul
        at = int(offs[2, m])
        down = QTensor(f"{d.name}[{these[m]}]", d.ggml_type, d.dims[:2], pool[at:at + per], reps[2])
        return _expert_rows(s.ye[:ge.shape[0]], ge, down)

    _fused_batch(kern, xb, (pool,) * 3, (offs[0], offs[1], offs[2]), gstart, pairs // k, pairs, s.ge, s.ue, ex2,
                 down_alone)


def _token_experts(kern, L, s, xb: np.ndarray, mix: np.ndarray) -> None:
    """mix f32[1, n_embd] = one token's mixture of its k experts (s.sel[0], s.wts[0]) from a resident
    layer's 3-D tensors, in two compiled calls."""
    g, u, d = L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps
    ids = s.sel[0].astype(np.int64)
    gb, ub, db = kern.expert_bytes
    k = ids.size
    _fused_experts(kern, xb, (g.data, u.data, d.data), (ids * gb, ids * ub, ids * db), s.wts[0], s.ge[:k],
                   s.ue[:k], s.ex[0], mix)


def _batch_experts(kern, L, s, xb: np.ndarray, sel: np.ndarray, ex2: np.ndarray) -> np.ndarray:
    """ex2 f32[n * k, n_embd][t * k + j] = slot j of token t's expert output, for the experts of at most
    kern.up_rows rows (gate and up in their one-token arithmetic; down too up to kern.down_rows, else its
    tiled matmul: fused_moe.run_batch), from a resident layer's 3-D tensors; returns the other experts
    (ascending), left for the expert-by-expert path."""
    k = sel.shape[1]
    flat = sel.reshape(-1)
    ids, counts = np.unique(flat, return_counts=True)
    small = counts <= kern.up_rows
    if not small.any():
        return ids
    order = np.argsort(flat, kind="stable")                    # pairs t * k + j by expert, token-major
    pairs = order[small[np.searchsorted(ids, flat[order])]].astype(np.int64)
    e = ids[small].astype(np.int64)
    start = np.zeros(e.size + 1, np.int64)
    np.cumsum(counts[small], out=start[1:])
    gb, ub, db = kern.expert_bytes
    g, u, d = L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps

    def down_alone(i: int, ge: np.ndarray) -> np.ndarray:     # an expert of many rows: down's tiled matmul
        return _expert_rows(s.ye[:ge.shape[0]], ge, expert_slice(d, int(e[i])))   # (an expert's rows <= the chunk's)

    _fused_batch(kern, xb, (g.data, u.data, d.data), (e * gb, e * ub, e * db), start, pairs // k, pairs, s.ge,
                 s.ue, ex2, down_alone)
    return ids[~small]


@timed(lambda kern, *a: f"experts {kern.types} (batch)")
def _fused_batch(kern, *args) -> None:
    fused_moe.run_batch(kern, *args)


@timed(lambda kern, *a: f"experts {kern.types}")
def _fused_experts(kern, x, raws, offs, wts, ge, ue, ex, out) -> None:
    fused_moe.run(kern, x, raws, offs, wts, ge, ue, ex, out)


def _expert_bias(L, name: str) -> np.ndarray | None:
    """An expert bias (GGUF [width, n_expert], F32) as f32[n_expert, width], or None."""
    t = getattr(L, name)
    return None if t is None else t.data.view(np.float32).reshape(t.dims[1], t.dims[0])


def _predict(predictor, x: np.ndarray, xn: np.ndarray, logits: np.ndarray, hp, batch: Batch | None) -> np.ndarray:
    """The next layer's likely experts, most picked first: its router applied to this layer's residual
    x f32[n, n_embd], normed with its ffn_norm (into xn), logits into f32[n, n_expert] scratch; each
    row's top k (a guess: its arithmetic need not be llama.cpp's)."""
    norm, router = predictor
    k = hp.n_expert_used
    if router.ggml_type == GGMLType.F32 and len(x) == 1:      # one token: one serial call, no ggml arithmetic
        return guess_token(x[0], norm.data, hp.rms_eps, router.data.view(np.float32), k, xn[0], logits[0])
    rms_norm(xn, x, norm.data, hp.rms_eps)                     # a batch: the router's own matmul (BLAS's
    router.rows(logits, xn, batch)                             # threads against the engine's took 40-70 ms a layer)
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k] if k < hp.n_expert else np.tile(np.arange(k), (len(x), 1))
    ids, counts = np.unique(top, return_counts=True)
    return ids[np.argsort(-counts, kind="stable")]


@timed(lambda y, x, t: f"expert matvec {t.ggml_type.name}")
def _expert_rows(y: np.ndarray, x: np.ndarray, t) -> np.ndarray:
    """y f32[c, rows of t] = x f32[c, n_in] @ t^T for the c rows routed to expert t (a 2-D QTensor)."""
    return expert_matmul(y, x, t.ggml_type, t.data, t.dims[1], t.dims[0], t.repacked)
