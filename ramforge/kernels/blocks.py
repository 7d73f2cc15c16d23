"""The block layouts of the executable quantized types, and their decoders, in one copy.

Dequantization (decode.py), the row unpackers of the integer dots (unpack.py), the packed-row
intrinsics (codegen.py) and the kernels of qmatmul.py all read blocks through what is here:
`LAYOUTS` (byte offsets of each field, as ggml's block_<type> structs), the sub-block scale
decoders, and the quant bit fields (`_nibble` for the 32-element types, `CHUNKS` for the
bit-packed K-quants).

Per-type code is made per type by a factory (`_scales_fn`: a closure over the type's constants,
compiled for that type alone on first use, cached by numba); a dispatch such as `_row_scales`
takes the GGMLType value t, which kernels pass as a constant so that numba keeps one branch; a
type without a branch raises.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ramforge.gguf.constants import GGML_BLOCK, QK_K, GGMLType

from .iquants import (IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, _scales_iq2_s, _scales_iq2_xs, _scales_iq2_xxs,
                      _scales_iq3_s, _scales_iq3_xxs)
from .naming import made_for
from .scalars import _f16_at, _f32_at, _half_bits_to_f32, _u16

T = GGMLType


class Layout(NamedTuple):
    """Byte offsets of the fields of one block (-1: the type has no such field), and its size."""

    nbytes: int
    d: int = -1         # scale: f16 (Q8_K: f32; MXFP4: u8 E8M0 exponent; IQ1_M: none, its f16 in the scales)
    m: int = -1         # f16 min (Q4_1, Q5_1) or super-block dmin (Q2_K, Q4_K, Q5_K)
    qh: int = -1        # high bits: u32 (Q5_0, Q5_1), u8[32] (Q5_K; Q3_K's hmask), u8[64] (Q6_K)
    qs: int = -1        # quants: nibbles, 2-bit fields, int8 or codebook indices (Q6_K: ql, the low 4 bits)
    scales: int = -1    # sub-block scales (IQ4_XS: u16 scales_h, then u8 scales_l[4])
    sub: int = 32       # quants per sub-block scale (the 32-element types: the whole block, scale 1)
    bias: int = 0       # added to a stored 4-6 bit quant to give the signed one (Q3_K's -4: in its chunk fields)


def _layout(t: GGMLType, *fields: tuple[str, int], sub: int = 32, bias: int = 0) -> Layout:
    """The Layout of fields (name, bytes) stored in this order; their bytes add up to GGML_BLOCK's."""
    at, off = {}, 0
    for name, n in fields:
        at[name], off = off, off + n
    if off != GGML_BLOCK[t][1]:
        raise AssertionError(f"{t.name} layout of {off} B, GGML_BLOCK says {GGML_BLOCK[t][1]}")
    return Layout(off, **{k: v for k, v in at.items() if k in Layout._fields}, sub=sub, bias=bias)


LAYOUTS: dict[GGMLType, Layout] = {
    T.Q4_0: _layout(T.Q4_0, ("d", 2), ("qs", 16), bias=-8),
    T.Q4_1: _layout(T.Q4_1, ("d", 2), ("m", 2), ("qs", 16)),
    T.Q5_0: _layout(T.Q5_0, ("d", 2), ("qh", 4), ("qs", 16), bias=-16),
    T.Q5_1: _layout(T.Q5_1, ("d", 2), ("m", 2), ("qh", 4), ("qs", 16)),
    T.Q8_0: _layout(T.Q8_0, ("d", 2), ("qs", 32)),
    T.IQ4_NL: _layout(T.IQ4_NL, ("d", 2), ("qs", 16)),
    T.Q2_K: _layout(T.Q2_K, ("scales", QK_K // 16), ("qs", QK_K // 4), ("d", 2), ("m", 2), sub=16),
    T.Q3_K: _layout(T.Q3_K, ("qh", QK_K // 8), ("qs", QK_K // 4), ("scales", 12), ("d", 2), sub=16),
    T.Q4_K: _layout(T.Q4_K, ("d", 2), ("m", 2), ("scales", 12), ("qs", QK_K // 2)),
    T.Q5_K: _layout(T.Q5_K, ("d", 2), ("m", 2), ("scales", 12), ("qh", QK_K // 8), ("qs", QK_K // 2)),
    T.Q6_K: _layout(T.Q6_K, ("qs", QK_K // 2), ("qh", QK_K // 4), ("scales", QK_K // 16), ("d", 2), sub=16,
                    bias=-32),
    T.Q8_K: _layout(T.Q8_K, ("d", 4), ("qs", QK_K), ("bsums", QK_K // 8)),
    T.IQ4_XS: _layout(T.IQ4_XS, ("d", 2), ("scales", 2 + QK_K // 64), ("qs", QK_K // 2)),
    T.MXFP4: _layout(T.MXFP4, ("d", 1), ("qs", 16)),
    T.TQ2_0: _layout(T.TQ2_0, ("qs", QK_K // 4), ("d", 2), sub=16, bias=-1),
    T.TQ1_0: _layout(T.TQ1_0, ("qs", 48), ("qh", QK_K // 64), ("d", 2), sub=16, bias=-1),
    T.IQ1_S: _layout(T.IQ1_S, ("d", 2), ("qs", QK_K // 8), ("qh", QK_K // 16)),
    T.IQ1_M: _layout(T.IQ1_M, ("qs", QK_K // 8), ("qh", QK_K // 16), ("scales", QK_K // 32), sub=16),
}
# names for the kernels: numba reads a global name as a constant, and prunes a `t == Q4_K` branch
# where t is one too (an attribute, GGMLType.Q4_K, it does not)
F32, F16, BF16 = T.F32, T.F16, T.BF16
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS = T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K, T.IQ4_XS
B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_Q8_0, B_IQ4_NL = (LAYOUTS[t] for t in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL))
B_Q2_K, B_Q3_K, B_Q4_K, B_Q5_K, B_Q6_K, B_Q8_K, B_IQ4_XS = (LAYOUTS[t] for t in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
                                                                              IQ4_XS))
MXFP4, TQ1_0, TQ2_0, IQ1_S, IQ1_M = T.MXFP4, T.TQ1_0, T.TQ2_0, T.IQ1_S, T.IQ1_M
B_MXFP4, B_TQ1_0, B_TQ2_0, B_IQ1_S, B_IQ1_M = (LAYOUTS[t] for t in (MXFP4, TQ1_0, TQ2_0, IQ1_S, IQ1_M))

# IQ4_NL / IQ4_XS non-linear 4-bit codebook
IQ4_KV = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
IQ4_KV_I8 = np.array(IQ4_KV, dtype=np.int8)
IQ4_KV_F32 = np.array(IQ4_KV, dtype=np.float32)


# ---------------------------------------------------------------- quants

@njit(cache=True, inline="always")
def _nibble(raw, o, j):
    """Quant j (0..31) of a 32-element block's 16 nibble bytes at o: low nibbles, then high."""
    return (np.int64(raw[o + (j & 15)]) >> (4 * (j >> 4))) & 15


@njit(cache=True, inline="always")
def _high_bit(qh, j):
    """Q5_0/Q5_1: bit j of the u32 qh, as the quant's fifth bit (0 or 16)."""
    return ((qh >> j) & 1) << 4


# The bit-packed K-quants, per chunk c (0..7) of 32 quants of a super-block: quant l of the chunk is
#   ((raw[p + ao + l] >> sa) & ma) + (((raw[p + bo + l] >> sb) & mb) << lb) + c0
# with (ao, sa, ma, bo, sb, mb, lb, c0) = CHUNKS[t][c] and p the super-block's first byte.

def _q2_k_chunk(c):
    return (B_Q2_K.qs + c // 4 * 32, 2 * (c % 4), 3, 0, 0, 0, 0, 0)


def _q3_k_chunk(c):      # low 2 bits, hmask bit c (set: +4), less 4
    return (B_Q3_K.qs + c // 4 * 32, 2 * (c % 4), 3, B_Q3_K.qh, c, 1, 2, -4)


def _q4_k_chunk(c):
    return (B_Q4_K.qs + c // 2 * 32, 4 * (c % 2), 15, 0, 0, 0, 0, 0)


def _q5_k_chunk(c):
    return (B_Q5_K.qs + c // 2 * 32, 4 * (c % 2), 15, B_Q5_K.qh, c, 1, 4, 0)


def _q6_k_chunk(c):      # unsigned 0..63 (the weight is q - 32)
    return (B_Q6_K.qs + c // 4 * 64 + c % 2 * 32, 4 * (c % 4 // 2), 15, B_Q6_K.qh + c // 4 * 32, 2 * (c % 4), 3, 4, 0)


def _q8_k_chunk(c):      # the int8 quants as bytes
    return (B_Q8_K.qs + c * 32, 0, 255, 0, 0, 0, 0, 0)


def _tq2_0_chunk(c):     # unsigned 0..3, as Q2_K's quants (the weight is q - 1)
    return (B_TQ2_0.qs + c // 4 * 32, 2 * (c % 4), 3, 0, 0, 0, 0, 0)


CHUNKS: dict[GGMLType, tuple[tuple[int, ...], ...]] = {
    t: tuple(f(c) for c in range(QK_K // 32))
    for t, f in ((Q2_K, _q2_k_chunk), (Q3_K, _q3_k_chunk), (Q4_K, _q4_k_chunk), (Q5_K, _q5_k_chunk),
                 (Q6_K, _q6_k_chunk), (Q8_K, _q8_k_chunk), (TQ2_0, _tq2_0_chunk))}


@njit(cache=True, inline="always")
def _chunk_quant(f, raw, p, l):
    """Quant l of a chunk with bit fields f (a CHUNKS entry) of the super-block at byte p."""
    ao, sa, ma, bo, sb, mb, lb, c0 = f
    return ((np.int64(raw[p + ao + l]) >> sa) & ma) + (((np.int64(raw[p + bo + l]) >> sb) & mb) << lb) + c0


# ---------------------------------------------------------------- sub-block scales (integers)

@njit(cache=True, inline="always")
def _q2_k_scale_min(raw, p, g):
    """Q2_K sub-block g (of 16): 4-bit scale and min."""
    v = np.int64(raw[p + B_Q2_K.scales + g])
    return v & 15, v >> 4


@njit(cache=True, inline="always")
def _q3_k_scale(raw, p, g):
    """Q3_K sub-block g (of 16): 6-bit scale (low 4 bits, then 2 high bits packed by 4) less 32."""
    so = p + B_Q3_K.scales
    if g < 8:
        lo = np.int64(raw[so + g]) & 15
    else:
        lo = np.int64(raw[so + g - 8]) >> 4
    hi = (np.int64(raw[so + 8 + (g & 3)]) >> (2 * (g >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(cache=True, inline="always")
def _k4_scale_min(raw, p, j):
    """Q4_K/Q5_K sub-block j (of 8): 6-bit scale and min from the 12 scale bytes."""
    so = p + B_Q4_K.scales
    if j < 4:
        sc = np.int64(raw[so + j]) & 63
        m = np.int64(raw[so + j + 4]) & 63
    else:
        sc = (np.int64(raw[so + j + 4]) & 15) | ((np.int64(raw[so + j - 4]) >> 6) << 4)
        m = (np.int64(raw[so + j + 4]) >> 4) | ((np.int64(raw[so + j]) >> 6) << 4)
    return sc, m


@njit(cache=True, inline="always")
def _q6_k_scale(raw, p, g):
    """Q6_K sub-block g (of 16): int8 scale."""
    v = np.int64(raw[p + B_Q6_K.scales + g])
    return v - ((v >> 7) << 8)


@njit(cache=True, inline="always")
def _iq4_xs_scale(raw, p, s):
    """IQ4_XS sub-block s (of 8): 6-bit scale (4 bits of scales_l, 2 of scales_h) less 32."""
    sh = _u16(raw, p + B_IQ4_XS.scales)
    lo = (np.int64(raw[p + B_IQ4_XS.scales + 2 + (s >> 1)]) >> (4 * (s & 1))) & 15
    return (lo | (((sh >> (2 * s)) & 3) << 4)) - 32


@njit(cache=True, inline="always")
def _iq1_s_scale(raw, p, g):
    """IQ1_S sub-block g (of 8): 2 * (bits 12-14 of its u16 qh word) + 1."""
    return 2 * ((_u16(raw, p + B_IQ1_S.qh + 2 * g) >> 12) & 7) + 1


@njit(cache=True, inline="always")
def _iq1_m_scale(raw, p, s):
    """IQ1_M sub-block s (of 16): 2 * (3 bits of its scale word, 4 per word) + 1."""
    return 2 * ((_u16(raw, p + B_IQ1_M.scales + 2 * (s >> 2)) >> (3 * (s & 3))) & 7) + 1


@njit(cache=True, inline="always")
def _iq1_m_d_bits(raw, p):
    """IQ1_M's f16 scale (bits): the top nibble of each of its 4 u16 scale words, lowest first."""
    o = p + B_IQ1_M.scales
    return ((_u16(raw, o) >> 12) | ((_u16(raw, o + 2) >> 8) & 0xF0) | ((_u16(raw, o + 4) >> 4) & 0xF00)
            | (_u16(raw, o + 6) & 0xF000))


def _scales_fn(t):
    """The scale decoder of K-type t, scales(raw, p, b, isc, imn, wd, wm): super-block b of a row, at
    byte p, to its float scale wd[b] and min wm[b] (f32 / f16 read as the integer dots read them)
    and its n sub-blocks' integer scales isc[b*n:(b+1)*n] and mins imn[...] (0 where none).
    IQ1_S / IQ1_M: wd = d / 8 (their quants are unpacked as 8 * grid + delta, lowbit.py)."""
    L, tid = LAYOUTS[t], int(t)
    n, f32_d, has_m = QK_K // L.sub, t == Q8_K, L.m >= 0

    @njit(cache=True, inline="always")
    def scales(raw, p, b, isc, imn, wd, wm):
        if tid == IQ1_M:
            wd[b] = _half_bits_to_f32(_iq1_m_d_bits(raw, p)) * np.float32(0.125)
        elif tid == IQ1_S:
            wd[b] = _f16_at(raw, p + L.d) * np.float32(0.125)
        elif f32_d:
            wd[b] = _f32_at(raw, p + L.d)
        else:
            wd[b] = _f16_at(raw, p + L.d)
        if has_m:
            wm[b] = _f16_at(raw, p + L.m)
        for g in range(n):
            if tid == Q2_K:
                sc, m = _q2_k_scale_min(raw, p, g)
            elif tid == Q3_K:
                sc, m = _q3_k_scale(raw, p, g), 0
            elif tid == Q4_K or tid == Q5_K:
                sc, m = _k4_scale_min(raw, p, g)
            elif tid == Q6_K:
                sc, m = _q6_k_scale(raw, p, g), 0
            elif tid == IQ4_XS:
                sc, m = _iq4_xs_scale(raw, p, g), 0
            elif tid == Q8_K or tid == TQ2_0 or tid == TQ1_0:
                sc, m = 1, 0
            elif tid == IQ1_S:                  # imn: the scale signed as its delta (codegen's packed
                sc = _iq1_s_scale(raw, p, g)    # IQ1_S dot takes the delta sums from the bsums)
                m = -sc if raw[p + B_IQ1_S.qh + 2 * g + 1] >> 7 else sc
            elif tid == IQ1_M:
                sc, m = _iq1_m_scale(raw, p, g), 0
            else:
                raise ValueError("no sub-block scales for this ggml type")
            isc[b * n + g] = sc
            imn[b * n + g] = m
    return made_for(scales, t)


_scales_q2_k, _scales_q3_k, _scales_q4_k = _scales_fn(Q2_K), _scales_fn(Q3_K), _scales_fn(Q4_K)
_scales_q5_k, _scales_q6_k, _scales_q8_k, _scales_iq4_xs = (_scales_fn(Q5_K), _scales_fn(Q6_K), _scales_fn(Q8_K),
                                                           _scales_fn(IQ4_XS))
_scales_tq2_0, _scales_tq1_0, _scales_iq1_s, _scales_iq1_m = (_scales_fn(TQ2_0), _scales_fn(TQ1_0), _scales_fn(IQ1_S),
                                                               _scales_fn(IQ1_M))


@njit(cache=True, inline="always")
def _row_scales(t, raw, p, b, isc, imn, wd, wm):
    """The scale decoder of K-type t (see _scales_fn), for code that passes t as a constant (numba
    keeps that branch alone)."""
    if t == Q2_K:
        _scales_q2_k(raw, p, b, isc, imn, wd, wm)
    elif t == Q3_K:
        _scales_q3_k(raw, p, b, isc, imn, wd, wm)
    elif t == Q4_K:
        _scales_q4_k(raw, p, b, isc, imn, wd, wm)
    elif t == Q5_K:
        _scales_q5_k(raw, p, b, isc, imn, wd, wm)
    elif t == Q6_K:
        _scales_q6_k(raw, p, b, isc, imn, wd, wm)
    elif t == Q8_K:
        _scales_q8_k(raw, p, b, isc, imn, wd, wm)
    elif t == IQ4_XS:
        _scales_iq4_xs(raw, p, b, isc, imn, wd, wm)
    elif t == TQ2_0:
        _scales_tq2_0(raw, p, b, isc, imn, wd, wm)
    elif t == TQ1_0:
        _scales_tq1_0(raw, p, b, isc, imn, wd, wm)
    elif t == IQ1_S:
        _scales_iq1_s(raw, p, b, isc, imn, wd, wm)
    elif t == IQ1_M:
        _scales_iq1_m(raw, p, b, isc, imn, wd, wm)
    elif t == IQ2_XXS:                  # the codebook types (iquants.py)
        _scales_iq2_xxs(raw, p, b, isc, imn, wd, wm)
    elif t == IQ2_XS:
        _scales_iq2_xs(raw, p, b, isc, imn, wd, wm)
    elif t == IQ2_S:
        _scales_iq2_s(raw, p, b, isc, imn, wd, wm)
    elif t == IQ3_XXS:
        _scales_iq3_xxs(raw, p, b, isc, imn, wd, wm)
    elif t == IQ3_S:
        _scales_iq3_s(raw, p, b, isc, imn, wd, wm)
    else:
        raise ValueError("no sub-block scales for this ggml type")


assert B_Q4_K.scales == B_Q5_K.scales and B_Q4_K.d == B_Q5_K.d and B_Q4_K.m == B_Q5_K.m
