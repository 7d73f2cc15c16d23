"""Bit-exact dequantization of ggml blocks to float32.

Each private kernel has the form `_dequant_<type>(out, raw, first_block, n_blocks)`:
  out          float32[n_blocks * block_elems], C-contiguous, written in full
  raw          uint8[total_blocks * block_bytes], the packed tensor (or any whole-block prefix of it)
  first_block  index of the first block of `raw` to decode
  n_blocks     number of blocks to decode
Kernels do no bounds checks; `dequantize` validates and then calls one.

Bit-exact against gguf-py's `gguf.quants.dequantize` (float32 numpy): each product or sum below is
one float32 op in the same order as there (e.g. Q4_K: (d*sc)*q - (dmin*m), never fused).
fastmath stays off: contraction of a*b+c into an FMA would change the rounding.
Helpers live in this file because numba's on-disk cache only notices edits to this file.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGML_BLOCK, QK_K, GGMLType


class DequantError(RamforgeError, ValueError):
    """Arguments to `dequantize` do not describe a whole, in-bounds run of blocks."""


def _nbytes(t: GGMLType) -> int:
    return GGML_BLOCK[t][1]


# block strides in bytes (compile-time constants for the kernels; format facts from GGML_BLOCK)
_B_Q4_0, _B_Q4_1 = _nbytes(GGMLType.Q4_0), _nbytes(GGMLType.Q4_1)
_B_Q5_0, _B_Q5_1 = _nbytes(GGMLType.Q5_0), _nbytes(GGMLType.Q5_1)
_B_Q8_0, _B_IQ4_NL = _nbytes(GGMLType.Q8_0), _nbytes(GGMLType.IQ4_NL)
_B_Q2_K, _B_Q3_K = _nbytes(GGMLType.Q2_K), _nbytes(GGMLType.Q3_K)
_B_Q4_K, _B_Q5_K = _nbytes(GGMLType.Q4_K), _nbytes(GGMLType.Q5_K)
_B_Q6_K, _B_Q8_K = _nbytes(GGMLType.Q6_K), _nbytes(GGMLType.Q8_K)
_B_IQ4_XS = _nbytes(GGMLType.IQ4_XS)

# IQ4_NL / IQ4_XS non-linear 4-bit codebook (int8 values), as float32
_KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                          dtype=np.float32)


# ---------------------------------------------------------------- scalar helpers

@intrinsic
def _bits_to_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (no value conversion)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        i32 = ir.IntType(32)
        if v.type.width > 32:
            v = builder.trunc(v, i32)
        elif v.type.width < 32:
            v = builder.zext(v, i32)
        return builder.bitcast(v, ir.FloatType())

    return types.float32(bits), codegen


@njit(cache=True, inline="always")
def _u16(raw, o):
    """Little-endian uint16 at byte o, as int64."""
    return np.int64(raw[o]) | (np.int64(raw[o + 1]) << 8)


@njit(cache=True, inline="always")
def _u32(raw, o):
    """Little-endian uint32 at byte o, as int64."""
    return _u16(raw, o) | (_u16(raw, o + 2) << 16)


@intrinsic
def _f32_as_bits(typingctx, f):
    """Reinterpret a float32 as its uint32 bits."""
    if not isinstance(f, types.Float) or f.bitwidth != 32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(f), codegen


@njit(cache=True)
def _f32_to_half_bits(f):
    # float32 -> IEEE binary16 bits, round to nearest even, as numpy and F16C do
    b = np.int64(_f32_as_bits(np.float32(f)))
    sign = (b >> 16) & 0x8000
    e = (b >> 23) & 0xFF
    m = b & 0x7FFFFF
    if e == 0xFF:
        return sign | 0x7C00 | (0x200 if m else 0)
    ee = e - 112                             # rebias 127 -> 15
    if ee >= 31:
        return sign | 0x7C00
    if ee <= 0:                              # subnormal f16
        if ee < -10:
            return sign
        m |= 0x800000
        shift = 14 - ee
        h = m >> shift
        rem, mid = m & ((1 << shift) - 1), 1 << (shift - 1)
        if rem > mid or (rem == mid and (h & 1)):
            h += 1
        return sign | h
    h = sign | (ee << 10) | (m >> 13)
    rem = m & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (h & 1)):
        h += 1                               # may carry into the exponent: still correct
    return h


F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)   # f32[65536]


@njit(cache=True)
def _half_bits_to_f32(h):
    """IEEE binary16 bits (int64, low 16 bits) -> float32, exact; NaN payload kept like numpy."""
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    if exp == 0x1F:                      # inf / nan
        return _bits_to_f32(sign | 0x7F800000 | (man << 13))
    if exp != 0:                         # normal
        return _bits_to_f32(sign | ((exp + 112) << 23) | (man << 13))
    if man == 0:                         # +-0
        return _bits_to_f32(sign)
    e = 113                              # subnormal: renormalize
    while (man & 0x400) == 0:
        man <<= 1
        e -= 1
    return _bits_to_f32(sign | (e << 23) | ((man & 0x3FF) << 13))


@njit(cache=True, inline="always")
def _f16(raw, o):
    """float16 at byte o -> float32."""
    return _half_bits_to_f32(_u16(raw, o))


@njit(cache=True, inline="always")
def _scale_min_k4(raw, o, j):
    """Q4_K/Q5_K 6-bit (scale, min) of sub-block j (0..7) from the 12 scale bytes at o."""
    if j < 4:
        sc = np.int64(raw[o + j]) & 63
        m = np.int64(raw[o + j + 4]) & 63
    else:
        sc = (np.int64(raw[o + j + 4]) & 0xF) | ((np.int64(raw[o + j - 4]) >> 6) << 4)
        m = (np.int64(raw[o + j + 4]) >> 4) | ((np.int64(raw[o + j]) >> 6) << 4)
    return sc, m


# ---------------------------------------------------------------- float types (block = 1 element)

@njit(cache=True)
def _dequant_f32(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _bits_to_f32(_u32(raw, 4 * (first_block + i)))


@njit(cache=True)
def _dequant_f16(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _f16(raw, 2 * (first_block + i))


@njit(cache=True)
def _dequant_bf16(out, raw, first_block, n_blocks):
    for i in range(n_blocks):
        out[i] = _bits_to_f32(_u16(raw, 2 * (first_block + i)) << 16)


# ---------------------------------------------------------------- 32-element blocks
# nibble layout: element j < 16 is qs[j] & 0xF, element j + 16 is qs[j] >> 4

@njit(cache=True)
def _dequant_q4_0(out, raw, first_block, n_blocks):
    # block: f16 d | u8 qs[16];  y = d * (q - 8)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q4_0
        d = _f16(raw, o)
        y = b * 32
        for j in range(16):
            v = np.int64(raw[o + 2 + j])
            out[y + j] = d * np.float32((v & 0xF) - 8)
            out[y + j + 16] = d * np.float32((v >> 4) - 8)


@njit(cache=True)
def _dequant_q4_1(out, raw, first_block, n_blocks):
    # block: f16 d | f16 m | u8 qs[16];  y = d*q + m
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q4_1
        d = _f16(raw, o)
        m = _f16(raw, o + 2)
        y = b * 32
        for j in range(16):
            v = np.int64(raw[o + 4 + j])
            out[y + j] = d * np.float32(v & 0xF) + m
            out[y + j + 16] = d * np.float32(v >> 4) + m


@njit(cache=True)
def _dequant_q5_0(out, raw, first_block, n_blocks):
    # block: f16 d | u32 qh (bit j = 5th bit of element j) | u8 qs[16];  y = d * (q - 16)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q5_0
        d = _f16(raw, o)
        qh = _u32(raw, o + 2)
        y = b * 32
        for j in range(16):
            v = np.int64(raw[o + 6 + j])
            lo = (v & 0xF) | (((qh >> j) & 1) << 4)
            hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)
            out[y + j] = d * np.float32(lo - 16)
            out[y + j + 16] = d * np.float32(hi - 16)


@njit(cache=True)
def _dequant_q5_1(out, raw, first_block, n_blocks):
    # block: f16 d | f16 m | u32 qh | u8 qs[16];  y = d*q + m
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q5_1
        d = _f16(raw, o)
        m = _f16(raw, o + 2)
        qh = _u32(raw, o + 4)
        y = b * 32
        for j in range(16):
            v = np.int64(raw[o + 8 + j])
            lo = (v & 0xF) | (((qh >> j) & 1) << 4)
            hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)
            out[y + j] = d * np.float32(lo) + m
            out[y + j + 16] = d * np.float32(hi) + m


@njit(cache=True)
def _dequant_q8_0(out, raw, first_block, n_blocks):
    # block: f16 d | i8 qs[32];  y = q * d
    qs = raw.view(np.int8)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q8_0
        d = _f16(raw, o)
        y = b * 32
        for j in range(32):
            out[y + j] = np.float32(qs[o + 2 + j]) * d


@njit(cache=True)
def _dequant_iq4_nl(out, raw, first_block, n_blocks):
    # block: f16 d | u8 qs[16] (4-bit codebook indices);  y = d * kvalues[q]
    kv = _KVALUES_IQ4NL
    for b in range(n_blocks):
        o = (first_block + b) * _B_IQ4_NL
        d = _f16(raw, o)
        y = b * 32
        for j in range(16):
            v = np.int64(raw[o + 2 + j])
            out[y + j] = d * kv[v & 0xF]
            out[y + j + 16] = d * kv[v >> 4]


# ---------------------------------------------------------------- 256-element super-blocks (K-quants)

@njit(cache=True)
def _dequant_q2_k(out, raw, first_block, n_blocks):
    # block: u8 scales[16] (lo nibble scale, hi nibble min) | u8 qs[64] (2-bit) | f16 d | f16 dmin
    # element j = h*128 + s*32 + l: q = (qs[h*32 + l] >> 2s) & 3, group g = j // 16
    # y = (d*sc[g])*q - (dmin*m[g])
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q2_K
        d = _f16(raw, o + 80)
        dmin = _f16(raw, o + 82)
        y = b * QK_K
        for g in range(16):
            sc = np.int64(raw[o + g])
            dl = d * np.float32(sc & 0xF)
            ml = dmin * np.float32(sc >> 4)
            h = g >> 3
            shift = 2 * ((g >> 1) & 3)
            base = o + 16 + h * 32 + (g & 1) * 16
            for l in range(16):
                q = (np.int64(raw[base + l]) >> shift) & 3
                out[y + g * 16 + l] = dl * np.float32(q) - ml


@njit(cache=True)
def _dequant_q3_k(out, raw, first_block, n_blocks):
    # block: u8 hmask[32] | u8 qs[64] (low 2 bits) | u8 scales[12] (16 x 6-bit) | f16 d
    # element j = h*128 + s*32 + l: low = (qs[h*32 + l] >> 2s) & 3, high = (hmask[l] >> (j//32)) & 1
    # q = low - (high ? 0 : 4);  y = (d * (sc[j//16] - 32)) * q
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q3_K
        d = _f16(raw, o + 108)
        so = o + 96
        y = b * QK_K
        for g in range(16):
            if g < 8:
                lo = np.int64(raw[so + g]) & 0xF
            else:
                lo = np.int64(raw[so + g - 8]) >> 4
            hi = (np.int64(raw[so + 8 + (g & 3)]) >> (2 * (g >> 2))) & 3
            dl = d * np.float32((lo | (hi << 4)) - 32)
            h = g >> 3
            s = (g >> 1) & 3
            l0 = (g & 1) * 16
            for l in range(l0, l0 + 16):
                low = (np.int64(raw[o + 32 + h * 32 + l]) >> (2 * s)) & 3
                high = (np.int64(raw[o + l]) >> (h * 4 + s)) & 1
                out[y + g * 16 + l - l0] = dl * np.float32(low - 4 + 4 * high)


@njit(cache=True)
def _dequant_q4_k(out, raw, first_block, n_blocks):
    # block: f16 d | f16 dmin | u8 scales[12] (8 x 6-bit scale, min) | u8 qs[128]
    # sub-block s (32 elems): q = (qs[(s//2)*32 + l] >> 4*(s%2)) & 0xF;  y = (d*sc)*q - (dmin*m)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q4_K
        d = _f16(raw, o)
        dmin = _f16(raw, o + 2)
        y = b * QK_K
        for s in range(8):
            sc, m = _scale_min_k4(raw, o + 4, s)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(m)
            base = o + 16 + (s >> 1) * 32
            shift = 4 * (s & 1)
            for l in range(32):
                q = (np.int64(raw[base + l]) >> shift) & 0xF
                out[y + s * 32 + l] = dl * np.float32(q) - ml


@njit(cache=True)
def _dequant_q5_k(out, raw, first_block, n_blocks):
    # block: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
    # sub-block s: q = Q4_K nibble | ((qh[l] >> s) & 1) << 4;  y = (d*sc)*q - (dmin*m)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q5_K
        d = _f16(raw, o)
        dmin = _f16(raw, o + 2)
        y = b * QK_K
        for s in range(8):
            sc, m = _scale_min_k4(raw, o + 4, s)
            dl = d * np.float32(sc)
            ml = dmin * np.float32(m)
            base = o + 48 + (s >> 1) * 32
            shift = 4 * (s & 1)
            for l in range(32):
                q = ((np.int64(raw[base + l]) >> shift) & 0xF) | (((np.int64(raw[o + 16 + l]) >> s) & 1) << 4)
                out[y + s * 32 + l] = dl * np.float32(q) - ml


@njit(cache=True)
def _dequant_q6_k(out, raw, first_block, n_blocks):
    # block: u8 ql[128] (low 4 bits) | u8 qh[64] (high 2 bits) | i8 scales[16] | f16 d
    # element j = h*128 + r: low = ql[h*64 + r%64] >> 4*(r//64), high = (qh[h*32 + r%32] >> 2*(r//32)) & 3
    # y = (d * sc[j//16]) * (low | high << 4) - 32)
    sc8 = raw.view(np.int8)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q6_K
        d = _f16(raw, o + 208)
        y = b * QK_K
        for g in range(16):
            dl = d * np.float32(sc8[o + 192 + g])
            h = g >> 3
            for r in range((g & 7) * 16, (g & 7) * 16 + 16):
                low = (np.int64(raw[o + h * 64 + (r & 63)]) >> (4 * (r >> 6))) & 0xF
                high = (np.int64(raw[o + 128 + h * 32 + (r & 31)]) >> (2 * (r >> 5))) & 3
                out[y + h * 128 + r] = dl * np.float32((low | (high << 4)) - 32)


@njit(cache=True)
def _dequant_q8_k(out, raw, first_block, n_blocks):
    # block: f32 d | i8 qs[256] | i16 bsums[16] (unused here);  y = d * q
    qs = raw.view(np.int8)
    for b in range(n_blocks):
        o = (first_block + b) * _B_Q8_K
        d = _bits_to_f32(_u32(raw, o))
        y = b * QK_K
        for j in range(QK_K):
            out[y + j] = d * np.float32(qs[o + 4 + j])


@njit(cache=True)
def _dequant_iq4_xs(out, raw, first_block, n_blocks):
    # block: f16 d | u16 scales_h (2 bits per sub-block) | u8 scales_l[4] (4 bits) | u8 qs[128]
    # sub-block s (32 elems): ls = lo4 | hi2 << 4;  y = (d * (ls - 32)) * kvalues[q]
    kv = _KVALUES_IQ4NL
    for b in range(n_blocks):
        o = (first_block + b) * _B_IQ4_XS
        d = _f16(raw, o)
        sh = _u16(raw, o + 2)
        y = b * QK_K
        for s in range(8):
            ls = ((np.int64(raw[o + 4 + (s >> 1)]) >> (4 * (s & 1))) & 0xF) | (((sh >> (2 * s)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            base = o + 8 + s * 16
            for j in range(16):
                v = np.int64(raw[base + j])
                out[y + s * 32 + j] = dl * kv[v & 0xF]
                out[y + s * 32 + j + 16] = dl * kv[v >> 4]


# ---------------------------------------------------------------- public, validating entry point

def dequantize(ggml_type, raw: np.ndarray, n_elements: int | None = None, first_block: int = 0,
               n_blocks: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Decode blocks [first_block, first_block + n_blocks) of a packed tensor to float32.

    raw: uint8 array holding whole blocks (any shape; flattened). n_elements, when given, is the
    element count `raw` must hold exactly. out: optional float32 C-contiguous destination of
    n_blocks * block_elems elements. Returns float32[n_blocks * block_elems].
    Raises UnsupportedType for a type without kernels, DequantError for bad sizes or ranges.
    """
    from ramforge.kernels.registry import kernels_for  # the registry imports this module

    k = kernels_for(ggml_type)
    t = k.ggml_type
    be, bb = GGML_BLOCK[t]
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
        got = raw.dtype if isinstance(raw, np.ndarray) else type(raw).__name__
        raise DequantError(f"{t.name} raw data must be a uint8 numpy array, got {got}")
    raw = np.ascontiguousarray(raw).reshape(-1)
    total, rem = divmod(raw.size, bb)
    if rem:
        raise DequantError(f"{t.name} raw data of {raw.size:,} B is not a whole number of blocks of {bb} B "
                           f"({total:,} blocks + {rem} B)")
    if n_elements is not None:
        if n_elements < 0 or n_elements % be:
            raise DequantError(f"{t.name} n_elements = {n_elements:,} is not a whole number of blocks "
                               f"of {be} elements")
        if n_elements // be != total:
            raise DequantError(f"{t.name} n_elements = {n_elements:,} needs {n_elements // be * bb:,} B "
                               f"but raw data has {raw.size:,} B")
    first_block = int(first_block)
    n_blocks = total - first_block if n_blocks is None else int(n_blocks)
    if first_block < 0 or n_blocks < 0 or first_block + n_blocks > total:
        raise DequantError(f"{t.name} block span [{first_block:,}, {first_block + n_blocks:,}) is out of "
                           f"range for {total:,} blocks")
    n_out = n_blocks * be
    if out is None:
        out = np.empty(n_out, dtype=np.float32)
    elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.ndim != 1
          or not out.flags.c_contiguous or not out.flags.writeable or out.size != n_out):
        desc = (f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__)
        raise DequantError(f"{t.name} out must be a writable contiguous float32[{n_out:,}], got {desc}")
    if n_blocks:
        k.dequant(out, raw, first_block, n_blocks)
    return out


# ---------------------------------------------------------------- dispatch by type id, for kernels

@njit(cache=True)
def _dequant_any(tid, out, raw, first_block, n_blocks):
    """The kernel of ggml type id `tid` (kernels call this; Python uses the registry)."""
    if tid == 0:
        _dequant_f32(out, raw, first_block, n_blocks)
    elif tid == 1:
        _dequant_f16(out, raw, first_block, n_blocks)
    elif tid == 30:
        _dequant_bf16(out, raw, first_block, n_blocks)
    elif tid == 2:
        _dequant_q4_0(out, raw, first_block, n_blocks)
    elif tid == 3:
        _dequant_q4_1(out, raw, first_block, n_blocks)
    elif tid == 6:
        _dequant_q5_0(out, raw, first_block, n_blocks)
    elif tid == 7:
        _dequant_q5_1(out, raw, first_block, n_blocks)
    elif tid == 8:
        _dequant_q8_0(out, raw, first_block, n_blocks)
    elif tid == 20:
        _dequant_iq4_nl(out, raw, first_block, n_blocks)
    elif tid == 10:
        _dequant_q2_k(out, raw, first_block, n_blocks)
    elif tid == 11:
        _dequant_q3_k(out, raw, first_block, n_blocks)
    elif tid == 12:
        _dequant_q4_k(out, raw, first_block, n_blocks)
    elif tid == 13:
        _dequant_q5_k(out, raw, first_block, n_blocks)
    elif tid == 14:
        _dequant_q6_k(out, raw, first_block, n_blocks)
    elif tid == 15:
        _dequant_q8_k(out, raw, first_block, n_blocks)
    elif tid == 23:
        _dequant_iq4_xs(out, raw, first_block, n_blocks)
