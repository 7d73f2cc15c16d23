"""Mixture-of-experts arithmetic as llama.cpp's CPU backend (x86, AVX-512) computes it.

`route`: llama.cpp's build_moe_ffn gating for a softmax router (src/llama-graph.cpp): the router
logits through ggml_soft_max, the experts ranked by ggml_argsort (descending; libstdc++'s
std::sort, so ties fall as its introsort leaves them), the top k probabilities as the weights,
optionally divided by their sum (sum_rows in float64, clamped to 2^-14, div).

`expert_matmul`: the rows routed to one expert, in the arithmetic ggml_compute_forward_mul_mat_id
gives them (ggml-cpu.c, tiled/tiled.cpp, repack.cpp): repacked weights (repack.cpp's
forward_mul_mat_id) take one gemv per row whatever their number; the tiled K-quants take the tiled
matmul once 8+ rows reach the expert, else vec_dot; every other type vec_dot per row (never
tinyBLAS, which mul_mat_id does not call).

`weighted_sum`: the experts' outputs times their weights (ggml_mul), added slot by slot (ggml_add).
"""
from __future__ import annotations

import math
from enum import IntEnum

import numpy as np
from numba import njit, prange

from ..errors import RamforgeError
from ..gguf.constants import GGML_BLOCK
from . import cxxsort
from .batch import Batch
from .fmatmul import _row_dot
from .matmul import float_matmul
from .ops import _expf, _rms_row
from .qmatmul import qmatmul
from .variants import TILED_FROM
from .registry import kernels_for

_LANES = 16                    # AVX-512 f32 lanes: ggml_vec_soft_max_f32's block
_SUM_CLAMP = np.float32(6.103515625e-5)   # build_moe_ffn clamps the weight sum to the smallest normal f16


# ---------------------------------------------------------------- softmax (ggml_soft_max_f32, no mask)

@njit(cache=True)
def _softmax(p, x):
    # p f32[n] = softmax(x f32[n]): max; exp(x - max) per block of 16 through ggml's vector exp, each
    # block's lanes summed pairwise (_mm512_reduce_add_ps) into a float64 sum; the tail through libm's
    # expf, added one by one; then times the float of 1/sum
    n = x.shape[0]
    mx = np.float32(-np.inf)
    for i in range(n):
        mx = max(mx, x[i])
    lanes = np.empty(_LANES, np.float32)
    total = 0.0
    i = 0
    while i + _LANES - 1 < n:
        for j in range(_LANES):
            lanes[j] = _expf(x[i + j] - mx)
            p[i + j] = lanes[j]
        w = _LANES
        while w > 1:
            w //= 2
            for j in range(w):
                lanes[j] = lanes[j] + lanes[j + w]
        total += np.float64(lanes[0])
        i += _LANES
    for j in range(i, n):
        e = math.exp(x[j] - mx)                  # a float32 argument: libm's expf, as ggml's scalar tail
        total += np.float64(e)
        p[j] = e
    scale = np.float32(1.0 / total)
    for j in range(n):
        p[j] = p[j] * scale


# ---------------------------------------------------------------- routing

class Gating(IntEnum):
    """How router logits become expert choices and weights (llama.cpp's llama_expert_gating_func_type)."""

    SOFTMAX = 0          # probs = softmax(logits); the top k probs are the weights
    SOFTMAX_WEIGHT = 1   # the top k logits chosen; their softmax is the weights (gpt-oss)


@njit(cache=True)
def _argsort_desc(o, v):
    # o i32[n] = the indices of v f32[n] by descending value, as libstdc++'s std::sort (ggml_argsort)
    for i in range(v.shape[0]):
        o[i] = i
    cxxsort.sort(o, 0, v.shape[0], v)


@njit(cache=True, parallel=True)
def _route(ids, wts, logits, norm_w, gating):
    # every token's routing (_route_row), tokens in parallel
    for t in prange(logits.shape[0]):
        _route_row(ids, wts, logits, norm_w, gating, t)


@njit(cache=True, nogil=True)
def _route_1(ids, wts, logits, norm_w, gating):
    # one token's (or a few): on the calling thread, no parallel region
    for t in range(logits.shape[0]):
        _route_row(ids, wts, logits, norm_w, gating, t)


@njit(cache=True, inline="always")
def _route_row(ids, wts, logits, norm_w, gating, t):
    # token t: SOFTMAX: probs = softmax(logits[t]), ids[t] = the k first of argsort(probs, desc),
    # wts[t] = probs[ids[t]]; SOFTMAX_WEIGHT: ids[t] = the k first of argsort(logits[t], desc), wts[t] =
    # softmax(logits[t, ids[t]]) (a k-wide ggml_soft_max). Then divided by max(sum, 2^-14) (sum in
    # float64, rounded to float) when norm_w
    n_exp = logits.shape[1]
    k = ids.shape[1]
    p = np.empty(n_exp, np.float32)
    o = np.empty(n_exp, np.int32)
    if gating == 1:
        _argsort_desc(o, logits[t])
        sel = np.empty(k, np.float32)
        for j in range(k):
            sel[j] = logits[t, o[j]]
        _softmax(p[:k], sel)
        for j in range(k):
            ids[t, j] = o[j]
            wts[t, j] = p[j]
    else:
        _softmax(p, logits[t])
        _argsort_desc(o, p)
        for j in range(k):
            ids[t, j] = o[j]
            wts[t, j] = p[o[j]]
    if norm_w:
        s = 0.0
        for j in range(k):
            s += np.float64(wts[t, j])
        d = max(min(np.float32(s), np.float32(np.inf)), _SUM_CLAMP)
        for j in range(k):
            wts[t, j] = wts[t, j] / d


def route(ids: np.ndarray, wts: np.ndarray, logits: np.ndarray, norm_w: bool,
          gating: Gating = Gating.SOFTMAX) -> None:
    """Gating: ids i32[n, k], wts f32[n, k] (slot j: the j-th ranked expert) from router logits
    f32[n, n_expert]; norm_w divides the k weights by their sum (qwen3moe, Mixtral)."""
    n, n_exp = logits.shape
    if ids.shape != wts.shape or ids.shape[0] != n or not 1 <= ids.shape[1] <= n_exp:
        raise RamforgeError(f"route: logits {logits.shape}, ids {ids.shape}, weights {wts.shape}")
    if ids.dtype != np.int32 or wts.dtype != np.float32 or logits.dtype != np.float32:
        raise RamforgeError(f"route: dtypes {ids.dtype}, {wts.dtype}, {logits.dtype}; want int32, float32, float32")
    (_route_1 if n <= _SERIAL_TOKENS else _route)(ids, wts, logits, bool(norm_w), int(Gating(gating)))


_SERIAL_TOKENS = 4             # routed on the calling thread up to this many tokens (a parallel region costs more)


@njit(cache=True, inline="always")
def _router_logits(logits, xb, w32):
    # one token: logits f32[1, n_exp] = xb f32[1, n] . W^T for an F32 router W (w32: n_exp rows of n), in
    # ggml_vec_dot_f32's arithmetic (fmatmul's for one token)
    n_exp, n = logits.shape[1], xb.shape[1]
    a = xb.reshape(-1)
    none16, f16 = np.empty(0, np.uint16), np.empty(0, np.float32)
    for r in range(n_exp):
        logits[0, r] = _row_dot(0, False, w32, none16, r * n, a, 0, n, f16)


@njit(cache=True, nogil=True)
def _router_1(logits, xb, w32, ids, wts, norm_w, gating):
    # one token's router logits (_router_logits), then its routing (_route_row); on the calling thread
    _router_logits(logits, xb, w32)
    _route_row(ids, wts, logits, norm_w, gating, 0)


def router_token(ids: np.ndarray, wts: np.ndarray, logits: np.ndarray, xb: np.ndarray, w32: np.ndarray,
                 norm_w: bool, gating: Gating = Gating.SOFTMAX) -> None:
    """One token's router logits f32[1, n_expert] = xb f32[1, n_embd] @ W^T (W: an F32 router, w32
    f32[n_expert * n_embd]) and its routing into ids i32[1, k], wts f32[1, k], in one call on the calling
    thread: the arithmetic of matmul (ggml_vec_dot_f32) and route."""
    n_exp, n = logits.shape[1], xb.shape[1]
    if (xb.shape[0] != 1 or logits.shape[0] != 1 or w32.dtype != np.float32 or w32.size != n_exp * n
            or not xb.flags.c_contiguous or not w32.flags.c_contiguous):
        raise RamforgeError(f"router_token: x {xb.shape}, logits {logits.shape}, weights {w32.dtype}{w32.shape}")
    if ids.shape != wts.shape or ids.shape[0] != 1 or not 1 <= ids.shape[1] <= n_exp:
        raise RamforgeError(f"router_token: logits {logits.shape}, ids {ids.shape}, weights {wts.shape}")
    _router_1(logits, xb, w32, ids, wts, bool(norm_w), int(Gating(gating)))


@njit(cache=True, nogil=True)
def _guess_1(ids, x, norm, eps, w32, xn, logits, order):
    # one token's likely experts, ids i64[k] ascending: the router's top k (by logit) of x f32[1, n] normed
    # with norm f32[n] (into xn f32[1, n]), in the router's own steps without its weights; logits
    # f32[1, n_exp], order i32[n_exp] scratch
    _rms_row(xn, x, norm, eps, 0)
    _router_logits(logits, xn, w32)
    _argsort_desc(order, logits[0])
    ids[:] = np.sort(order[:ids.size])


def guess_token(x: np.ndarray, norm: np.ndarray, eps: float, w32: np.ndarray, k: int,
                xn: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """The k experts (i64, ascending) an F32 router w32 f32[n_expert * n_embd] ranks highest for one
    token x f32[n_embd] normed with norm f32[n_embd] (xn f32[n_embd], logits f32[n_expert]: scratch);
    one call on the calling thread, the GIL let go. The next layer's guess (models.moe)."""
    n, n_exp = x.size, logits.size
    if (norm.shape != (n,) or xn.shape != (n,) or w32.dtype != np.float32 or w32.size != n_exp * n
            or not 1 <= k <= n_exp):
        raise RamforgeError(f"guess_token: x {x.shape}, norm {norm.shape}, router {w32.shape}, k {k}")
    ids = np.empty(k, np.int64)
    _guess_1(ids, x.reshape(1, n), norm, np.float32(eps), w32, xn.reshape(1, n), logits.reshape(1, n_exp),
             np.empty(n_exp, np.int32))
    return ids


def argsort_desc(v: np.ndarray) -> np.ndarray:
    """The indices of v f32[n] by descending value, ties as libstdc++'s std::sort (ggml_argsort) leaves them."""
    v = np.ascontiguousarray(v, dtype=np.float32)
    o = np.empty(v.shape[0], np.int32)
    _argsort_desc(o, v)
    return o


# ---------------------------------------------------------------- one expert's rows (mul_mat_id)

def _row_group(qd, be: int, n_out: int, c: int) -> int:
    """How many rows one qmatmul call may take so that every row gets the arithmetic a single row
    gets (vec_dot, or gemv for a repacked weight): c, 3 (fewer than a gemm group of 4) or 1."""
    lo1, hi1, split1 = qd.variants(be, n_out, 1)
    one = hi1 if split1 == 0 else lo1
    for g in (c, 3, 1):
        lo, hi, split = qd.variants(be, n_out, g)
        if (split == 0 or lo == one) and (split >= g or hi == one):
            return min(g, c)
    return 1


def expert_matmul(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int,
                  repacked: int = 0) -> np.ndarray:
    """y f32[c, n_out] = x f32[c, n_in] @ W^T for the c rows routed to one expert (W: its n_out rows of
    n_in elements, packed; in kernels.repack's groups of `repacked` rows where not 0), in the arithmetic
    llama.cpp's mul_mat_id gives c rows (see the module doc)."""
    k = kernels_for(ggml_type)
    c = x.shape[0]
    if k.qdot is None:
        return float_matmul(y, x, ggml_type, raw, n_out, n_in, 1)          # ggml_vec_dot_{f32,f16,bf16}
    be = GGML_BLOCK[k.ggml_type][0]
    qd = k.qdot
    llama_repacks = qd.repack is not None and n_out % 8 == 0
    if qd.tiled and not llama_repacks and c >= TILED_FROM:
        return qmatmul(y, x, ggml_type, raw, n_out, n_in, batch=Batch(c, 0), repacked=repacked)   # the tiled matmul
    g = _row_group(qd, be, n_out, c)
    for r in range(0, c, g):
        qmatmul(y[r:r + g], x[r:r + g], ggml_type, raw, n_out, n_in, batch=Batch(min(g, c - r), 0), repacked=repacked)
    return y


# ---------------------------------------------------------------- qwen2moe's shared-expert gate

@njit(cache=True)
def _silu_over_x(g):
    # g f32[n] <- silu(g) / g, silu(g) = g / (1 + expf(-g)): ggml_vec_silu_f32's scalar tail for a
    # one-wide row (libm's expf: numba's exp of a float32), then ggml_div
    for i in range(g.shape[0]):
        v = g[i]
        s = v / (np.float32(1.0) + math.exp(-v))
        g[i] = s / v


def shared_expert_gate(g: np.ndarray) -> np.ndarray:
    """g f32[n, 1] <- the sigmoid of qwen2moe's shared-expert gate as llama.cpp writes it: silu(g) / g."""
    if g.dtype != np.float32 or g.ndim != 2 or g.shape[1] != 1 or not g.flags.c_contiguous:
        raise RamforgeError(f"shared_expert_gate: want contiguous f32[n, 1], got {g.dtype}{g.shape}")
    _silu_over_x(g.reshape(-1))
    return g


# ---------------------------------------------------------------- the weighted sum of the slots

@njit(cache=True, inline="always")
def _weighted_row(out, ex, wts, t):
    # out f32[n, d][t] = ((ex[t, 0] * w0 + ex[t, 1] * w1) + ex[t, 2] * w2) + ..., each product rounded to
    # float before it is added (ggml_mul, then one ggml_add per slot); ex f32[n, k, d], wts f32[n, k]
    k, d = ex.shape[1], ex.shape[2]
    for i in range(d):
        out[t, i] = ex[t, 0, i] * wts[t, 0]
    for j in range(1, k):
        w = wts[t, j]
        for i in range(d):
            p = ex[t, j, i] * w
            out[t, i] = out[t, i] + p


@njit(cache=True, parallel=True)
def _weighted_sum(out, ex, wts):
    for t in prange(ex.shape[0]):
        _weighted_row(out, ex, wts, t)


@njit(cache=True, nogil=True)
def _weighted_sum_serial(out, ex, wts):
    # a few rows: less work than waking the threads
    for t in range(ex.shape[0]):
        _weighted_row(out, ex, wts, t)


def weighted_sum(out: np.ndarray, ex: np.ndarray, wts: np.ndarray) -> np.ndarray:
    """out f32[n, d] = the experts' outputs ex f32[n, k, d] weighted by wts f32[n, k], added in slot order."""
    n, k, d = ex.shape
    if out.shape != (n, d) or wts.shape != (n, k):
        raise RamforgeError(f"weighted_sum: out {out.shape}, experts {ex.shape}, weights {wts.shape}")
    (_weighted_sum_serial if n <= SERIAL_ROWS else _weighted_sum)(out, ex, wts)
    return out


SERIAL_ROWS = 4         # weighted sums of up to this many rows run on the calling thread
