"""The row dots of the integer-dot matmul, as the kernels call them: intrinsics over a variant
constant (`_vrow`, `_vrow_raw`, `_vrows8`: numba emits the IR of that variant only) and the
plain-loop twin of `_vrow`, `_prow`, op for op the same arithmetic (vector=False, RAMFORGE_PORTABLE=1).

Arguments, by name: wq i8 unpacked weight quants at wo; isc / imn i32 sub-block scales / mins at io;
wd / wm f32 super-block scale / min at so; aq i8 activation quants at ao; ad / am f32 activation
scale (and Q8_1's s, or the scale again) per super-block at to; bsum i32 activation sums per
sub-block at bo; n_sb super-blocks. The variant's fields: variants.Spec.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .codegen import _raw_source, _rows8_codegen, row_prefetch
from .rowdot import RowSource, row_codegen
from .llvmir import I8, I64, dtypes_are
from .scalars import _fma
from .variants import (_ROWS8, GROUPS, IQ1_DELTA, IQ1_DLANES, K_LANES, K_MIN4, K_MINS, K_SUM, LANES, LANES2, Q8_1_SUM,
                       RAW_ROWS, SCALAR_FMA, SPECS, TILED, RawRow, Variant)

_SPEC_ARR = np.array([SPECS[v] for v in Variant], dtype=np.int64)     # i64[n_variants, 7], by Variant
_F32_ARGS = (types.int8, types.int8, types.int32, types.int32, types.float32, types.float32, types.float32,
             types.float32, types.int32)


def _literal(kind, v):
    """The member of IntEnum `kind` a literal int argument names (None if the argument is not a constant)."""
    return kind(v.literal_value) if isinstance(v, types.IntegerLiteral) else None


def _ptrs(context, builder, sig, args, names):
    # name -> element pointer of array argument k at offset argument o, for names {name: (k, o)}
    return {n: builder.gep(context.make_array(sig.args[k])(context, builder, args[k]).data, [args[o]])
            for n, (k, o) in names.items()}


def _scratch_source(builder, p) -> RowSource:
    # the source of unpacked rows: the weights p["wq"], the float scales p["wd"], p["wm"]
    vt = ir.VectorType(I8, 32)

    def w_vec(b, e, c):
        return builder.load(builder.bitcast(builder.gep(p["wq"], [e]), vt.as_pointer()), align=1)
    return RowSource(lambda b: builder.load(builder.gep(p["wd"], [b])),
                     lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec)


@intrinsic(prefer_literal=True)
def _vrow(typingctx, vid, wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo):
    """f32: one unpacked weight row . one token in the arithmetic of variant `vid` (a constant).
    Integer lanes per 32 elements as llvmir.quad_lanes, times the sub-block scales (Q6_K: unsigned
    quants less `offset` * madd(bsums, scales)); then the float steps of llama.cpp's kernel
    (`mode`, `mins`, group `grp`) with d = d_a * d_w, dmin = -(d_a * dmin_w)."""
    v = _literal(Variant, vid)
    if v is None or not dtypes_are((wq, aq, isc, imn, wd, wm, ad, am, bsum), _F32_ARGS):
        return None

    def codegen(context, builder, sig, args):
        sig_, args_ = sig.replace(args=sig.args[1:]), args[1:]
        p = _ptrs(context, builder, sig_, args_, {"wq": (0, 1), "aq": (2, 3), "isc": (4, 6), "imn": (5, 6),
                                                  "wd": (7, 9), "wm": (8, 9), "ad": (10, 12), "am": (11, 12),
                                                  "bsum": (14, 15)})
        return row_codegen(context, builder, SPECS[v], p, _scratch_source(builder, p), args_[13])
    return types.float32(vid, wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo), codegen


@intrinsic(prefer_literal=True)
def _vrow_raw(typingctx, ri, raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo):
    """f32: as _vrow, in the variant of packed-row intrinsic `ri` (a RawRow constant), the row's blocks
    read from raw[ro:] (u8, packed as ri's type); isc, imn, wd, wm: the row's unpacked scales
    (super-block types; the 32-element types read theirs from raw)."""
    r = _literal(RawRow, ri)
    if r is None or not dtypes_are((raw, aq, isc, imn, wd, wm, ad, am, bsum), (types.uint8,) + _F32_ARGS[1:]):
        return None
    t, v = RAW_ROWS[r]

    def codegen(context, builder, sig, args):
        sig_, args_ = sig.replace(args=sig.args[1:]), args[1:]
        p = _ptrs(context, builder, sig_, args_, {"raw": (0, 1), "aq": (2, 3), "ad": (8, 10), "am": (9, 10),
                                                  "bsum": (12, 13)})
        for k, name in ((4, "isc"), (5, "imn"), (6, "wd"), (7, "wm")):
            p[name] = context.make_array(sig_.args[k])(context, builder, args_[k]).data
        return row_codegen(context, builder, SPECS[v], p, _raw_source(context, builder, t, p["raw"], p), args_[11],
                            row_prefetch(builder, t, p["raw"]))
    return types.float32(ri, raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo), codegen


@intrinsic(prefer_literal=True)
def _vrows8(typingctx, vid, wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo,
            y, yo):
    """8 unpacked rows (row i at wq[wo + i*n_in], isc/imn[io + i*n_sub], wd/wm[so + i*n_sbs]) . one
    token, in the arithmetic of variant `vid` (a constant in _ROWS8), stored to y[yo:yo+8] (f32)."""
    v = _literal(Variant, vid)
    if v is None or v not in _ROWS8 or not dtypes_are((wq, aq, isc, imn, wd, wm, ad, am, bsum, y),
                                                      _F32_ARGS + (types.float32,)):
        return None

    def codegen(context, builder, sig, args):
        sig_, args_ = sig.replace(args=sig.args[1:]), args[1:]

        def base(k, o):
            return builder.gep(context.make_array(sig_.args[k])(context, builder, args_[k]).data, [args_[o]])

        def rows(k, o, stride):
            p0 = base(k, o)
            return [builder.gep(p0, [builder.mul(args_[stride], ir.Constant(I64, i))]) for i in range(8)]
        wqs, iscs, imns, wds, wms = rows(0, 1, 2), rows(5, 7, 8), rows(6, 7, 8), rows(9, 11, 12), rows(10, 11, 12)
        srcs = [_scratch_source(builder, {"wq": wqs[i], "wd": wds[i], "wm": wms[i]}) for i in range(8)]
        p = {"aq": base(3, 4), "ad": base(13, 15), "am": base(14, 15), "bsum": base(17, 18)}
        r = _rows8_codegen(context, builder, SPECS[v], p, srcs, iscs, imns, args_[16])
        builder.store(r, builder.bitcast(base(19, 20), ir.VectorType(ir.FloatType(), 8).as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(vid, wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo,
                      y, yo), codegen


@njit(cache=True)
def _prow(wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo, vid, lanes, ilane):
    # the plain-loop twin of _vrow for variant vid, op for op (scratch: lanes f32[24], ilane i64[16])
    if vid < 0 or vid >= len(_SPEC_ARR):
        raise ValueError("unknown arithmetic variant")
    sub, nsub, mins, mode, offset, grp, post = _SPEC_ARR[vid]
    iq1 = mins == IQ1_DELTA or mins == IQ1_DLANES   # quants 8*grid + delta8: split (LANES)
    pf = np.float32(1.0) / np.float32(1 << post)    # the codebook types' 2^-post (exact)
    lanes[:] = 0                # [0:8] the dot lanes, [8:16] odd blocks (LANES2), [16:24] mins (IQ1: delta)
    sacc = np.float32(0.0)
    for b in range(n_sb):
        k0 = b * nsub
        da = ad[to + b]
        d = da * (wd[so + b] * np.float32(8.0) if iq1 else wd[so + b])
        dmin = -(da * wm[so + b])
        ilane[:] = 0            # [0:8] the integer lanes, [8:16] IQ1's delta8 lanes
        for c in range(sub * nsub // 32):
            for h in range(32 // sub):              # the chunk's sub-blocks
                sc = np.int64(isc[io + k0 + (32 * c) // sub + h])
                e0 = b * sub * nsub + 32 * c + h * sub
                for i in range(h * sub, (h + 1) * sub, 4):
                    q = np.int64(0)
                    dq = np.int64(0)
                    for u in range(4):
                        w = np.int64(wq[wo + e0 + i - h * sub + u])
                        a = np.int64(aq[ao + e0 + i - h * sub + u])
                        if iq1:
                            g = (w + 4) >> 3
                            q += g * a
                            dq += (w - 8 * g) * a
                        else:
                            q += w * a
                    ilane[i >> 2] += sc * q
                    ilane[8 + (i >> 2)] += sc * dq
            if offset:
                kk = io + k0 + 2 * c
                corr = offset * (np.int64(bsum[bo + k0 + 2 * c]) * isc[kk] +
                                 np.int64(bsum[bo + k0 + 2 * c + 1]) * isc[kk + 1])
                ilane[c % 8 if mode == LANES else 0] -= corr
            if mode == GROUPS and (c + 1) * 32 % grp == 0:
                g = (c + 1) * 32 // grp - 1
                sacc = _fma(np.float32(ilane[:8].sum()), d, sacc)
                ilane[:] = 0
                if mins == K_MINS:
                    gs = grp // sub
                    msum = np.int64(0)
                    for j in range(k0 + g * gs, k0 + (g + 1) * gs):
                        msum += np.int64(imn[io + j]) * np.int64(bsum[bo + j])
                    lanes[16] = _fma(np.float32(msum), wm[so + b] * da, lanes[16])
        msum = np.int64(0)
        for j in range(k0, k0 + nsub):
            msum += np.int64(imn[io + j]) * np.int64(bsum[bo + j])
        if mode == TILED:
            r = np.float32(ilane[:8].sum()) * (wd[so + b] * pf)
            if mins == K_MINS:
                r = _fma(-wm[so + b], np.float32(msum), r)
            sacc = _fma(r, da, sacc)
        elif mode == LANES2:
            if (b | 1) == n_sb:         # an odd count's last block: a scalar fma after the hsum
                sacc = np.float32(ilane[:8].sum())
                lanes[16] = d
            else:
                for k in range(8):
                    lanes[8 * (b & 1) + k] = _fma(d, np.float32(ilane[k]), lanes[8 * (b & 1) + k])
        elif mode == LANES:
            if mins == K_LANES:
                for k in range(8):
                    ml = np.int64(imn[io + k0 + 2 * k]) * bsum[bo + k0 + 2 * k] + \
                        np.int64(imn[io + k0 + 2 * k + 1]) * bsum[bo + k0 + 2 * k + 1]
                    lanes[k] = _fma(dmin, np.float32(ml), lanes[k])
            for k in range(8):
                lanes[k] = _fma(d, np.float32(ilane[k]), lanes[k])
            if mins == Q8_1_SUM:
                x, y = wm[so + b], am[to + b]
                lanes[16] = _fma(x, y, lanes[16]) if SCALAR_FMA else lanes[16] + x * y
            elif mins == K_SUM:
                lanes[16] = _fma(dmin, np.float32(msum), lanes[16]) if SCALAR_FMA else \
                    lanes[16] + dmin * np.float32(msum)
            elif mins == K_MIN4:
                for k in range(4):
                    ml = np.int64(imn[io + k0 + 2 * k]) * bsum[bo + k0 + 2 * k] + \
                        np.int64(imn[io + k0 + 2 * k + 1]) * bsum[bo + k0 + 2 * k + 1]
                    lanes[16 + k] = _fma(dmin, np.float32(ml), lanes[16 + k])
            elif mins == IQ1_DELTA:
                lanes[16] = _fma(d, np.float32(ilane[8:16].sum()), lanes[16])
            elif mins == IQ1_DLANES:
                for k in range(8):
                    lanes[16 + k] = _fma(d, np.float32(ilane[8 + k]), lanes[16 + k])
    if mode == GROUPS:
        return sacc - lanes[16] if mins == K_MINS else sacc
    if mode == TILED:
        return sacc
    if mode == LANES2:
        for k in range(8):
            lanes[k] = lanes[k] + lanes[8 + k]
        r = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
        return _fma(lanes[16], sacc, r) if n_sb & 1 else r
    r = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
    r = r * pf
    if mins == Q8_1_SUM or mins == K_SUM:
        r += lanes[16]
    elif mins == K_MIN4:
        r += (lanes[16] + lanes[18]) + (lanes[17] + lanes[19])
    elif mins == IQ1_DELTA or mins == IQ1_DLANES:
        acc1 = lanes[16] if mins == IQ1_DELTA else \
            ((lanes[16] + lanes[20]) + (lanes[18] + lanes[22])) + ((lanes[17] + lanes[21]) + (lanes[19] + lanes[23]))
        r = _fma(np.float32(0.125), acc1, r) if SCALAR_FMA else r + np.float32(0.125) * acc1
    return r

