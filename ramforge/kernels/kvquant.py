"""Quantized KV cache rows (Q8_0, Q4_0) and attention over them, as llama.cpp's CPU backend.

A cache row is one position's keys (or values) of one KV head: head_dim elements, in blocks of 32
(Q8_0: f16 scale + 32 int8, 34 B; Q4_0: f16 scale + 16 bytes of nibbles, 18 B), the bytes llama.cpp
writes with ggml_set_rows: Q8_0 through ggml-cpu's quantize_row_q8_0 (amax/127, x * (127/amax)
rounded half to even), Q4_0 through ggml-base's quantize_row_q4_0_ref (d = max/-8, x * (1/d) + 8.5
truncated, each a float32 rounding of its own: that library is built without FMA).

Before a quantized cache stores them, llama.cpp rotates the rows by an orthonormal Walsh-Hadamard
transform (llama_kv_cache's attn_rot_k / attn_rot_v, on unless LLAMA_ATTN_ROT_DISABLE is set, which
ramforge does not read): a quantized K whose head size is a multiple of 64 is stored rotated in
blocks of the largest power of two dividing the head size, and q is rotated the same way before the
scores (H is symmetric and H^2 = I, so q.k is kept); a quantized V (head size a multiple of 64) is
stored rotated in blocks of 64 and the attention output rotated back. ggml computes each rotation as
a fast transform (ggml_compute_forward_fwht): every element times 1/sqrtf(n), then butterflies
u + v, u - v of span 1, 2, 4, ... (_fwht).

A quantized V cache needs flash attention in llama.cpp (llama_init_from_model refuses it without, or
turns it on in auto mode); with any quantized cache type ggml's CPU flash_attn_ext takes its one
path for non-F16 caches (ggml_compute_forward_flash_attn_ext_f16_one_chunk; the tiled and split-KV
paths need F16 K and V of one type), one query row per job, the keys in position order:

- q is converted to K's vec_dot_type (Q8_0 for a Q8_0 or Q4_0 K, f16 for an F16 K), and each key's
  score is K's vec_dot with it (ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0: per block 8 int32 lanes of 4
  products, one fma per lane with d_k * d_q, hsum_float_8; ggml_vec_dot_f16: 4 x 16 lanes);
- s * scale (scale = kq_scale / softcap with a soft-cap, then softcap * tanhf(s));
- an online softmax in float32 with libm's expf: a new maximum scales the accumulator and the sum by
  expf(M_old - M), any other key adds with weight expf(s - M); the sum S = S * ms + vs is one fma
  in the loop over keys and two roundings where the sinks join (as GCC built them: the records tell
  the two apart, fma or not, in each place);
- V accumulates in float32 (a quantized V: its row dequantized, then fma) or, for an F16 V, in f16
  (ggml_vec_mad_f16 / ggml_vec_scale_f16: each step an fma or product rounded to f16);
- sinks (gpt-oss) join once after the keys; the row is scaled by 1/S.
It does not depend on the batch size or the thread count.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..errors import KVTypeError, RamforgeError
from ..gguf.constants import GGML_BLOCK, GGMLType, row_nbytes
from .fmatmul import _f16_vd
from .quantize import _quantize_q8_0
from .scalars import F16_TO_F32, _f32_to_half_bits, _fma, half_bits, half_round

F16, Q8_0, Q4_0 = 0, 1, 2                         # kernel codes
_CODE = {"f16": F16, "q8_0": Q8_0, "q4_0": Q4_0}

KV_TYPES = {"f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}   # name -> ggml type
QK = GGML_BLOCK[GGMLType.Q8_0][0]                 # elements per block of both quantized types (32)


def row_bytes(kind: str, head_dim: int) -> int:
    """Bytes of one cache row (one position, one KV head) of type `kind`."""
    if kind != "f16" and head_dim % QK:
        raise KVTypeError(f"a {kind} KV cache stores blocks of {QK} elements; a head size of {head_dim} is not "
                          f"a multiple of {QK} (use f16 for this model)")
    return row_nbytes(KV_TYPES[kind], head_dim)


# ---------------------------------------------------------------- the Hadamard rotation


def rotation(kind: str, head_dim: int, keys: bool) -> int:
    """The size of llama.cpp's Walsh-Hadamard rotation for a cache of `kind` (0: none). A quantized
    cache whose head size is a multiple of 64 is rotated (llama_kv_cache's attn_rot_k / attn_rot_v): K
    (and q with it) in blocks of the largest power of two dividing the head size, V (and the attention
    output back) in blocks of 64."""
    if kind == "f16" or head_dim % 64:
        return 0
    if not keys:
        return 64
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


@njit(cache=True)
def _fwht(x, n):
    # x f32[m] in place, rows of n (a power of two): ggml's fwht (mul_mat with the Hadamard hint):
    # each element times 1/sqrtf(n), then butterflies (u + v, u - v) of span 1, 2, 4, ... n/2
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(n)))
    for r in range(x.size // n):
        o = r * n
        for j in range(n):
            x[o + j] = x[o + j] * scale
        span = 1
        while span < n:
            for i in range(0, n, 2 * span):
                for j in range(span):
                    u = x[o + i + j]
                    v = x[o + i + span + j]
                    x[o + i + j] = u + v
                    x[o + i + span + j] = u - v
            span *= 2


def rotate(x: np.ndarray, n: int) -> np.ndarray:
    """A copy of x (f32, last dimension a multiple of n) rotated in blocks of n along its last dimension."""
    y = np.array(x, np.float32, order="C")
    if n:
        _fwht(y.reshape(-1), n)
    return y


# ---------------------------------------------------------------- storing rows


@njit(cache=True)
def _store_q8_0(dst, x):
    # x f32[n_rows, hd] -> dst u8[n_rows, hd/32*34]: ggml-cpu's quantize_row_q8_0 (as quantize._quantize_q8_0)
    n, hd = x.shape
    nb = hd // 32
    q = np.empty(n * hd, np.int8)
    d = np.empty(n * nb, np.float32)
    _quantize_q8_0(x, q, d, d, np.empty(n * nb, np.int32), False)
    for r in range(n):
        for b in range(nb):
            o = b * 34
            h = _f32_to_half_bits(d[r * nb + b])
            dst[r, o] = h & 0xFF
            dst[r, o + 1] = (h >> 8) & 0xFF
            for i in range(32):
                dst[r, o + 2 + i] = np.uint8(q[(r * nb + b) * 32 + i] & 0xFF)


@njit(cache=True)
def _store_q4_0(dst, x):
    # x f32[n_rows, hd] -> dst u8[n_rows, hd/32*18]: ggml-base's quantize_row_q4_0_ref (no fma)
    n, hd = x.shape
    for r in range(n):
        for b in range(hd // 32):
            o, e = b * 18, b * 32
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for i in range(32):
                v = x[r, e + i]
                if amax < abs(v):
                    amax = abs(v)
                    mx = v
            dd = mx / np.float32(-8.0)
            inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
            h = _f32_to_half_bits(dd)
            dst[r, o] = h & 0xFF
            dst[r, o + 1] = (h >> 8) & 0xFF
            for j in range(16):
                x0 = x[r, e + j] * inv
                x1 = x[r, e + 16 + j] * inv
                a = min(15, int(x0 + np.float32(8.5)))       # (int8_t) of the float: truncation
                c = min(15, int(x1 + np.float32(8.5)))
                dst[r, o + 2 + j] = np.uint8(a | (c << 4))


def store_rows(dst: np.ndarray, x: np.ndarray, kind: str, keys: bool) -> None:
    """Write f32 rows x[n, n_head_kv, hd] into cache rows dst[n, n_head_kv, row_bytes] of type `kind`
    (keys: K rows, else V rows; a quantized cache stores them rotated, see rotation)."""
    n, nh, hd = x.shape
    if kind == "f16":
        half_bits(x, dst)
        return
    x2 = rotate(x, rotation(kind, hd, keys)).reshape(n * nh, hd)
    out = np.empty((n * nh, dst.shape[-1]), np.uint8)
    (_store_q8_0 if kind == "q8_0" else _store_q4_0)(out, x2)
    dst[...] = out.reshape(dst.shape)


@njit(cache=True)
def dequantize_rows(src, kind, hd):
    """Cache rows u8[n, row_bytes] of kind Q8_0 / Q4_0 (kernel codes) -> f32[n, hd] (ggml's to_float)."""
    n = src.shape[0]
    out = np.empty((n, hd), np.float32)
    for r in range(n):
        _dequant_row(src[r], 0, kind, hd, out[r])
    return out


# ---------------------------------------------------------------- flash attention


@njit(cache=True, inline="always")
def _half(raw, o):
    return F16_TO_F32[np.int64(raw[o]) | (np.int64(raw[o + 1]) << 8)]


@njit(cache=True, inline="always")
def _dequant_row(raw, o, kind, hd, out):
    # dequantize_row_q8_0 / _q4_0 (ggml-base): q * d, exact
    if kind == Q8_0:
        k8 = raw.view(np.int8)
        for b in range(hd // 32):
            bo = o + b * 34
            d = _half(raw, bo)
            for i in range(32):
                out[b * 32 + i] = np.float32(k8[bo + 2 + i]) * d
    else:
        for b in range(hd // 32):
            bo = o + b * 18
            d = _half(raw, bo)
            for j in range(16):
                byte = np.int32(raw[bo + 2 + j])
                out[b * 32 + j] = np.float32((byte & 0x0F) - 8) * d
                out[b * 32 + 16 + j] = np.float32((byte >> 4) - 8) * d


@njit(cache=True, inline="always")
def _qdot(raw, o, kind, qq, qd, qo, nb, lanes):
    # ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0 (x86 AVX2 form): K row at raw[o], q8_0 query qq[qo*32..], qd[qo..]:
    # per block 8 int32 lanes of 4 products (exact), each lane += d_k * d_q * lane (an fma); hsum_float_8
    for ln in range(8):
        lanes[ln] = np.float32(0.0)
    k8 = raw.view(np.int8)
    for b in range(nb):
        qb = (qo + b) * 32
        if kind == Q8_0:
            bo = o + b * 34
            d = _half(raw, bo) * qd[qo + b]
            for ln in range(8):
                acc = np.int32(0)
                for i in range(4 * ln, 4 * ln + 4):
                    acc += np.int32(k8[bo + 2 + i]) * np.int32(qq[qb + i])
                lanes[ln] = _fma(d, np.float32(acc), lanes[ln])
        else:
            bo = o + b * 18
            d = _half(raw, bo) * qd[qo + b]
            for ln in range(4):                    # elements 0..15: the low nibbles of bytes 0..15
                acc = np.int32(0)
                for i in range(4 * ln, 4 * ln + 4):
                    acc += (np.int32(raw[bo + 2 + i] & 0x0F) - 8) * np.int32(qq[qb + i])
                lanes[ln] = _fma(d, np.float32(acc), lanes[ln])
            for ln in range(4):                    # elements 16..31: the high nibbles
                acc = np.int32(0)
                for i in range(4 * ln, 4 * ln + 4):
                    acc += (np.int32(raw[bo + 2 + i] >> 4) - 8) * np.int32(qq[qb + 16 + i])
                lanes[4 + ln] = _fma(d, np.float32(acc), lanes[4 + ln])
    a = lanes
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


@njit(cache=True, parallel=True)
def _flash(out, qh, qq, qd, kraw, vraw, pos0, n_tok, n_head, n_kv, hd_k, hd_v, kt, vt, rbk, rbv,
           scale, softcap, window, sinks, cptr, cidx):
    # cptr i32[n_tok+1], cidx i32[...] (or both empty): token t reads the cache rows cidx[cptr[t]:cptr[t+1]]
    # (llama.cpp's visible KV cells, in cell order) instead of positions j0..pos0+t
    # out f32[n_tok, n_head, hd_v]; kraw, vraw: the layer's cache bytes (u8, flat), rows of rbk / rbv bytes
    # in the order (position, kv head); qh f32[n_tok*n_head*hd_k]: q f16-rounded (an F16 K), or
    # qq i8 / qd f32: q as Q8_0 blocks (a quantized K)
    gqa = n_head // n_kv
    k16 = kraw.view(np.uint16)
    v16 = vraw.view(np.uint16)
    nbk = hd_k // 32
    vk = hd_k - hd_k % 64
    for job in prange(n_tok * n_head):
        t, h = job // n_head, job % n_head
        kvh = h // gqa
        p = pos0 + t
        j0 = 0 if window <= 0 else max(0, p - window + 1)
        acc = np.zeros(hd_v, np.float32)
        vrow = np.empty(hd_v, np.float32)
        lanes = np.empty(8, np.float32)
        M = np.float32(-np.inf)
        S = np.float32(0.0)
        row = t * n_head + h
        a, b = j0, p + 1
        if cptr.size:
            a, b = np.int64(cptr[t]), np.int64(cptr[t + 1])
        for m in range(a, b):
            j = np.int64(cidx[m]) if cptr.size else m
            ko = (j * n_kv + kvh) * rbk
            if kt == F16:
                sd = np.float64(_f16_vd(k16, ko // 2, qh, row * hd_k, vk))
                if vk < hd_k:                                  # ggml_vec_dot_f16's scalar tail, in double
                    for d in range(vk, hd_k):
                        sd += np.float64(qh[row * hd_k + d] * F16_TO_F32[k16[ko // 2 + d]])
                s = np.float32(sd)
            else:
                s = _qdot(kraw, ko, kt, qq, qd, row * nbk, nbk, lanes)
            s = s * scale
            if softcap != 0:
                s = softcap * np.float32(math.tanh(s))
            ms = np.float32(1.0)
            vs = np.float32(1.0)
            vo = (j * n_kv + kvh) * rbv
            if s > M:
                m_old = M
                M = s
                ms = np.float32(math.exp(m_old - M))
                if vt == F16:
                    for d in range(hd_v):
                        acc[d] = F16_TO_F32[_f32_to_half_bits(acc[d] * ms)]
                else:
                    for d in range(hd_v):
                        acc[d] = acc[d] * ms
            else:
                vs = np.float32(math.exp(s - M))
            if vt == F16:
                for d in range(hd_v):
                    acc[d] = F16_TO_F32[_f32_to_half_bits(_fma(F16_TO_F32[v16[vo // 2 + d]], vs, acc[d]))]
            else:
                _dequant_row(vraw, vo, vt, hd_v, vrow)
                for d in range(hd_v):
                    acc[d] = _fma(vrow[d], vs, acc[d])
            S = _fma(S, ms, vs)
        if sinks.size:
            sk = sinks[h]
            ms = np.float32(1.0)
            vs = np.float32(1.0)
            if sk > M:
                ms = np.float32(math.exp(M - sk))
                M = sk
                for d in range(hd_v):
                    acc[d] = acc[d] * ms
            else:
                vs = np.float32(math.exp(sk - M))
            S = S * ms + vs                           # not an fma here (see the docstring)
        inv = np.float32(0.0) if S == 0 else np.float32(1.0) / S
        for d in range(hd_v):
            out[t, h, d] = acc[d] * inv


_NO_SINKS = np.empty(0, np.float32)
_EMPTY_F = np.empty(0, np.float32)
_EMPTY_I = np.empty(0, np.int8)
_EMPTY_I32 = np.empty(0, np.int32)


def flash_attention(out: np.ndarray, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, k_type: str,
                    v_type: str, pos0: int, kq_scale: float, window: int = 0, softcap: float = 0.0,
                    sinks: np.ndarray | None = None, cells: tuple | None = None) -> np.ndarray:
    """Causal attention of q (f32[n_tok, n_head, hd_k], positions pos0..) over cache rows 0..pos0+n_tok-1
    as ggml's CPU flash_attn_ext computes it (see the module docstring). k_cache: the layer's K rows
    (u16[n_ctx, n_kv, hd_k] f16 bits, or u8[n_ctx, n_kv, row_bytes] of k_type), v_cache likewise.
    cells: (ptr, idx) as attention.attention's: the rows each token reads, in cell order (pos0, window unused)."""
    n_tok, n_head, hd_k = q.shape
    hd_v = out.shape[2]
    n_kv = k_cache.shape[1]
    if (n_kv == 0 or n_head % n_kv or (cells is None and pos0 + n_tok > k_cache.shape[0]) or v_cache.shape[:2] != k_cache.shape[:2]
            or k_cache.shape[2] * k_cache.itemsize != row_bytes(k_type, hd_k)
            or v_cache.shape[2] * v_cache.itemsize != row_bytes(v_type, hd_v)
            or not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous) or out.shape[:2] != (n_tok, n_head)):
        raise RamforgeError(f"flash_attention: q {q.shape}, k cache {k_cache.shape} {k_type}, "
                            f"v cache {v_cache.shape} {v_type}, out {out.shape}, pos0 {pos0}")
    sk = _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    if sk.size not in (0, n_head):
        raise RamforgeError(f"flash_attention: {sk.size} sinks for {n_head} heads")
    kt, vt = _CODE[k_type], _CODE[v_type]
    q2 = rotate(q, rotation(k_type, hd_k, True)).reshape(n_tok * n_head, hd_k)
    if kt == F16:                                   # q to K's vec_dot_type: f16 ...
        qh, qq, qd = half_round(q2).reshape(-1), _EMPTY_I, _EMPTY_F
    else:                                           # ... or Q8_0 blocks (quantize_row_q8_0)
        nb = n_tok * n_head * hd_k // QK
        qq, qd = np.empty(nb * QK, np.int8), np.empty(nb, np.float32)
        _quantize_q8_0(q2, qq, qd, qd, np.empty(nb, np.int32), False)
        qh = _EMPTY_F
    f = np.float32
    scale = f(kq_scale) / f(softcap) if softcap else f(kq_scale)
    _flash(out, qh, qq, qd, k_cache.reshape(-1).view(np.uint8), v_cache.reshape(-1).view(np.uint8), pos0, n_tok,
           n_head, n_kv, hd_k, hd_v, kt, vt, k_cache.shape[2] * k_cache.itemsize, v_cache.shape[2] * v_cache.itemsize,
           scale, f(softcap), window, sk, *((_EMPTY_I32, _EMPTY_I32) if cells is None else cells))
    nv = rotation(v_type, hd_v, False)
    if nv:                                          # the output rotated back (V was stored rotated)
        _fwht(out.reshape(-1), nv)
    return out
