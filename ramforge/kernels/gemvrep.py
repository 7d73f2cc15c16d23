"""The gemv of one repacked group (repack.py's layouts) . one token, the group's G rows in the lanes
of <G x i32> / <G x float> vectors, in the float steps of the kernel llama.cpp runs for the type:
Q4_K and Q4_0 their repacked gemv (variants.K32_GROUPS256, B32_GROUPS32, as gemv8.py), Q8_0 its
vec_dot (B32_LANES, as rowdot.row_codegen: 8 f32 lanes per row, here 8 vectors of G rows, one per
lane, then hsum_float_8). The integer parts are exact: vpdpbusd per 4 quants of every row where the
target has VNNI (AVX2 alone: pmaddubsw + pmaddwd); generic IR elsewhere.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvmir import (I8, I16, I32, I64, avx2_only, dtypes_are, fma_fn, half_to_float, has_avx512_vnni,
                     has_vnni, maddubs, maddwd, native_half, prefetch, quad_dot_avx2, quad_lanes, sign_split, splat)


def _c64(v):
    return ir.Constant(I64, v)


def _load(builder, p, off, ty):
    return builder.load(builder.bitcast(builder.gep(p, [off]), ty.as_pointer()), align=1)


_AHEAD = 2          # blocks prefetched ahead (4 KiB at least): one core streamed Q4_K at 31 GB/s, not 25


def _block(context, builder, G, gp, aq, ad, b, nbytes, elems):
    """Block b of a group of G rows (nbytes a block, elems per row), its successor prefetched: (its
    bytes i8*, the token's quants i8* at its first element, d_a <G x float>, the rows' d_w <G x
    float>, the f16 plane at the block's start)."""
    blk = builder.gep(gp, [builder.mul(b, _c64(nbytes))])
    prefetch(builder, blk, nbytes, max(_AHEAD * nbytes, 4096))
    a0 = builder.gep(aq, [builder.mul(b, _c64(elems))])
    da = splat(builder, builder.load(builder.gep(ad, [b])), ir.VectorType(ir.FloatType(), G))
    return blk, a0, da, _f16s(context, builder, blk, 0, G)


def _f16s(context, builder, blk, off, G):
    """<G x float>: the f16 plane at blk + off (one value per row)."""
    return half_to_float(context, builder, _load(builder, blk, _c64(off), ir.VectorType(I16, G)),
                         native_half(context))


def _hsum8(builder, f):
    """hsum_float_8 of 8 lanes held as 8 vectors: ((f0+f4) + (f2+f6)) + ((f1+f5) + (f3+f7))."""
    t = [builder.fadd(f[4 + i], f[i]) for i in range(4)]
    return builder.fadd(builder.fadd(t[0], t[2]), builder.fadd(t[1], t[3]))


def _dpbusd(context, builder, acc, w, a):
    """<G x i32> acc + per lane the 4 products of unsigned w and signed a (<4G x i8>): vpdpbusd where
    the target has VNNI (512 bits, or two 256-bit halves), else the products' quad sums (AVX2 without
    VNNI takes its own path in the callers: i16 pair sums of the nibbles, Q8_0's sign trick)."""
    n = acc.type.count
    if n == 16 and has_avx512_vnni(context) or n == 8 and has_vnni(context):
        vt, bits = ir.VectorType(I8, 4 * n), 32 * n
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(acc.type, [acc.type, vt, vt]),
                                            f"llvm.x86.avx512.vpdpbusd.{bits}")
        return builder.call(fn, [acc, w, a])
    if n == 16 and has_vnni(context):
        def half(v, h, m):
            return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, m), list(range(h * m, h * m + m))))
        lo = _dpbusd(context, builder, half(acc, 0, 8), half(w, 0, 32), half(a, 0, 32))
        hi = _dpbusd(context, builder, half(acc, 1, 8), half(w, 1, 32), half(a, 1, 32))
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 16), list(range(16))))
    wt = ir.VectorType(I32, 4 * n)
    return builder.add(acc, quad_lanes(builder, builder.mul(builder.zext(w, wt), builder.sext(a, wt))))


def _i16_add(builder, acc, p):
    """acc + p (<2G x i16> pair sums), acc starting as an i32 zero constant (no sum yet)."""
    return p if acc.type.element.width == 32 else builder.add(acc, p)


def _pairs16(builder, sc):
    """<G x i8 / i32> scales (signed, |sc| < 2^15) -> <2G x i16>, each row's scale in both of its pair lanes."""
    n = sc.type.count
    s16 = (builder.trunc if sc.type.element.width > 16 else builder.sext)(sc, ir.VectorType(I16, n))
    return builder.shuffle_vector(s16, s16, ir.Constant(ir.VectorType(I32, 2 * n), [i // 2 for i in range(2 * n)]))


def _k4_scales(builder, blk, G):
    """The 8 sub-block scales and 8 mins (<G x i8> each, one lane per row) of a Q4_K group's
    super-block at blk, from its 12 planes at 4G (repack.py): j < 4: q[j] & 63, q[j+4] & 63; j >= 4:
    (q[j+4] & 15) | (q[j-4] >> 6) << 4, (q[j+4] >> 4) | (q[j] >> 6) << 4 (blocks._k4_scale_min)."""
    VB = ir.VectorType(I8, 4 * G)

    def bytes_(v):
        return ir.Constant(VB, [v] * (4 * G))

    def sub_of(v, j):                          # lanes j*G..j*G+G-1 of a <4G x i8> quad of planes
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, G), list(range(j * G, j * G + G))))
    p0, p1, p2 = (_load(builder, blk, _c64(k * G), VB) for k in (4, 8, 12))
    six, hi2 = bytes_(63), builder.shl(builder.lshr(p0, bytes_(6)), bytes_(4))
    sc_lo, mn_lo = builder.and_(p0, six), builder.and_(p1, six)               # scales / mins 0-3
    sc_hi = builder.or_(builder.and_(p2, bytes_(15)), hi2)                    # 4-7: low 4 bits in 8-11
    mn_hi = builder.or_(builder.lshr(p2, bytes_(4)), builder.shl(builder.lshr(p1, bytes_(6)), bytes_(4)))
    return ([sub_of(lo if j < 4 else hi, j % 4) for j in range(8)] for lo, hi in ((sc_lo, sc_hi), (mn_lo, mn_hi)))


def _q4_k(context, builder, G, gp, aq, ad, bs, n_sb, grp=256):
    """<G x float>: the Q4_K group at gp (i8*) . one token (aq i8*, ad float* per super-block, bs i32*
    per 32), as ggml_gemv_q4_K_8x8_q8_K (grp 256): per row and super-block sacc = fma(float(isum),
    d_w*d_a, sacc), macc = fma(float(msum), dmin_w*d_a, macc); sacc - macc. grp 64: the gemm's
    (variants.K32_GROUPS64), the two fmas per 64 elements (sub-blocks 2c, 2c+1)."""
    VB, LG, FG = ir.VectorType(I8, 4 * G), ir.VectorType(I32, G), ir.VectorType(ir.FloatType(), G)
    fma = fma_fn(builder, FG)
    sacc = cgutils.alloca_once_value(builder, ir.Constant(FG, [0.0] * G))
    macc = cgutils.alloca_once_value(builder, ir.Constant(FG, [0.0] * G))
    pk = avx2_only(context)                   # nibbles: pmaddubsw pairs as i16 over 8 steps (2*15*128*8 <= 32767)

    def bytes_(v):
        return ir.Constant(VB, [v] * (4 * G))

    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        blk, a0, da, dw = _block(context, builder, G, gp, aq, ad, b, G * 144, 256)
        dm = _f16s(context, builder, blk, 2 * G, G)
        sc, mn = ([builder.zext(v, LG) for v in vs] for vs in _k4_scales(builder, blk, G))

        def mins(j0, j1):                      # sum over sub-blocks j0..j1-1 of min * the token's bsum
            msum = ir.Constant(LG, [0] * G)
            for j in range(j0, j1):
                bj = builder.load(builder.gep(bs, [builder.add(builder.mul(b, _c64(8)), _c64(j))]))
                msum = builder.add(msum, builder.mul(mn[j], splat(builder, bj, LG)))
            return msum

        def fmas(isum, msum):
            builder.store(builder.call(fma, [builder.sitofp(isum, FG), builder.fmul(da, dw), builder.load(sacc)]),
                          sacc)
            builder.store(builder.call(fma, [builder.sitofp(msum, FG), builder.fmul(dm, da), builder.load(macc)]),
                          macc)
        isum = ir.Constant(LG, [0] * G)
        for c in range(4):                     # sub-blocks 2c (low nibbles) and 2c+1 (high)
            acc = [ir.Constant(LG, [0] * G)] * 2
            for k in range(8):
                w = _load(builder, blk, _c64(16 * G + (8 * c + k) * 4 * G), VB)
                for h, wv in enumerate((builder.and_(w, bytes_(15)), builder.lshr(w, bytes_(4)))):
                    a = builder.bitcast(splat(builder, _load(builder, a0, _c64(64 * c + 32 * h + 4 * k), I32), LG), VB)
                    acc[h] = _i16_add(builder, acc[h], maddubs(builder, wv, a)) if pk else \
                        _dpbusd(context, builder, acc[h], wv, a)
            if pk:                             # the i16 pair sums times the scales: pmaddwd
                isum = builder.add(isum, builder.add(maddwd(builder, acc[0], _pairs16(builder, sc[2 * c])),
                                                     maddwd(builder, acc[1], _pairs16(builder, sc[2 * c + 1]))))
            else:
                isum = builder.add(isum, builder.add(builder.mul(acc[0], sc[2 * c]),
                                                     builder.mul(acc[1], sc[2 * c + 1])))
            if grp == 64:
                fmas(isum, mins(2 * c, 2 * c + 2))
                isum = ir.Constant(LG, [0] * G)
        if grp == 256:
            fmas(isum, mins(0, 8))
    return builder.fsub(builder.load(sacc), builder.load(macc))


def _q8_0(context, builder, G, gp, aq, ad, bs, n_sb):
    """<G x float>: the Q8_0 group at gp (i8*; quants stored + 128, repack.py) . one token (ad: float*
    per block of 32), as ggml_vec_dot_q8_0_q8_0 row by row: lane l of a row's 8 = products 4l..4l+3 of
    the block; facc_l = fma(d_a*d_w, float(lane l), facc_l) per block; hsum_float_8 of the row's facc."""
    VB, LG, FG = ir.VectorType(I8, 4 * G), ir.VectorType(I32, G), ir.VectorType(ir.FloatType(), G)
    fma = fma_fn(builder, FG)
    facc = [cgutils.alloca_once_value(builder, ir.Constant(FG, [0.0] * G)) for _ in range(8)]
    zero, ones = ir.Constant(LG, [0] * G), ir.Constant(VB, [1] * (4 * G))
    ones128, avx2 = ir.Constant(VB, [128] * (4 * G)), avx2_only(context)
    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        blk, a0, da, dw = _block(context, builder, G, gp, aq, ad, b, G * 34, 32)
        d = builder.fmul(da, dw)
        for k in range(8):
            a = builder.bitcast(splat(builder, _load(builder, a0, _c64(4 * k), I32), LG), VB)
            w = _load(builder, blk, _c64(2 * G + k * 4 * G), VB)
            if avx2:                           # the signed quants (w ^ 0x80): |q| . a * sign(q), exact
                lane = quad_dot_avx2(builder, zero, *sign_split(builder, builder.xor(w, ones128), a))
            else:
                s = builder.shl(_dpbusd(context, builder, zero, ones, a), ir.Constant(LG, [7] * G))   # 128 * sum a
                lane = builder.sub(_dpbusd(context, builder, zero, w, a), s)
            builder.store(builder.call(fma, [d, builder.sitofp(lane, FG), builder.load(facc[k])]), facc[k])
    return _hsum8(builder, [builder.load(p) for p in facc])


def _q4_0(context, builder, G, gp, aq, ad, bs, n_sb):
    """<G x float>: the Q4_0 group at gp (i8*) . one token (ad: float* per block of 32, bs: i32* its
    sums), as ggml_gemv_q4_0_8x8_q8_0 (variants.B32_GROUPS32): per row and block isum = the unsigned
    nibbles' products less 8 * the block's sum, sacc = fma(float(isum), d_a*d_w, sacc)."""
    VB, LG, FG = ir.VectorType(I8, 4 * G), ir.VectorType(I32, G), ir.VectorType(ir.FloatType(), G)
    fma = fma_fn(builder, FG)
    sacc = cgutils.alloca_once_value(builder, ir.Constant(FG, [0.0] * G))
    low, four = ir.Constant(VB, [15] * (4 * G)), ir.Constant(VB, [4] * (4 * G))
    pk = avx2_only(context)                   # nibbles: pmaddubsw pairs as i16 over 8 steps (2*15*128*8 <= 32767)
    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        blk, a0, da, dw = _block(context, builder, G, gp, aq, ad, b, G * 18, 32)
        d = builder.fmul(da, dw)
        isum = ir.Constant(LG, [0] * G)
        for k in range(4):
            w = _load(builder, blk, _c64(2 * G + k * 4 * G), VB)
            for h, wv in enumerate((builder.and_(w, low), builder.lshr(w, four))):
                a = builder.bitcast(splat(builder, _load(builder, a0, _c64(16 * h + 4 * k), I32), LG), VB)
                isum = _i16_add(builder, isum, maddubs(builder, wv, a)) if pk else \
                    _dpbusd(context, builder, isum, wv, a)
        if pk:
            isum = maddwd(builder, isum)
        s8 = builder.shl(splat(builder, builder.load(builder.gep(bs, [b])), LG), ir.Constant(LG, [3] * G))
        builder.store(builder.call(fma, [builder.sitofp(builder.sub(isum, s8), FG), d, builder.load(sacc)]), sacc)
    return builder.load(sacc)


def _q4_k_gemm(context, builder, G, gp, aq, ad, bs, n_sb):
    return _q4_k(context, builder, G, gp, aq, ad, bs, n_sb, grp=64)


GEMM_Q4_K = 3         # _vgemv_rep's kind for Q4_K's layout in the repacked gemm's float steps


@intrinsic(prefer_literal=True)
def _vgemv_rep(typingctx, kind, G, raw, go, n_sb, aq, ao, ad, to, bsum, bo, y, yo):
    """y[yo:yo+G] (f32) = the repacked group of G rows (a constant: 8 or 16) of the type `kind` (a
    constant, repack.KINDS: 0 Q4_K, 1 Q8_0, 2 Q4_0; or GEMM_Q4_K: Q4_K in its gemm's
    steps) at raw[go:] . the token at aq[ao:] (ad: its super-block scales at to, bsum: its sums per
    sub-block at bo)."""
    arrays = (types.uint8, types.int8, types.float32, types.int32, types.float32)
    if not all(isinstance(v, types.IntegerLiteral) for v in (kind, G)) or G.literal_value not in (8, 16) or \
            not dtypes_are((raw, aq, ad, bsum, y), arrays):
        return None
    g, body = G.literal_value, (_q4_k, _q8_0, _q4_0, _q4_k_gemm)[kind.literal_value]

    def codegen(context, builder, sig, args):
        def base(k, o):
            return builder.gep(context.make_array(sig.args[k])(context, builder, args[k]).data, [args[o]])
        out = body(context, builder, g, base(2, 3), base(5, 6), base(7, 8), base(9, 10), args[4])
        builder.store(out, builder.bitcast(base(11, 12), out.type.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(kind, G, raw, go, n_sb, aq, ao, ad, to, bsum, bo, y, yo), codegen
