"""The K-quants' sub-block scales decoded in registers: LLVM IR twins of blocks.py's scale decoders
(`_scales_fn`), for the packed-row dots (codegen._raw_source), which then read no scratch.

`block_scales(builder, t, blk)` gives a super-block's (isc, imn): <n x i32> integer sub-block
scales and mins (mins zero where the type has none), the same integers blocks.py writes to isc /
imn; `blk(off, ty)` loads a `ty` at byte `off` of the block. Exactness: integer ops only.
"""
from __future__ import annotations

from llvmlite import ir

from ramforge.gguf.constants import GGMLType

from .blocks import LAYOUTS
from .llvmir import I8, I16, I32

T = GGMLType


def _v(ty, vals):
    return ir.Constant(ir.VectorType(ty, len(vals)), list(vals))


def _bytes(builder, blk, off, n):
    """<n x i32>: n bytes at off, zero-extended."""
    return builder.zext(blk(off, ir.VectorType(I8, n)), ir.VectorType(I32, n))


def _pick(builder, v, idx):
    return builder.shuffle_vector(v, v, _v(I32, idx))


def _k4(builder, blk, so):
    """Q4_K / Q5_K: 12 bytes q -> 8 six-bit scales and mins (blocks._k4_scale_min): j < 4: q[j] & 63,
    q[j+4] & 63; j >= 4: (q[j+4] & 15) | (q[j-4] >> 6) << 4, (q[j+4] >> 4) | (q[j] >> 6) << 4."""
    q = _bytes(builder, blk, so, 12)
    lo = [0, 0, 0, 0, 4, 4, 4, 4]
    sc = builder.and_(_pick(builder, q, [0, 1, 2, 3, 8, 9, 10, 11]), _v(I32, [63] * 4 + [15] * 4))
    mn = builder.and_(builder.lshr(_pick(builder, q, [4, 5, 6, 7, 8, 9, 10, 11]), _v(I32, lo)),
                      _v(I32, [63] * 4 + [15] * 4))
    hi_mask = _v(I32, [0] * 4 + [0x30] * 4)            # (q >> 6) << 4 = (q >> 2) & 0x30, upper half only
    sc = builder.or_(sc, builder.and_(builder.lshr(_pick(builder, q, [0, 1, 2, 3, 0, 1, 2, 3]), _v(I32, [2] * 8)),
                                      hi_mask))
    mn = builder.or_(mn, builder.and_(builder.lshr(_pick(builder, q, [4, 5, 6, 7, 4, 5, 6, 7]), _v(I32, [2] * 8)),
                                      hi_mask))
    return sc, mn


def _q6_k(builder, blk, so):
    """Q6_K: 16 int8 scales."""
    return builder.sext(blk(so, ir.VectorType(I8, 16)), ir.VectorType(I32, 16)), _v(I32, [0] * 16)


def _q2_k(builder, blk, so):
    """Q2_K: 16 bytes, scale the low nibble, min the high."""
    q = _bytes(builder, blk, so, 16)
    return builder.and_(q, _v(I32, [15] * 16)), builder.lshr(q, _v(I32, [4] * 16))


def _q3_k(builder, blk, so):
    """Q3_K: 16 six-bit scales less 32 (blocks._q3_k_scale): low 4 bits q[g] & 15 (g < 8) or q[g-8] >> 4,
    high 2 bits (q[8 + g % 4] >> 2 * (g // 4)) & 3."""
    q = _bytes(builder, blk, so, 12)
    lo = builder.and_(builder.lshr(_pick(builder, q, list(range(8)) * 2), _v(I32, [0] * 8 + [4] * 8)),
                      _v(I32, [15] * 16))
    hi = builder.and_(builder.lshr(_pick(builder, q, [8, 9, 10, 11] * 4), _v(I32, [2 * (g // 4) for g in range(16)])),
                      _v(I32, [3] * 16))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, _v(I32, [4] * 16))), _v(I32, [32] * 16))
    return sc, _v(I32, [0] * 16)


def _iq4_xs(builder, blk, so):
    """IQ4_XS: u16 scales_h then 4 bytes scales_l; scale s = (4 bits of scales_l | 2 of scales_h << 4) - 32."""
    h = builder.zext(blk(so, I16), I32)
    hv = builder.insert_element(ir.Constant(ir.VectorType(I32, 8), ir.Undefined), h, ir.Constant(I32, 0))
    hv = _pick(builder, hv, [0] * 8)
    q = _bytes(builder, blk, so + 2, 4)
    lo = builder.and_(builder.lshr(_pick(builder, q, [0, 0, 1, 1, 2, 2, 3, 3]), _v(I32, [0, 4] * 4)),
                      _v(I32, [15] * 8))
    hi = builder.and_(builder.lshr(hv, _v(I32, [2 * s for s in range(8)])), _v(I32, [3] * 8))
    sc = builder.sub(builder.or_(lo, builder.shl(hi, _v(I32, [4] * 8))), _v(I32, [32] * 8))
    return sc, _v(I32, [0] * 8)


def _ones(n):
    return lambda builder, blk, so: (_v(I32, [1] * n), _v(I32, [0] * n))


_DECODERS = {T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _k4, T.Q5_K: _k4, T.Q6_K: _q6_k, T.IQ4_XS: _iq4_xs,
             T.Q8_K: _ones(8), T.TQ2_0: _ones(16)}


def has_block_scales(t: GGMLType) -> bool:
    """Whether type t's scales decode in registers (block_scales)."""
    return t in _DECODERS


def block_scales(builder, t: GGMLType, blk):
    """(isc, imn) <n x i32> of one super-block of type t, n its sub-blocks (see the module doc)."""
    return _DECODERS[t](builder, blk, LAYOUTS[t].scales)
