"""LLVM IR of one weight row . one token in an arithmetic variant (variants.SPECS): `row_codegen`.

The weights come from a `RowSource` (unpacked rows in scratch, rows.py; or the packed blocks
themselves, codegen._raw_source). Per super-block the exact integer sums are built chunk by chunk
(`_RowDot.dots`), then the float steps of the llama.cpp kernel named by the variant's mode follow,
op for op (the same lanes, fmas and horizontal-sum order): one method per mode, GROUPS (`group_step`,
inside the chunk loop), TILED, LANES2, LANES (`tiled_end`, `lanes2_end`, `lanes_end`), and the
final sums (`finish`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from llvmlite import ir
from numba.core import cgutils

from .llvmir import (I8, I16, I32, I64, dot64_scaled, dot_lanes, dot_lanes_scaled, fma_fn, has_avx2, has_avx512_vnni,
                     has_vnni, hsum8, maddwd, pair_lanes, pick, reduce_add, scale16, splat)
from .variants import (GROUPS, IQ1_DELTA, IQ1_DLANES, IQ1_MINS, K_LANES, K_MIN4, K_MINS, K_SUM, LANES, LANES2, NO_MIN,
                       Q8_1_SUM, SCALAR_FMA, TERNARY_OFFSET, TILED)


class RowSource(NamedTuple):
    """Where a row dot's weights come from: IR builders, called per super-block b (an i64 value)."""

    w_d: Callable                       # w_d(b): super-block b's float scale
    w_m: Callable                       # w_m(b): its float min (the scale again where the type has none)
    w_vec: Callable                     # w_vec(b, e, c): <32 x i8> weights of chunk c (element e of the row)
    shifted: tuple | None = None        # (w_unsigned, c): a packed type's quants before their offset c (Q4_0: -8)
    iq1_delta: object = None            # IQ1 read packed: True (IQ1_S) or delta(b, c, ones), IQ1_M's delta8 lanes
    scales: Callable | None = None      # scales(b): (isc, imn) <nsub x i32>, decoded in registers (packed K-quants)
    pair: Callable | None = None        # pair(b, c): <64 x i8> of chunks c, c+1 at once, or None (chunk_pair)


def scale8(builder, sc):
    """<8 x i32> lanes of a chunk's sub-block scales: sc[0] in every lane, or sc[0] in lanes 0-3 and
    sc[1] in 4-7 (16-element sub-blocks)."""
    l8 = ir.VectorType(I32, 8)
    sv = [splat(builder, s, l8) for s in sc]
    return sv[0] if len(sv) == 1 else builder.shuffle_vector(sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))


def post_scaled(builder, v, post):
    """v * 2^-post (float or <n x float>; exact: a power of two), v itself when post is 0."""
    if not post:
        return v
    f = ir.Constant(ir.FloatType(), 2.0 ** -post)
    return builder.fmul(v, splat(builder, f, v.type) if isinstance(v.type, ir.VectorType) else f)


def chunk_pair(builder, wsrc: RowSource, b, e, c):
    """<64 x i8>: chunks c and c+1 (elements e..e+63) of super-block b of a source: its 512-bit builder
    (wsrc.pair) where it has one, else its two chunks joined."""
    w = wsrc.pair(b, c) if wsrc.pair is not None else None
    if w is not None:
        return w
    return builder.shuffle_vector(wsrc.w_vec(b, e, c), wsrc.w_vec(b, builder.add(e, ir.Constant(I64, 32)), c + 1),
                                  ir.Constant(ir.VectorType(I32, 64), list(range(64))))


class _Block(NamedTuple):
    """One super-block's values in the row loop."""

    b: object                           # its index (i64)
    e0: object                          # its first element
    k0: object                          # its first sub-block
    da: object                          # the activation's scale
    d: object                           # d_a * d_w
    dmin: object                        # -(d_a * dmin_w)
    regs: tuple | None                  # (isc, imn) in registers (RowSource.scales), or None: scratch


def row_codegen(context, builder, variant, p, wsrc: RowSource, n_sb, ahead=None):
    """IR of one weight row . one token in the arithmetic of `variant` (sub, nsub, mins, mode, offset,
    grp, post): p maps "aq" "isc" "imn" "ad" "am" "bsum" to element pointers at their offsets; wsrc:
    the weights (RowSource); ahead(b), if given, at each block (codegen.row_prefetch)."""
    r = _RowDot(context, builder, variant, p, wsrc)
    with cgutils.for_range(builder, n_sb) as loop:
        blk = r.block(loop.index)
        if ahead is not None:
            ahead(blk.b)
        iacc, dacc = r.dots(blk)
        if r.offset:
            iacc = r.offset_fix(blk, iacc)
        if r.mode == TILED:
            r.tiled_end(blk, iacc)
        elif r.mode == LANES2:
            r.lanes2_end(blk, iacc, n_sb)
        elif r.mode == LANES:
            r.lanes_end(blk, iacc, dacc)
    return r.finish(n_sb)


class _RowDot:
    """The state of one row_codegen: the variant's fields and flags, the pointers, the accumulators."""

    def __init__(self, context, builder, variant, p, wsrc: RowSource):
        sub, nsub, mins, mode, offset, grp, post = variant
        assert not post or (mins, mode) in ((NO_MIN, LANES), (NO_MIN, TILED))
        self.context, self.builder, self.wsrc = context, builder, wsrc
        self.sub, self.nsub, self.mins, self.mode, self.offset, self.grp, self.post = variant
        self.scaled = nsub > 1 and offset != TERNARY_OFFSET        # (the ternary types' scales are all 1)
        self.unsigned = mins not in (NO_MIN,) + IQ1_MINS or offset != 0     # mins or an offset: quants >= 0
        self.iq1 = mins in IQ1_MINS                    # quants 8*grid + delta8, split per chunk (LANES only)
        self.fused = self.scaled and not self.iq1      # scaled dots as dot_lanes_scaled
        self.vt = ir.VectorType(I8, 32)
        self.l8, self.f8, self.f32 = ir.VectorType(I32, 8), ir.VectorType(ir.FloatType(), 8), ir.FloatType()
        self.ap, self.sp, self.mp, self.dap, self.map_, self.bp = (p[k] for k in ("aq", "isc", "imn", "ad", "am",
                                                                                  "bsum"))
        # a type with a quant offset c, read packed, on VNNI: dot the unsigned quants and add c * the
        # activation's sums (exact integers; no sign trick): per block (GROUPS) or per lane of 4 (LANES)
        self.shifted = wsrc.shifted if mode in (GROUPS, LANES) and nsub == 1 and has_vnni(context) else None
        # IQ1 read packed (lowbit_ir.py): w_vec gives grid + 1 (0..2); IQ1_M's delta8 lanes from iq1_delta
        self.iq1raw = wsrc.iq1_delta if self.iq1 else None
        self.wide = (self.fused and self.unsigned and mode == LANES and (sub * nsub // 32) % 2 == 0
                     and self.shifted is None and has_avx512_vnni(context))   # two chunks at once (dot64_scaled)
        self.fma8, self.fma1 = fma_fn(builder, self.f8), fma_fn(builder, self.f32)
        self.zero8, zero = ir.Constant(self.f8, [0.0] * 8), ir.Constant(self.f32, 0.0)
        self.facc = cgutils.alloca_once_value(builder, self.zero8)      # the 8 f32 lanes
        self.facc2 = cgutils.alloca_once_value(builder, self.zero8)     # LANES2: odd blocks
        self.macc = cgutils.alloca_once_value(builder, self.zero8)      # min lanes / scalar (lane 0)
        self.sacc = cgutils.alloca_once_value(builder, zero)            # scalar accumulator

    # ---- small IR helpers
    def at(self, p, k):
        return self.builder.load(self.builder.gep(p, [k]))

    def ivec(self, p, k, n):            # <n x i32> at p + k
        t = ir.VectorType(I32, n)
        return self.builder.load(self.builder.bitcast(self.builder.gep(p, [k]), t.as_pointer()), align=4)

    def fmaf(self, a, b, c):
        return self.builder.call(self.fma1, [a, b, c])

    @staticmethod
    def c64(v):
        return ir.Constant(I64, v)

    def lane(self, v, i):
        return self.builder.extract_element(v, ir.Constant(I32, i))

    def sc_at(self, blk: _Block, j):    # sub-block j's scale (i32)
        return self.lane(blk.regs[0], j) if blk.regs else self.at(self.sp, self.builder.add(blk.k0, self.c64(j)))

    def blk_vec(self, blk: _Block, which, j0, n):   # <n x i32>: scales (0) or mins (1) of sub-blocks j0..j0+n-1
        if blk.regs:
            return pick(self.builder, blk.regs[which], list(range(j0, j0 + n)))
        return self.ivec((self.sp, self.mp)[which], self.builder.add(blk.k0, self.c64(j0)), n)

    # ---- per super-block
    def block(self, b) -> _Block:
        bd, w = self.builder, self.wsrc
        e0 = bd.mul(b, self.c64(self.sub * self.nsub))
        k0 = bd.mul(b, self.c64(self.nsub))
        da = self.at(self.dap, b)
        wdb = bd.fmul(w.w_d(b), ir.Constant(self.f32, 8.0)) if self.iq1 else w.w_d(b)     # IQ1: wd = d / 8
        d = bd.fmul(da, wdb)
        dmin = bd.fneg(bd.fmul(da, w.w_m(b)))
        regs = w.scales(b) if w.scales is not None else None
        return _Block(b, e0, k0, da, d, dmin, regs)

    def dots(self, blk: _Block):
        """The block's integer lanes (iacc <8 x i32>; IQ1: dacc, its delta8 lanes), chunk by chunk;
        GROUPS takes its float step per group on the way (group_step)."""
        bd, ctx, vt, l8 = self.builder, self.context, self.vt, self.l8
        b, e0 = blk.b, blk.e0
        iacc = ir.Constant(l8, [0] * 8)
        dacc = ir.Constant(l8, [0] * 8)            # IQ1: the delta8 lanes
        chunks = self.sub * self.nsub // 32
        if self.wide:                              # two chunks a step on 512 bits, lanes 8-15 the second's,
            acc = ir.Constant(ir.VectorType(I32, 16), [0] * 16)     # folded onto 0-7 after (exact integers)
            sc16 = bd.trunc(self.blk_vec(blk, 0, 0, self.nsub), ir.VectorType(I16, self.nsub))
            for c in range(0, chunks, 2):
                e = bd.add(e0, self.c64(32 * c))
                w = chunk_pair(bd, self.wsrc, b, e, c)
                a = bd.load(bd.bitcast(bd.gep(self.ap, [e]), ir.VectorType(I8, 64).as_pointer()), align=1)
                sc = pick(bd, sc16, [(32 * c + 2 * j) // self.sub for j in range(32)])
                acc = dot64_scaled(bd, acc, w, a, sc)
            iacc = bd.add(pick(bd, acc, list(range(8))), pick(bd, acc, list(range(8, 16))))
        for c in range(0 if not self.wide else chunks, chunks):   # 32-element chunks
            e = bd.add(e0, self.c64(32 * c))
            va = self.wsrc.w_vec(b, e, c) if self.shifted is None else self.shifted[0](b, e, c)
            vb = bd.load(bd.bitcast(bd.gep(self.ap, [e]), vt.as_pointer()), align=1)
            dpart = None
            if self.fused:                         # sc * dot, lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                sc = [self.sc_at(blk, c * 32 // self.sub + h) for h in range(32 // self.sub)]
                iacc = dot_lanes_scaled(ctx, bd, iacc, va, vb, self.unsigned, scale16(bd, *sc), scale8(bd, sc))
            elif self.iq1raw is not None:          # grid = (grid + 1) - 1 per lane of 4; delta8 lanes of
                ones = dot_lanes(ctx, bd, ir.Constant(vt, [1] * 32), vb, True)     # IQ1_M from ones
                part = bd.sub(dot_lanes(ctx, bd, va, vb, True), ones)
                if self.mins == IQ1_DLANES:
                    dpart = self.iq1raw(b, c, ones)
            else:
                if self.iq1:                       # grid = (w + 4) >> 3, delta8 = w - 8*grid
                    grid = bd.ashr(bd.add(va, ir.Constant(vt, [4] * 32)), ir.Constant(vt, [3] * 32))
                    dpart = dot_lanes(ctx, bd, bd.sub(va, bd.shl(grid, ir.Constant(vt, [3] * 32))), vb)
                    va = grid
                part = dot_lanes(ctx, bd, va, vb, self.unsigned or self.shifted is not None)
            if self.shifted is not None and self.mode == LANES:      # + c * (a's sums per lane of 4)
                ones = dot_lanes(ctx, bd, ir.Constant(vt, [1] * 32), vb, True)
                part = bd.add(part, bd.mul(ones, ir.Constant(l8, [self.shifted[1]] * 8)))
            if self.scaled and not self.fused:     # IQ1: grid and delta8 lanes times the scales
                scale = scale8(bd, [self.sc_at(blk, c * 32 // self.sub + h) for h in range(32 // self.sub)])
                part = bd.mul(part, scale)
                if dpart is not None:
                    dacc = bd.add(dacc, bd.mul(dpart, scale))
            if not self.fused:
                iacc = bd.add(iacc, part)
            if self.mode == GROUPS and (c + 1) * 32 % self.grp == 0:    # one fma per group
                self.group_step(blk, iacc, (c + 1) * 32 // self.grp - 1)
                iacc = ir.Constant(l8, [0] * 8)
        return iacc, dacc

    def group_step(self, blk: _Block, iacc, g):
        """GROUPS, at the end of group g: sacc = fma(isum, d, sacc) [macc = fma(msum, dmin_w * d_a, macc)]."""
        bd = self.builder
        isum = reduce_add(bd, iacc)
        if self.shifted is not None:                     # + c * sum a over the block
            isum = bd.add(isum, bd.mul(self.at(self.bp, blk.b), ir.Constant(I32, self.shifted[1])))
        bd.store(self.fmaf(bd.sitofp(isum, self.f32), blk.d, bd.load(self.sacc)), self.sacc)
        if self.mins == K_MINS:
            gs = self.grp // self.sub
            msum = reduce_add(bd, bd.mul(self.blk_vec(blk, 1, g * gs, gs),
                                         self.ivec(self.bp, bd.add(blk.k0, self.c64(g * gs)), gs)))
            m0 = bd.extract_element(bd.load(self.macc), ir.Constant(I32, 0))
            m0 = self.fmaf(bd.sitofp(msum, self.f32), bd.fmul(self.wsrc.w_m(blk.b), blk.da), m0)
            bd.store(bd.insert_element(self.zero8, m0, ir.Constant(I32, 0)), self.macc)

    def offset_fix(self, blk: _Block, iacc):
        """Q6_K (and the ternary types): lane c less offset * (bsum*sc) of sub-blocks 2c, 2c+1 (a madd
        of the 16 bsums; TILED sums the lanes)."""
        bd = self.builder
        assert self.nsub == 16 and self.mode in (LANES, TILED)
        bs = self.ivec(self.bp, blk.k0, 16)
        if self.offset == TERNARY_OFFSET:
            corr = pair_lanes(bd, bs)
        elif has_avx2(self.context):            # one pmaddwd: |bsum| <= 16*128 and |scale| <= 128 fit in i16
            v16 = ir.VectorType(I16, 16)
            corr = maddwd(bd, bd.trunc(bs, v16), bd.trunc(self.blk_vec(blk, 0, 0, 16), v16))
        else:
            corr = pair_lanes(bd, bd.mul(bs, self.blk_vec(blk, 0, 0, 16)))
        return bd.sub(iacc, bd.mul(corr, ir.Constant(self.l8, [self.offset] * 8)))

    def tiled_end(self, blk: _Block, iacc):
        """TILED (the K-quant tiled matmul): r = isum*d_w [r = fma(-dmin_w, msum, r)]; sacc = fma(r, d_a, sacc)."""
        bd, w = self.builder, self.wsrc
        r = bd.fmul(bd.sitofp(reduce_add(bd, iacc), self.f32), post_scaled(bd, w.w_d(blk.b), self.post))
        if self.mins == K_MINS:
            msum = reduce_add(bd, bd.mul(self.blk_vec(blk, 1, 0, self.nsub), self.ivec(self.bp, blk.k0, self.nsub)))
            r = self.fmaf(bd.fneg(w.w_m(blk.b)), bd.sitofp(msum, self.f32), r)
        bd.store(self.fmaf(r, blk.da, bd.load(self.sacc)), self.sacc)          # (GCC contracts add(mul))

    def lanes2_end(self, blk: _Block, iacc, n_sb):
        """LANES2: even blocks' fma lanes in facc, odd in facc2, an odd count's last block as a scalar."""
        bd, f8 = self.builder, self.f8
        odd = bd.trunc(blk.b, ir.IntType(1))
        tail = bd.icmp_signed("==", bd.or_(blk.b, self.c64(1)), n_sb)
        with bd.if_else(tail) as (then_tail, not_tail):
            with then_tail:
                bd.store(bd.sitofp(reduce_add(bd, iacc), self.f32), self.sacc)
                bd.store(bd.insert_element(self.zero8, blk.d, ir.Constant(I32, 0)), self.macc)
            with not_tail:
                with bd.if_else(odd) as (then, otherwise):
                    with then:
                        bd.store(bd.call(self.fma8, [splat(bd, blk.d, f8), bd.sitofp(iacc, f8), bd.load(self.facc2)]),
                                 self.facc2)
                    with otherwise:
                        bd.store(bd.call(self.fma8, [splat(bd, blk.d, f8), bd.sitofp(iacc, f8), bd.load(self.facc)]),
                                 self.facc)

    def lanes_end(self, blk: _Block, iacc, dacc):
        """LANES (vec_dot): facc = fma(d, lanes, facc) (Q2_K: its min pairs first), the mins' terms in macc."""
        bd, f8, f32, k0 = self.builder, self.f8, self.f32, blk.k0
        mins = self.mins
        if mins == K_LANES:                        # Q2_K: min pairs into the lanes first
            ml = pair_lanes(bd, bd.mul(self.blk_vec(blk, 1, 0, 16), self.ivec(self.bp, k0, 16)))
            bd.store(bd.call(self.fma8, [splat(bd, blk.dmin, f8), bd.sitofp(ml, f8), bd.load(self.facc)]), self.facc)
        bd.store(bd.call(self.fma8, [splat(bd, blk.d, f8), bd.sitofp(iacc, f8), bd.load(self.facc)]), self.facc)
        m = bd.load(self.macc)
        if mins == Q8_1_SUM or mins == K_SUM:      # scalar summs (lane 0)
            if mins == Q8_1_SUM:
                x, y = self.wsrc.w_m(blk.b), self.at(self.map_, blk.b)
            else:
                msum = reduce_add(bd, bd.mul(self.blk_vec(blk, 1, 0, self.nsub), self.ivec(self.bp, k0, self.nsub)))
                x, y = blk.dmin, bd.sitofp(msum, f32)
            m0 = bd.extract_element(m, ir.Constant(I32, 0))
            m0 = self.fmaf(x, y, m0) if SCALAR_FMA else bd.fadd(m0, bd.fmul(x, y))
            bd.store(bd.insert_element(m, m0, ir.Constant(I32, 0)), self.macc)
        elif mins == K_MIN4:                       # Q4_K: 4 lanes of min pairs (lanes 0-3)
            ml = pair_lanes(bd, bd.mul(self.blk_vec(blk, 1, 0, 8), self.ivec(self.bp, k0, 8)))
            ml = bd.shuffle_vector(ml, ml, ir.Constant(self.l8, [0, 1, 2, 3, 0, 1, 2, 3]))
            bd.store(bd.call(self.fma8, [splat(bd, blk.dmin, f8), bd.sitofp(ml, f8), m]), self.macc)
        elif mins == IQ1_DELTA:                    # IQ1_S: accum1 += d * sumi1 (lane 0); packed: sumi1 =
            sumi1 = reduce_add(bd, dacc if self.iq1raw is None else    # sum of imn (+-scale) * bsum per 32
                               bd.mul(self.blk_vec(blk, 1, 0, self.nsub), self.ivec(self.bp, k0, self.nsub)))
            m0 = self.fmaf(blk.d, bd.sitofp(sumi1, f32), self.lane(m, 0))
            bd.store(bd.insert_element(m, m0, ir.Constant(I32, 0)), self.macc)
        elif mins == IQ1_DLANES:                   # IQ1_M: accum2 = fma(d, sumi2, accum2), 8 lanes
            bd.store(bd.call(self.fma8, [splat(bd, blk.d, f8), bd.sitofp(dacc, f8), m]), self.macc)

    def finish(self, n_sb):
        """The row's f32 after the last block: the mode's horizontal sums and min terms."""
        bd, f32, mins, lane = self.builder, self.f32, self.mins, self.lane
        m = bd.load(self.macc)
        if self.mode == GROUPS:
            return bd.fsub(bd.load(self.sacc), lane(m, 0)) if mins == K_MINS else bd.load(self.sacc)
        if self.mode == TILED:
            return bd.load(self.sacc)
        if self.mode == LANES2:
            r = hsum8(bd, bd.fadd(bd.load(self.facc), bd.load(self.facc2)))
            odd_n = bd.trunc(n_sb, ir.IntType(1))
            tail = self.fmaf(lane(m, 0), bd.load(self.sacc), r)    # + the tail's d * isum (sumf += d * sumi: an fma)
            return bd.select(odd_n, tail, r)
        r = hsum8(bd, bd.load(self.facc))
        if self.post:                              # the codebook types' 2^-post * hsum
            r = post_scaled(bd, r, self.post)
        if mins in (Q8_1_SUM, K_SUM):
            r = bd.fadd(r, lane(m, 0))
        elif mins == K_MIN4:                       # (m0 + m2) + (m1 + m3)
            r = bd.fadd(r, bd.fadd(bd.fadd(lane(m, 0), lane(m, 2)), bd.fadd(lane(m, 1), lane(m, 3))))
        elif mins in IQ1_MINS:                     # hsum + IQ1*_DELTA * accum1 (or hsum of accum2)
            acc1 = lane(m, 0) if mins == IQ1_DELTA else hsum8(bd, m)
            r = self.fmaf(ir.Constant(f32, 0.125), acc1, r) if SCALAR_FMA else \
                bd.fadd(r, bd.fmul(ir.Constant(f32, 0.125), acc1))
        return r
