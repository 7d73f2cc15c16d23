"""Attention over the KV cache as llama.cpp's CPU backend computes it: an F16 cache as its default graph
(KQ and KQV matmuls, a softmax: q and the probabilities rounded to f16, the F16 cache's vec_dot_type;
softmax sums in float64), a Q8_0 / Q4_0 one as its flash attention (kvquant.py), over positions 0..n
(`_attention`, `_attention_1`) or over each token's visible KV cells (`_attention_cells`).

`attention` checks shapes and calls a private @njit kernel.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import RamforgeError
from ..profiling import timed
from .batch import Batch, batch_size
from .fmatmul import _f16_tb, _f16_vd
from .kvquant import flash_attention, row_bytes
from .llvmir import half_to_float
from .ops import _expf, _softmax_exp
from .scalars import F16_TO_F32, _f32_to_half_bits, half_round
from .vexp import _exp_sub16

_W = 16                      # lanes of the f16 vector intrinsics below
_NO_SINKS = np.empty(0, np.float32)


def _vec_at(context, builder, sig, args, k, o, elem):
    arr = context.make_array(sig.args[k])(context, builder, args[k])
    return builder.bitcast(builder.gep(arr.data, [args[o]]), ir.VectorType(elem, _W).as_pointer())


def _make_widen16(native):
    @intrinsic
    def _widen16(typingctx, src, so, dst, do):
        """dst[do:do+16] = the f16 values of the bits src[so:so+16] (a check of llvmir.half_to_float)."""
        def codegen(context, builder, sig, args):
            h = builder.load(_vec_at(context, builder, sig, args, 0, 1, ir.IntType(16)), align=2)
            builder.store(half_to_float(context, builder, h, native),
                          _vec_at(context, builder, sig, args, 2, 3, ir.FloatType()), align=4)
            return context.get_dummy_value()
        if not (src == types.uint16[::1] and dst == types.float32[::1]):
            return None
        return types.void(src, so, dst, do), codegen
    return _widen16


_widen16_auto, _widen16_int = _make_widen16(None), _make_widen16(False)       # for the tests


@intrinsic
def _axpy_f16(typingctx, out, oo, a, vc, vo, n):
    """out[oo+i] += a * f16(vc[vo+i]) for i < n (a multiple of 16), one fma per element."""
    def codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        vf = ir.VectorType(f32, _W)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
        op = _vec_at(context, builder, sig, args, 0, 1, f32)
        vp = _vec_at(context, builder, sig, args, 3, 4, ir.IntType(16))
        av = builder.insert_element(ir.Constant(vf, ir.Undefined), args[2], ir.Constant(ir.IntType(32), 0))
        av = builder.shuffle_vector(av, av, ir.Constant(ir.VectorType(ir.IntType(32), _W), [0] * _W))
        with cgutils.for_range(builder, builder.udiv(args[5], ir.Constant(args[5].type, _W))) as loop:
            i = loop.index
            vv = half_to_float(context, builder, builder.load(builder.gep(vp, [i]), align=2))
            ptr = builder.gep(op, [i])
            builder.store(builder.call(fma, [av, vv, builder.load(ptr, align=4)]), ptr, align=4)
        return context.get_dummy_value()
    if not (out == types.float32[::1] and vc == types.uint16[::1]):
        return None
    return types.void(out, oo, a, vc, vo, n), codegen


@njit(cache=True, inline="always")
def _sum_lanes16(a, o, stride):
    # the 16 values a[o + l*stride] summed pairwise, as _mm512_reduce_add_ps
    return ((((a[o] + a[o + 8 * stride]) + (a[o + 4 * stride] + a[o + 12 * stride]))
             + ((a[o + 2 * stride] + a[o + 10 * stride]) + (a[o + 6 * stride] + a[o + 14 * stride])))
            + (((a[o + stride] + a[o + 9 * stride]) + (a[o + 5 * stride] + a[o + 13 * stride]))
               + ((a[o + 3 * stride] + a[o + 11 * stride]) + (a[o + 7 * stride] + a[o + 15 * stride]))))


@njit(cache=True, inline="always")
def _attend(job, out, q, k_cache, v_cache, pos0, kq_scale, window, gqa, f16, single, softcap, sinks):
    # query job = t * n_head + h: out f32[n_tok, n_head, hd_v]; q f32[n_tok, n_head, hd_k] (already f16-rounded)
    # k_cache u16[n_ctx, n_head_kv, hd_k], v_cache u16[n_ctx, n_head_kv, hd_v]: f16 bits
    # f16 f32[65536]: the value of each f16 bit pattern (for head-dim tails)
    # sinks f32[n_head] or empty: a per-head logit in the softmax's max and sum only (gpt-oss; expf)
    # KQ and KQV round as llama.cpp's matmuls of them (without flash attention): a batch of 2+
    # tokens through tinyBLAS's F16 gemm (16 lanes, lane = index % 16), a single token (`single`)
    # through ggml_vec_dot_f16 (4 x 16 lanes, by index % 64); the lanes summed as _sum_lanes16
    n_head, n_kv = q.shape[1], k_cache.shape[1]
    hd_k, hd_v = q.shape[2], v_cache.shape[2]
    nl = 64 if single else 16                            # lanes: key j's V products in lane j % nl
    vk = hd_k - hd_k % nl                                # the vector part of a KQ dot
    vv = hd_v - hd_v % 16
    qf, kf, vf = q.reshape(-1), k_cache.reshape(-1), v_cache.reshape(-1)
    t, h = job // n_head, job % n_head
    kvh = h // gqa
    p = pos0 + t
    j0 = 0 if window <= 0 else max(0, p - window + 1)
    scores = np.empty(p + 1, np.float32)
    acc = np.zeros(nl * hd_v, np.float32)
    qo = (t * n_head + h) * hd_k
    mx = np.float32(-np.inf)
    for j in range(j0, p + 1):
        ko = (j * n_kv + kvh) * hd_k
        s = np.float32(_f16_vd(kf, ko, qf, qo, vk) if single else _f16_tb(kf, ko, qf, qo, vk))
        if vk < hd_k:                                # ggml's scalar tail, in float64
            sd = np.float64(s)
            for d in range(vk, hd_k):
                sd += np.float64(qf[qo + d] * f16[kf[ko + d]])
            s = np.float32(sd)
        if softcap > 0:                              # gemma2: cap * tanhf(s * (1/cap)), three ggml ops
            s = np.float32(math.tanh(s * (np.float32(1.0) / softcap))) * softcap
        s *= kq_scale
        scores[j] = s
        if s > mx:
            mx = s
    if sinks.size:
        mx = max(mx, sinks[h])
    total = _softmax_exp(scores, j0, p, mx)
    if sinks.size:
        total += np.float64(math.exp(sinks[h] - mx))   # a float32 argument: libm's expf, as ggml
    inv = np.float32(1.0 / total)
    for j in range(j0, p + 1):
        pj = f16[_f32_to_half_bits(scores[j] * inv)]    # probabilities meet V as f16
        vo = (j * n_kv + kvh) * hd_v
        lo = (j % nl) * hd_v
        _axpy_f16(acc, lo, pj, vf, vo, vv)
        for d in range(vv, hd_v):
            acc[lo + d] += pj * f16[vf[vo + d]]
    if single:                                       # 4 accumulators: (a0 + a2) + (a1 + a3), lanewise
        for ln in range(16):                         # (d innermost: contiguous, vectorized)
            for d in range(hd_v):
                acc[ln * hd_v + d] = (acc[ln * hd_v + d] + acc[(32 + ln) * hd_v + d]) + \
                    (acc[(16 + ln) * hd_v + d] + acc[(48 + ln) * hd_v + d])
    for d in range(hd_v):
        out[t, h, d] = _sum_lanes16(acc, d, hd_v)


@njit(cache=True, parallel=True)
def _attention(out, q, k_cache, v_cache, pos0, n_tok, kq_scale, window, gqa, f16, single, softcap, sinks):
    # every (token, head) query in parallel (_attend)
    for job in prange(n_tok * q.shape[1]):
        _attend(job, out, q, k_cache, v_cache, pos0, kq_scale, window, gqa, f16, single, softcap, sinks)


@njit(cache=True, nogil=True)
def _attention_1(out, q, k_cache, v_cache, pos0, n_tok, kq_scale, window, gqa, f16, single, softcap, sinks):
    # the same on the calling thread: a short one-token attention costs less than a parallel region's
    # wake-up and barrier (which a busy core stretches to a scheduler slice)
    for job in range(n_tok * q.shape[1]):
        _attend(job, out, q, k_cache, v_cache, pos0, kq_scale, window, gqa, f16, single, softcap, sinks)


_SERIAL_WORK = 1 << 16       # query-key-dim products (n_tok * n_head * n_kv * (hd_k + hd_v)) below which
#                              attention runs on the calling thread (~15 us; a parallel region costs ~3 us:
#                              a 1B's 32 heads over 200 positions take 1.2 ms less per token in parallel)


@njit(cache=True, parallel=True)
def _attention_cells(out, q, k_cache, v_cache, ptr, idx, kq_scale, gqa, f16, single, softcap, sinks):
    # as _attention, token t over the cache rows idx[ptr[t]:ptr[t+1]] (ascending; i32), the cells llama.cpp's
    # KQ mask leaves visible; a row's lane is its cell index (row % nl), masked cells add exact zeros
    n_tok, n_head, n_kv = q.shape[0], q.shape[1], k_cache.shape[1]
    hd_k, hd_v = q.shape[2], v_cache.shape[2]
    nl = 64 if single else 16
    vk = hd_k - hd_k % nl
    vv = hd_v - hd_v % 16
    qf, kf, vf = q.reshape(-1), k_cache.reshape(-1), v_cache.reshape(-1)
    for job in prange(n_tok * n_head):
        t, h = job // n_head, job % n_head
        kvh = h // gqa
        a, b = ptr[t], ptr[t + 1]
        base = idx[a] - idx[a] % 16
        L = idx[b - 1] + 1 - base
        scores = np.empty(L, np.float32)
        vis = np.zeros(L, np.bool_)
        acc = np.zeros(nl * hd_v, np.float32)
        qo = (t * n_head + h) * hd_k
        mx = np.float32(-np.inf)
        for m in range(a, b):
            j = idx[m]
            ko = (j * n_kv + kvh) * hd_k
            s = np.float32(_f16_vd(kf, ko, qf, qo, vk) if single else _f16_tb(kf, ko, qf, qo, vk))
            if vk < hd_k:
                sd = np.float64(s)
                for d in range(vk, hd_k):
                    sd += np.float64(qf[qo + d] * f16[kf[ko + d]])
                s = np.float32(sd)
            if softcap > 0:
                s = np.float32(math.tanh(s * (np.float32(1.0) / softcap))) * softcap
            s *= kq_scale
            scores[j - base] = s
            vis[j - base] = True
            if s > mx:
                mx = s
        if sinks.size:
            mx = max(mx, sinks[h])
        total = 0.0                                      # as _softmax_exp: per 16 cells, masked ones 0
        lanes = np.zeros(16, np.float32)
        for k in range(0, L, 16):
            full = k + 16 <= L
            if full:
                for i in range(16):
                    if not vis[k + i]:
                        full = False
                        break
            if full:
                total += np.float64(_exp_sub16(scores, k, mx))
                continue
            for i in range(16):
                e = np.float32(0.0)
                if k + i < L and vis[k + i]:
                    e = _expf(scores[k + i] - mx)
                    scores[k + i] = e
                lanes[i] = e
            total += np.float64(_sum_lanes16(lanes, 0, 1))
        if sinks.size:
            total += np.float64(math.exp(sinks[h] - mx))
        inv = np.float32(1.0 / total)
        for m in range(a, b):
            j = idx[m]
            pj = f16[_f32_to_half_bits(scores[j - base] * inv)]
            vo = (j * n_kv + kvh) * hd_v
            lo = (j % nl) * hd_v
            _axpy_f16(acc, lo, pj, vf, vo, vv)
            for d in range(vv, hd_v):
                acc[lo + d] += pj * f16[vf[vo + d]]
        for d in range(hd_v):
            if single:
                for ln in range(16):
                    acc[ln * hd_v + d] = (acc[ln * hd_v + d] + acc[(32 + ln) * hd_v + d]) + \
                        (acc[(16 + ln) * hd_v + d] + acc[(48 + ln) * hd_v + d])
            out[t, h, d] = _sum_lanes16(acc, d, hd_v)


def _cache_type(slab: np.ndarray, head_dim: int) -> str:
    """The KV cache type of a layer's slab (memory.kv_cache.KVCache): f16 bits, or Q8_0 / Q4_0 rows by their size."""
    if slab.dtype == np.uint16:
        return "f16"
    for kind in ("q8_0", "q4_0"):
        if head_dim % 32 == 0 and slab.shape[-1] == row_bytes(kind, head_dim):
            return kind
    raise RamforgeError(f"attention: a cache slab {slab.shape} {slab.dtype} is no KV type of head size {head_dim}")


@timed("attention")
def attention(out: np.ndarray, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int,
              kq_scale: float, window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
              cells: tuple | None = None, batch: Batch | None = None) -> np.ndarray:
    """Causal attention of n_tok queries at positions pos0.. over the cache rows 0..pos0+n_tok-1.

    window > 0 masks keys at distance >= window (llama.cpp's standard sliding window); softcap > 0
    caps the logits q.k at +-softcap (softcap * tanh(q.k / softcap), before kq_scale), as gemma2;
    sinks f32[n_head] adds one logit per head to each softmax that no value follows
    (ggml_soft_max_add_sinks), as gpt-oss. An F16 cache is read as llama.cpp's default graph reads it
    (no flash attention: KQ and KQV matmuls, a softmax); a Q8_0 / Q4_0 K or V cache as its flash
    attention does (kernels/kvquant.py).

    cells (memory.KVCache.visible): (ptr i32[n_tok+1], idx i32[...], single): token t attends to the
    cache rows idx[ptr[t]:ptr[t+1]] (ascending, the window already applied; pos0 and window unused),
    lane = row, as llama.cpp's masked attention over KV cells; single: one query per stream (vec_dot).
    batch (kernels.batch): the llama.cpp batch the queries are rows of, where not a batch of their own
    (a batch of one token takes vec_dot's arithmetic).
    """
    n_tok, n_head, hd_k = q.shape
    if cells is not None:
        ptr, idx, _ = cells
        if (ptr.shape != (n_tok + 1,) or ptr[0] != 0 or ptr[-1] != idx.size or (np.diff(ptr) <= 0).any()
                or idx.size and (idx.min() < 0 or idx.max() >= k_cache.shape[0])):
            raise RamforgeError(f"attention: cells {ptr.shape} / {idx.shape} for {n_tok} tokens, cache {k_cache.shape}")
    if not (k_cache.dtype == np.uint16 and v_cache.dtype == np.uint16):     # a quantized cache: flash attention
        return flash_attention(out, q, k_cache, v_cache, _cache_type(k_cache, hd_k), _cache_type(v_cache, out.shape[2]),
                               pos0, kq_scale, window, softcap, sinks, cells=None if cells is None else cells[:2])
    n_kv = k_cache.shape[1]
    if (n_kv == 0 or n_head % n_kv or k_cache.shape[2] != hd_k
            or (cells is None and pos0 + n_tok > k_cache.shape[0])
            or not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous)):
        raise RamforgeError(f"attention: q {q.shape}, k cache {k_cache.shape}, pos0 {pos0}")
    sk = _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    if sk.size not in (0, n_head):
        raise RamforgeError(f"attention: {sk.size} sinks for {n_head} heads")
    qr = half_round(q)                                    # q meets an F16 cache as f16
    if cells is not None:
        _attention_cells(out, qr, k_cache, v_cache, cells[0], cells[1], np.float32(kq_scale), n_head // n_kv,
                         F16_TO_F32, bool(cells[2]), np.float32(softcap), sk)
        return out
    single = batch_size(batch, n_tok) == 1               # llama.cpp's batch, where the engine gives one
    work = n_tok * n_head * (pos0 + n_tok) * (hd_k + v_cache.shape[2])
    kernel = _attention_1 if work < _SERIAL_WORK else _attention
    kernel(out, qr, k_cache, v_cache, pos0, n_tok, np.float32(kq_scale), window, n_head // n_kv, F16_TO_F32,
           single, np.float32(softcap), sk)
    return out
