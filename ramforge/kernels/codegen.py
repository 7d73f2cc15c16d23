"""LLVM IR of the row dots of the integer-dot matmul, in each arithmetic variant (variants.SPECS).

`rowdot.row_codegen` emits one weight row . one token, `_rows8_codegen` 8 rows . one token (the
rows' float steps lane by lane); both take the weights from a source (rowdot.RowSource): unpacked rows
in scratch (unpack.py), or the packed blocks themselves (`_raw_source`). The integer sums are exact; the
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
from .llvmir import I8, I16, I32, I64, dot_lanes, fma_fn, half_to_float, has_avx2, hsum8, native_half, pair_lanes, \
    prefetch, reduce_add, splat
from .rowdot import RowSource, post_scaled
from .variants import GROUPS, K_MINS, LANES, NO_MIN, TILED


def scales_in_registers(t) -> bool:
    """Whether _raw_source decodes type t's sub-block scales itself (no scratch to unpack them into)."""
    return (t in CHUNKS or t == GGMLType.IQ4_XS) and has_block_scales(t)


def _raw_source(context, builder, t, rp, p):
    """The RowSource for rowdot.row_codegen over a packed row at rp (i8*) of type t's blocks (blocks.LAYOUTS):
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
        return RowSource(w_d4, w_d4, w_vec, scales=lambda b: block_scales(builder, t, lambda o, ty: blk(b, o, ty)))
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
            return RowSource(lambda b: builder.load(builder.gep(p["wd"], [b])),
                             lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec, pair=pair)

        def w_d(b):                            # f16 (Q8_K: f32) as blocks._scales_fn reads it
            if t == GGMLType.Q8_K:
                return blk(b, L.d, ir.FloatType())
            return half_to_float(context, builder, blk(b, L.d, I16), native)

        def w_m(b):
            return half_to_float(context, builder, blk(b, L.m, I16), native) if L.m >= 0 else w_d(b)
        return RowSource(w_d, w_m, w_vec, scales=lambda b: block_scales(builder, t, lambda o, ty: blk(b, o, ty)),
                         pair=pair)

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
    return RowSource(w_d, w_m, w_vec, shifted=(w_unsigned, L.bias) if L.bias else None)


_ROW_AHEAD = 8192   # one core streamed Q6_K rows at 22 GB/s without, 30 with 4 KiB, 35-37 with 8 KiB


def row_prefetch(builder, t, rp):
    """ahead(b) for rowdot.row_codegen over a packed row at rp (i8*) of type t: its bytes _ROW_AHEAD past block b
    prefetched (a line a block, or a block's lines); rows lie one after another, so past a row's end
    the next row's."""
    nbytes = GGML_BLOCK[t][1]
    return lambda b: prefetch(builder, builder.gep(rp, [builder.mul(b, ir.Constant(I64, nbytes))]), nbytes,
                              _ROW_AHEAD)


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
    sacc_r = fma(r, d_a, sacc_r). wsrcs: each row's RowSource (w_d, w_m, w_vec read); iscs, imns:
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
        wd8 = post_scaled(builder, lanes8([w.w_d(b) for w in wsrcs], f8), post)
        d8 = builder.fmul(da8, wd8)
        iacc = [ir.Constant(l8, [0] * 8)] * 8
        for c in range(sub * nsub // 32):
            e = builder.add(e0, c64(32 * c))
            vb = builder.load(builder.bitcast(builder.gep(ap, [e]), vt.as_pointer()), align=1)
            for r, w in enumerate(wsrcs):
                part = dot_lanes(context, builder, w.w_vec(b, e, c), vb, unsigned)
                if nsub > 1:                       # lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                    ks = [builder.add(k0, c64(c * 32 // sub + h)) for h in range(32 // sub)]
                    sv = [splat(builder, builder.load(builder.gep(iscs[r], [k])), l8) for k in ks]
                    scale = sv[0] if sub == 32 else builder.shuffle_vector(
                        sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))
                    part = builder.mul(part, scale)
                iacc[r] = builder.add(iacc[r], part)
            if mode == LANES:                      # each row its 8 lanes: fma(d_a*d_w, lanes, acc)
                for r, w in enumerate(wsrcs):
                    dr = splat(builder, builder.fmul(da, w.w_d(b)), f8)
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
                    wm8 = builder.fmul(lanes8([w.w_m(b) for w in wsrcs], f8), da8)
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
                wm8 = lanes8([w.w_m(b) for w in wsrcs], f8)
                r8 = builder.call(fma8, [builder.fneg(wm8), builder.sitofp(msum, f8), r8])
            builder.store(builder.call(fma8, [r8, da8, builder.load(sacc)]), sacc)
    if mode == LANES:
        return lanes8([hsum8(builder, builder.load(f)) for f in faccs], f8)
    r = builder.load(sacc)
    return builder.fsub(r, builder.load(macc)) if mode == GROUPS and mins == K_MINS else r
