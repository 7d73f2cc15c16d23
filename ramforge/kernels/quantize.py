"""Activation quantization, as llama.cpp's CPU backend quantizes src1 before an integer dot.

`quantize_activation` rounds f32 activations to the weight type's `vec_dot_type`: Q8_0/Q8_1 blocks
of 32 (f16 scale amax/127, round half to even; Q8_1 also its f16 s = d * sum q) or Q8_K blocks of
256 (f32 scale -max/127 of the signed max, sums per sub-block: llama.cpp's bsums). The @njit
quantizers run per matmul; the numpy `*_reference` versions beside them are the naive twins the
tests compare them with, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import QK_K
from ramforge.kernels.registry import ActType
from ramforge.kernels.scalars import _f32_to_half_bits, _half_bits_to_f32

@dataclass
class QuantizedActivation:
    """x (f32[n_tok, n]) quantized as llama.cpp's vec_dot_type: q i8[n_tok * n] (flat), d f32 per block,
    s f32 (Q8_1: f16(d * sum q) per 32, else empty), bsum i32 sums of q per `sub` elements (Q8_K) or
    per block of 32 (Q8_0, Q8_1)."""

    q: np.ndarray
    d: np.ndarray
    s: np.ndarray
    bsum: np.ndarray


_EMPTY_F = np.zeros((1, 1), dtype=np.float32)
_EMPTY_I = np.zeros((1, 1), dtype=np.int32)          # (kept 2-D: QuantizedActivation.bsum)


@njit(cache=True, inline="always")
def _f16_round(v):
    """float32 v rounded to the nearest binary16 (ties to even; overflow to inf), as numpy's
    astype(float16), and widened back to float32."""
    return _half_bits_to_f32(_f32_to_half_bits(v))


_ABS_BITS, _INF_BITS = 0x7FFFFFFF, 0x7F800000
_MAGIC = np.float32(12582912.0)          # 1.5 * 2^23: adding it rounds a float32 below 2^22 to an integer


@njit(cache=True, inline="always")
def _rint(v):
    """np.rint of a float32 of magnitude below 2^22 (|x * scale| <= 127 here), round half to even, as
    ggml's nearest_int; vectorizes where np.rint's call does not."""
    return (v + _MAGIC) - _MAGIC


@njit(cache=True, inline="always")
def _amax_bits(xi):
    """The largest |x| of a block as its float32 bits (xi: the block viewed as int32): non-negative floats
    order as their bits, so the max is an integer max, which vectorizes (above _INF_BITS: a NaN)."""
    m = 0
    for i in range(xi.size):
        m = max(m, xi[i] & _ABS_BITS)
    return m


# The quantizers below read each block through 1-D slices (xb, qb): 2-D indexing x[t, o + i] keeps
# LLVM from vectorizing the loops (2.5x slower on a decode token).

@njit(cache=True, inline="always")
def _q8_0_token(x, t, q, d, s, bsum, with_sum):
    # token t of x f32[n_tok, n] -> q i8[n_tok*n], d f32[n_tok*n/32] (f16-rounded amax/127), bsum i32
    # sum q per 32, s (with_sum) f32 f16(d32 * sum q) per 32; the arithmetic of _q8_0_reference
    n = x.shape[1]
    nb = n // 32
    xt = x[t]
    xit = xt.view(np.int32)
    for b in range(nb):
        xb, xi = xt[b * 32:b * 32 + 32], xit[b * 32:b * 32 + 32]
        qb = q[(t * nb + b) * 32:(t * nb + b) * 32 + 32]
        amax = np.float32(0.0)
        m = _amax_bits(xi)
        if m > _INF_BITS:                       # a NaN: the float loop's rule (NaN never wins)
            for i in range(32):
                amax = max(amax, abs(xb[i]))
        else:
            for i in range(32):
                if xi[i] & _ABS_BITS == m:
                    amax = abs(xb[i])
                    break
        d32 = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        tot = 0
        for i in range(32):
            v = np.int8(_rint(xb[i] * inv))
            qb[i] = v
            tot += v
        d[t * nb + b] = _f16_round(d32)
        bsum[t * nb + b] = tot
        if with_sum:
            s[t * nb + b] = _f16_round(np.float32(tot) * d32)


@njit(cache=True, inline="always")
def _q8_k_token(x, t, q, d, bsum, sub, pos_ties):
    # token t of x f32[n_tok, n] -> q i8[n_tok*n], d f32[n_tok*n/256], bsum i32[n_tok*n/sub]; see _q8_k_reference
    n = x.shape[1]
    nb = n // QK_K
    xt = x[t]
    xit = xt.view(np.int32)
    for b in range(nb):
        o = b * QK_K
        xb, xi = xt[o:o + QK_K], xit[o:o + QK_K]
        big = xb[0]
        m = _amax_bits(xi)
        if m > _INF_BITS:                       # a NaN: the scan's rule (NaN never wins)
            for i in range(1, QK_K):
                if abs(xb[i]) > abs(big):
                    big = xb[i]
        else:                                   # the first value of the largest magnitude
            for i in range(QK_K):
                if xi[i] & _ABS_BITS == m:
                    big = xb[i]
                    break
        if t < pos_ties and big < 0:
            for i in range(QK_K):
                if xb[i] == -big:
                    big = -big
                    break
        k = t * n + o
        qb, bb = q[k:k + QK_K], bsum[k // sub:(k + QK_K) // sub]
        if abs(big) == np.inf:                  # llama.cpp's iscale = -127/big = -+0 then makes every
            qb[:] = 0                           # q its nearest_int of +-0 or NaN (inf * 0): 0, and d = 1/iscale
            bb[:] = 0
            d[t * nb + b] = -np.inf if big > 0 else np.inf
            continue
        iscale = np.float32(-127.0) / big if big != 0 else np.float32(0.0)
        for i in range(QK_K):                   # nearest_int(NaN) is 0; a NaN float -> int8 is LLVM poison
            v = min(_rint(xb[i] * iscale), np.float32(127.0))   # (AVX2's packs saturate it to -128)
            qb[i] = np.int8(v if v == v else np.float32(0.0))
        for j in range(QK_K // sub):
            acc = 0
            for i in range(sub):
                acc += qb[j * sub + i]
            bb[j] = acc
        d[t * nb + b] = np.float32(1.0) / iscale if big != 0 else np.float32(0.0)


# Tokens in parallel (each is quantized alone), or, for a little work, on the calling thread alone: a
# parallel region costs more than quantizing a decode token's few thousand values.
_SERIAL_VALUES = 32768


@njit(cache=True, parallel=True)
def _quantize_q8_0(x, q, d, s, bsum, with_sum):
    for t in prange(x.shape[0]):
        _q8_0_token(x, t, q, d, s, bsum, with_sum)


@njit(cache=True)
def _quantize_q8_0_1(x, q, d, s, bsum, with_sum):
    for t in range(x.shape[0]):
        _q8_0_token(x, t, q, d, s, bsum, with_sum)


@njit(cache=True, parallel=True)
def _quantize_q8_k(x, q, d, bsum, sub, pos_ties):
    for t in prange(x.shape[0]):
        _q8_k_token(x, t, q, d, bsum, sub, pos_ties)


@njit(cache=True)
def _quantize_q8_k_1(x, q, d, bsum, sub, pos_ties):
    for t in range(x.shape[0]):
        _q8_k_token(x, t, q, d, bsum, sub, pos_ties)


def _q8_0(x: np.ndarray, with_sum: bool) -> QuantizedActivation:
    n_tok, n = x.shape
    q = np.empty(n_tok * n, np.int8)
    d = np.empty((n_tok, n // 32), np.float32)
    s = np.empty((n_tok, n // 32), np.float32) if with_sum else _EMPTY_F
    bsum = np.empty((n_tok, n // 32), np.int32)
    run = _quantize_q8_0_1 if x.size <= _SERIAL_VALUES else _quantize_q8_0
    run(x, q, d.reshape(-1), s.reshape(-1), bsum.reshape(-1), with_sum)
    return QuantizedActivation(q, d, s, bsum)


def _q8_k(x: np.ndarray, sub: int, pos_ties: int = 0) -> QuantizedActivation:
    n_tok, n = x.shape
    q = np.empty(n_tok * n, np.int8)
    d = np.empty((n_tok, n // QK_K), np.float32)
    bsum = np.empty((n_tok, n // sub), np.int32)
    run = _quantize_q8_k_1 if x.size <= _SERIAL_VALUES else _quantize_q8_k
    run(x, q, d.reshape(-1), bsum.reshape(-1), sub, pos_ties)
    return QuantizedActivation(q, d, _EMPTY_F, bsum)


# The numpy references of the two quantizers above (tests check them equal, bit for bit).

def _q8_0_reference(x: np.ndarray, with_sum: bool) -> QuantizedActivation:
    # per 32: d = f16(amax/127), q = rint(x * 127/amax) (round half to even), as ggml's x86 quantize_row_q8_0/1
    n_tok = x.shape[0]
    xb = x.reshape(n_tok, -1, 32)
    amax = np.abs(xb).max(axis=2)
    d32 = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        q = np.rint(xb * inv[..., None]).astype(np.int8)
    d = d32.astype(np.float16).astype(np.float32)
    s = _EMPTY_F
    if with_sum:
        s = (q.sum(axis=2, dtype=np.int32).astype(np.float32) * d32).astype(np.float16).astype(np.float32)
    return QuantizedActivation(q.reshape(-1), d, s, _EMPTY_I)


def _q8_k_reference(x: np.ndarray, sub: int, pos_ties: int = 0) -> QuantizedActivation:
    # per 256: iscale = -127/max (signed value of largest |x|, the first; in the first pos_ties
    # tokens the positive one if +-max tie, as ggml's 4-row quantize_mat), q = min(rint(x*iscale), 127),
    # d = 1/iscale
    n_tok = x.shape[0]
    xb = x.reshape(-1, QK_K)
    ax = np.abs(xb)
    ax[np.isnan(ax)] = -1                               # (a NaN never wins ggml's scan)
    big = np.take_along_axis(xb, ax.argmax(axis=1)[:, None], axis=1)[:, 0]
    if pos_ties:
        nb = pos_ties * (x.shape[1] // QK_K)
        amax = np.abs(big[:nb])
        tie = (big[:nb] < 0) & (xb[:nb] == amax[:, None]).any(axis=1)
        big[:nb][tie] = amax[tie]
    nz = big != 0
    iscale = np.zeros_like(big)
    iscale[nz] = np.float32(-127) / big[nz]
    with np.errstate(invalid="ignore"):
        q = np.minimum(np.rint(xb * iscale[:, None]), np.float32(127))
    q = np.where(np.isnan(q), 0, q).astype(np.int8)      # nearest_int(NaN) is 0 (inf * 0, NaN * iscale)
    d = np.zeros_like(big)
    with np.errstate(divide="ignore"):
        d[nz] = np.float32(1) / iscale[nz]               # an infinite big: iscale -+0, d -+inf
    bsum = q.reshape(n_tok, -1, sub).sum(axis=2, dtype=np.int32)
    return QuantizedActivation(q.reshape(-1), d.reshape(n_tok, -1), _EMPTY_F, bsum)


# One token quantized inside a compiled kernel (kernels.fused): the activation type as a code, numba's
# branch on it in place of quantize_activation's on the ActType.
ACT_CODE = {ActType.Q8_0: 0, ActType.Q8_1: 1, ActType.Q8_K: 2}
_Q8_1, _Q8_K = ACT_CODE[ActType.Q8_1], ACT_CODE[ActType.Q8_K]


@njit(cache=True, inline="always")
def _token_activation(code, sub, x):
    # x f32[1, n] of activation `code` -> (q i8[n], d f32 per block, m (Q8_1's sums, else d), bsum i32 per
    # `sub` (Q8_K) or per 32): quantize_activation's arrays of one token, flat
    n = x.shape[1]
    q = np.empty(n, dtype=np.int8)
    d = np.empty(n // 32, dtype=np.float32)
    s = np.empty(n // 32 if code == _Q8_1 else 0, dtype=np.float32)
    bsum = np.empty(n // 16, dtype=np.int32)
    if code == _Q8_K:
        _q8_k_token(x, 0, q, d, bsum, sub, 0)
    else:
        _q8_0_token(x, 0, q, d, s, bsum, code == _Q8_1)
    return q, d, s if code == _Q8_1 else d, bsum


def quantize_activation(x: np.ndarray, act, sub: int = 16, pos_ties: int = 0) -> QuantizedActivation:
    """x (f32[n_tok, n]) quantized as llama.cpp does before an integer dot with a weight of `act`
    (an ActType: Q8_0, Q8_1 or Q8_K); `sub` is the weight's sub-block size for Q8_K's sums;
    pos_ties: leading tokens quantized by ggml's 4-row Q8_K quantizer (repacked weights)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if act is ActType.Q8_K:
        return _q8_k(x, sub, pos_ties)
    if act is ActType.Q8_0 or act is ActType.Q8_1:
        return _q8_0(x, act is ActType.Q8_1)
    raise RamforgeError(f"no integer activation type {act!r}")
