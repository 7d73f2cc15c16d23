"""The codebook quant types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: block layouts, dequantization
kernels and row unpackers for the integer dots, in one copy.

A super-block of 256 weights is 8 chunks of 32; each chunk is 4 groups of 8 (IQ2: one u64 grid
entry of 8 magnitudes) or 8 groups of 4 (IQ3: one u32 entry of 4), each magnitude signed by one bit
(IQ2_XXS / IQ2_XS / IQ3_XXS: 7 stored bits, the 8th their parity, kernels.grids.KSIGNS_IQ2XS;
IQ2_S / IQ3_S: 8 stored bits). `_chunk_<type>` decodes chunk c to 32 signed int8 values
(grid magnitude * sign, |v| <= 62), `_ls_<type>` reads sub-block s's 4-bit scale ls (16-element
sub-blocks for IQ2_XS / IQ2_S, else 32); `raw_source` builds the same chunk in registers:

    dequantize (gguf-py's float ops):  w = db * v,  db = (d * (0.5 + ls)) * 0.25   (IQ2_*)
                                                    db = (d * (0.5 + ls)) * 0.5    (IQ3_XXS)
                                                    db = d * (1 + 2*ls)            (IQ3_S)
    integer dots (ggml's vec_dot):     isc = 2*ls + 1, wd = d, and the result times 2^-post
                                       (IQ2_*: 1/8, IQ3_XXS: 1/4, IQ3_S: 1), which is the same
                                       weight exactly (a power of two scales without rounding).

Signs: in vector IR (m = 0xFF where the bit is set, (g ^ m) - m), or in the plain loops 8 bytes at
a time in a u64: (g ^ m) + (m & 0x01..01) (no carry between bytes: no magnitude is 0).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ramforge.gguf.constants import GGML_BLOCK, QK_K, GGMLType

from .grids import IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS
from .llvmir import I8, I32, I64, dtypes_are, ptr
from .naming import made_for
from .rowdot import RowSource
from .scalars import _f16_at, _f16_at_int, _store_u64

T = GGMLType
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S = T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S
IQ_TYPES = (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)


class IQLayout(NamedTuple):
    """Byte offsets in one block (-1: none; d, the f16 scale, is at 0), the sub-block size and
    `post`: the integer dot's result is times 2^-post (variants.Spec)."""

    nbytes: int
    qs: int             # grid indices (IQ2_XXS / IQ2_XS: u16 with signs and scales packed in)
    qh: int = -1        # high index bits, a byte per chunk
    signs: int = -1     # sign bytes (IQ2_S, IQ3_S); IQ3_XXS: u32 scale-and-signs per chunk
    scales: int = -1    # 4-bit scales, two per byte
    sub: int = 32
    post: int = 0


LAYOUTS: dict[GGMLType, IQLayout] = {
    IQ2_XXS: IQLayout(66, qs=2, post=3),
    IQ2_XS: IQLayout(74, qs=2, scales=66, sub=16, post=3),
    IQ2_S: IQLayout(82, qs=2, signs=2 + QK_K // 8, qh=66, scales=74, sub=16, post=3),
    IQ3_XXS: IQLayout(98, qs=2, signs=66, post=2),
    IQ3_S: IQLayout(110, qs=2, qh=66, signs=74, scales=106),
}
for _t, _l in LAYOUTS.items():
    assert _l.nbytes == GGML_BLOCK[_t][1], _t

# sign masks: byte j of SIGN_MASK[s] is 0xFF where bit j of s is set; KSIGN_MASK by the 7 stored bits
SIGN_MASK = np.array([sum(0xFF << (8 * j) for j in range(8) if s >> j & 1) for s in range(256)], dtype=np.uint64)
KSIGN_MASK = SIGN_MASK[KSIGNS_IQ2XS]
ONES = np.uint64(0x0101010101010101)
G2XXS, G2XS, G2S = IQ2XXS_GRID, IQ2XS_GRID, IQ2S_GRID
G3XXS, G3S = IQ3XXS_GRID.astype(np.uint64), IQ3S_GRID.astype(np.uint64)      # (shifted by 32)
B2XXS, B2XS, B2S, B3XXS, B3S = (LAYOUTS[t] for t in IQ_TYPES)


def _make_load(ty):
    @intrinsic
    def _load(typingctx, raw, o):
        """The little-endian unsigned integer at byte o of a uint8 array, as int64 (no index checks)."""
        def codegen(context, builder, sig, args):
            return builder.zext(builder.load(ptr(context, builder, sig.args[0], args[0], args[1], ty), align=1), I64)
        if not dtypes_are((raw,), (types.uint8,)):
            return None
        return types.int64(raw, o), codegen
    return _load


_b8, _b16, _b32 = _make_load(I8), _make_load(ir.IntType(16)), _make_load(I32)


@intrinsic
def _tab(typingctx, table, i):
    """table[i] of a 1-D u64 / i64 table, i known in range (no index checks)."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]]))
    if not (isinstance(table, types.Array) and table.ndim == 1 and table.dtype in (types.uint64, types.int64)):
        return None
    return table.dtype(table, i), codegen


@njit(cache=True, inline="always")
def _put(wq, y, g, m):
    # 8 magnitudes g (u64), negated where the mask m has 0xFF, to wq[y:y+8]
    _store_u64(wq, y, (g ^ m) + (m & ONES))


def _parity7(builder, sb):
    """<4 x i8> of 7 sign bits each -> with bit 7 = their parity (KSIGNS_IQ2XS)."""
    v4 = sb.type
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v4, [v4]), "llvm.ctpop.v4i8")
    par = builder.and_(builder.call(ctpop, [sb]), ir.Constant(v4, [1] * 4))
    return builder.or_(sb, builder.shl(par, ir.Constant(v4, [7] * 4)))


def _sign_bytes(builder, s, ksigns):
    """The 4 sign bytes <4 x i8> of the i32 s: its bytes, or (ksigns) its 4 x 7 bits (bits 0-27) with
    their parities."""
    v4 = ir.VectorType(I8, 4)
    if not ksigns:
        return builder.bitcast(s, v4)
    b = [builder.and_(builder.shl(s, ir.Constant(I32, k)), ir.Constant(I32, 0x7F << (8 * k))) for k in range(4)]
    return _parity7(builder, builder.bitcast(builder.or_(builder.or_(b[0], b[1]), builder.or_(b[2], b[3])), v4))


def _signed32(builder, g, sb):
    """<32 x i8> magnitudes g, negated where bit j of sign byte j // 8 of sb (<4 x i8>) is set:
    (g ^ m) - m with m = 0xFF there (0 elsewhere)."""
    v32, w32 = ir.VectorType(I8, 32), ir.VectorType(I32, 32)
    sb = builder.shuffle_vector(sb, sb, ir.Constant(w32, [j // 8 for j in range(32)]))
    bit = ir.Constant(v32, [1 << (j % 8) for j in range(32)])
    m = builder.sext(builder.icmp_unsigned("!=", builder.and_(sb, bit), ir.Constant(v32, [0] * 32)), v32)
    return builder.sub(builder.xor(g, m), m)


def _make_put(n, ksigns):
    @intrinsic
    def _vput(typingctx, wq, y, g, s):
        """wq[y:y+32] = the n entries of the UniTuple g (u64: 8 magnitudes each if n = 4, u32
        entries of 4 if n = 8), signed by the sign bytes of s (an int64; see _sign_bytes), in one
        32-byte store."""
        def codegen(context, builder, sig, args):
            et = I64 if n == 4 else I32
            v = ir.Constant(ir.VectorType(et, n), ir.Undefined)
            for i in range(n):
                e = builder.extract_value(args[2], i)
                v = builder.insert_element(v, e if n == 4 else builder.trunc(e, I32), ir.Constant(I32, i))
            sb = _sign_bytes(builder, builder.trunc(args[3], I32), ksigns)
            r = _signed32(builder, builder.bitcast(v, ir.VectorType(I8, 32)), sb)
            builder.store(r, ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(I8, 32)), align=1)
            return context.get_dummy_value()
        if (not dtypes_are((wq,), (types.int8,)) or not isinstance(g, types.UniTuple) or g.count != n
                or g.dtype != types.uint64):
            return None
        return types.void(wq, y, g, s), codegen
    return _vput


_vput4, _vput4k, _vput8, _vput8k = _make_put(4, False), _make_put(4, True), _make_put(8, False), _make_put(8, True)


@njit(cache=True, inline="always")
def _ls_iq2_xxs(raw, p, c):
    # the 4-bit scale: top of the chunk's second u32
    return _b32(raw, p + B2XXS.qs + 8 * c + 4) >> 28


@njit(cache=True, inline="always")
def _ls_iq3_xxs(raw, p, c):
    return _b32(raw, p + B3XXS.signs + 4 * c) >> 28


@njit(cache=True, inline="always")
def _ls_iq3_s(raw, p, c):
    return (_b8(raw, p + B3S.scales + c // 2) >> (4 * (c & 1))) & 15


@njit(cache=True, inline="always")
def _ls_iq2_xs(raw, p, s):
    # 16-element sub-block s: a scale byte per chunk, low nibble first
    return (_b8(raw, p + B2XS.scales + s // 2) >> (4 * (s & 1))) & 15


@njit(cache=True, inline="always")
def _ls_iq2_s(raw, p, s):
    return (_b8(raw, p + B2S.scales + s // 2) >> (4 * (s & 1))) & 15


@njit(cache=True, inline="always")
def _chunk_iq2_xxs(vec, raw, p, c, wq, y):
    # u16 qs[32]: per chunk 4 grid bytes, then a u32 of 4 x 7 sign bits and the 4-bit scale
    q = p + B2XXS.qs + 8 * c
    a = _b32(raw, q + 4)
    if vec:
        g = (_tab(G2XXS, _b8(raw, q)), _tab(G2XXS, _b8(raw, q + 1)), _tab(G2XXS, _b8(raw, q + 2)),
             _tab(G2XXS, _b8(raw, q + 3)))
        _vput4k(wq, y, g, a)
    else:
        for l in range(4):
            _put(wq, y + 8 * l, _tab(G2XXS, _b8(raw, q + l)), _tab(KSIGN_MASK, (a >> (7 * l)) & 127))


@njit(cache=True, inline="always")
def _chunk_iq2_xs(vec, raw, p, c, wq, y):
    # u16 qs[32]: 9-bit grid index | 7 sign bits << 9; a scale byte per chunk (low nibble first)
    q = p + B2XS.qs + 8 * c
    if vec:
        v0, v1, v2, v3 = _b16(raw, q), _b16(raw, q + 2), _b16(raw, q + 4), _b16(raw, q + 6)
        g = (_tab(G2XS, v0 & 511), _tab(G2XS, v1 & 511), _tab(G2XS, v2 & 511), _tab(G2XS, v3 & 511))
        _vput4k(wq, y, g, (v0 >> 9) | ((v1 >> 9) << 7) | ((v2 >> 9) << 14) | ((v3 >> 9) << 21))
    else:
        for l in range(4):
            v = _b16(raw, q + 2 * l)
            _put(wq, y + 8 * l, _tab(G2XS, v & 511), _tab(KSIGN_MASK, v >> 9))


@njit(cache=True, inline="always")
def _chunk_iq2_s(vec, raw, p, c, wq, y):
    # 8 low index bits per group, 2 high bits per group in qh[c], a sign byte per group
    q = p + B2S.qs + 4 * c
    h = _b8(raw, p + B2S.qh + c)
    if vec:
        g = (_tab(G2S, _b8(raw, q) | ((h << 8) & 0x300)), _tab(G2S, _b8(raw, q + 1) | ((h << 6) & 0x300)),
             _tab(G2S, _b8(raw, q + 2) | ((h << 4) & 0x300)), _tab(G2S, _b8(raw, q + 3) | ((h << 2) & 0x300)))
        _vput4(wq, y, g, _b32(raw, p + B2S.signs + 4 * c))
    else:
        for l in range(4):
            i = _b8(raw, q + l) | ((h << (8 - 2 * l)) & 0x300)
            _put(wq, y + 8 * l, _tab(G2S, i), _tab(SIGN_MASK, _b8(raw, p + B2S.signs + 4 * c + l)))


@njit(cache=True, inline="always")
def _chunk_iq3_xxs(vec, raw, p, c, wq, y):
    # 8 grid bytes per chunk (u32 entries of 4); a u32 per chunk of 4 x 7 sign bits and the scale
    q = p + B3XXS.qs + 8 * c
    a = _b32(raw, p + B3XXS.signs + 4 * c)
    if vec:
        g = (_tab(G3XXS, _b8(raw, q)), _tab(G3XXS, _b8(raw, q + 1)), _tab(G3XXS, _b8(raw, q + 2)),
             _tab(G3XXS, _b8(raw, q + 3)), _tab(G3XXS, _b8(raw, q + 4)), _tab(G3XXS, _b8(raw, q + 5)),
             _tab(G3XXS, _b8(raw, q + 6)), _tab(G3XXS, _b8(raw, q + 7)))
        _vput8k(wq, y, g, a)
    else:
        for l in range(4):
            g2 = _tab(G3XXS, _b8(raw, q + 2 * l)) | (_tab(G3XXS, _b8(raw, q + 2 * l + 1)) << np.uint64(32))
            _put(wq, y + 8 * l, g2, _tab(KSIGN_MASK, (a >> (7 * l)) & 127))


@njit(cache=True, inline="always")
def _chunk_iq3_s(vec, raw, p, c, wq, y):
    # 8 low index bits per group of 4, the 9th bit k of qh[c] for group k, a sign byte per 8
    q = p + B3S.qs + 8 * c
    h = _b8(raw, p + B3S.qh + c)
    if vec:
        g = (_tab(G3S, _b8(raw, q) | ((h << 8) & 256)), _tab(G3S, _b8(raw, q + 1) | ((h << 7) & 256)),
             _tab(G3S, _b8(raw, q + 2) | ((h << 6) & 256)), _tab(G3S, _b8(raw, q + 3) | ((h << 5) & 256)),
             _tab(G3S, _b8(raw, q + 4) | ((h << 4) & 256)), _tab(G3S, _b8(raw, q + 5) | ((h << 3) & 256)),
             _tab(G3S, _b8(raw, q + 6) | ((h << 2) & 256)), _tab(G3S, _b8(raw, q + 7) | ((h << 1) & 256)))
        _vput8(wq, y, g, _b32(raw, p + B3S.signs + 4 * c))
    else:
        for l in range(4):
            i0 = _b8(raw, q + 2 * l) | (((h >> (2 * l)) & 1) << 8)
            i1 = _b8(raw, q + 2 * l + 1) | (((h >> (2 * l + 1)) & 1) << 8)
            _put(wq, y + 8 * l, _tab(G3S, i0) | (_tab(G3S, i1) << np.uint64(32)),
                 _tab(SIGN_MASK, _b8(raw, p + B3S.signs + 4 * c + l)))


_CHUNK = {IQ2_XXS: _chunk_iq2_xxs, IQ2_XS: _chunk_iq2_xs, IQ2_S: _chunk_iq2_s, IQ3_XXS: _chunk_iq3_xxs,
          IQ3_S: _chunk_iq3_s}
# the 4-bit scale of sub-block s (of 8 or 16) of the super-block at p
_LS = {IQ2_XXS: _ls_iq2_xxs, IQ2_XS: _ls_iq2_xs, IQ2_S: _ls_iq2_s, IQ3_XXS: _ls_iq3_xxs, IQ3_S: _ls_iq3_s}


# ---------------------------------------------------------------- dequantization

def _dequant_iq(t):
    """The dequant kernel of codebook type t (decode.py's form): w = db * v, db per sub-block in
    gguf-py's float ops (module docstring)."""
    L, chunk, ls_of, kind = LAYOUTS[t], _CHUNK[t], _LS[t], (0 if t == IQ3_S else 1 if t == IQ3_XXS else 2)
    per = 32 // L.sub                      # sub-blocks per chunk

    @njit(cache=True)
    def dequant(out, raw, first_block, n_blocks):
        v = np.empty(32, dtype=np.int8)
        for b in range(n_blocks):
            p = (first_block + b) * L.nbytes
            d = _f16_at_int(raw, p)
            for c in range(QK_K // 32):
                chunk(False, raw, p, c, v, 0)
                for h in range(per):
                    ls = np.float32(ls_of(raw, p, c * per + h))
                    if kind == 0:
                        db = d * (np.float32(1.0) + np.float32(2.0) * ls)
                    elif kind == 1:
                        db = (d * (np.float32(0.5) + ls)) * np.float32(0.5)
                    else:
                        db = (d * (np.float32(0.5) + ls)) * np.float32(0.25)
                    for j in range(h * L.sub, (h + 1) * L.sub):
                        out[b * QK_K + 32 * c + j] = db * np.float32(v[j])
    return made_for(dequant, t)


_dequant_iq2_xxs, _dequant_iq2_xs, _dequant_iq2_s = _dequant_iq(IQ2_XXS), _dequant_iq(IQ2_XS), _dequant_iq(IQ2_S)
_dequant_iq3_xxs, _dequant_iq3_s = _dequant_iq(IQ3_XXS), _dequant_iq(IQ3_S)
DEQUANT = dict(zip(IQ_TYPES, (_dequant_iq2_xxs, _dequant_iq2_xs, _dequant_iq2_s, _dequant_iq3_xxs, _dequant_iq3_s)))


# ---------------------------------------------------------------- scales and row unpackers

def _scales_iq(t):
    """blocks._scales_fn's form for codebook type t: super-block b at byte p -> wd[b] = d (f16),
    wm[b] = 0, isc = 2*ls + 1 and imn = 0 for its sub-blocks."""
    L, ls_of = LAYOUTS[t], _LS[t]
    n = QK_K // L.sub

    @njit(cache=True, inline="always")
    def scales(raw, p, b, isc, imn, wd, wm):
        wd[b] = _f16_at(raw, p)
        wm[b] = 0
        for s in range(n):
            isc[b * n + s] = 2 * ls_of(raw, p, s) + 1
            imn[b * n + s] = 0
    return made_for(scales, t)


_scales_iq2_xxs, _scales_iq2_xs, _scales_iq2_s = _scales_iq(IQ2_XXS), _scales_iq(IQ2_XS), _scales_iq(IQ2_S)
_scales_iq3_xxs, _scales_iq3_s = _scales_iq(IQ3_XXS), _scales_iq(IQ3_S)
_SCALES = dict(zip(IQ_TYPES, (_scales_iq2_xxs, _scales_iq2_xs, _scales_iq2_s, _scales_iq3_xxs, _scales_iq3_s)))


def _unpack_iq(t):
    """The row unpacker of codebook type t: wq = the signed values, scales as _scales_iq. `vec`: a
    chunk's 32 bytes built in one vector (_vput4 / _vput8), else 8 at a time in u64s."""
    L, chunk, scales = LAYOUTS[t], _CHUNK[t], _SCALES[t]

    @njit(cache=True)
    def unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
        for b in range(n_sb):
            p = o + b * L.nbytes
            scales(raw, p, b, isc, imn, wd, wm)
            for c in range(QK_K // 32):
                chunk(vec, raw, p, c, wq, b * QK_K + 32 * c)
    return made_for(unpack, t)


_unpack_iq2_xxs, _unpack_iq2_xs, _unpack_iq2_s = _unpack_iq(IQ2_XXS), _unpack_iq(IQ2_XS), _unpack_iq(IQ2_S)
_unpack_iq3_xxs, _unpack_iq3_s = _unpack_iq(IQ3_XXS), _unpack_iq(IQ3_S)
UNPACK = dict(zip(IQ_TYPES, (_unpack_iq2_xxs, _unpack_iq2_xs, _unpack_iq2_s, _unpack_iq3_xxs, _unpack_iq3_s)))


# ---------------------------------------------------------------- packed rows, in registers

def _ir_table(builder, name, table):
    """The numpy table as an internal LLVM constant of this module (made once per module)."""
    mod = builder.module
    gv = mod.globals.get(name)
    if gv is None:
        et = ir.IntType(table.dtype.itemsize * 8)
        ty = ir.ArrayType(et, len(table))
        gv = ir.GlobalVariable(mod, ty, name=name)
        gv.initializer = ir.Constant(ty, [int(v) for v in table])
        gv.global_constant = True
        gv.linkage = "internal"
    return gv


def raw_source(builder, t, rp, p):
    """The rowdot.RowSource over a packed row at rp (i8*) of codebook type t: chunk c of
    super-block b built in registers as _chunk_<t> builds it in memory (the same grid entries and
    signs); the float scale from the row's scratch p["wd"] (the kernel unpacks the scales per row,
    blocks._row_scales)."""
    L = LAYOUTS[t]
    grid, ksigns, n = {IQ2_XXS: (G2XXS, True, 4), IQ2_XS: (G2XS, True, 4), IQ2_S: (G2S, False, 4),
                       IQ3_XXS: (IQ3XXS_GRID, True, 8), IQ3_S: (IQ3S_GRID, False, 8)}[t]
    gv = _ir_table(builder, f"ramforge_{t.name.lower()}_grid", grid)
    et = gv.type.pointee.element
    i16 = ir.IntType(16)

    def c32(v):
        return ir.Constant(I32, v)

    def at(b, off, ty):                        # the little-endian ty at byte off of super-block b, as i32
        q = builder.gep(rp, [builder.add(builder.mul(b, ir.Constant(I64, L.nbytes)), ir.Constant(I64, off))])
        v = builder.load(builder.bitcast(q, ty.as_pointer()), align=1)
        return v if ty == I32 or isinstance(ty, ir.VectorType) else builder.zext(v, I32)

    def entry(i):                              # grid[i] (i32 index)
        return builder.load(builder.gep(gv, [ir.Constant(I32, 0), i]))

    def w_vec(b, e, c):
        if t == IQ2_XXS:
            q = L.qs + 8 * c
            idx, s = [at(b, q + l, I8) for l in range(4)], at(b, q + 4, I32)
        elif t == IQ2_XS:                      # the 4 u16 at once for the signs: 7 bits each
            idx = [builder.and_(at(b, L.qs + 8 * c + 2 * l, i16), c32(511)) for l in range(4)]
            l16 = ir.VectorType(i16, 4)
            v = at(b, L.qs + 8 * c, l16)
            sb = _parity7(builder, builder.trunc(builder.lshr(v, ir.Constant(l16, [9] * 4)), ir.VectorType(I8, 4)))
        elif t == IQ2_S:
            h = at(b, L.qh + c, I8)
            idx = [builder.or_(at(b, L.qs + 4 * c + l, I8), builder.and_(builder.shl(h, c32(8 - 2 * l)), c32(0x300)))
                   for l in range(4)]
            s = at(b, L.signs + 4 * c, I32)
        elif t == IQ3_XXS:
            idx, s = [at(b, L.qs + 8 * c + k, I8) for k in range(8)], at(b, L.signs + 4 * c, I32)
        else:
            h = at(b, L.qh + c, I8)
            idx = [builder.or_(at(b, L.qs + 8 * c + k, I8), builder.and_(builder.shl(h, c32(8 - k)), c32(256)))
                   for k in range(8)]
            s = at(b, L.signs + 4 * c, I32)
        v = ir.Constant(ir.VectorType(et, n), ir.Undefined)
        for i, ix in enumerate(idx):
            v = builder.insert_element(v, entry(ix), c32(i))
        if t != IQ2_XS:
            sb = _sign_bytes(builder, s, ksigns)
        return _signed32(builder, builder.bitcast(v, ir.VectorType(I8, 32)), sb)

    return RowSource(lambda b: builder.load(builder.gep(p["wd"], [b])),
                     lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec)
