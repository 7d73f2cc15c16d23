"""Row unpackers of the batched path in one intrinsic per type: a row's super-blocks to exactly what
unpack.py's unpackers write (int8 quants, i32 sub-block scales and mins, f32 super-block scale and
min), with the scales decoded as vectors and every shift a constant. unpack.py's path decodes the
scales scalar by scalar (about 150 cycles a super-block, more than the dots of 32 tokens).

`FAST` lists the types done here; the kernels take unpack._unpack_row for the rest (and for
vector=False). tests/test_qmatmul.py checks both unpackers equal on random blocks.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ramforge.gguf.constants import QK_K

from .blocks import (CHUNKS, IQ4_KV, IQ4_NL, IQ4_XS, LAYOUTS, Q2_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K,
                     Q8_0)
from .llvmir import I8, I16, I32, I64, dtypes_are, half_to_float, pick, splat

_K = (Q2_K, Q4_K, Q5_K, Q6_K, IQ4_XS)                  # super-blocks of 256
_B32 = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL)          # blocks of 32 (a "super-block" of one sub-block)
FAST = frozenset(int(t) for t in _K + _B32)


def _lookup(builder, table, idx):
    """<n x i8> table[idx] for idx in 0..15 (a pshufb / vpermb)."""
    out = ir.Constant(idx.type, ir.Undefined)
    for i in range(idx.type.count):
        e = builder.extract_element(idx, ir.Constant(I32, i))
        out = builder.insert_element(out, builder.extract_element(table, e), ir.Constant(I32, i))
    return out


def _scales(builder, t, blk, c8):
    """(isc, imn) of a super-block: <n x i32> each (imn None: zeros), n = QK_K / sub; blk(off, ty)
    loads ty at byte off of the block, c8(v, n) a constant <n x i32>."""
    L = LAYOUTS[t]
    v8 = ir.VectorType(I32, 8)
    if t in (Q4_K, Q5_K):                      # j < 4: s[j] & 63, s[j+4] & 63; else 4 low bits of s[j+4]
        s = blk(L.scales, ir.VectorType(I8, 16))      # and s[j-4] >> 6, s[j] >> 6 above them (16 read, 12 used)

        def b32(idx):
            return builder.zext(pick(builder, s, idx), v8)
        lo = [True] * 4 + [False] * 4
        a, am = b32([0, 1, 2, 3, 8, 9, 10, 11]), b32([4, 5, 6, 7, 8, 9, 10, 11])
        hs, hm = b32([0, 1, 2, 3, 0, 1, 2, 3]), b32([4, 5, 6, 7, 4, 5, 6, 7])
        k = ir.Constant(ir.VectorType(ir.IntType(1), 8), lo)
        sc = builder.select(k, builder.and_(a, c8(63, 8)), builder.or_(
            builder.and_(a, c8(15, 8)), builder.shl(builder.lshr(hs, c8(6, 8)), c8(4, 8))))
        mn = builder.select(k, builder.and_(am, c8(63, 8)), builder.or_(
            builder.lshr(am, c8(4, 8)), builder.shl(builder.lshr(hm, c8(6, 8)), c8(4, 8))))
        return sc, mn
    if t == Q6_K:                              # int8 scales
        return builder.sext(blk(L.scales, ir.VectorType(I8, 16)), ir.VectorType(I32, 16)), None
    if t == Q2_K:                              # scale: low nibble, min: high nibble
        s = builder.zext(blk(L.scales, ir.VectorType(I8, 16)), ir.VectorType(I32, 16))
        return builder.and_(s, c8(15, 16)), builder.lshr(s, c8(4, 16))
    if t == IQ4_XS:                            # 4 bits of scales_l[j/2] (low, then high), 2 of scales_h, less 32
        sh = builder.zext(blk(L.scales, I16), I32)
        sl = builder.zext(pick(builder, blk(L.scales + 2, ir.VectorType(I8, 4)), [0, 0, 1, 1, 2, 2, 3, 3]), v8)
        lo = builder.and_(builder.lshr(sl, ir.Constant(v8, [0, 4] * 4)), c8(15, 8))
        shv = builder.insert_element(ir.Constant(v8, ir.Undefined), sh, ir.Constant(I32, 0))
        shv = pick(builder, shv, [0] * 8)
        hi = builder.and_(builder.lshr(shv, ir.Constant(v8, [2 * j for j in range(8)])), c8(3, 8))
        return builder.sub(builder.or_(lo, builder.shl(hi, c8(4, 8))), c8(32, 8)), None
    raise AssertionError(t)


def _super_block(builder, t, blk, b, wp, sp, mp, store):
    """A 256-element super-block b's sub-block scales and mins (to sp, mp) and quants (to wp)."""
    L = LAYOUTS[t]
    nsub = QK_K // L.sub

    def c8(v, n):
        return ir.Constant(ir.VectorType(I32, n), [v] * n)

    def k8(v, n=32):
        return ir.Constant(ir.VectorType(I8, n), [v & 0xFF] * n)
    v32 = ir.VectorType(I8, 32)
    sc, mn = _scales(builder, t, blk, c8)
    kb = builder.mul(b, ir.Constant(I64, nsub))
    store(sp, kb, sc)
    store(mp, kb, mn if mn is not None else c8(0, nsub))
    e0 = builder.mul(b, ir.Constant(I64, QK_K))
    for c in range(QK_K // 32):
        if t == IQ4_XS:                        # nibbles of qs[16c:16c+16], low then high, through the codebook
            v = blk(L.qs + 16 * c, ir.VectorType(I8, 16))
            table = ir.Constant(ir.VectorType(I8, 16), [x & 0xFF for x in IQ4_KV])
            for h, part in enumerate((builder.and_(v, k8(15, 16)), builder.lshr(v, k8(4, 16)))):
                store(wp, builder.add(e0, ir.Constant(I64, 32 * c + 16 * h)), _lookup(builder, table, part))
            continue
        ao, sa, ma, bo, sb, mb, lb, c0 = CHUNKS[t][c]
        r = builder.and_(builder.lshr(blk(ao, v32), k8(sa)), k8(ma))
        if mb:
            h = builder.and_(builder.lshr(blk(bo, v32), k8(sb)), k8(mb))
            r = builder.add(r, builder.shl(h, k8(lb)))
        if c0:
            r = builder.add(r, k8(c0))
        store(wp, builder.add(e0, ir.Constant(I64, 32 * c)), r)


def _block32(builder, t, blk, put):
    """A 32-element block's quants as unpack._unpack_32 makes them, stored by put(v, h) (v: i8 vector
    for elements h..): Q8_0's int8; nibbles (low, then high) [| qh bit << 4] + bias; IQ4_NL's codebook."""
    L = LAYOUTS[t]
    v16, v32, w32 = ir.VectorType(I8, 16), ir.VectorType(I8, 32), ir.VectorType(I32, 32)
    if t == Q8_0:
        put(blk(L.qs, v32))
        return
    v = blk(L.qs, v16)
    lo, hi = builder.and_(v, ir.Constant(v16, [15] * 16)), builder.lshr(v, ir.Constant(v16, [4] * 16))
    if t == IQ4_NL:                            # two 16-byte lookups, stored apart (see unpack._make_nib)
        table = ir.Constant(v16, [x & 0xFF for x in IQ4_KV])
        put(_lookup(builder, table, lo))
        put(_lookup(builder, table, hi), 16)
        return
    r = builder.shuffle_vector(lo, hi, ir.Constant(w32, list(range(32))))
    if L.qh >= 0:
        bits = builder.lshr(splat(builder, blk(L.qh, I32), w32), ir.Constant(w32, list(range(32))))
        bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
        r = builder.add(r, builder.trunc(bits, v32))
    put(builder.add(r, ir.Constant(v32, [L.bias & 0xFF] * 32)) if L.bias else r)


@intrinsic(prefer_literal=True)
def _vunpack(typingctx, t, raw, o, n_sb, wq, wo, isc, imn, io, wd, wm, so):
    """As unpack._unpack_row of type t (a FAST constant) for one row at raw[o:] (u8) of n_sb super-
    blocks, into wq[wo:] (i8), isc / imn[io:] (i32), wd / wm[so:] (f32)."""
    if not isinstance(t, types.IntegerLiteral) or t.literal_value not in FAST or not dtypes_are(
            (raw, wq, isc, imn, wd, wm), (types.uint8, types.int8, types.int32, types.int32, types.float32,
                                         types.float32)):
        return None
    gt = next(x for x in _K + _B32 if int(x) == t.literal_value)
    L = LAYOUTS[gt]
    k_type = gt in _K

    def codegen(context, builder, sig, args):
        _, raw_, o_, nsb_, wq_, wo_, isc_, imn_, io_, wd_, wm_, so_ = args
        ta = sig.args

        def base(k, a, off):
            return builder.gep(context.make_array(ta[k])(context, builder, a).data, [off])
        rp, wp, sp, mp, dp, mq = (base(1, raw_, o_), base(4, wq_, wo_), base(6, isc_, io_), base(7, imn_, io_),
                                  base(9, wd_, so_), base(10, wm_, so_))
        def store(p, k, v):
            builder.store(v, builder.bitcast(builder.gep(p, [k]), v.type.as_pointer()), align=1)
        with cgutils.for_range(builder, nsb_) as loop:
            b = loop.index
            pb = builder.gep(rp, [builder.mul(b, ir.Constant(I64, L.nbytes))])

            def blk(off, ty):
                return builder.load(builder.bitcast(builder.gep(pb, [ir.Constant(I64, off)]), ty.as_pointer()),
                                    align=1)
            builder.store(half_to_float(context, builder, blk(L.d, I16)), builder.gep(dp, [b]))
            if L.m >= 0:
                builder.store(half_to_float(context, builder, blk(L.m, I16)), builder.gep(mq, [b]))
            if not k_type:                     # isc = 1 (imn, unused, left as it is); the block's quants
                builder.store(ir.Constant(I32, 1), builder.gep(sp, [b]))
                e0 = builder.mul(b, ir.Constant(I64, 32))
                _block32(builder, gt, blk, lambda v, h=0: store(wp, builder.add(e0, ir.Constant(I64, h)), v))
            else:
                _super_block(builder, gt, blk, b, wp, sp, mp, store)
        return context.get_dummy_value()
    return types.void(t, raw, o, n_sb, wq, wo, isc, imn, io, wd, wm, so), codegen
