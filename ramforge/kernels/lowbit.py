"""The low-bit types MXFP4, TQ1_0, IQ1_S and IQ1_M: dequantization kernels and row unpackers
(TQ2_0 is a bit-packed chunk type: blocks.CHUNKS, decode._dequant_k, unpack._unpack_k).

Dequantization is bit-exact against gguf-py (`gguf.quants`), as decode.py's kernels are:
  MXFP4  w = e8m0_half(e) * kv[nibble]                  (f32 product; kv the doubled e2m1 values)
  TQ1_0  w = d * (digit - 1)                            (base-3 digits of the packed bytes)
  IQ1_S  w = (d * (2s + 1)) * (grid + delta)            per 32: 3-bit s, delta = +-1/8
  IQ1_M  w = (d * (2s + 1)) * (grid + delta)            per 16: 3-bit s; per 8: delta; d an f16 in
                                                        the top nibbles of the 4 scale words
The unpackers write what the integer dots read (unpack.py's convention, weight = wd*isc*wq):
  TQ1_0  wq = digit (0..2, the dots' offset 1), isc = 1 per 16, wd = d
  IQ1_*  wq = 8*grid + delta8 (delta8 = +-1), isc = 2s + 1, wd = d / 8: the codes and scale of
         llama.cpp's tiled matmul; its vec_dot takes grid = (wq + 4) >> 3 and delta8 = wq - 8*grid
         apart (codegen.py), with d = 8 * wd (both exact: powers of two).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ramforge.gguf.constants import QK_K

from .blocks import (B_IQ1_M, B_IQ1_S, B_MXFP4, B_TQ1_0, IQ1_M, IQ1_S, TQ1_0, _iq1_m_d_bits, _iq1_m_scale,
                     _iq1_s_scale, _row_scales)
from .llvmir import I8, I64, dtypes_are, ptr
from .lowbit_ir import tq1_0_chunks
from .naming import made_for
from .lowbit_tables import E8M0_HALF, IQ1_W64, IQ1S_DELTA, IQ1S_GRID, KVALUES_MXFP4_F32, POW3
from .scalars import _f16_at_int, _half_bits_to_f32, _store_u64, _u16

_POW3 = np.array(POW3, dtype=np.int64)
_GRID_F32 = IQ1S_GRID.astype(np.float32)                                   # f32[2048, 8]
_DELTA = np.float32(IQ1S_DELTA)


@intrinsic
def _vtq1_0(typingctx, dst, do, raw, o):
    """dst[do:do+256] (i8) = the digits of the TQ1_0 block at raw[o] (u8), as lowbit_ir builds them."""
    def codegen(context, builder, sig, args):
        rp = ptr(context, builder, sig.args[2], args[2], args[3], I8)
        w_vec = tq1_0_chunks(context, builder, rp)
        zero = ir.Constant(I64, 0)
        for c in range(QK_K // 32):
            q = ptr(context, builder, sig.args[0], args[0], builder.add(args[1], ir.Constant(I64, 32 * c)),
                    ir.VectorType(I8, 32))
            builder.store(w_vec(zero, None, c), q, align=1)
        return context.get_dummy_value()
    if not dtypes_are((dst, raw), (types.int8, types.uint8)):
        return None
    return types.void(dst, do, raw, o), codegen


# ---------------------------------------------------------------- bit fields

@njit(cache=True, inline="always")
def _tq1_0_digit(raw, p, e):
    """TQ1_0 quant e (0..255, unsigned 0..2) of the block at byte p: base-3 digit n of a byte,
    elements 0..159: bytes 0..31, digit e // 32; 160..239: bytes 32..47, digit (e-160) // 16;
    240..255: the 4 qh bytes, digit (e-240) // 4. digit = ((q * 3^n mod 256) * 3) >> 8."""
    if e < 160:
        q, n = raw[p + B_TQ1_0.qs + (e & 31)], e >> 5
    elif e < 240:
        q, n = raw[p + B_TQ1_0.qs + 32 + ((e - 160) & 15)], (e - 160) >> 4
    else:
        q, n = raw[p + B_TQ1_0.qh + ((e - 240) & 3)], (e - 240) >> 2
    return (((np.int64(q) * _POW3[n]) & 255) * 3) >> 8


@njit(cache=True, inline="always")
def _iq1_group(m_type, raw, p, g):
    """IQ1_S / IQ1_M group g (0..31) of 8 values: grid index + 2048 if its delta is negative (a row
    of IQ1_W). IQ1_S: index bits 8-10 and the sign (bit 15) in the u16 qh word of its 32; IQ1_M: in
    the nibble g & 1 of qh byte g >> 1 (bits 0-2, sign bit 3)."""
    if m_type:
        h = np.int64(raw[p + B_IQ1_M.qh + (g >> 1)]) >> (4 * (g & 1))
        return np.int64(raw[p + B_IQ1_M.qs + g]) | ((h & 15) << 8)
    hw = _u16(raw, p + B_IQ1_S.qh + 2 * (g >> 2))
    return np.int64(raw[p + B_IQ1_S.qs + g]) | (((hw >> (3 * (g & 3))) & 7) << 8) | ((hw >> 15) << 11)


# ---------------------------------------------------------------- dequantization

@njit(cache=True)
def _dequant_mxfp4(out, raw, first_block, n_blocks):
    # u8 e | u8 qs[16]; w = e8m0_half(e) * kv[nibble] (nibble j: low nibbles, then high)
    for b in range(n_blocks):
        p = (first_block + b) * B_MXFP4.nbytes
        d = E8M0_HALF[raw[p + B_MXFP4.d]]
        for j in range(32):
            q = (np.int64(raw[p + B_MXFP4.qs + (j & 15)]) >> (4 * (j >> 4))) & 15
            out[b * 32 + j] = d * KVALUES_MXFP4_F32[q]


@njit(cache=True)
def _dequant_tq1_0(out, raw, first_block, n_blocks):
    # u8 qs[48] | u8 qh[4] | f16 d; w = d * (digit - 1)
    for b in range(n_blocks):
        p = (first_block + b) * B_TQ1_0.nbytes
        d = _f16_at_int(raw, p + B_TQ1_0.d)
        for e in range(QK_K):
            out[b * QK_K + e] = d * np.float32(_tq1_0_digit(raw, p, e) - 1)


def _dequant_iq1(m_type):
    """The kernel of IQ1_S (f16 d | u8 qs[32] | u16 qh[8]) or IQ1_M (u8 qs[32] | u8 qh[16] |
    u16 scales[4]): per group of 8, w = (d * (2s + 1)) * (grid + delta)."""
    L = B_IQ1_M if m_type else B_IQ1_S

    @njit(cache=True)
    def dequant(out, raw, first_block, n_blocks):
        for b in range(n_blocks):
            p = (first_block + b) * L.nbytes
            d = _half_bits_to_f32(_iq1_m_d_bits(raw, p)) if m_type else _f16_at_int(raw, p + L.d)
            for g in range(QK_K // 8):
                sc = _iq1_m_scale(raw, p, g >> 1) if m_type else _iq1_s_scale(raw, p, g >> 2)
                dl = d * np.float32(sc)
                i = _iq1_group(m_type, raw, p, g)
                delta = -_DELTA if i >> 11 else _DELTA
                for j in range(8):
                    out[b * QK_K + 8 * g + j] = dl * (_GRID_F32[i & 2047, j] + delta)
    return made_for(dequant, "IQ1_M" if m_type else "IQ1_S")


_dequant_iq1_s, _dequant_iq1_m = _dequant_iq1(False), _dequant_iq1(True)


# ---------------------------------------------------------------- row unpackers (integer dots)

@njit(cache=True)
def _unpack_tq1_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # wq = digit 0..2 (weight = digit - 1: QDot offset 1); isc = 1 per 16, wd = d (blocks._row_scales)
    for b in range(n_sb):
        p = o + b * B_TQ1_0.nbytes
        _row_scales(TQ1_0, raw, p, b, isc, imn, wd, wm)
        if vec:
            _vtq1_0(wq, b * QK_K, raw, p)
        else:
            for e in range(QK_K):
                wq[b * QK_K + e] = np.int8(_tq1_0_digit(raw, p, e))


def _unpack_iq1(t):
    """The unpacker of IQ1_S / IQ1_M: wq = 8*grid + delta8 (IQ1_W, 8 bytes at a time); isc = 2s + 1
    per 32 / 16 and wd = d / 8 (blocks._row_scales)."""
    L, m_type = LAYOUTS_IQ1[t], t == IQ1_M

    @njit(cache=True)
    def unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
        for b in range(n_sb):
            p = o + b * L.nbytes
            _row_scales(t, raw, p, b, isc, imn, wd, wm)
            for g in range(QK_K // 8):
                _store_u64(wq, b * QK_K + 8 * g, IQ1_W64[_iq1_group(m_type, raw, p, g)])
    return made_for(unpack, t)


LAYOUTS_IQ1 = {IQ1_S: B_IQ1_S, IQ1_M: B_IQ1_M}


_unpack_iq1_s, _unpack_iq1_m = _unpack_iq1(IQ1_S), _unpack_iq1(IQ1_M)
