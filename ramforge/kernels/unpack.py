"""Row unpackers of the integer-dot matmul: packed blocks -> int8 quants and integer sub-block scales.

unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm) writes one row of n_sb super-blocks from byte o of
raw (u8): wq i8[n_sb * sb] quants, isc / imn i32[n_sb * sb/sub] sub-block scales and mins, wd / wm
f32[n_sb] float scale and min; weight = wd*isc*(wq - offset) [- wm*imn] (QDot). The blocks are read
through blocks.py, as dequantization reads them. `vec`: 32 bytes at a time as LLVM vector IR (the
intrinsics below); else their plain-loop twins, bit for bit equal.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ramforge.gguf.constants import QK_K

from .blocks import (CHUNKS, IQ1_M, IQ1_S, IQ4_KV, IQ4_KV_I8, IQ4_NL, IQ4_XS, LAYOUTS, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1,
                     Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q8_K, TQ1_0, TQ2_0, _high_bit, _nibble, _row_scales)
from .iquants import (IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, _unpack_iq2_s, _unpack_iq2_xs, _unpack_iq2_xxs,
                      _unpack_iq3_s, _unpack_iq3_xxs)
from .llvmir import I8, I32, dtypes_are, ptr, splat
from .lowbit import _unpack_iq1_m, _unpack_iq1_s, _unpack_tq1_0
from .naming import made_for
from .lowbit_tables import E8M0_HALF, KVALUES_MXFP4, KVALUES_MXFP4_I8
from .scalars import _f16_at, _u32

# ---------------------------------------------------------------- vector primitives


def _lookup16(builder, table, idx):
    """<16 x i8> table[idx & 15], written as a build of variable extracts (LLVM's x86 backend makes
    this one pshufb / vpermb, AArch64 a tbl)."""
    idx = builder.and_(idx, ir.Constant(idx.type, [15] * 16))
    out = ir.Constant(idx.type, ir.Undefined)
    for i in range(16):
        e = builder.extract_element(idx, ir.Constant(I32, i))
        out = builder.insert_element(out, builder.extract_element(table, e), ir.Constant(I32, i))
    return out


def _make_nib(mode, kv=IQ4_KV):
    @intrinsic
    def _vnib(typingctx, dst, do, src, so, c, qh):
        """16 bytes at src[so] -> dst[do:do+32]: low nibbles then high nibbles, in one 32-byte store;
        mode "qh": + ((qh >> i) & 1) << 4 (Q5_0/Q5_1); then + c; mode "kv": dst = kv[nibble]."""
        def codegen(context, builder, sig, args):
            v16, v32, w32 = ir.VectorType(I8, 16), ir.VectorType(I8, 32), ir.VectorType(I32, 32)
            v = builder.load(ptr(context, builder, sig.args[2], args[2], args[3], v16), align=1)
            lo = builder.and_(v, ir.Constant(v16, [15] * 16))
            hi = builder.lshr(v, ir.Constant(v16, [4] * 16))
            if mode == "kv":
                # two 16-byte lookups, each one variable shuffle (pshufb / tbl), stored apart: joined
                # into one vector, LLVM sees a 32-lane gather from two index vectors and scalarizes it
                table = ir.Constant(v16, [ir.Constant(I8, x & 0xFF) for x in kv])
                p = ptr(context, builder, sig.args[0], args[0], args[1], v16)
                builder.store(_lookup16(builder, table, lo), p, align=1)
                builder.store(_lookup16(builder, table, hi), builder.gep(p, [ir.Constant(I32, 1)]), align=1)
                return context.get_dummy_value()
            r = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))
            if mode == "qh":
                bits = builder.lshr(splat(builder, args[5], w32), ir.Constant(w32, list(range(32))))
                bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
                r = builder.add(r, builder.trunc(bits, v32))
            r = builder.add(r, splat(builder, args[4], v32))
            builder.store(r, ptr(context, builder, sig.args[0], args[0], args[1], v32), align=1)
            return context.get_dummy_value()
        if not dtypes_are((dst, src), (types.int8, types.uint8)):
            return None
        return types.void(dst, do, src, so, c, qh), codegen
    return _vnib


_vnib, _vnib_qh, _vnib_kv = _make_nib("plain"), _make_nib("qh"), _make_nib("kv")
_vnib_mx = _make_nib("kv", KVALUES_MXFP4)


@intrinsic
def _vbits(typingctx, dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c):
    """dst[do+i] = ((a[ao+i] >> sa) & ma) + (((b[bo+i] >> sb) & mb) << lb) + c for i < 32, bytewise
    mod 256 (shifts < 8)."""
    def codegen(context, builder, sig, args):
        vt = ir.VectorType(I8, 32)
        s = [splat(builder, args[k], vt) for k in (4, 5, 8, 9, 10, 11)]
        va = builder.load(ptr(context, builder, sig.args[2], args[2], args[3], vt), align=1)
        vb = builder.load(ptr(context, builder, sig.args[6], args[6], args[7], vt), align=1)
        r = builder.and_(builder.lshr(va, s[0]), s[1])
        h = builder.shl(builder.and_(builder.lshr(vb, s[2]), s[3]), s[4])
        r = builder.add(builder.add(r, h), s[5])
        builder.store(r, ptr(context, builder, sig.args[0], args[0], args[1], vt), align=1)
        return context.get_dummy_value()
    if not dtypes_are((dst, a, b), (types.int8, types.uint8, types.uint8)):
        return None
    return types.void(dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c), codegen


# ---------------------------------------------------------------- the same, vector or plain loop

@njit(cache=True, inline="always")
def _bits(vec, dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c):
    # see _vbits: 32 bytes of bit fields from a (and b), plus c
    if vec:
        _vbits(dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c)
        return
    for i in range(32):
        v = ((np.int64(a[ao + i]) >> sa) & ma) + (((np.int64(b[bo + i]) >> sb) & mb) << lb) + c
        dst[do + i] = np.int8(((v + 128) & 0xFF) - 128)


@njit(cache=True, inline="always")
def _nib32(vec, wq, y, raw, o, c):
    # a 32-element block's 16 nibble bytes at o -> 32 values (blocks._nibble order), plus c
    if vec:
        _vnib(wq, y, raw, o, c, 0)
        return
    for j in range(32):
        wq[y + j] = np.int8(_nibble(raw, o, j) + c)


@njit(cache=True, inline="always")
def _nib32_qh(vec, wq, y, raw, o, qh, c):
    # as _nib32, with bit j of the u32 qh as the fifth bit of value j
    if vec:
        _vnib_qh(wq, y, raw, o, c, qh)
        return
    for j in range(32):
        wq[y + j] = np.int8((_nibble(raw, o, j) | _high_bit(qh, j)) + c)


@njit(cache=True, inline="always")
def _nib32_kv(vec, wq, y, raw, o, mx):
    # as _nib32, through a 16-value codebook: IQ4_NL's, or (mx) MXFP4's doubled e2m1 values
    if vec:
        if mx:
            _vnib_mx(wq, y, raw, o, 0, 0)
        else:
            _vnib_kv(wq, y, raw, o, 0, 0)
        return
    table = KVALUES_MXFP4_I8 if mx else IQ4_KV_I8
    for j in range(32):
        wq[y + j] = table[_nibble(raw, o, j)]


# ---------------------------------------------------------------- rows, by type

def _unpack_32(t):
    """The unpacker of a 32-element type (a block is a "super-block"): wd = d, wm = m (Q4_1, Q5_1),
    isc = 1; quants with the bias applied (Q4_0: q - 8, Q5_0: q - 16), int8 (Q8_0) or codebook
    values (IQ4_NL; MXFP4, whose wd is its E8M0 scale halved)."""
    L, kv, q8, has_m, has_qh = LAYOUTS[t], t == IQ4_NL, t == Q8_0, LAYOUTS[t].m >= 0, LAYOUTS[t].qh >= 0
    mx = t == MXFP4

    @njit(cache=True)
    def unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
        for b in range(n_sb):
            p = o + b * L.nbytes
            wd[b] = E8M0_HALF[raw[p + L.d]] if mx else _f16_at(raw, p + L.d)
            if has_m:
                wm[b] = _f16_at(raw, p + L.m)
            isc[b] = 1
            if kv or mx:
                _nib32_kv(vec, wq, b * 32, raw, p + L.qs, mx)
            elif q8:
                _bits(vec, wq, b * 32, raw, p + L.qs, 0, 255, raw, p, 0, 0, 0, 0)
            elif has_qh:
                _nib32_qh(vec, wq, b * 32, raw, p + L.qs, _u32(raw, p + L.qh), L.bias)
            else:
                _nib32(vec, wq, b * 32, raw, p + L.qs, L.bias)
    return made_for(unpack, t)


def _unpack_k(t):
    """The unpacker of a 256-element type: scales as blocks._row_scales; quants per 32-element chunk from
    their bit fields (blocks.CHUNKS), unsigned for Q6_K (offset 32); IQ4_XS: codebook values."""
    L, tid, kv = LAYOUTS[t], int(t), t == IQ4_XS
    chunks = CHUNKS[t] if not kv else ((0,) * 8,) * (QK_K // 32)

    @njit(cache=True)
    def unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
        for b in range(n_sb):
            p = o + b * L.nbytes
            _row_scales(tid, raw, p, b, isc, imn, wd, wm)
            for c in range(QK_K // 32):
                if kv:
                    _nib32_kv(vec, wq, b * QK_K + c * 32, raw, p + L.qs + c * 16, False)
                else:
                    ao, sa, ma, bo, sb, mb, lb, c0 = chunks[c]
                    _bits(vec, wq, b * QK_K + c * 32, raw, p + ao, sa, ma, raw, p + bo, sb, mb, lb, c0)
    return made_for(unpack, t)


_unpack_q4_0, _unpack_q4_1, _unpack_q5_0 = _unpack_32(Q4_0), _unpack_32(Q4_1), _unpack_32(Q5_0)
_unpack_q5_1, _unpack_q8_0, _unpack_iq4_nl = _unpack_32(Q5_1), _unpack_32(Q8_0), _unpack_32(IQ4_NL)
_unpack_q2_k, _unpack_q3_k, _unpack_q4_k = _unpack_k(Q2_K), _unpack_k(Q3_K), _unpack_k(Q4_K)
_unpack_q5_k, _unpack_q6_k, _unpack_q8_k = _unpack_k(Q5_K), _unpack_k(Q6_K), _unpack_k(Q8_K)
_unpack_iq4_xs, _unpack_mxfp4, _unpack_tq2_0 = _unpack_k(IQ4_XS), _unpack_32(MXFP4), _unpack_k(TQ2_0)


@njit(cache=True, inline="always")
def _unpack_row(t, vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    """The unpacker of ggml type t, for kernels that pass t as a constant (numba keeps that branch
    alone); Python uses the registry."""
    if t == Q4_0:
        _unpack_q4_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q4_1:
        _unpack_q4_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q5_0:
        _unpack_q5_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q5_1:
        _unpack_q5_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q8_0:
        _unpack_q8_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ4_NL:
        _unpack_iq4_nl(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q2_K:
        _unpack_q2_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q3_K:
        _unpack_q3_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q4_K:
        _unpack_q4_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q5_K:
        _unpack_q5_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q6_K:
        _unpack_q6_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == Q8_K:
        _unpack_q8_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ4_XS:
        _unpack_iq4_xs(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == MXFP4:
        _unpack_mxfp4(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == TQ2_0:
        _unpack_tq2_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == TQ1_0:
        _unpack_tq1_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ1_S:
        _unpack_iq1_s(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ1_M:
        _unpack_iq1_m(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ2_XXS:                  # the codebook types (iquants.py)
        _unpack_iq2_xxs(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ2_XS:
        _unpack_iq2_xs(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ2_S:
        _unpack_iq2_s(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ3_XXS:
        _unpack_iq3_xxs(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif t == IQ3_S:
        _unpack_iq3_s(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    else:
        raise ValueError("no row unpacker for this ggml type")
