"""8 packed weight rows . one token in the arithmetic of llama.cpp's repacked gemv (GROUPS mode:
q4_0_8x8, q4_K_8x8, q2_K_8x8), read straight from the rows' blocks, for 1-3 token matmuls.

The repacked gemv keeps its 8 rows in the lanes of one vector: per group of `grp` elements
sacc = fma(float(isum), d_a*d_w, sacc) (and macc = fma(float(msum), dmin_w*d_a, macc) for the
mins), lane r for row r, the result sacc - macc. Here too: each row's integer sums (exact, any
order) are transposed into one <8 x i32> (codegen._sum_rows8), so the float steps run once per
group for all 8 rows, where a row-by-row dot pays two horizontal sums and two scalar fmas per row.
The K-quants' scales are decoded in registers (scales_ir.py); Q4_0 dots its unsigned nibbles and
adds -8 * the activation's block sum (one vector add for the 8 rows).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .codegen import _raw_source, _sum_rows8, scales_in_registers
from .rowdot import chunk_pair, scale8
from .llvmir import (I8, I16, I32, I64, dot64_scaled, dot_lanes, dot_lanes_scaled, dtypes_are, fma_fn, has_avx512_vnni,
                     pair_lanes, pick, scale16, splat)
from .rows import _literal
from .variants import GROUPS, K_MINS, RAW_ROWS, SPECS, RawRow

F8 = ir.VectorType(ir.FloatType(), 8)
L8 = ir.VectorType(I32, 8)
L16 = ir.VectorType(I32, 16)
V64 = ir.VectorType(I8, 64)


def gemv8_ok(ri: int) -> bool:
    """Whether packed-row intrinsic ri has an 8-row gemv (a GROUPS variant, which QDot.variants picks
    for rows a multiple of 8 alone; scales the IR decodes itself, or none)."""
    if ri < 0:
        return False
    t, v = RAW_ROWS[RawRow(ri)]
    s = SPECS[v]
    return s.mode == GROUPS and not s.post and (s.nsub == 1 or scales_in_registers(t))


def _lanes8(builder, vals, ty):
    v = ir.Constant(ty, ir.Undefined)
    for i, x in enumerate(vals):
        v = builder.insert_element(v, x, ir.Constant(I32, i))
    return v


def _to8(builder, v):
    """<n x i32> (n a power of two) -> <8 x i32> of the same total: pair sums until 8 lanes, or
    zeros after the n lanes where n < 8 (a gemm's group of 2 sub-blocks)."""
    while v.type.count > 8:
        v = pair_lanes(builder, v)
    n = v.type.count
    if n < 8:
        zero = ir.Constant(v.type, [0] * n)
        v = builder.shuffle_vector(v, zero, ir.Constant(ir.VectorType(I32, 8), list(range(n)) + [n] * (8 - n)))
    return v


def _gemv8_codegen(context, builder, spec, t, rps, p, n_sb):
    """<8 x float>: rows rps[0..7] (i8* to their packed blocks of type t) . one token (p: "aq", "ad",
    "bsum" element pointers at its offsets), in GROUPS variant `spec`."""
    sub, nsub, mins, mode, offset, grp, post = spec
    assert mode == GROUPS and not offset and not post
    srcs = [_raw_source(context, builder, t, rp, {}) for rp in rps]
    shifted = srcs[0].shifted                                   # Q4_0: (nibbles, -8)
    unsigned = mins == K_MINS or shifted is not None
    fma8 = fma_fn(builder, F8)
    sacc = cgutils.alloca_once_value(builder, ir.Constant(F8, [0.0] * 8))
    macc = cgutils.alloca_once_value(builder, ir.Constant(F8, [0.0] * 8))
    vt = ir.VectorType(I8, 32)

    def c64(v):
        return ir.Constant(I64, v)

    def ivec(q, k, n):
        return builder.load(builder.bitcast(builder.gep(q, [k]), ir.VectorType(I32, n).as_pointer()), align=4)

    wide = unsigned and nsub > 1 and has_avx512_vnni(context)
    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        e0, k0 = builder.mul(b, c64(sub * nsub)), builder.mul(b, c64(nsub))
        da8 = splat(builder, builder.load(builder.gep(p["ad"], [b])), F8)
        d8 = builder.fmul(da8, _lanes8(builder, [s.w_d(b) for s in srcs], F8))
        regs = [s.scales(b) for s in srcs] if nsub > 1 else None    # (isc, imn) <nsub x i32> per row

        def group_end(c, iacc):                # after chunk c: one fma per group, the 8 rows in lanes
            g = (c + 1) * 32 // grp - 1
            isum = _sum_rows8(builder, iacc)
            if shifted is not None:            # + (-8) * the block's activation sum, every row
                bs = builder.load(builder.gep(p["bsum"], [b]))
                isum = builder.add(isum, splat(builder, builder.mul(bs, ir.Constant(I32, shifted[1])), L8))
            builder.store(builder.call(fma8, [builder.sitofp(isum, F8), d8, builder.load(sacc)]), sacc)
            if mins == K_MINS:
                gs = grp // sub
                bs = ivec(p["bsum"], builder.add(k0, c64(g * gs)), gs)
                msum = _sum_rows8(builder, [_to8(builder, builder.mul(pick(builder, rg[1], list(range(g * gs,
                                                                                              (g + 1) * gs))), bs))
                                            for rg in regs])
                wm8 = builder.fmul(_lanes8(builder, [s.w_m(b) for s in srcs], F8), da8)
                builder.store(builder.call(fma8, [builder.sitofp(msum, F8), wm8, builder.load(macc)]), macc)

        chunks = sub * nsub // 32
        if wide:                               # two chunks a step on 512 bits (exact integers: any lanes)
            iacc = [ir.Constant(L16, [0] * 16)] * 8
            for c in range(0, chunks, 2):
                e = builder.add(e0, c64(32 * c))
                vb = builder.load(builder.bitcast(builder.gep(p["aq"], [e]), V64.as_pointer()), align=1)
                for r, s in enumerate(srcs):
                    w = chunk_pair(builder, s, b, e, c)
                    sc = builder.trunc(regs[r][0], ir.VectorType(I16, nsub))       # pairs' scales by sub-block
                    sc = pick(builder, sc, [(32 * c + 2 * i) // sub for i in range(32)])
                    iacc[r] = dot64_scaled(builder, iacc[r], w, vb, sc)
                if (c + 2) * 32 % grp == 0:
                    group_end(c + 1, [builder.add(pick(builder, a, list(range(8))), pick(builder, a, list(range(8, 16))))
                                      for a in iacc])
                    iacc = [ir.Constant(L16, [0] * 16)] * 8
        else:
            iacc = [ir.Constant(L8, [0] * 8)] * 8
            for c in range(chunks):
                e = builder.add(e0, c64(32 * c))
                vb = builder.load(builder.bitcast(builder.gep(p["aq"], [e]), vt.as_pointer()), align=1)
                for r, s in enumerate(srcs):
                    if regs is None:
                        w = s.w_vec(b, e, c) if shifted is None else s.shifted[0](b, e, c)
                        iacc[r] = builder.add(iacc[r], dot_lanes(context, builder, w, vb, unsigned))
                    else:                      # lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                        sc = [builder.extract_element(regs[r][0], ir.Constant(I32, c * 32 // sub + h))
                              for h in range(32 // sub)]
                        iacc[r] = dot_lanes_scaled(context, builder, iacc[r], s.w_vec(b, e, c), vb, unsigned,
                                                   scale16(builder, *sc), scale8(builder, sc))
                if (c + 1) * 32 % grp == 0:
                    group_end(c, iacc)
                    iacc = [ir.Constant(L8, [0] * 8)] * 8
    r = builder.load(sacc)
    return builder.fsub(r, builder.load(macc)) if mins == K_MINS else r


@intrinsic(prefer_literal=True)
def _vgemv8(typingctx, ri, raw, ro, row_bytes, aq, ao, ad, to, n_sb, bsum, bo, y, yo):
    """y[yo:yo+8] (f32) = rows ro, ro+row_bytes, ... (8 rows of raw u8, packed-row intrinsic `ri`, a
    RawRow constant with gemv8_ok) . the token at aq[ao:] (ad: its scales at to, bsum: its sums at bo)."""
    r = _literal(RawRow, ri)
    if r is None or not dtypes_are((raw, aq, ad, bsum, y), (types.uint8, types.int8, types.float32, types.int32,
                                                            types.float32)):
        return None
    t, v = RAW_ROWS[r]

    def codegen(context, builder, sig, args):
        sig_, args_ = sig.replace(args=sig.args[1:]), args[1:]

        def base(k, o):
            return builder.gep(context.make_array(sig_.args[k])(context, builder, args_[k]).data, [args_[o]])
        r0 = base(0, 1)
        rps = [builder.gep(r0, [builder.mul(args_[2], ir.Constant(I64, i))]) for i in range(8)]
        p = {"aq": base(3, 4), "ad": base(5, 6), "bsum": base(8, 9)}
        out = _gemv8_codegen(context, builder, SPECS[v], t, rps, p, args_[7])
        builder.store(out, builder.bitcast(base(10, 11), F8.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(ri, raw, ro, row_bytes, aq, ao, ad, to, n_sb, bsum, bo, y, yo), codegen
