"""Token tiles of the batched integer-dot matmul: TILE_ROWS unpacked weight rows x TT tokens per
call, the tokens in vector lanes. llama.cpp's float steps are per (row, token), so lane by lane they
are op for op those of _rows8_codegen; only the exact integer sums are computed otherwise:

  per 4 elements: a row's 4 quants broadcast to every lane, one vpdpbusd per (row, vector of W tokens)
  per sub-block:  iacc += acc * sc (one vpmulld per row and vector; none for the 32-element types)
  per sub-block pair (mins): msum += <(imn_2j, imn_2j+1), (bsum_2j, bsum_2j+1)> (one vpdpwssd, i16 pairs)

no horizontal sums, an activation vector loaded once per TILE_ROWS rows, a weight word once per W
tokens. Integer modes (`tile_mode`):
  UNSIGNED (GROUPS / TILED with mins, no offset: weights >= 0): dpbusd(w u8, a s8)
  SIGNED (the other GROUPS / TILED): dpbusd(a + 128 u8, w - offset s8) less 128 * sc_j * sum(w - offset)
      per sub-block j, which `_vprep` writes per row (applying the offset to the scratch in place)
  LANES_MODE (B32_LANES: each block's 8 lanes of 4 products fma'd apart): per 4 elements
      dpbusd(-128 * sum a, w + 128 u8, a s8) is the exact lane; `_vprep` adds the 128 in place

Per matmul `_tile_acts` lays out each tile of TT tokens (zero-padded), tile k:
  act i32[k, n_in/4, TT]    4 activation quants per i32 (SIGNED: each byte ^ 0x80, i.e. a + 128 as u8;
                            LANES_MODE: then i32[n_in/4, TT] of -128 * the 4 quants' sum)
  adt f32[k, n_sb, TT]      activation scale per super-block
  bst i32[k, n_sub/2, TT]   UNSIGNED: Q8_K sums of sub-blocks 2j, 2j+1 as an i16 pair (lo, hi)
Arguments of the intrinsics, by name (positional: numba intrinsics): wq i8 unpacked rows at wo (n_in a
row); isc, imn, corr i32 per sub-block at io (n_sub a row); wd, wm f32 per super-block at so (n_sbs a
row); act, adt, bst the tile at ao, dto, bso; n_sb super-blocks a row; out f32[nrows * TT].

W is 16 (zmm) where the target has AVX512-VNNI, else 8. On AVX2 without VNNI (`avx2_only`) the same exact
integers come from pmaddubsw + pmaddwd wherever a pair of products fits i16 (QDot.wmax: the type's largest
|w - offset|): UNSIGNED as it is (w u8 <= wmax, a s8: 2 * 128 * wmax), SIGNED as VNNI's (a + 128 u8) .
(w - offset s8) (2 * 255 * wmax: Q4_0, Q3_K, Q6_K), the pairs summed as i16 over as many steps as stay
<= 32767, then one pmaddwd by the sub-block scale (SIGNED: less the 128 * sum correction); the other
SIGNED (weights past 64) as the signed dot of the
activation (its byte ^ 0x80) and w - offset through the sign trick, which is the mode's lane after
the 128 * sum correction, so that correction is not subtracted; LANES_MODE as the signed dot of w (its
byte ^ 0x80) and a, which is the lane. Elsewhere the dots are generic IR.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .llvmir import (F32, I8, I16, I32, I64, _features, avx2_only, dtypes_are, fma_fn, has_avx2, has_vnni, maddubs,
                     maddwd, quad_dot_avx2, quad_lanes, reduce_add, sign_split, splat)
from .variants import GROUPS, K_MINS, LANES, NO_MIN, SPECS, TILED, Variant

TT = 16                 # tokens per tile (activation lanes)
TILE_ROWS = 8           # weight rows per tile call, at most (GROUPS; the others 4: fewer registers spilled)
TILE_FROM = 4           # a token range of at least this many takes tiles (fewer: one token at a time) ...
TILE_FROM_LANES = 10    # ... in LANES_MODE this many (3 vector ops per 4 elements, 1.4 in the others)
_SHIFT = np.int32(-0x7F7F7F80)      # 0x80808080: a + 128 per byte
UNSIGNED, SIGNED, LANES_MODE = 0, 1, 2      # the integer modes (see the module doc)


def tiled(v) -> bool:
    """Whether variant v has a tile kernel (the GROUPS and TILED modes, and the 32-element LANES)."""
    s = SPECS[Variant(v)]
    return s.mode in (GROUPS, TILED) or (s.mode, s.nsub, s.mins, s.offset) == (LANES, 1, NO_MIN, 0)


def tile_mode(v) -> int:
    """The integer mode of variant v's tiles."""
    s = SPECS[Variant(v)]
    return LANES_MODE if s.mode == LANES else UNSIGNED if s.mins == K_MINS and s.offset == 0 else SIGNED


def tile_rows(v) -> int:
    """Rows per tile call of variant v: a divisor of TILE_ROWS and of qmatmul's 8-row groups."""
    return TILE_ROWS if SPECS[Variant(v)].mode == GROUPS else TILE_ROWS // 2


def tile_from(v) -> int:
    """The fewest tokens that variant v's tiles take (below: token by token, faster there)."""
    return TILE_FROM_LANES if tile_mode(v) == LANES_MODE else TILE_FROM


def _lanes(context) -> int:
    """W: tokens per vector, 16 where the target has 512-bit VNNI."""
    return 16 if has_vnni(context) and {"+avx512vnni", "+avx512f"} <= _features(context) else 8


def _sdot(builder, acc, x, y):
    """acc + per lane the 4 products of signed bytes x (|x| <= 128) and y (|y| <= 127), on AVX2 (avx2_only)."""
    return quad_dot_avx2(builder, acc, *sign_split(builder, x, y))


def _dpbusd(context, builder, acc, u, s):
    """acc + per lane the sum of 4 products of u (u8) and s (s8): <W x i32>, <4W x i8>, <4W x i8>."""
    w = acc.type.count
    if has_vnni(context):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(acc.type, [acc.type, u.type, s.type]),
                                            f"llvm.x86.avx512.vpdpbusd.{32 * w}")
        return builder.call(fn, [acc, u, s])
    wt = ir.VectorType(I32, 4 * w)
    return builder.add(acc, quad_lanes(builder, builder.mul(builder.zext(u, wt), builder.sext(s, wt))))


def _dpwssd(context, builder, acc, a, b):
    """acc + per lane a's i16 pair . b's: <W x i32>, <2W x i16>, <2W x i16>."""
    w = acc.type.count
    if has_vnni(context):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(acc.type, [acc.type, a.type, b.type]),
                                            f"llvm.x86.avx512.vpdpwssd.{32 * w}")
        return builder.call(fn, [acc, a, b])
    if has_avx2(context):
        return builder.add(acc, maddwd(builder, a, b))
    wt = ir.VectorType(I32, 2 * w)
    p = builder.mul(builder.sext(a, wt), builder.sext(b, wt))
    ev = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, w), list(range(0, 2 * w, 2))))
    od = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(I32, w), list(range(1, 2 * w, 2))))
    return builder.add(acc, builder.add(ev, od))


def _tile_codegen(context, builder, spec, R, rp, tp, n_sb, wmax):
    """IR: R rows . TT tokens over n_sb super-blocks in the float steps of `spec` (GROUPS or TILED),
    stored to tp["out"] f32[R * TT] (row-major). rp[name][r]: row r's element pointers "wq" (i8),
    "isc", "imn", "corr" (i32, per sub-block), "wd", "wm" (f32, per super-block); tp: the tile's
    "act" (i32), "adt" (f32), "bst" (i32) at its first element. wmax: the type's largest |w - offset|."""
    sub, nsub, mins, mode, offset, grp, post = spec
    W = _lanes(context)
    TV = TT // W
    sgn = not (mins == K_MINS and offset == 0)
    avx2 = avx2_only(context)
    pair = 2 * wmax * (255 if sgn else 128)         # a pmaddubsw pair's largest |sum|: (a + 128) . w, or w . a
    packed = avx2 and pair <= 32767                 # AVX2: the pairs summed as i16 over `steps`, then pmaddwd
    steps = 32767 // pair
    narrow = packed and sgn                         # SIGNED: pmaddubsw(a + 128, w) as VNNI's dpbusd
    sb = sub * nsub
    unit = grp if mode == GROUPS else sb           # elements per float step
    spu = unit // sub                               # sub-blocks per unit
    assert mins in (NO_MIN, K_MINS) and (mins == NO_MIN or spu % 2 == 0)
    li, lf = ir.VectorType(I32, W), ir.VectorType(F32, W)
    b8 = ir.VectorType(I8, 4 * W)
    h16 = ir.VectorType(I16, 2 * W)
    fma = fma_fn(builder, lf)
    zi, zf = ir.Constant(li, [0] * W), ir.Constant(lf, [0.0] * W)
    ld = builder.load

    def c64(v):
        return ir.Constant(I64, v)

    def vload(p, k, ty):                            # <W x ty> at p + k (elements)
        return ld(builder.bitcast(builder.gep(p, [k]), ty.as_pointer()), align=4)

    sacc = [[cgutils.alloca_once_value(builder, zf) for _ in range(TV)] for _ in range(R)]
    macc = [[cgutils.alloca_once_value(builder, zf) for _ in range(TV)] for _ in range(R)] if mins else None
    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        q0, k0 = builder.mul(b, c64(sb // 4)), builder.mul(b, c64(nsub))
        pa = builder.gep(tp["act"], [builder.mul(q0, c64(TT))])            # the super-block's activations
        pw = [builder.bitcast(builder.gep(rp["wq"][r], [builder.mul(q0, c64(4))]), I32.as_pointer())
              for r in range(R)]                                            # its weights, i32 words
        da = [vload(tp["adt"], builder.add(builder.mul(b, c64(TT)), c64(v * W)), lf) for v in range(TV)]
        wd = [ld(builder.gep(rp["wd"][r], [b])) for r in range(R)]
        if post:
            wd = [builder.fmul(x, ir.Constant(F32, 2.0 ** -post)) for x in wd]
        wd = [splat(builder, x, lf) for x in wd]
        wm = [splat(builder, ld(builder.gep(rp["wm"][r], [b])), lf) for r in range(R)] if mins else None
        for u in range(sb // unit):
            iacc = [[zi] * TV for _ in range(R)]
            for js in range(spu):
                j = u * spu + js                      # sub-block of the super-block
                acc = [[zi] * TV for _ in range(R)]
                isc = [ld(builder.gep(rp["isc"][r], [builder.add(k0, c64(j))])) if nsub > 1 else None
                       for r in range(R)]
                if packed:                                  # the pair sums times the scale, by pmaddwd
                    sc16 = [splat(builder, x, h16) if x is not None else ir.Constant(h16, [1] * (2 * W)) for x in isc]
                    p16 = [[None] * TV for _ in range(R)]
                for s in range(sub // 4):
                    e4 = (j * sub) // 4 + s                 # 4-element step of the super-block
                    av = [builder.bitcast(vload(pa, c64(e4 * TT + v * W), li), b8) for v in range(TV)]
                    if sgn and avx2 and not narrow:         # the signed activations: a + 128 ^ 0x80
                        av = [builder.xor(x, ir.Constant(b8, [128] * (4 * W))) for x in av]
                    for r in range(R):
                        wb = builder.bitcast(splat(builder, ld(builder.gep(pw[r], [c64(e4)]), align=1), li), b8)
                        for v in range(TV):
                            if packed:
                                p = maddubs(builder, av[v], wb) if narrow else maddubs(builder, wb, av[v])
                                p16[r][v] = p if p16[r][v] is None else builder.add(p16[r][v], p)
                                if s % steps == steps - 1 or s == sub // 4 - 1:
                                    acc[r][v] = builder.add(acc[r][v], maddwd(builder, p16[r][v], sc16[r]))
                                    p16[r][v] = None
                                continue
                            acc[r][v] = (_sdot(builder, acc[r][v], av[v], wb) if sgn and avx2 else
                                         _dpbusd(context, builder, acc[r][v], av[v], wb) if sgn else
                                         _dpbusd(context, builder, acc[r][v], wb, av[v]))
                for r in range(R):
                    sc = splat(builder, isc[r], li) if isc[r] is not None and not packed else None
                    for v in range(TV):
                        p = builder.mul(acc[r][v], sc) if sc is not None else acc[r][v]
                        iacc[r][v] = builder.add(iacc[r][v], p)
            ku = builder.add(k0, c64(u * spu))       # the unit's first sub-block (of the row)
            if sgn and (not avx2 or narrow):          # less 128 * sum_j sc_j * sum(w) over the unit
                for r in range(R):
                    cs = reduce_add(builder, vload(rp["corr"][r], ku, ir.VectorType(I32, spu))) if spu > 1 else \
                        ld(builder.gep(rp["corr"][r], [ku]))
                    cs = splat(builder, cs, li)
                    iacc[r] = [builder.sub(a, cs) for a in iacc[r]]
            msum = None
            if mins:                                  # per row and lane: sum_j imn_j * bsum_j over the unit
                msum = [[zi] * TV for _ in range(R)]
                for jp in range(spu // 2):
                    kp = builder.add(builder.udiv(ku, c64(2)), c64(jp))
                    bs = [builder.bitcast(vload(tp["bst"], builder.add(builder.mul(kp, c64(TT)), c64(v * W)), li),
                                          h16) for v in range(TV)]
                    for r in range(R):
                        k = builder.add(ku, c64(2 * jp))
                        lo = ld(builder.gep(rp["imn"][r], [k]))
                        hi = ld(builder.gep(rp["imn"][r], [builder.add(k, c64(1))]))
                        pair = builder.or_(builder.and_(lo, ir.Constant(I32, 0xFFFF)),
                                           builder.shl(hi, ir.Constant(I32, 16)))
                        pr = builder.bitcast(splat(builder, pair, li), h16)
                        msum[r] = [_dpwssd(context, builder, msum[r][v], bs[v], pr) for v in range(TV)]
            for r in range(R):
                for v in range(TV):
                    fi = builder.sitofp(iacc[r][v], lf)
                    if mode == GROUPS:        # sacc = fma(isum, d_a*d_w, sacc); macc = fma(msum, dmin_w*d_a, macc)
                        builder.store(builder.call(fma, [fi, builder.fmul(da[v], wd[r]), ld(sacc[r][v])]), sacc[r][v])
                        if mins:
                            builder.store(builder.call(fma, [builder.sitofp(msum[r][v], lf), builder.fmul(wm[r], da[v]),
                                                             ld(macc[r][v])]), macc[r][v])
                    else:                             # r = isum*d_w [fma(-dmin_w, msum, r)]; sacc = fma(r, d_a, sacc)
                        x = builder.fmul(fi, wd[r])
                        if mins:
                            x = builder.call(fma, [builder.fneg(wm[r]), builder.sitofp(msum[r][v], lf), x])
                        builder.store(builder.call(fma, [x, da[v], ld(sacc[r][v])]), sacc[r][v])
    for r in range(R):
        for v in range(TV):
            y = ld(sacc[r][v])
            if mode == GROUPS and mins:
                y = builder.fsub(y, ld(macc[r][v]))
            builder.store(y, builder.bitcast(builder.gep(tp["out"], [c64(r * TT + v * W)]), lf.as_pointer()), align=4)


def _lanes_codegen(context, builder, R, rp, tp, n_sb, n4):
    """IR of LANES_MODE (B32_LANES, llama.cpp's vec_dot / tinyBLAS): per block b and step l (4 elements)
    p = dpbusd(-128 * a's 4-sum, w + 128, a) = the exact lane l of its dot, f_l = fma(d_a*d_w, float(p),
    f_l) lane by lane; the result hsum_float_8 of f_0..f_7. Rows two at a time (16 accumulators)."""
    W = _lanes(context)
    TV = TT // W
    li, lf = ir.VectorType(I32, W), ir.VectorType(F32, W)
    b8 = ir.VectorType(I8, 4 * W)
    fma = fma_fn(builder, lf)
    zf, zi = ir.Constant(lf, [0.0] * W), ir.Constant(li, [0] * W)
    avx2, k128 = avx2_only(context), ir.Constant(b8, [128] * (4 * W))       # AVX2: the signed dot of w (^ 0x80) and a
    ld = builder.load

    def c64(v):
        return ir.Constant(I64, v)

    def vload(p, k, ty):
        return ld(builder.bitcast(builder.gep(p, [k]), ty.as_pointer()), align=4)
    pnc = builder.gep(tp["act"], [builder.mul(n4, c64(TT))])        # the 4-sums, after the quants
    for rows in [list(range(r, min(r + 2, R))) for r in range(0, R, 2)]:
        f = {(r, l, v): cgutils.alloca_once_value(builder, zf) for r in rows for l in range(8) for v in range(TV)}
        with cgutils.for_range(builder, n_sb) as loop:
            b = loop.index
            o = builder.mul(b, c64(8 * TT))
            pa, pn = builder.gep(tp["act"], [o]), builder.gep(pnc, [o])
            da = [vload(tp["adt"], builder.add(builder.mul(b, c64(TT)), c64(v * W)), lf) for v in range(TV)]
            d = {(r, v): builder.fmul(da[v], splat(builder, ld(builder.gep(rp["wd"][r], [b])), lf))
                 for r in rows for v in range(TV)}
            pw = {r: builder.bitcast(builder.gep(rp["wq"][r], [builder.mul(b, c64(32))]), I32.as_pointer())
                  for r in rows}
            for l in range(8):
                av = [builder.bitcast(vload(pa, c64(l * TT + v * W), li), b8) for v in range(TV)]
                nc = [vload(pn, c64(l * TT + v * W), li) for v in range(TV)]
                for r in rows:
                    wb = builder.bitcast(splat(builder, ld(builder.gep(pw[r], [c64(l)]), align=1), li), b8)
                    for v in range(TV):
                        p = builder.sitofp(_sdot(builder, zi, builder.xor(wb, k128), av[v]) if avx2 else
                                           _dpbusd(context, builder, nc[v], wb, av[v]), lf)
                        builder.store(builder.call(fma, [d[r, v], p, ld(f[r, l, v])]), f[r, l, v])
        for r in rows:
            for v in range(TV):
                x = [ld(f[r, l, v]) for l in range(8)]
                y = builder.fadd(builder.fadd(builder.fadd(x[0], x[4]), builder.fadd(x[2], x[6])),
                                 builder.fadd(builder.fadd(x[1], x[5]), builder.fadd(x[3], x[7])))
                builder.store(y, builder.bitcast(builder.gep(tp["out"], [c64(r * TT + v * W)]), lf.as_pointer()),
                              align=4)


@intrinsic(prefer_literal=True)
def _vtile(typingctx, vid, wmax, nrows, wq, wo, n_in, isc, imn, io, n_sub, wd, wm, so, n_sbs, corr, act, ao, adt, dto,
           bst, bso, n_sb, out):
    """out f32[nrows * TT] = rows (row r: wq[wo + r*n_in], isc/imn/corr[io + r*n_sub], wd/wm[so + r*n_sbs])
    . the tile's TT tokens (act[ao:], adt[dto:], bst[bso:]), in variant `vid` (a tiled() constant); wmax:
    the type's largest |w - offset| (a constant, QDot.wmax)."""
    if not all(isinstance(x, types.IntegerLiteral) for x in (vid, nrows, wmax)):
        return None
    v, R = Variant(vid.literal_value), nrows.literal_value
    if not tiled(v) or not dtypes_are((wq, isc, imn, wd, wm, corr, act, adt, bst, out),
                                      (types.int8, types.int32, types.int32, types.float32, types.float32,
                                       types.int32, types.int32, types.float32, types.int32, types.float32)):
        return None

    def codegen(context, builder, sig, args):
        a = args[2:]
        ta = sig.args[2:]

        def data(k):
            return context.make_array(ta[k])(context, builder, a[k]).data

        def rows(k, o, stride):
            p0 = builder.gep(data(k), [a[o]])
            return [builder.gep(p0, [builder.mul(a[stride], ir.Constant(I64, r))]) for r in range(R)]
        rp = {"wq": rows(1, 2, 3), "isc": rows(4, 6, 7), "imn": rows(5, 6, 7), "corr": rows(12, 6, 7),
              "wd": rows(8, 10, 11), "wm": rows(9, 10, 11)}
        tp = {"act": builder.gep(data(13), [a[14]]), "adt": builder.gep(data(15), [a[16]]),
              "bst": builder.gep(data(17), [a[18]]), "out": data(20)}
        if SPECS[v].mode == LANES:
            _lanes_codegen(context, builder, R, rp, tp, a[19], builder.udiv(a[3], ir.Constant(I64, 4)))
        else:
            _tile_codegen(context, builder, SPECS[v], R, rp, tp, a[19], wmax.literal_value)
        return context.get_dummy_value()
    return types.void(vid, wmax, nrows, wq, wo, n_in, isc, imn, io, n_sub, wd, wm, so, n_sbs, corr, act, ao, adt, dto,
                      bst, bso, n_sb, out), codegen


@intrinsic(prefer_literal=True)
def _vprep(typingctx, vid, wq, wo, n_in, isc, corr, io, n_sub):
    """One unpacked row, in place: SIGNED: wq[wo:wo+n_in] -= offset, corr[io + j] = 128 * sc_j * sum of
    sub-block j's weights (sc_j = isc[io + j] where the variant scales its sub-blocks, else 1);
    LANES_MODE: wq += 128 (as u8)."""
    if not isinstance(vid, types.IntegerLiteral) or not dtypes_are((wq, isc, corr),
                                                                   (types.int8, types.int32, types.int32)):
        return None
    sub, nsub, mins, mode, offset, grp, post = SPECS[Variant(vid.literal_value)]

    def codegen(context, builder, sig, args):
        _, wq_, wo_, _, isc_, corr_, io_, nsub_ = args
        ta = sig.args
        wp = builder.gep(context.make_array(ta[1])(context, builder, wq_).data, [wo_])
        sp = builder.gep(context.make_array(ta[4])(context, builder, isc_).data, [io_])
        cp = builder.gep(context.make_array(ta[5])(context, builder, corr_).data, [io_])
        vt = ir.VectorType(I8, sub)
        with cgutils.for_range(builder, nsub_) as loop:
            j = loop.index
            q = builder.bitcast(builder.gep(wp, [builder.mul(j, ir.Constant(I64, sub))]), vt.as_pointer())
            w = builder.load(q, align=1)
            if mode == LANES:
                builder.store(builder.xor(w, ir.Constant(vt, [0x80] * sub)), q, align=1)
            else:
                if offset:
                    w = builder.sub(w, ir.Constant(vt, [offset] * sub))
                    builder.store(w, q, align=1)
                s = builder.mul(reduce_add(builder, builder.sext(w, ir.VectorType(I32, sub))), ir.Constant(I32, 128))
                if nsub > 1:
                    s = builder.mul(s, builder.load(builder.gep(sp, [j])))
                builder.store(s, builder.gep(cp, [j]))
        return context.get_dummy_value()
    return types.void(vid, wq, wo, n_in, isc, corr, io, n_sub), codegen


@njit(cache=True)
def _tile_acts(k, t0, t1, aq, ad, bsum, n_in, n_sb, n_sub, tmode, act, adt, bst):
    # tile k <- tokens t0..t1 (at most TT; the lanes past them zeroed): aq i8[n_tok * n_in], ad
    # f32[n_tok * n_sb], bsum i32[n_tok * n_sub] (UNSIGNED's mins); SIGNED: a + 128; LANES_MODE: after
    # act, -128 * its 4-sums. Every element of the tile is written (the arrays come from np.empty)
    n4, nsp = n_in // 4, n_sub // 2
    q32 = aq.view(np.int32)
    x = _SHIFT if tmode == SIGNED else np.int32(0)
    base = k * n4 * (2 if tmode == LANES_MODE else 1)
    nj = t1 - t0
    for j in range(TT):
        t = t0 + j
        if j >= nj:                       # padding lanes: zero quants, scales and sums
            for s in range(n4 * (2 if tmode == LANES_MODE else 1)):
                act[(base + s) * TT + j] = 0
            for b in range(n_sb):
                adt[(k * n_sb + b) * TT + j] = 0
            if tmode == UNSIGNED:
                for p in range(nsp):
                    bst[(k * nsp + p) * TT + j] = 0
            continue
        for s in range(n4):
            act[(base + s) * TT + j] = q32[t * n4 + s] ^ x
        if tmode == LANES_MODE:
            for s in range(n4):
                o = t * n_in + 4 * s
                act[(base + n4 + s) * TT + j] = -128 * (np.int32(aq[o]) + aq[o + 1] + aq[o + 2] + aq[o + 3])
        for b in range(n_sb):
            adt[(k * n_sb + b) * TT + j] = ad[t * n_sb + b]
        if tmode == UNSIGNED:
            for p in range(nsp):
                bst[(k * nsp + p) * TT + j] = ((bsum[t * n_sub + 2 * p] & 0xFFFF) |
                                               (bsum[t * n_sub + 2 * p + 1] << 16))
