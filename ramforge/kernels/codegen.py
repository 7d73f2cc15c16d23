"""LLVM IR of the row dots of the integer-dot matmul, in each arithmetic variant (variants.SPECS).

`_row_codegen` emits one weight row . one token, `_rows8_codegen` 8 rows . one token (the rows'
float steps lane by lane); both take the weights from a "source": unpacked rows in scratch
(unpack.py), or the packed blocks themselves (`_raw_source`). The integer sums are exact; the
float steps are those of the llama.cpp kernel named by the variant's mode, op for op: the same
lanes, fmas and horizontal-sum order (see variants.py). rows.py wraps these in intrinsics.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from ramforge.gguf.constants import GGML_BLOCK, GGMLType

from .blocks import CHUNKS, IQ4_KV, LAYOUTS
from .lowbit_ir import RAW_SOURCES
from .scales_ir import block_scales, has_block_scales
from .unpack import _lookup16
from .iquants import LAYOUTS as IQ_LAYOUTS
from .iquants import raw_source as iq_raw_source
from .llvmir import (I8, I16, I32, I64, dot64_scaled, dot_lanes, dot_lanes_scaled, fma_fn, half_to_float, has_avx2,
                     has_avx512_vnni, has_vnni, hsum8, maddwd, native_half, pair_lanes, pick, prefetch, reduce_add,
                     scale16, splat)
from .variants import (GROUPS, IQ1_DELTA, IQ1_DLANES, IQ1_MINS, K_LANES, K_MIN4, K_MINS, K_SUM, LANES, LANES2, NO_MIN,
                       Q8_1_SUM, SCALAR_FMA, TERNARY_OFFSET, TILED)


def _row_codegen(context, builder, variant, p, wsrc, n_sb, ahead=None):
    """IR of one weight row . one token in the arithmetic of `variant` (sub, nsub, mins, mode,
    offset, grp): p maps "aq" "isc" "imn" "ad" "am" "bsum" to element pointers at their offsets;
    wsrc = (w_d(b), w_m(b), w_vec(b, e, c)): super-block b's float scale and min, and the 32 int8
    weights of its chunk c (element e of the row); ahead(b), if given, at each block (row_prefetch)."""
    sub, nsub, mins, mode, offset, grp, post = variant
    assert not post or (mins, mode) in ((NO_MIN, LANES), (NO_MIN, TILED))
    scaled = nsub > 1 and offset != TERNARY_OFFSET        # (the ternary types' scales are all 1)
    unsigned = mins not in (NO_MIN,) + IQ1_MINS or offset != 0      # types with mins or an offset store quants >= 0
    iq1 = mins in IQ1_MINS                        # quants 8*grid + delta8, split per chunk (LANES only)
    fused = scaled and not iq1                    # scaled dots as dot_lanes_scaled
    vt = ir.VectorType(I8, 32)
    l8, f8, f32 = ir.VectorType(I32, 8), ir.VectorType(ir.FloatType(), 8), ir.FloatType()
    ap, sp, mp, dap, map_, bp = (p[k] for k in ("aq", "isc", "imn", "ad", "am", "bsum"))
    w_d, w_m, w_vec = wsrc[:3]
    # a type with a quant offset c, read packed, on VNNI: dot the unsigned quants and add c * the
    # activation's sums (exact integers; no sign trick): per block (GROUPS) or per lane of 4 (LANES)
    shifted = wsrc[3] if len(wsrc) > 3 and mode in (GROUPS, LANES) and nsub == 1 and has_vnni(context) else None
    # IQ1 read packed (lowbit_ir.py): w_vec gives grid + 1 (0..2); IQ1_M's delta8 lanes from wsrc[4](b, c, ones)
    iq1raw = wsrc[4] if iq1 and len(wsrc) > 4 else None
    wide = (fused and unsigned and mode == LANES and (sub * nsub // 32) % 2 == 0 and shifted is None
            and has_avx512_vnni(context))       # scaled dots two chunks at once (dot64_scaled)
    in_regs = wsrc[5] if len(wsrc) > 5 else None            # a packed K-quant's scales, decoded in registers
    fma8, fma1 = fma_fn(builder, f8), fma_fn(builder, f32)
    zero8, zero = ir.Constant(f8, [0.0] * 8), ir.Constant(f32, 0.0)
    facc = cgutils.alloca_once_value(builder, zero8)        # the 8 f32 lanes
    facc2 = cgutils.alloca_once_value(builder, zero8)       # LANES2: odd blocks
    macc = cgutils.alloca_once_value(builder, zero8)        # min lanes / scalar (lane 0)
    sacc = cgutils.alloca_once_value(builder, zero)         # scalar accumulator
    ld = builder.load

    def at(p, k):
        return ld(builder.gep(p, [k]))

    def ivec(p, k, n):          # <n x i32> at p + k
        t = ir.VectorType(I32, n)
        return ld(builder.bitcast(builder.gep(p, [k]), t.as_pointer()), align=4)

    def fmaf(a, b, c):
        return builder.call(fma1, [a, b, c])

    def c64(v):
        return ir.Constant(I64, v)

    def lane_of(v, i):
        return builder.extract_element(v, ir.Constant(I32, i))

    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        e0 = builder.mul(b, c64(sub * nsub))
        k0 = builder.mul(b, c64(nsub))
        da = at(dap, b)
        wdb = builder.fmul(w_d(b), ir.Constant(f32, 8.0)) if iq1 else w_d(b)     # IQ1: wd = d / 8
        d = builder.fmul(da, wdb)
        dmin = builder.fneg(builder.fmul(da, w_m(b)))
        regs = in_regs(b) if in_regs is not None else None      # (isc, imn) <nsub x i32>, or None: scratch
        if ahead is not None:
            ahead(b)

        def sc_at(j):                              # sub-block j's scale (i32)
            return lane_of(regs[0], j) if regs else at(sp, builder.add(k0, c64(j)))

        def blk_vec(which, j0, n):                 # <n x i32>: scales (0) or mins (1) of sub-blocks j0..j0+n-1
            if regs:
                return pick(builder, regs[which], list(range(j0, j0 + n)))
            return ivec((sp, mp)[which], builder.add(k0, c64(j0)), n)
        iacc = ir.Constant(l8, [0] * 8)
        dacc = ir.Constant(l8, [0] * 8)            # IQ1: the delta8 lanes
        chunks = sub * nsub // 32
        if wide:                                   # two chunks a step on 512 bits, lanes 8-15 the second's,
            acc = ir.Constant(ir.VectorType(I32, 16), [0] * 16)     # folded onto 0-7 after (exact integers)
            sc16 = builder.trunc(blk_vec(0, 0, nsub), ir.VectorType(I16, nsub))
            for c in range(0, chunks, 2):
                e = builder.add(e0, c64(32 * c))
                w = chunk_pair(builder, wsrc, b, e, c)
                a = ld(builder.bitcast(builder.gep(ap, [e]), ir.VectorType(I8, 64).as_pointer()), align=1)
                sc = pick(builder, sc16, [(32 * c + 2 * j) // sub for j in range(32)])
                acc = dot64_scaled(builder, acc, w, a, sc)
            iacc = builder.add(pick(builder, acc, list(range(8))), pick(builder, acc, list(range(8, 16))))
        for c in range(0 if not wide else chunks, chunks):   # 32-element chunks
            e = builder.add(e0, c64(32 * c))
            va = w_vec(b, e, c) if shifted is None else shifted[0](b, e, c)
            vb = ld(builder.bitcast(builder.gep(ap, [e]), vt.as_pointer()), align=1)
            dpart = None
            if fused:                              # sc * dot, lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                sc = [sc_at(c * 32 // sub + h) for h in range(32 // sub)]
                iacc = dot_lanes_scaled(context, builder, iacc, va, vb, unsigned, scale16(builder, *sc),
                                        _scale8(builder, sc))
            elif iq1raw is not None:                 # grid = (grid + 1) - 1 per lane of 4; delta8 lanes of
                ones = dot_lanes(context, builder, ir.Constant(vt, [1] * 32), vb, True)     # IQ1_M from ones
                part = builder.sub(dot_lanes(context, builder, va, vb, True), ones)
                if mins == IQ1_DLANES:
                    dpart = iq1raw(b, c, ones)
            else:
                if iq1:                            # grid = (w + 4) >> 3, delta8 = w - 8*grid
                    grid = builder.ashr(builder.add(va, ir.Constant(vt, [4] * 32)), ir.Constant(vt, [3] * 32))
                    dpart = dot_lanes(context, builder, builder.sub(va, builder.shl(grid, ir.Constant(vt, [3] * 32))),
                                      vb)
                    va = grid
                part = dot_lanes(context, builder, va, vb, unsigned or shifted is not None)
            if shifted is not None and mode == LANES:        # + c * (a's sums per lane of 4)
                ones = dot_lanes(context, builder, ir.Constant(vt, [1] * 32), vb, True)
                part = builder.add(part, builder.mul(ones, ir.Constant(l8, [shifted[1]] * 8)))
            if scaled and not fused:               # IQ1: grid and delta8 lanes times the scales
                scale = _scale8(builder, [sc_at(c * 32 // sub + h) for h in range(32 // sub)])
                part = builder.mul(part, scale)
                if dpart is not None:
                    dacc = builder.add(dacc, builder.mul(dpart, scale))
            if not fused:
                iacc = builder.add(iacc, part)
            if mode == GROUPS and (c + 1) * 32 % grp == 0:    # one fma per group
                g = (c + 1) * 32 // grp - 1
                isum = reduce_add(builder, iacc)
                if shifted is not None:                      # + c * sum a over the block
                    isum = builder.add(isum, builder.mul(at(bp, b), ir.Constant(I32, shifted[1])))
                builder.store(fmaf(builder.sitofp(isum, f32), d, ld(sacc)), sacc)
                iacc = ir.Constant(l8, [0] * 8)
                if mins == K_MINS:
                    gs = grp // sub
                    msum = reduce_add(builder, builder.mul(blk_vec(1, g * gs, gs),
                                              ivec(bp, builder.add(k0, c64(g * gs)), gs)))
                    m0 = builder.extract_element(ld(macc), ir.Constant(I32, 0))
                    m0 = fmaf(builder.sitofp(msum, f32), builder.fmul(w_m(b), da), m0)
                    builder.store(builder.insert_element(zero8, m0, ir.Constant(I32, 0)), macc)
        if offset:          # Q6_K: lane c less 32 * (bsum*sc) of sub-blocks 2c, 2c+1 (a madd of the
            assert nsub == 16 and mode in (LANES, TILED)            # 16 bsums; TILED sums the lanes)
            bs = ivec(bp, k0, 16)
            if offset == TERNARY_OFFSET:
                corr = pair_lanes(builder, bs)
            elif has_avx2(context):                # one pmaddwd: |bsum| <= 16*128 and |scale| <= 128 fit in i16
                v16 = ir.VectorType(I16, 16)
                corr = maddwd(builder, builder.trunc(bs, v16), builder.trunc(blk_vec(0, 0, 16), v16))
            else:
                corr = pair_lanes(builder, builder.mul(bs, blk_vec(0, 0, 16)))
            iacc = builder.sub(iacc, builder.mul(corr, ir.Constant(l8, [offset] * 8)))
        if mode == TILED:
            r = builder.fmul(builder.sitofp(reduce_add(builder, iacc), f32), _post_scaled(builder, w_d(b), post))
            if mins == K_MINS:
                msum = reduce_add(builder, builder.mul(blk_vec(1, 0, nsub), ivec(bp, k0, nsub)))
                r = fmaf(builder.fneg(w_m(b)), builder.sitofp(msum, f32), r)
            builder.store(fmaf(r, da, ld(sacc)), sacc)          # (GCC contracts add(mul))
        elif mode == LANES2:                       # even blocks in facc, odd in facc2, an
            odd = builder.trunc(b, ir.IntType(1))     # odd count's last block as a scalar
            tail = builder.icmp_signed("==", builder.or_(b, c64(1)), n_sb)
            with builder.if_else(tail) as (then_tail, not_tail):
                with then_tail:
                    builder.store(builder.sitofp(reduce_add(builder, iacc), f32), sacc)
                    builder.store(builder.insert_element(zero8, d, ir.Constant(I32, 0)), macc)
                with not_tail:
                    with builder.if_else(odd) as (then, otherwise):
                        with then:
                            builder.store(builder.call(fma8, [splat(builder, d, f8), builder.sitofp(iacc, f8),
                                                              ld(facc2)]), facc2)
                        with otherwise:
                            builder.store(builder.call(fma8, [splat(builder, d, f8), builder.sitofp(iacc, f8),
                                                              ld(facc)]), facc)
        elif mode == LANES:
            if mins == K_LANES:                    # Q2_K: min pairs into the lanes first
                ml = pair_lanes(builder, builder.mul(blk_vec(1, 0, 16), ivec(bp, k0, 16)))
                builder.store(builder.call(fma8, [splat(builder, dmin, f8), builder.sitofp(ml, f8),
                                                  ld(facc)]), facc)
            builder.store(builder.call(fma8, [splat(builder, d, f8), builder.sitofp(iacc, f8),
                                              ld(facc)]), facc)
            m = ld(macc)
            if mins == Q8_1_SUM or mins == K_SUM:  # scalar summs (lane 0)
                if mins == Q8_1_SUM:
                    x, y = w_m(b), at(map_, b)
                else:
                    msum = reduce_add(builder, builder.mul(blk_vec(1, 0, nsub), ivec(bp, k0, nsub)))
                    x, y = dmin, builder.sitofp(msum, f32)
                m0 = builder.extract_element(m, ir.Constant(I32, 0))
                m0 = fmaf(x, y, m0) if SCALAR_FMA else builder.fadd(m0, builder.fmul(x, y))
                builder.store(builder.insert_element(m, m0, ir.Constant(I32, 0)), macc)
            elif mins == K_MIN4:                   # Q4_K: 4 lanes of min pairs (lanes 0-3)
                ml = pair_lanes(builder, builder.mul(blk_vec(1, 0, 8), ivec(bp, k0, 8)))
                ml = builder.shuffle_vector(ml, ml, ir.Constant(l8, [0, 1, 2, 3, 0, 1, 2, 3]))
                builder.store(builder.call(fma8, [splat(builder, dmin, f8), builder.sitofp(ml, f8), m]), macc)
            elif mins == IQ1_DELTA:                # IQ1_S: accum1 += d * sumi1 (lane 0); packed: sumi1 =
                sumi1 = reduce_add(builder, dacc if iq1raw is None else   # sum of imn (+-scale) * bsum per 32
                                   builder.mul(blk_vec(1, 0, nsub), ivec(bp, k0, nsub)))
                m0 = fmaf(d, builder.sitofp(sumi1, f32), lane_of(m, 0))
                builder.store(builder.insert_element(m, m0, ir.Constant(I32, 0)), macc)
            elif mins == IQ1_DLANES:               # IQ1_M: accum2 = fma(d, sumi2, accum2), 8 lanes
                builder.store(builder.call(fma8, [splat(builder, d, f8), builder.sitofp(dacc, f8), m]), macc)

    def lane(v, i):
        return builder.extract_element(v, ir.Constant(I32, i))
    m = ld(macc)
    if mode == GROUPS:
        return builder.fsub(ld(sacc), lane(m, 0)) if mins == K_MINS else ld(sacc)
    if mode == TILED:
        return ld(sacc)
    if mode == LANES2:
        r = hsum8(builder, builder.fadd(ld(facc), ld(facc2)))
        odd_n = builder.trunc(n_sb, ir.IntType(1))
        tail = fmaf(lane(m, 0), ld(sacc), r)      # + the tail's d * isum (sumf += d * sumi: an fma)
        return builder.select(odd_n, tail, r)
    r = hsum8(builder, ld(facc))
    if post:                                       # the codebook types' 2^-post * hsum
        r = _post_scaled(builder, r, post)
    if mins in (Q8_1_SUM, K_SUM):
        r = builder.fadd(r, lane(m, 0))
    elif mins == K_MIN4:                           # (m0 + m2) + (m1 + m3)
        r = builder.fadd(r, builder.fadd(builder.fadd(lane(m, 0), lane(m, 2)),
                                         builder.fadd(lane(m, 1), lane(m, 3))))
    elif mins in IQ1_MINS:                         # hsum + IQ1*_DELTA * accum1 (or hsum of accum2)
        acc1 = lane(m, 0) if mins == IQ1_DELTA else hsum8(builder, m)
        r = fmaf(ir.Constant(f32, 0.125), acc1, r) if SCALAR_FMA else \
            builder.fadd(r, builder.fmul(ir.Constant(f32, 0.125), acc1))
    return r


def _scale8(builder, sc):
    """<8 x i32> lanes of a chunk's sub-block scales: sc[0] in every lane, or sc[0] in lanes 0-3 and
    sc[1] in 4-7 (16-element sub-blocks)."""
    l8 = ir.VectorType(I32, 8)
    sv = [splat(builder, s, l8) for s in sc]
    return sv[0] if len(sv) == 1 else builder.shuffle_vector(sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))


def _post_scaled(builder, v, post):
    """v * 2^-post (float or <n x float>; exact: a power of two), v itself when post is 0."""
    if not post:
        return v
    f = ir.Constant(ir.FloatType(), 2.0 ** -post)
    return builder.fmul(v, splat(builder, f, v.type) if isinstance(v.type, ir.VectorType) else f)


def scales_in_registers(t) -> bool:
    """Whether _raw_source decodes type t's sub-block scales itself (no scratch to unpack them into)."""
    return (t in CHUNKS or t == GGMLType.IQ4_XS) and has_block_scales(t)


def _raw_source(context, builder, t, rp, p):
    """wsrc for _row_codegen over a packed row at rp (i8*) of type t's blocks (blocks.LAYOUTS):
    weights built in registers exactly as the unpackers build them in memory. The super-block types
    take their float scales from the row's scratch p["wd"], p["wm"] (unpacked per row by the kernel);
    the 32-element types read theirs, f16, from the blocks."""
    if t in RAW_SOURCES:                       # TQ1_0, IQ1_S, IQ1_M (lowbit_ir.py)
        return RAW_SOURCES[t](context, builder, rp, p)
    if t in IQ_LAYOUTS:                        # the codebook types: grid lookups in registers
        return iq_raw_source(builder, t, rp, p)
    v16, v32, w32 = ir.VectorType(I8, 16), ir.VectorType(I8, 32), ir.VectorType(I32, 32)
    L = LAYOUTS[t]

    def blk(b, off, ty):
        q = builder.gep(rp, [builder.add(builder.mul(b, ir.Constant(I64, L.nbytes)), ir.Constant(I64, off))])
        return builder.load(builder.bitcast(q, ty.as_pointer()), align=1)

    def k(v):
        return ir.Constant(v32, [v] * 32)

    native = native_half(context)
    if t == GGMLType.IQ4_XS:                   # codebook nibbles: one 32-byte table lookup (pshufb)
        kv = [ir.Constant(I8, x & 0xFF) for x in IQ4_KV]

        def w_vec(b, e, c):                    # sub-block c: 16 bytes, low nibbles then high
            v = blk(b, L.qs + 16 * c, v16)
            lo, hi = builder.and_(v, ir.Constant(v16, [15] * 16)), builder.lshr(v, ir.Constant(v16, [4] * 16))
            if not has_avx2(context):
                table = ir.Constant(v16, kv)
                return builder.shuffle_vector(_lookup16(builder, table, lo), _lookup16(builder, table, hi),
                                              ir.Constant(w32, list(range(32))))
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32, v32]),
                                                "llvm.x86.avx2.pshuf.b")
            idx = builder.shuffle_vector(lo, hi, ir.Constant(w32, list(range(32))))
            return builder.call(fn, [ir.Constant(v32, kv + kv), idx])  # (in-lane: the table in both halves)

        def w_d4(b):
            return half_to_float(context, builder, blk(b, L.d, I16), native)
        return w_d4, w_d4, w_vec, None, None, lambda b: block_scales(builder, t, lambda o, ty: blk(b, o, ty))
    if t in CHUNKS:
        def w_vec(b, e, c):                    # chunk c as unpack._bits builds it (blocks.CHUNKS)
            ao, sa, ma, bo, sb, mb, lb, c0 = CHUNKS[t][c]
            r = builder.and_(builder.lshr(blk(b, ao, v32), k(sa)), k(ma))
            if mb:
                h = builder.and_(builder.lshr(blk(b, bo, v32), k(sb)), k(mb))
                r = builder.add(r, builder.shl(h, k(lb)))
            return builder.add(r, k(c0)) if c0 else r
        pair = _chunk_pair(builder, t, blk)
        if not has_block_scales(t):            # the row's scales unpacked into scratch by the kernel
            return (lambda b: builder.load(builder.gep(p["wd"], [b])),
                    lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec, None, None, None, pair)

        def w_d(b):                            # f16 (Q8_K: f32) as blocks._scales_fn reads it
            if t == GGMLType.Q8_K:
                return blk(b, L.d, ir.FloatType())
            return half_to_float(context, builder, blk(b, L.d, I16), native)

        def w_m(b):
            return half_to_float(context, builder, blk(b, L.m, I16), native) if L.m >= 0 else w_d(b)
        return w_d, w_m, w_vec, None, None, lambda b: block_scales(builder, t, lambda o, ty: blk(b, o, ty)), pair

    def w_unsigned(b, e, chunk):               # the quants before the bias (0..15 or 0..31): blocks._nibble
        v = blk(b, L.qs, v16)                  # order, low nibbles then high, | the qh bits << 4
        lo = builder.and_(v, ir.Constant(v16, [15] * 16))
        hi = builder.lshr(v, ir.Constant(v16, [4] * 16))
        r = builder.shuffle_vector(lo, hi, ir.Constant(w32, list(range(32))))
        if L.qh >= 0:
            bits = builder.lshr(splat(builder, blk(b, L.qh, I32), w32), ir.Constant(w32, list(range(32))))
            bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
            r = builder.add(r, builder.trunc(bits, v32))
        return r

    def w_vec(b, e, chunk):
        if t == GGMLType.Q8_0:
            return blk(b, L.qs, v32)
        r = w_unsigned(b, e, chunk)
        return builder.add(r, k(L.bias)) if L.bias else r

    def w_d(b):
        return half_to_float(context, builder, blk(b, L.d, I16), native)

    def w_m(b):                                # (a type without m: d, unused)
        return half_to_float(context, builder, blk(b, L.m if L.m >= 0 else L.d, I16), native)
    return w_d, w_m, w_vec, ((w_unsigned, L.bias) if L.bias else None)


_ROW_AHEAD = 8192   # one core streamed Q6_K rows at 22 GB/s without, 30 with 4 KiB, 35-37 with 8 KiB


def row_prefetch(builder, t, rp):
    """ahead(b) for _row_codegen over a packed row at rp (i8*) of type t: its bytes _ROW_AHEAD past block b
    prefetched (a line a block, or a block's lines); rows lie one after another, so past a row's end
    the next row's."""
    nbytes = GGML_BLOCK[t][1]
    return lambda b: prefetch(builder, builder.gep(rp, [builder.mul(b, ir.Constant(I64, nbytes))]), nbytes,
                              _ROW_AHEAD)


def chunk_pair(builder, wsrc, b, e, c):
    """<64 x i8>: chunks c and c+1 (elements e..e+63) of super-block b of a source wsrc: its 512-bit
    builder (wsrc[6], _chunk_pair) where it has one, else its two chunks joined."""
    w = wsrc[6](b, c) if len(wsrc) > 6 else None
    if w is not None:
        return w
    return builder.shuffle_vector(wsrc[2](b, e, c), wsrc[2](b, builder.add(e, ir.Constant(I64, 32)), c + 1),
                                  ir.Constant(ir.VectorType(I32, 64), list(range(64))))


def _chunk_pair(builder, t, blk):
    """pair(b, c) -> <64 x i8>: chunks c and c+1 of super-block b (blocks.CHUNKS) side by side, built on
    512 bits: each bit field read once, as 64 bytes where the two chunks' bytes follow each other, or as
    32 bytes broadcast where they share them, then shifted lane by lane (the same quants as w_vec's
    two chunks); None where a field's bytes of the two chunks do neither."""
    v32, v64, w32 = ir.VectorType(I8, 32), ir.VectorType(I8, 64), ir.VectorType(I16, 32)
    twice = ir.Constant(ir.VectorType(I32, 64), list(range(32)) * 2)
    fs = CHUNKS[t]

    def field(b, o0, o1, s0, s1, m, lb=0):    # ((the field >> s) & m) << lb, where the bytes of chunk c
        if o1 == o0 + 32 and s0 == s1:        # are at o0, of chunk c+1 at o1
            v = blk(b, o0, v64)
        elif o1 == o0:
            v = blk(b, o0, v32)
            v = builder.shuffle_vector(v, v, twice)
        else:
            return None
        if (m << max(s0, s1)) > 255:           # (shifts per 16 bits: no kept bit may come from the next byte)
            return None
        w = builder.bitcast(v, w32)
        if lb >= max(s0, s1):                  # one shift left to the bits' place (the bits the low byte
            w = builder.shl(w, ir.Constant(w32, [lb - s0] * 16 + [lb - s1] * 16))       # pushes over: masked)
        elif lb <= min(s0, s1):
            w = builder.lshr(w, ir.Constant(w32, [s0 - lb] * 16 + [s1 - lb] * 16))
        else:                                  # (one half left, one right: no type's fields)
            return None
        return builder.and_(builder.bitcast(w, v64), ir.Constant(v64, [m << lb] * 64))

    def pair(b, c):
        (ao, sa, ma, bo, sb, mb, lb, c0), f1 = fs[c], fs[c + 1]
        assert (ma, mb, lb, c0) == (f1[2], f1[5], f1[6], f1[7])
        r = field(b, ao, f1[0], sa, f1[1], ma)
        if mb and r is not None:
            h = field(b, bo, f1[3], sb, f1[4], mb, lb)
            r = None if h is None else builder.or_(r, h)       # (disjoint bits)
        if r is None:
            return None
        return builder.add(r, ir.Constant(v64, [c0] * 64)) if c0 else r
    return pair


def _sum_rows8(builder, vs):
    """8 vectors <8 x i32> -> <8 x i32> whose lane r is the sum of vs[r]'s lanes (exact integers,
    so any order): three levels of pairwise shuffles and adds."""
    l8 = vs[0].type
    for lo, hi in (([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]),
                   ([0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]),
                   ([0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15])):
        vs = [builder.add(builder.shuffle_vector(a, b, ir.Constant(l8, lo)),
                          builder.shuffle_vector(a, b, ir.Constant(l8, hi))) for a, b in zip(vs[::2], vs[1::2])]
    return vs[0]


def _rows8_codegen(context, builder, variant, p, wsrcs, iscs, imns, n_sb):
    """<8 x float>: 8 weight rows . one token, the rows' scalar float steps done lane by lane. GROUPS
    (repacked gemv / gemm): per group, sacc_r = fma(float(isum_r), d_a*d_w, sacc_r), for mins
    macc_r = fma(float(msum_r), dmin_w*d_a, macc_r); result sacc_r - macc_r. TILED (the K-quant
    tiled matmul): per super-block r = float(isum_r)*d_w [r = fma(-dmin_w, float(msum_r), r)],
    sacc_r = fma(r, d_a, sacc_r). wsrcs: each row's (w_d, w_m, w_vec) as in _row_codegen; iscs, imns:
    each row's sub-block scale / min pointers."""
    sub, nsub, mins, mode, offset, grp, post = variant
    assert not post or mode == TILED
    assert mode in (GROUPS, TILED) and (not offset or mode == TILED) or (mode, nsub, mins) == (LANES, 1, NO_MIN)
    unsigned = mins != NO_MIN or offset != 0
    l8, f8 = ir.VectorType(I32, 8), ir.VectorType(ir.FloatType(), 8)
    ap, dap, bp = p["aq"], p["ad"], p["bsum"]
    fma8 = fma_fn(builder, f8)
    zero8 = ir.Constant(f8, [0.0] * 8)
    sacc = cgutils.alloca_once_value(builder, zero8)
    macc = cgutils.alloca_once_value(builder, zero8)
    faccs = [cgutils.alloca_once_value(builder, zero8) for _ in wsrcs] if mode == LANES else []
    vt = ir.VectorType(I8, 32)

    def c64(v):
        return ir.Constant(I64, v)

    def ivec(q, k, n):
        return builder.load(builder.bitcast(builder.gep(q, [k]), ir.VectorType(I32, n).as_pointer()), align=4)

    def lanes8(vals, ty):
        v = ir.Constant(ty, ir.Undefined)
        for i, x in enumerate(vals):
            v = builder.insert_element(v, x, ir.Constant(I32, i))
        return v

    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        e0, k0 = builder.mul(b, c64(sub * nsub)), builder.mul(b, c64(nsub))
        da = builder.load(builder.gep(dap, [b]))
        da8 = splat(builder, da, f8)
        wd8 = _post_scaled(builder, lanes8([w_d(b) for w_d, _, _ in wsrcs], f8), post)
        d8 = builder.fmul(da8, wd8)
        iacc = [ir.Constant(l8, [0] * 8)] * 8
        for c in range(sub * nsub // 32):
            e = builder.add(e0, c64(32 * c))
            vb = builder.load(builder.bitcast(builder.gep(ap, [e]), vt.as_pointer()), align=1)
            for r, (_, _, w_vec) in enumerate(wsrcs):
                part = dot_lanes(context, builder, w_vec(b, e, c), vb, unsigned)
                if nsub > 1:                       # lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                    ks = [builder.add(k0, c64(c * 32 // sub + h)) for h in range(32 // sub)]
                    sv = [splat(builder, builder.load(builder.gep(iscs[r], [k])), l8) for k in ks]
                    scale = sv[0] if sub == 32 else builder.shuffle_vector(
                        sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))
                    part = builder.mul(part, scale)
                iacc[r] = builder.add(iacc[r], part)
            if mode == LANES:                      # each row its 8 lanes: fma(d_a*d_w, lanes, acc)
                for r, (w_d, _, _) in enumerate(wsrcs):
                    dr = splat(builder, builder.fmul(da, w_d(b)), f8)
                    builder.store(builder.call(fma8, [dr, builder.sitofp(iacc[r], f8), builder.load(faccs[r])]),
                                  faccs[r])
            if mode == GROUPS and (c + 1) * 32 % grp == 0:    # one fma per group and row
                g = (c + 1) * 32 // grp - 1
                isum = builder.sitofp(_sum_rows8(builder, iacc), f8)
                builder.store(builder.call(fma8, [isum, d8, builder.load(sacc)]), sacc)
                iacc = [ir.Constant(l8, [0] * 8)] * 8
                if mins == K_MINS:
                    gs = grp // sub
                    kg = builder.add(k0, c64(g * gs))
                    bs = ivec(bp, kg, gs)
                    msum = lanes8([reduce_add(builder, builder.mul(ivec(m, kg, gs), bs)) for m in imns], l8)
                    wm8 = builder.fmul(lanes8([w_m(b) for _, w_m, _ in wsrcs], f8), da8)
                    builder.store(builder.call(fma8, [builder.sitofp(msum, f8), wm8, builder.load(macc)]), macc)
        if mode == TILED:                          # per super-block and row
            if offset:                             # Q6_K: less 32 * (bsum*sc) per sub-block pair
                bs = ivec(bp, k0, 16)
                iacc = [builder.sub(a, builder.mul(pair_lanes(builder, builder.mul(bs, ivec(iscs[r], k0, 16))),
                                                   ir.Constant(l8, [offset] * 8))) for r, a in enumerate(iacc)]
            r8 = builder.fmul(builder.sitofp(_sum_rows8(builder, iacc), f8), wd8)
            if mins == K_MINS:
                bs = ivec(bp, k0, nsub)
                msum = lanes8([reduce_add(builder, builder.mul(ivec(m, k0, nsub), bs)) for m in imns], l8)
                wm8 = lanes8([w_m(b) for _, w_m, _ in wsrcs], f8)
                r8 = builder.call(fma8, [builder.fneg(wm8), builder.sitofp(msum, f8), r8])
            builder.store(builder.call(fma8, [r8, da8, builder.load(sacc)]), sacc)
    if mode == LANES:
        return lanes8([hsum8(builder, builder.load(f)) for f in faccs], f8)
    r = builder.load(sacc)
    return builder.fsub(r, builder.load(macc)) if mode == GROUPS and mins == K_MINS else r
