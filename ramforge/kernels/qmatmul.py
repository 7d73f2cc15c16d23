"""Integer-dot matmul of quantized weights, bit for bit as llama.cpp's CPU backend computes it.

llama.cpp quantizes the activation to its weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K) and
dots int8 quants with int8 quants in exact integer arithmetic, scaling once per block. Here:

1. `quantize_activation` (kernels.quantize) quantizes x once per matmul: int8 quants, one f32 scale per block
   of 32 (Q8_0/Q8_1, scale f16-rounded) or 256 (Q8_K), Q8_1's f16 s = d*sum(q) per 32 and Q8_K's
   integer sums per sub-block (llama.cpp's bsums) for the weight mins.
2. `_qmatmul` (parallel over row ranges) dots each weight row with every token. Batches (4+
   tokens) unpack a group of 8 rows once into int8 quants, integer sub-block scales / mins and
   float super-block scales (the repacked types' GROUPS arithmetic then runs the 8 rows at once,
   lane by lane); fewer tokens read the packed rows straight into registers (_RAW_ROWS):
       y = sum_b (d_w*d_a)_b * sum_j sc_j * <q_w, q_a>_j  [- (dmin_w*d_a)_b * sum_j m_j * bsum_j]
                                                          [+ (m_w * s_a)_b  for Q4_1/Q5_1]
   with the integer sums exact and the float steps those of the llama.cpp kernel that would run
   (vec_dot, tinyBLAS, its tiled K-quant matmul, repacked gemv/gemm: chosen, as there, by type,
   row count and batch size; see the modes below and QDot.variants), op for op: the same lanes,
   fmas and horizontal-sum order. The result equals ggml's mul_mat on the x86 build that recorded
   our oracle (AVX2, FMA, AVX512-VNNI) bit for bit; tests/test_qmatmul.py checks it live (-m oracle).
   Elsewhere it is within float rounding of llama.cpp.

The int8 work (unpacking and the row dots) is written as numba intrinsics emitting LLVM vector IR:
generic IR (LLVM picks vpmaddwd / pmaddwd / NEON, pshufb / tbl per machine), and one target
intrinsic, vpdpbusd, where the CPU has 256-bit VNNI (the integer sums are the same either way).
Each has a plain-loop twin; `vector=False` (or RAMFORGE_PORTABLE=1) runs those, bit for bit equal.
Helpers live in this file because numba's on-disk cache only notices edits to this file.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGML_BLOCK
from ramforge.kernels.dequant import _u16, _u32
from ramforge.kernels.quantize import quantize_activation

VECTOR = os.environ.get("RAMFORGE_PORTABLE", "").strip().lower() in ("", "0", "false", "no")
_CHUNKS_PER_THREAD = 8        # row ranges per thread (load balance vs per-range scratch)
_GROUP_ROWS = 8               # rows unpacked together for a batch of tokens ...
_GROUP_FROM_TOKENS = 4        # ... of at least this many (a single token: one row at a time, in L1)

# How llama.cpp's x86 CPU backend finishes a row dot (the build that recorded our oracle: AVX2,
# FMA, AVX512-VNNI; REPACK, LLAMAFILE and its tiled K-quant matmul), reproduced op for op so that
# our results round as its results do (see _make_row). Modes:
LANES = 0     # vec_dot / tinyBLAS: per 32 elements 8 int32 lanes of 4 products, one fma per lane and
#               (super-)block into 8 f32 lanes, hsum_float_8 at the end
LANES2 = 1    # IQ4_NL's vec_dot: as LANES, even and odd blocks in two accumulators
GROUPS = 2    # repacked gemv / gemm: the whole integer sum of each group of `grp` elements, one
#               scalar fma per group (and one for the mins), acc - acc_min
TILED = 3     # tiled K-quant matmul (8+ tokens): per super-block r = S1*d_w - dmin_w*S2 (an fma),
#               acc = fma(r, d_a, acc)
# min / offset terms in LANES mode (llama.cpp's handling, per type)
NO_MIN = 0        # none
Q8_1_SUM = 1      # Q4_1/Q5_1: summs += m * s per block (an fma), added after hsum
K_SUM = 2         # Q5_K: summs += (-d_a*dmin) * sum_j min_j*bsum_j per super-block (an fma), added
K_MIN4 = 3        # Q4_K: 4 f32 lanes of min pairs, fma'd, summed, added
K_LANES = 4       # Q2_K: 8 lanes of min pairs fma'd into the main lanes before the dot
K_MINS = 5        # GROUPS / TILED modes: the type has mins
_SCALAR_FMA = True   # llama.cpp's scalar `summs += a * b` is contracted to an fma (GCC, -march=native)
TILED_FROM = 8       # llama.cpp's tiled K-quant matmul takes batches of at least this many tokens

_KV = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)   # IQ4 codebook
_KV_NP = np.array(_KV, dtype=np.int8)


@dataclass(frozen=True)
class QDot:
    """How a type runs through the integer-dot kernel.

    unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm) writes one row of n_sb super-blocks: int8
    quants wq, per sub-block of `sub` elements an integer scale isc and min imn, per super-block
    float scales wd and wm; weight = wd*isc*(wq - offset) [- wm*imn]. The rest says which
    arithmetic llama.cpp's x86 backend uses: `mins` (NO_MIN ...) in its vec_dot; `repack`: the
    (gemm, gemv) group sizes when it repacks the type (rows a multiple of 8; gemm for whole
    groups of 4 tokens); `tiled`: batches of TILED_FROM+ tokens go to its tiled matmul. `raw`: the
    layout (_RAW_LAYOUT / _RAW_K) that one-token matmuls read packed, or None to unpack first."""

    unpack: object
    sub: int
    mins: int = NO_MIN
    repack: tuple | None = None
    tiled: bool = False
    offset: int = 0
    lanes2: bool = False
    raw: str | None = None

    def variants(self, sb: int, n_out: int, n_tok: int) -> tuple[int, int, int]:
        """(variant for tokens < split, variant for the rest, split): indices into _VARIANTS, for
        super-blocks of sb elements, n_out rows and n_tok tokens."""
        nsub = sb // self.sub
        has_min = self.mins not in (NO_MIN, Q8_1_SUM)
        if self.repack and n_out % 8 == 0:
            gemm, gemv = self.repack
            m = K_MINS if has_min else NO_MIN
            return (_VARIANT_ID[(self.sub, nsub, m, GROUPS, self.offset, gemm)],
                    _VARIANT_ID[(self.sub, nsub, m, GROUPS, self.offset, gemv)], n_tok - n_tok % 4)
        if self.tiled and n_tok >= TILED_FROM:
            v = _VARIANT_ID[(self.sub, nsub, K_MINS if has_min else NO_MIN, TILED, self.offset, 0)]
        elif self.lanes2 and n_tok == 1:
            v = _VARIANT_ID[(self.sub, nsub, self.mins, LANES2, self.offset, 0)]
        else:
            v = _VARIANT_ID[(self.sub, nsub, self.mins, LANES, self.offset, 0)]
        return v, v, n_tok


# ---------------------------------------------------------------- LLVM vector intrinsics

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)


def _ptr(context, builder, arrty, arr, off, vt):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [off]), vt.as_pointer())


def _splat(builder, val, vt):
    if isinstance(val.type, ir.IntType) and val.type.width > vt.element.width:
        val = builder.trunc(val, vt.element)
    elif isinstance(val.type, ir.IntType) and val.type.width < vt.element.width:
        val = builder.sext(val, vt.element)
    undef = ir.Constant(vt, ir.Undefined)
    v0 = builder.insert_element(undef, val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v0, undef, ir.Constant(ir.VectorType(_I32, vt.count), [0] * vt.count))


def _dtypes_are(arrays, dtypes):
    """Typing guard: each argument is a C-contiguous array of the given dtype (the IR reads raw memory)."""
    return all(isinstance(a, types.Array) and a.dtype == d and a.layout == "C" for a, d in zip(arrays, dtypes))


def _pick(builder, v, idx):
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _quad_lanes(builder, p):
    """<32 x i32> products -> <8 x i32>, lane l = p[4l] + ... + p[4l+3]: the lanes of llama.cpp's
    x86 dots (maddubs + madd, or dpbusd), built as pair sums first (LLVM makes them pmaddwd)."""
    q = builder.add(_pick(builder, p, list(range(0, 32, 2))), _pick(builder, p, list(range(1, 32, 2))))
    return builder.add(_pick(builder, q, list(range(0, 16, 2))), _pick(builder, q, list(range(1, 16, 2))))


def _has_vnni(context) -> bool:
    """Whether the compile target has 256-bit VNNI (AVX512-VNNI with VL, or AVX-VNNI): vpdpbusd.
    RAMFORGE_NO_VNNI=1 compiles the generic IR instead (the tests use it, with a cache dir of its own:
    numba's cache does not know the setting)."""
    if os.environ.get("RAMFORGE_NO_VNNI", "").strip() not in ("", "0"):
        return False
    f = set((getattr(context.codegen(), "_tm_features", "") or "").split(","))
    return llvm.get_process_triple().startswith("x86_64") and (
        {"+avx512vnni", "+avx512vl"} <= f or "+avxvnni" in f)


def _dot_lanes(context, builder, w, a, unsigned=False):
    """<32 x i8> weights . <32 x i8> activations -> <8 x i32>, lane l = sum of products 4l..4l+3:
    one vpdpbusd where the target has VNNI, of w itself when the weights are `unsigned` (0..127),
    else of |w| (u8) and a signed as w (exact: |a| <= 127, as llama.cpp's quantizers make it);
    elsewhere the products summed as _quad_lanes."""
    if not _has_vnni(context):
        wt = ir.VectorType(_I32, 32)
        return _quad_lanes(builder, builder.mul(builder.sext(w, wt), builder.sext(a, wt)))
    v32, l8 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8)
    zero = ir.Constant(v32, [0] * 32)
    if unsigned:
        aw, sa = w, a
    else:
        neg = builder.icmp_signed("<", w, zero)
        aw = builder.select(neg, builder.sub(zero, w), w)           # |w|, -128 -> 0x80 = 128 as u8
        sa = builder.select(neg, builder.sub(zero, a), a)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(l8, [l8, v32, v32]),
                                        "llvm.x86.avx512.vpdpbusd.256")
    return builder.call(fn, [ir.Constant(l8, [0] * 8), aw, sa])


def _hsum8(builder, v):
    """llama.cpp's hsum_float_8: ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))."""
    t = builder.fadd(_pick(builder, v, [4, 5, 6, 7]), _pick(builder, v, [0, 1, 2, 3]))
    u = builder.fadd(t, _pick(builder, t, [2, 3, 2, 3]))
    u0, u1 = (builder.extract_element(u, ir.Constant(_I32, i)) for i in (0, 1))
    return builder.fadd(u0, u1)


def _fma_fn(builder, ty):
    name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty, ty, ty]), name)


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (llvm.fma: the instruction, or libm's fmaf)."""
    def codegen(context, builder, sig, args):
        return builder.call(_fma_fn(builder, ir.FloatType()), list(args))
    return types.float32(types.float32, types.float32, types.float32), codegen


def _pair_lanes(builder, v):
    """<2n x i32> -> <n x i32>, lane l = v[2l] + v[2l+1] (madd_epi16's pairing)."""
    n = v.type.count
    return builder.add(_pick(builder, v, list(range(0, n, 2))), _pick(builder, v, list(range(1, n, 2))))


def _row_codegen(context, builder, variant, p, wsrc, n_sb):
    """IR of one weight row . one token in the arithmetic of `variant` (sub, nsub, mins, mode,
    offset, grp): p maps "aq" "isc" "imn" "ad" "am" "bsum" to element pointers at their offsets;
    wsrc = (w_d(b), w_m(b), w_vec(b, e, c)): super-block b's float scale and min, and the 32 int8
    weights of its chunk c (element e of the row)."""
    sub, nsub, mins, mode, offset, grp = variant
    scaled = nsub > 1
    unsigned = mins != NO_MIN or offset != 0      # types with mins or an offset store quants >= 0
    vt = ir.VectorType(_I8, 32)
    l8, f8, f32 = ir.VectorType(_I32, 8), ir.VectorType(ir.FloatType(), 8), ir.FloatType()
    ap, sp, mp, dap, map_, bp = (p[k] for k in ("aq", "isc", "imn", "ad", "am", "bsum"))
    w_d, w_m, w_vec = wsrc[:3]
    # a type with a quant offset c, read packed, on VNNI: dot the unsigned quants and add c * the
    # activation's sums (exact integers; no sign trick): per block (GROUPS) or per lane of 4 (LANES)
    shifted = wsrc[3] if len(wsrc) > 3 and mode in (GROUPS, LANES) and nsub == 1 and _has_vnni(context) else None
    fma8, fma1 = _fma_fn(builder, f8), _fma_fn(builder, f32)
    zero8, zero = ir.Constant(f8, [0.0] * 8), ir.Constant(f32, 0.0)
    facc = cgutils.alloca_once_value(builder, zero8)        # the 8 f32 lanes
    facc2 = cgutils.alloca_once_value(builder, zero8)       # LANES2: odd blocks
    macc = cgutils.alloca_once_value(builder, zero8)        # min lanes / scalar (lane 0)
    sacc = cgutils.alloca_once_value(builder, zero)         # scalar accumulator
    ld = builder.load

    def at(p, k):
        return ld(builder.gep(p, [k]))

    def ivec(p, k, n):          # <n x i32> at p + k
        t = ir.VectorType(_I32, n)
        return ld(builder.bitcast(builder.gep(p, [k]), t.as_pointer()), align=4)

    def reduce(v):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                            f"llvm.vector.reduce.add.v{v.type.count}i32")
        return builder.call(fn, [v])

    def fmaf(a, b, c):
        return builder.call(fma1, [a, b, c])

    def c64(v):
        return ir.Constant(_I64, v)

    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        e0 = builder.mul(b, c64(sub * nsub))
        k0 = builder.mul(b, c64(nsub))
        da = at(dap, b)
        d = builder.fmul(da, w_d(b))
        dmin = builder.fneg(builder.fmul(da, w_m(b)))
        iacc = ir.Constant(l8, [0] * 8)
        chunks = sub * nsub // 32
        for c in range(chunks):                    # 32-element chunks
            e = builder.add(e0, c64(32 * c))
            va = w_vec(b, e, c) if shifted is None else shifted[0](b, e, c)
            vb = ld(builder.bitcast(builder.gep(ap, [e]), vt.as_pointer()), align=1)
            part = _dot_lanes(context, builder, va, vb, unsigned or shifted is not None)
            if shifted is not None and mode == LANES:        # + c * (a's sums per lane of 4)
                ones = _dot_lanes(context, builder, ir.Constant(vt, [1] * 32), vb, True)
                part = builder.add(part, builder.mul(ones, ir.Constant(l8, [shifted[1]] * 8)))
            if scaled:                             # lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                ks = [builder.add(k0, c64(c * 32 // sub + h)) for h in range(32 // sub)]
                sv = [_splat(builder, at(sp, k), l8) for k in ks]
                scale = sv[0] if sub == 32 else builder.shuffle_vector(
                    sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))
                part = builder.mul(part, scale)
            iacc = builder.add(iacc, part)
            if mode == GROUPS and (c + 1) * 32 % grp == 0:    # one fma per group
                g = (c + 1) * 32 // grp - 1
                isum = reduce(iacc)
                if shifted is not None:                      # + c * sum a over the block
                    isum = builder.add(isum, builder.mul(at(bp, b), ir.Constant(_I32, shifted[1])))
                builder.store(fmaf(builder.sitofp(isum, f32), d, ld(sacc)), sacc)
                iacc = ir.Constant(l8, [0] * 8)
                if mins == K_MINS:
                    gs = grp // sub
                    msum = reduce(builder.mul(ivec(mp, builder.add(k0, c64(g * gs)), gs),
                                              ivec(bp, builder.add(k0, c64(g * gs)), gs)))
                    m0 = builder.extract_element(ld(macc), ir.Constant(_I32, 0))
                    m0 = fmaf(builder.sitofp(msum, f32), builder.fmul(w_m(b), da), m0)
                    builder.store(builder.insert_element(zero8, m0, ir.Constant(_I32, 0)), macc)
        if offset:          # Q6_K: lane c less 32 * (bsum*sc) of sub-blocks 2c, 2c+1 (a madd of the
            assert nsub == 16 and mode in (LANES, TILED)            # 16 bsums; TILED sums the lanes)
            corr = _pair_lanes(builder, builder.mul(ivec(bp, k0, 16), ivec(sp, k0, 16)))
            iacc = builder.sub(iacc, builder.mul(corr, ir.Constant(l8, [offset] * 8)))
        if mode == TILED:
            r = builder.fmul(builder.sitofp(reduce(iacc), f32), w_d(b))
            if mins == K_MINS:
                msum = reduce(builder.mul(ivec(mp, k0, nsub), ivec(bp, k0, nsub)))
                r = fmaf(builder.fneg(w_m(b)), builder.sitofp(msum, f32), r)
            builder.store(fmaf(r, da, ld(sacc)), sacc)          # (GCC contracts add(mul))
        elif mode == LANES2:                       # even blocks in facc, odd in facc2, an
            odd = builder.trunc(b, ir.IntType(1))     # odd count's last block as a scalar
            tail = builder.icmp_signed("==", builder.or_(b, c64(1)), n_sb)
            with builder.if_else(tail) as (then_tail, not_tail):
                with then_tail:
                    builder.store(builder.sitofp(reduce(iacc), f32), sacc)
                    builder.store(builder.insert_element(zero8, d, ir.Constant(_I32, 0)), macc)
                with not_tail:
                    with builder.if_else(odd) as (then, otherwise):
                        with then:
                            builder.store(builder.call(fma8, [_splat(builder, d, f8), builder.sitofp(iacc, f8),
                                                              ld(facc2)]), facc2)
                        with otherwise:
                            builder.store(builder.call(fma8, [_splat(builder, d, f8), builder.sitofp(iacc, f8),
                                                              ld(facc)]), facc)
        elif mode == LANES:
            if mins == K_LANES:                    # Q2_K: min pairs into the lanes first
                ml = _pair_lanes(builder, builder.mul(ivec(mp, k0, 16), ivec(bp, k0, 16)))
                builder.store(builder.call(fma8, [_splat(builder, dmin, f8), builder.sitofp(ml, f8),
                                                  ld(facc)]), facc)
            builder.store(builder.call(fma8, [_splat(builder, d, f8), builder.sitofp(iacc, f8),
                                              ld(facc)]), facc)
            m = ld(macc)
            if mins == Q8_1_SUM or mins == K_SUM:  # scalar summs (lane 0)
                if mins == Q8_1_SUM:
                    x, y = w_m(b), at(map_, b)
                else:
                    msum = reduce(builder.mul(ivec(mp, k0, nsub), ivec(bp, k0, nsub)))
                    x, y = dmin, builder.sitofp(msum, f32)
                m0 = builder.extract_element(m, ir.Constant(_I32, 0))
                m0 = fmaf(x, y, m0) if _SCALAR_FMA else builder.fadd(m0, builder.fmul(x, y))
                builder.store(builder.insert_element(m, m0, ir.Constant(_I32, 0)), macc)
            elif mins == K_MIN4:                   # Q4_K: 4 lanes of min pairs (lanes 0-3)
                ml = _pair_lanes(builder, builder.mul(ivec(mp, k0, 8), ivec(bp, k0, 8)))
                ml = builder.shuffle_vector(ml, ml, ir.Constant(l8, [0, 1, 2, 3, 0, 1, 2, 3]))
                builder.store(builder.call(fma8, [_splat(builder, dmin, f8), builder.sitofp(ml, f8), m]), macc)

    def lane(v, i):
        return builder.extract_element(v, ir.Constant(_I32, i))
    m = ld(macc)
    if mode == GROUPS:
        return builder.fsub(ld(sacc), lane(m, 0)) if mins == K_MINS else ld(sacc)
    if mode == TILED:
        return ld(sacc)
    if mode == LANES2:
        r = _hsum8(builder, builder.fadd(ld(facc), ld(facc2)))
        odd_n = builder.trunc(n_sb, ir.IntType(1))
        tail = builder.fadd(r, builder.fmul(lane(m, 0), ld(sacc)))      # + the tail's d * isum
        return builder.select(odd_n, tail, r)
    r = _hsum8(builder, ld(facc))
    if mins in (Q8_1_SUM, K_SUM):
        r = builder.fadd(r, lane(m, 0))
    elif mins == K_MIN4:                           # (m0 + m2) + (m1 + m3)
        r = builder.fadd(r, builder.fadd(builder.fadd(lane(m, 0), lane(m, 2)),
                                         builder.fadd(lane(m, 1), lane(m, 3))))
    return r


# Weight rows read straight from their packed blocks (one-token rows of the 32-element types, where
# unpacking into scratch first costs more than the dot): block bytes, offsets of the f16 min, the
# u32 high bits and the quants, the quant offset c (w = q + c).
_RAW_LAYOUT = {
    "q4_0": (18, 0, 0, 2, -8), "q4_1": (20, 2, 0, 4, 0), "q5_0": (22, 0, 2, 6, -16), "q5_1": (24, 2, 4, 8, 0),
    "q8_0": (34, 0, 0, 2, 0),
}
# The super-block types: block bytes, and per 32-element chunk c the unpackers' bit fields (see
# _vbits: a offset, shift, mask, b offset, shift, mask, left shift, constant); their scales come
# from _scales_any, unpacked per row into scratch.
_RAW_K = {
    "q2_k": (84, lambda c: (16 + c // 4 * 32, 2 * (c % 4), 3, 0, 0, 0, 0, 0)),
    "q3_k": (110, lambda c: (32 + c // 4 * 32, 2 * (c % 4), 3, 0, c, 1, 2, -4)),
    "q4_k": (144, lambda c: (16 + c // 2 * 32, 4 * (c % 2), 15, 0, 0, 0, 0, 0)),
    "q5_k": (176, lambda c: (48 + c // 2 * 32, 4 * (c % 2), 15, 16, c, 1, 4, 0)),
    "q6_k": (210, lambda c: (c // 4 * 64 + c % 2 * 32, 4 * (c % 4 // 2), 15, 128 + c // 4 * 32, 2 * (c % 4), 3, 4, 0)),
    "q8_k": (292, lambda c: (4 + c * 32, 0, 255, 0, 0, 0, 0, 0)),
}


def _raw_source(context, builder, src, rp, p):
    """wsrc for _row_codegen over a packed row at rp (i8*) of layout `src`: weights built in
    registers exactly as the unpackers build them in memory; super-block types take their float
    scales from the row's scratch p["wd"], p["wm"]."""
    v16, v32, w32 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 32), ir.VectorType(_I32, 32)
    bb = _RAW_K[src][0] if src in _RAW_K else _RAW_LAYOUT[src][0]

    def blk(b, off, ty):
        q = builder.gep(rp, [builder.add(builder.mul(b, ir.Constant(_I64, bb)), ir.Constant(_I64, off))])
        return builder.load(builder.bitcast(q, ty.as_pointer()), align=1)

    def nibbles(b, off):              # 16 bytes -> <32 x i8>: low nibbles, then high
        v = blk(b, off, v16)
        lo = builder.and_(v, ir.Constant(v16, [15] * 16))
        hi = builder.lshr(v, ir.Constant(v16, [4] * 16))
        return builder.shuffle_vector(lo, hi, ir.Constant(w32, list(range(32))))

    if src in _RAW_K:
        fields = _RAW_K[src][1]

        def w_vec(b, e, c):
            ao, sa, ma, bo, sb, mb, lb, cst = fields(c)
            k = lambda v: ir.Constant(v32, [v] * 32)  # noqa: E731
            r = builder.and_(builder.lshr(blk(b, ao, v32), k(sa)), k(ma))
            if mb:
                h = builder.and_(builder.lshr(blk(b, bo, v32), k(sb)), k(mb))
                r = builder.add(r, builder.shl(h, k(lb)))
            return builder.add(r, k(cst)) if cst else r
        return (lambda b: builder.load(builder.gep(p["wd"], [b])),
                lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec)

    _, m_off, qh_off, qs_off, c = _RAW_LAYOUT[src]
    native = _native_half(context)

    def w_vec(b, e, chunk):
        if src == "q8_0":
            return blk(b, qs_off, v32)
        r = nibbles(b, qs_off)
        if qh_off:
            bits = builder.lshr(_splat(builder, blk(b, qh_off, _I32), w32), ir.Constant(w32, list(range(32))))
            bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
            r = builder.add(r, builder.trunc(bits, v32))
        return builder.add(r, ir.Constant(v32, [c] * 32)) if c else r

    def w_d(b):
        return _half_to_float(builder, blk(b, 0, ir.IntType(16)), native)

    def w_m(b):
        return _half_to_float(builder, blk(b, m_off, ir.IntType(16)), native)

    def w_unsigned(b, e, chunk):               # the quants before the offset c (0..15 or 0..31)
        r = nibbles(b, qs_off)
        if qh_off:
            bits = builder.lshr(_splat(builder, blk(b, qh_off, _I32), w32), ir.Constant(w32, list(range(32))))
            bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
            r = builder.add(r, builder.trunc(bits, v32))
        return r
    return w_d, w_m, w_vec, ((w_unsigned, c) if c else None)


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
    sub, nsub, mins, mode, offset, grp = variant
    assert mode in (GROUPS, TILED) and (not offset or mode == TILED) or (mode, nsub, mins) == (LANES, 1, NO_MIN)
    unsigned = mins != NO_MIN or offset != 0
    l8, f8 = ir.VectorType(_I32, 8), ir.VectorType(ir.FloatType(), 8)
    ap, dap, bp = p["aq"], p["ad"], p["bsum"]
    fma8 = _fma_fn(builder, f8)
    zero8 = ir.Constant(f8, [0.0] * 8)
    sacc = cgutils.alloca_once_value(builder, zero8)
    macc = cgutils.alloca_once_value(builder, zero8)
    faccs = [cgutils.alloca_once_value(builder, zero8) for _ in wsrcs] if mode == LANES else []
    vt = ir.VectorType(_I8, 32)

    def c64(v):
        return ir.Constant(_I64, v)

    def ivec(q, k, n):
        return builder.load(builder.bitcast(builder.gep(q, [k]), ir.VectorType(_I32, n).as_pointer()), align=4)

    def lanes8(vals, ty):
        v = ir.Constant(ty, ir.Undefined)
        for i, x in enumerate(vals):
            v = builder.insert_element(v, x, ir.Constant(_I32, i))
        return v

    def rsum(v):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                            f"llvm.vector.reduce.add.v{v.type.count}i32")
        return builder.call(fn, [v])

    with cgutils.for_range(builder, n_sb) as loop:
        b = loop.index
        e0, k0 = builder.mul(b, c64(sub * nsub)), builder.mul(b, c64(nsub))
        da = builder.load(builder.gep(dap, [b]))
        da8 = _splat(builder, da, f8)
        wd8 = lanes8([w_d(b) for w_d, _, _ in wsrcs], f8)
        d8 = builder.fmul(da8, wd8)
        iacc = [ir.Constant(l8, [0] * 8)] * 8
        for c in range(sub * nsub // 32):
            e = builder.add(e0, c64(32 * c))
            vb = builder.load(builder.bitcast(builder.gep(ap, [e]), vt.as_pointer()), align=1)
            for r, (_, _, w_vec) in enumerate(wsrcs):
                part = _dot_lanes(context, builder, w_vec(b, e, c), vb, unsigned)
                if nsub > 1:                       # lanes 0-3 / 4-7: sub-blocks 2c / 2c+1 if sub = 16
                    ks = [builder.add(k0, c64(c * 32 // sub + h)) for h in range(32 // sub)]
                    sv = [_splat(builder, builder.load(builder.gep(iscs[r], [k])), l8) for k in ks]
                    scale = sv[0] if sub == 32 else builder.shuffle_vector(
                        sv[0], sv[1], ir.Constant(l8, [0, 1, 2, 3, 12, 13, 14, 15]))
                    part = builder.mul(part, scale)
                iacc[r] = builder.add(iacc[r], part)
            if mode == LANES:                      # each row its 8 lanes: fma(d_a*d_w, lanes, acc)
                for r, (w_d, _, _) in enumerate(wsrcs):
                    dr = _splat(builder, builder.fmul(da, w_d(b)), f8)
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
                    msum = lanes8([rsum(builder.mul(ivec(m, kg, gs), bs)) for m in imns], l8)
                    wm8 = builder.fmul(lanes8([w_m(b) for _, w_m, _ in wsrcs], f8), da8)
                    builder.store(builder.call(fma8, [builder.sitofp(msum, f8), wm8, builder.load(macc)]), macc)
        if mode == TILED:                          # per super-block and row
            if offset:                             # Q6_K: less 32 * (bsum*sc) per sub-block pair
                bs = ivec(bp, k0, 16)
                iacc = [builder.sub(a, builder.mul(_pair_lanes(builder, builder.mul(bs, ivec(iscs[r], k0, 16))),
                                                   ir.Constant(l8, [offset] * 8))) for r, a in enumerate(iacc)]
            r8 = builder.fmul(builder.sitofp(_sum_rows8(builder, iacc), f8), wd8)
            if mins == K_MINS:
                bs = ivec(bp, k0, nsub)
                msum = lanes8([rsum(builder.mul(ivec(m, k0, nsub), bs)) for m in imns], l8)
                wm8 = lanes8([w_m(b) for _, w_m, _ in wsrcs], f8)
                r8 = builder.call(fma8, [builder.fneg(wm8), builder.sitofp(msum, f8), r8])
            builder.store(builder.call(fma8, [r8, da8, builder.load(sacc)]), sacc)
    if mode == LANES:
        return lanes8([_hsum8(builder, builder.load(f)) for f in faccs], f8)
    r = builder.load(sacc)
    return builder.fsub(r, builder.load(macc)) if mode == GROUPS and mins == K_MINS else r


def _make_rows8(sub, nsub, mins, mode, offset, grp):
    """_vrows8(wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo,
    y, yo): 8 unpacked rows (row i at wq[wo + i*n_in], isc/imn[io + i*n_sub], wd/wm[so + i*n_sbs])
    . one token, in GROUPS arithmetic, stored to y[yo:yo+8]."""
    variant = (sub, nsub, mins, mode, offset, grp)

    @intrinsic
    def _vrows8(typingctx, wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb,
                bsum, bo, y, yo):
        def codegen(context, builder, sig, args):
            def base(k, o):
                return builder.gep(context.make_array(sig.args[k])(context, builder, args[k]).data, [args[o]])

            def rows(k, o, stride):
                p0 = base(k, o)
                return [builder.gep(p0, [builder.mul(args[stride], ir.Constant(_I64, i))]) for i in range(8)]
            wqs, iscs, imns, wds, wms = rows(0, 1, 2), rows(5, 7, 8), rows(6, 7, 8), rows(9, 11, 12), rows(10, 11, 12)
            vt = ir.VectorType(_I8, 32)

            def source(i):
                def w_vec(b, e, c):
                    return builder.load(builder.bitcast(builder.gep(wqs[i], [e]), vt.as_pointer()), align=1)
                return (lambda b: builder.load(builder.gep(wds[i], [b])),
                        lambda b: builder.load(builder.gep(wms[i], [b])), w_vec)
            p = {"aq": base(3, 4), "ad": base(13, 15), "am": base(14, 15), "bsum": base(17, 18)}
            r = _rows8_codegen(context, builder, variant, p, [source(i) for i in range(8)], iscs, imns, args[16])
            yp = builder.bitcast(base(19, 20), ir.VectorType(ir.FloatType(), 8).as_pointer())
            builder.store(r, yp, align=4)
            return context.get_dummy_value()
        if not _dtypes_are((wq, aq, isc, imn, wd, wm, ad, am, bsum, y),
                           (types.int8, types.int8, types.int32, types.int32, types.float32, types.float32,
                            types.float32, types.float32, types.int32, types.float32)):
            return None
        return types.void(wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo,
                          y, yo), codegen
    return _vrows8


def _make_row(sub, nsub, mins, mode, offset, grp, src=None):
    """The row-dot intrinsic of one arithmetic variant, over unpacked rows (_vrow) or, with `src`
    (a _RAW_LAYOUT key), over the packed rows themselves (_vrow_raw)."""
    variant = (sub, nsub, mins, mode, offset, grp)

    def ptrs(context, builder, sig, args, names):
        return {n: builder.gep(context.make_array(sig.args[k])(context, builder, args[k]).data, [args[o]])
                for n, (k, o) in names.items()}

    @intrinsic
    def _vrow(typingctx, wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo):
        """One weight row . one token, over n_sb super-blocks of nsub sub-blocks of `sub`:
        wq[wo:], isc/imn[io:] (per sub-block), wd/wm[so:] (per super-block); aq[ao:], ad/am[to:]
        (per super-block: the scale, and Q8_1's s or the scale again), bsum[bo:] (per sub-block).
        Integer lanes per 32 elements as _quad_lanes, times the sub-block scales (Q6_K: unsigned
        quants less `offset` * madd(bsums, scales)); then the float steps of llama.cpp's kernel
        (`mode`, `mins`, group `grp`) with d = d_a * d_w, dmin = -(d_a * dmin_w)."""
        def codegen(context, builder, sig, args):
            p = ptrs(context, builder, sig, args, {"wq": (0, 1), "aq": (2, 3), "isc": (4, 6), "imn": (5, 6),
                                                   "wd": (7, 9), "wm": (8, 9), "ad": (10, 12), "am": (11, 12),
                                                   "bsum": (14, 15)})
            vt = ir.VectorType(_I8, 32)

            def w_vec(b, e, c):
                return builder.load(builder.bitcast(builder.gep(p["wq"], [e]), vt.as_pointer()), align=1)
            wsrc = (lambda b: builder.load(builder.gep(p["wd"], [b])),
                    lambda b: builder.load(builder.gep(p["wm"], [b])), w_vec)
            return _row_codegen(context, builder, variant, p, wsrc, args[13])
        if not _dtypes_are((wq, aq, isc, imn, wd, wm, ad, am, bsum),
                           (types.int8, types.int8, types.int32, types.int32, types.float32, types.float32,
                            types.float32, types.float32, types.int32)):
            return None
        return types.float32(wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo), codegen

    @intrinsic
    def _vrow_raw(typingctx, raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo):
        """As _vrow, the row's blocks read from raw[ro:] (uint8, packed as `src`); isc, imn, wd, wm:
        the row's unpacked scales (super-block types; the 32-element types read theirs from raw)."""
        def codegen(context, builder, sig, args):
            p = ptrs(context, builder, sig, args, {"raw": (0, 1), "aq": (2, 3), "ad": (8, 10), "am": (9, 10),
                                                   "bsum": (12, 13)})
            for k, name in ((4, "isc"), (5, "imn"), (6, "wd"), (7, "wm")):
                p[name] = context.make_array(sig.args[k])(context, builder, args[k]).data
            wsrc = _raw_source(context, builder, src, p["raw"], p)
            return _row_codegen(context, builder, variant, p, wsrc, args[11])
        if not _dtypes_are((raw, aq, isc, imn, wd, wm, ad, am, bsum),
                           (types.uint8, types.int8, types.int32, types.int32, types.float32, types.float32,
                            types.float32, types.float32, types.int32)):
            return None
        return types.float32(raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo), codegen

    return _vrow if src is None else _vrow_raw


def _lookup16(builder, table, idx):
    """<16 x i8> table[idx & 15], written as a build of variable extracts (LLVM's x86 backend makes
    this one pshufb / vpermb, AArch64 a tbl)."""
    idx = builder.and_(idx, ir.Constant(idx.type, [15] * 16))
    out = ir.Constant(idx.type, ir.Undefined)
    for i in range(16):
        e = builder.extract_element(idx, ir.Constant(_I32, i))
        out = builder.insert_element(out, builder.extract_element(table, e), ir.Constant(_I32, i))
    return out


def _make_nib(mode):
    @intrinsic
    def _vnib(typingctx, dst, do, src, so, c, qh):
        """16 bytes at src[so] -> dst[do:do+32]: low nibbles then high nibbles, in one 32-byte store;
        mode "qh": + ((qh >> i) & 1) << 4 (Q5_0/Q5_1); then + c; mode "kv": dst = KV[nibble]."""
        def codegen(context, builder, sig, args):
            v16, v32, w32 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 32), ir.VectorType(_I32, 32)
            v = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], v16), align=1)
            lo = builder.and_(v, ir.Constant(v16, [15] * 16))
            hi = builder.lshr(v, ir.Constant(v16, [4] * 16))
            if mode == "kv":
                # two 16-byte lookups, each one variable shuffle (pshufb / tbl), stored apart: joined
                # into one vector, LLVM sees a 32-lane gather from two index vectors and scalarizes it
                table = ir.Constant(v16, [ir.Constant(_I8, x & 0xFF) for x in _KV])
                p = _ptr(context, builder, sig.args[0], args[0], args[1], v16)
                builder.store(_lookup16(builder, table, lo), p, align=1)
                builder.store(_lookup16(builder, table, hi), builder.gep(p, [ir.Constant(_I32, 1)]), align=1)
                return context.get_dummy_value()
            r = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
            if mode == "qh":
                bits = builder.lshr(_splat(builder, args[5], w32), ir.Constant(w32, list(range(32))))
                bits = builder.shl(builder.and_(bits, ir.Constant(w32, [1] * 32)), ir.Constant(w32, [4] * 32))
                r = builder.add(r, builder.trunc(bits, v32))
            r = builder.add(r, _splat(builder, args[4], v32))
            builder.store(r, _ptr(context, builder, sig.args[0], args[0], args[1], v32), align=1)
            return context.get_dummy_value()
        if not _dtypes_are((dst, src), (types.int8, types.uint8)):
            return None
        return types.void(dst, do, src, so, c, qh), codegen
    return _vnib


@intrinsic
def _vbits(typingctx, dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c):
    """dst[do+i] = ((a[ao+i] >> sa) & ma) + (((b[bo+i] >> sb) & mb) << lb) + c for i < 32, bytewise
    mod 256 (shifts < 8)."""
    def codegen(context, builder, sig, args):
        vt = ir.VectorType(_I8, 32)
        s = [_splat(builder, args[k], vt) for k in (4, 5, 8, 9, 10, 11)]
        va = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], vt), align=1)
        vb = builder.load(_ptr(context, builder, sig.args[6], args[6], args[7], vt), align=1)
        r = builder.and_(builder.lshr(va, s[0]), s[1])
        h = builder.shl(builder.and_(builder.lshr(vb, s[2]), s[3]), s[4])
        r = builder.add(builder.add(r, h), s[5])
        builder.store(r, _ptr(context, builder, sig.args[0], args[0], args[1], vt), align=1)
        return context.get_dummy_value()
    if not _dtypes_are((dst, a, b), (types.int8, types.uint8, types.uint8)):
        return None
    return types.void(dst, do, a, ao, sa, ma, b, bo, sb, mb, lb, c), codegen


def _native_half(context) -> bool:
    """Whether the compile target widens half natively (x86 F16C, AArch64): elsewhere `fpext half`
    becomes a libcall (__extendhfsf2) that numba's JIT does not resolve. Numba keys its cache on
    the target CPU and features, so the choice is consistent per cache entry."""
    triple = llvm.get_process_triple()
    if triple.startswith(("x86_64", "i386", "i686")):
        return "+f16c" in (getattr(context.codegen(), "_tm_features", "") or "").split(",")
    return triple.startswith(("aarch64", "arm64"))


def _half_to_float(builder, h16, native):
    """IEEE binary16 bits (i16) -> float exactly (NaN payloads kept, as numpy): `fpext half` where
    native, else integer ops plus one exact multiply (by 2^-24, for subnormals)."""
    if native:
        return builder.fpext(builder.bitcast(h16, ir.HalfType()), ir.FloatType())
    c = lambda v: ir.Constant(_I32, v)  # noqa: E731
    h = builder.zext(h16, _I32)
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    e = builder.and_(builder.lshr(h, c(10)), c(31))
    m = builder.and_(h, c(0x3FF))
    m13 = builder.shl(m, c(13))
    normal = builder.or_(builder.shl(builder.add(e, c(112)), c(23)), m13)
    infnan = builder.or_(c(0x7F800000), m13)
    sub = builder.fmul(builder.uitofp(m, ir.FloatType()), ir.Constant(ir.FloatType(), 2.0 ** -24))
    bits = builder.select(builder.icmp_unsigned("==", e, c(31)), infnan, normal)
    bits = builder.select(builder.icmp_unsigned("==", e, c(0)), builder.bitcast(sub, _I32), bits)
    return builder.bitcast(builder.or_(bits, sign), ir.FloatType())


def _make_f16(mode):
    @intrinsic
    def _f16(typingctx, raw, o):
        """The IEEE binary16 at byte o of a uint8 array, widened exactly to float32."""
        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[0], args[0], args[1], ir.IntType(16))
            native = _native_half(context) if mode == "auto" else mode == "native"
            return _half_to_float(builder, builder.load(p, align=1), native)
        if not _dtypes_are((raw,), (types.uint8,)):
            return None
        return types.float32(raw, o), codegen
    return _f16


_f16_at, _f16_at_int = _make_f16("auto"), _make_f16("int")      # the second for the tests


@intrinsic
def _f32_at(typingctx, raw, o):
    """The float32 at byte o of a uint8 array."""
    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], ir.FloatType()), align=1)
    return types.float32(raw, o), codegen


# every (sub, nsub, mins, mode, offset, grp) the registry uses (QDot.variants picks one by index)
_VARIANTS = (
    (32, 1, NO_MIN, LANES, 0, 0), (32, 1, Q8_1_SUM, LANES, 0, 0), (32, 1, NO_MIN, LANES2, 0, 0),
    (32, 1, NO_MIN, GROUPS, 0, 32),                                         # Q8_0/Q5_0/Q4_0/IQ4_NL, Q4_1/Q5_1
    (32, 8, NO_MIN, LANES, 0, 0), (32, 8, K_SUM, LANES, 0, 0), (32, 8, K_MIN4, LANES, 0, 0),
    (32, 8, NO_MIN, TILED, 0, 0), (32, 8, K_MINS, TILED, 0, 0),
    (32, 8, K_MINS, GROUPS, 0, 64), (32, 8, K_MINS, GROUPS, 0, 256),        # IQ4_XS/Q8_K, Q5_K, Q4_K
    (16, 16, NO_MIN, LANES, 0, 0), (16, 16, NO_MIN, LANES, 32, 0), (16, 16, K_LANES, LANES, 0, 0),
    (16, 16, NO_MIN, TILED, 0, 0), (16, 16, NO_MIN, TILED, 32, 0), (16, 16, K_MINS, TILED, 0, 0),
    (16, 16, K_MINS, GROUPS, 0, 128), (16, 16, K_MINS, GROUPS, 0, 256),    # Q3_K, Q6_K, Q2_K
)
_VARIANT_ID = {v: i for i, v in enumerate(_VARIANTS)}
_VARIANT_ARR = np.array(_VARIANTS, dtype=np.int64)
(_vr0, _vr1, _vr2, _vr3, _vr4, _vr5, _vr6, _vr7, _vr8, _vr9, _vr10, _vr11, _vr12, _vr13, _vr14, _vr15, _vr16,
 _vr17, _vr18) = (_make_row(*v) for v in _VARIANTS)
_vnib, _vnib_qh, _vnib_kv = _make_nib("plain"), _make_nib("qh"), _make_nib("kv")

# (layout, variant) of every packed-row intrinsic: each type's one-token variants (QDot.raw names a
# type's layout). The codebook types (IQ4_NL, IQ4_XS) are left to the unpacking path: built in
# registers, their two 16-byte lookups joined into one vector become a scalarized gather (3.9 GB/s
# against 11.8 unpacked).
_RAW_ROWS = (("q4_0", 0), ("q4_0", 3), ("q4_1", 1), ("q5_0", 0), ("q5_1", 1), ("q8_0", 0), ("q2_k", 13),
             ("q2_k", 18), ("q3_k", 11), ("q4_k", 6), ("q4_k", 10), ("q5_k", 5), ("q6_k", 12), ("q8_k", 4))
_RAW_ID = {rv: i for i, rv in enumerate(_RAW_ROWS)}
(_rr0, _rr1, _rr2, _rr3, _rr4, _rr5, _rr6, _rr7, _rr8, _rr9, _rr10, _rr11, _rr12, _rr13) = \
    (_make_row(*_VARIANTS[v], src=s) for s, v in _RAW_ROWS)


# the GROUPS (repacked types), TILED (K-quants, 8+ tokens) and plain LANES variants run 8 rows at a
# time in the batched path
_ROWS8 = (3, 9, 10, 17, 18, 7, 8, 14, 15, 16, 0)
_g3, _g9, _g10, _g17, _g18, _g7, _g8, _g14, _g15, _g16, _g0 = (_make_rows8(*_VARIANTS[v]) for v in _ROWS8)


def raw_row_id(layout: str | None, vid: int) -> int:
    """The packed-row intrinsic of a type's `layout` (QDot.raw) in variant vid, or -1 (unpack first)."""
    return _RAW_ID.get((layout, vid), -1)


# ---------------------------------------------------------------- primitives: vector or plain loop

@njit(cache=True)
def _prow(wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo, vid, lanes, ilane):
    # the plain-loop twin of _vrow for variant vid, op for op (scratch: lanes f32[24], ilane i64[8])
    sub, nsub, mins, mode, offset, grp = _VARIANT_ARR[vid]
    lanes[:] = 0                # [0:8] the dot lanes, [8:16] odd blocks (LANES2), [16:24] mins
    sacc = np.float32(0.0)
    for b in range(n_sb):
        k0 = b * nsub
        da = ad[to + b]
        d = da * wd[so + b]
        dmin = -(da * wm[so + b])
        ilane[:] = 0
        for c in range(sub * nsub // 32):
            for h in range(32 // sub):              # the chunk's sub-blocks
                sc = np.int64(isc[io + k0 + (32 * c) // sub + h])
                e0 = b * sub * nsub + 32 * c + h * sub
                for i in range(h * sub, (h + 1) * sub, 4):
                    q = np.int64(0)
                    for u in range(4):
                        q += np.int64(wq[wo + e0 + i - h * sub + u]) * np.int64(aq[ao + e0 + i - h * sub + u])
                    ilane[i >> 2] += sc * q
            if offset:
                kk = io + k0 + 2 * c
                corr = offset * (np.int64(bsum[bo + k0 + 2 * c]) * isc[kk] +
                                 np.int64(bsum[bo + k0 + 2 * c + 1]) * isc[kk + 1])
                ilane[c % 8 if mode == LANES else 0] -= corr
            if mode == GROUPS and (c + 1) * 32 % grp == 0:
                g = (c + 1) * 32 // grp - 1
                sacc = _fma(np.float32(ilane.sum()), d, sacc)
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
            r = np.float32(ilane.sum()) * wd[so + b]
            if mins == K_MINS:
                r = _fma(-wm[so + b], np.float32(msum), r)
            sacc = _fma(r, da, sacc)
        elif mode == LANES2:
            if (b | 1) == n_sb:         # an odd count's last block: a scalar fma after the hsum
                sacc = np.float32(ilane.sum())
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
                lanes[16] = _fma(x, y, lanes[16]) if _SCALAR_FMA else lanes[16] + x * y
            elif mins == K_SUM:
                lanes[16] = _fma(dmin, np.float32(msum), lanes[16]) if _SCALAR_FMA else \
                    lanes[16] + dmin * np.float32(msum)
            elif mins == K_MIN4:
                for k in range(4):
                    ml = np.int64(imn[io + k0 + 2 * k]) * bsum[bo + k0 + 2 * k] + \
                        np.int64(imn[io + k0 + 2 * k + 1]) * bsum[bo + k0 + 2 * k + 1]
                    lanes[16 + k] = _fma(dmin, np.float32(ml), lanes[16 + k])
    if mode == GROUPS:
        return sacc - lanes[16] if mins == K_MINS else sacc
    if mode == TILED:
        return sacc
    if mode == LANES2:
        for k in range(8):
            lanes[k] = lanes[k] + lanes[8 + k]
        r = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
        return r + lanes[16] * sacc if n_sb & 1 else r
    r = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
    if mins == Q8_1_SUM or mins == K_SUM:
        r += lanes[16]
    elif mins == K_MIN4:
        r += (lanes[16] + lanes[18]) + (lanes[17] + lanes[19])
    return r


@njit(cache=True, inline="always")
def _row(vec, vid, wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo, lanes, ilane):
    """One row . one token in the arithmetic of variant vid (see _vrow): vector or plain loops."""
    if not vec:
        return _prow(wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo, vid, lanes, ilane)
    a = (wq, wo, aq, ao, isc, imn, io, wd, wm, so, ad, am, to, n_sb, bsum, bo)
    if vid < 10:
        if vid == 0:
            return _vr0(*a)
        if vid == 1:
            return _vr1(*a)
        if vid == 2:
            return _vr2(*a)
        if vid == 3:
            return _vr3(*a)
        if vid == 4:
            return _vr4(*a)
        if vid == 5:
            return _vr5(*a)
        if vid == 6:
            return _vr6(*a)
        if vid == 7:
            return _vr7(*a)
        if vid == 8:
            return _vr8(*a)
        return _vr9(*a)
    if vid == 10:
        return _vr10(*a)
    if vid == 11:
        return _vr11(*a)
    if vid == 12:
        return _vr12(*a)
    if vid == 13:
        return _vr13(*a)
    if vid == 14:
        return _vr14(*a)
    if vid == 15:
        return _vr15(*a)
    if vid == 16:
        return _vr16(*a)
    if vid == 17:
        return _vr17(*a)
    return _vr18(*a)


@njit(cache=True, inline="always")
def _raw_row(ri, raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo):
    """One packed row . one token through packed-row intrinsic ri (see _RAW_ROWS)."""
    a = (raw, ro, aq, ao, isc, imn, wd, wm, ad, am, to, n_sb, bsum, bo)
    if ri < 7:
        if ri == 0:
            return _rr0(*a)
        if ri == 1:
            return _rr1(*a)
        if ri == 2:
            return _rr2(*a)
        if ri == 3:
            return _rr3(*a)
        if ri == 4:
            return _rr4(*a)
        if ri == 5:
            return _rr5(*a)
        return _rr6(*a)
    if ri == 7:
        return _rr7(*a)
    if ri == 8:
        return _rr8(*a)
    if ri == 9:
        return _rr9(*a)
    if ri == 10:
        return _rr10(*a)
    if ri == 11:
        return _rr11(*a)
    if ri == 12:
        return _rr12(*a)
    return _rr13(*a)


@njit(cache=True, inline="always")
def _rows8(vid, wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo, y, yo):
    """8 unpacked rows . one token into y[yo:yo+8] if variant vid has an 8-row kernel (True), else False."""
    a = (wq, wo, n_in, aq, ao, isc, imn, io, n_sub, wd, wm, so, n_sbs, ad, am, to, n_sb, bsum, bo, y, yo)
    if vid == 3:
        _g3(*a)
    elif vid == 9:
        _g9(*a)
    elif vid == 10:
        _g10(*a)
    elif vid == 17:
        _g17(*a)
    elif vid == 18:
        _g18(*a)
    elif vid == 7:
        _g7(*a)
    elif vid == 8:
        _g8(*a)
    elif vid == 14:
        _g14(*a)
    elif vid == 15:
        _g15(*a)
    elif vid == 16:
        _g16(*a)
    elif vid == 0:
        _g0(*a)
    else:
        return False
    return True


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
    # 16 bytes at o -> 32 values: low nibbles, then high nibbles, plus c
    if vec:
        _vnib(wq, y, raw, o, c, 0)
        return
    for i in range(16):
        v = np.int64(raw[o + i])
        wq[y + i] = np.int8((v & 15) + c)
        wq[y + 16 + i] = np.int8((v >> 4) + c)


@njit(cache=True, inline="always")
def _nib32_qh(vec, wq, y, raw, o, qh, c):
    # as _nib32, with bit i of the u32 qh as the fifth bit of value i
    if vec:
        _vnib_qh(wq, y, raw, o, c, qh)
        return
    for i in range(16):
        v = np.int64(raw[o + i])
        wq[y + i] = np.int8(((v & 15) | (((qh >> i) & 1) << 4)) + c)
        wq[y + 16 + i] = np.int8(((v >> 4) | (((qh >> (i + 16)) & 1) << 4)) + c)


@njit(cache=True, inline="always")
def _nib32_kv(vec, wq, y, raw, o):
    # as _nib32, through the IQ4 codebook
    if vec:
        _vnib_kv(wq, y, raw, o, 0, 0)
        return
    for i in range(16):
        v = np.int64(raw[o + i])
        wq[y + i] = _KV_NP[v & 15]
        wq[y + 16 + i] = _KV_NP[v >> 4]


# ---------------------------------------------------------------- per-type row unpacking
# unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm): n_sb super-blocks from byte o of raw

@njit(cache=True)
def _unpack_q4_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | u8 qs[16];  w = d * (q - 8)
    for b in range(n_sb):
        p = o + b * 18
        wd[b] = _f16_at(raw, p)
        isc[b] = 1
        _nib32(vec, wq, b * 32, raw, p + 2, -8)


@njit(cache=True)
def _unpack_q4_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | f16 m | u8 qs[16];  w = d*q + m
    for b in range(n_sb):
        p = o + b * 20
        wd[b] = _f16_at(raw, p)
        wm[b] = _f16_at(raw, p + 2)
        isc[b] = 1
        _nib32(vec, wq, b * 32, raw, p + 4, 0)


@njit(cache=True)
def _unpack_q5_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | u32 qh | u8 qs[16];  w = d * ((nibble | bit << 4) - 16)
    for b in range(n_sb):
        p = o + b * 22
        wd[b] = _f16_at(raw, p)
        isc[b] = 1
        qh = _u32(raw, p + 2)
        _nib32_qh(vec, wq, b * 32, raw, p + 6, qh, -16)


@njit(cache=True)
def _unpack_q5_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | f16 m | u32 qh | u8 qs[16];  w = d * (nibble | bit << 4) + m
    for b in range(n_sb):
        p = o + b * 24
        wd[b] = _f16_at(raw, p)
        wm[b] = _f16_at(raw, p + 2)
        isc[b] = 1
        qh = _u32(raw, p + 4)
        _nib32_qh(vec, wq, b * 32, raw, p + 8, qh, 0)


@njit(cache=True)
def _unpack_q8_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | i8 qs[32]
    for b in range(n_sb):
        p = o + b * 34
        wd[b] = _f16_at(raw, p)
        isc[b] = 1
        _bits(vec, wq, b * 32, raw, p + 2, 0, 255, raw, p, 0, 0, 0, 0)


@njit(cache=True)
def _unpack_iq4_nl(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | u8 qs[16] (codebook indices);  w = d * kv[q]
    for b in range(n_sb):
        p = o + b * 18
        wd[b] = _f16_at(raw, p)
        isc[b] = 1
        _nib32_kv(vec, wq, b * 32, raw, p + 2)


@njit(cache=True, inline="always")
def _sc_q2_k(raw, p, b, isc, imn, wd, wm):
    # u8 scales[16] (lo: scale, hi: min) | u8 qs[64] | f16 d | f16 dmin; 16 sub-blocks of 16
    wd[b] = _f16_at(raw, p + 80)
    wm[b] = _f16_at(raw, p + 82)
    for g in range(16):
        sc = np.int64(raw[p + g])
        isc[b * 16 + g] = sc & 15
        imn[b * 16 + g] = sc >> 4


@njit(cache=True)
def _unpack_q2_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # element h*128 + s*32 + l = (qs[h*32 + l] >> 2s) & 3
    for b in range(n_sb):
        p = o + b * 84
        _sc_q2_k(raw, p, b, isc, imn, wd, wm)
        for h in range(2):
            for s in range(4):
                _bits(vec, wq, b * 256 + h * 128 + s * 32, raw, p + 16 + h * 32, 2 * s, 3,
                      raw, p, 0, 0, 0, 0)


@njit(cache=True, inline="always")
def _sc_q3_k(raw, p, b, isc, imn, wd, wm):
    # u8 hmask[32] | u8 qs[64] | u8 scales[12] (16 x 6 bit, -32) | f16 d; 16 sub-blocks of 16
    wd[b] = _f16_at(raw, p + 108)
    so = p + 96
    for g in range(16):
        if g < 8:
            lo = np.int64(raw[so + g]) & 15
        else:
            lo = np.int64(raw[so + g - 8]) >> 4
        hi = (np.int64(raw[so + 8 + (g & 3)]) >> (2 * (g >> 2))) & 3
        isc[b * 16 + g] = (lo | (hi << 4)) - 32


@njit(cache=True)
def _unpack_q3_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # element h*128 + s*32 + l = ((qs[h*32 + l] >> 2s) & 3) + 4 * ((hmask[l] >> (4h + s)) & 1) - 4
    for b in range(n_sb):
        p = o + b * 110
        _sc_q3_k(raw, p, b, isc, imn, wd, wm)
        for h in range(2):
            for s in range(4):
                _bits(vec, wq, b * 256 + h * 128 + s * 32, raw, p + 32 + h * 32, 2 * s, 3,
                      raw, p, 4 * h + s, 1, 2, -4)


@njit(cache=True, inline="always")
def _sc_q4_k(raw, p, b, isc, imn, wd, wm):
    # Q4_K/Q5_K: f16 d | f16 dmin | 12 bytes of 8 x (6-bit scale, 6-bit min)
    wd[b] = _f16_at(raw, p)
    wm[b] = _f16_at(raw, p + 2)
    so = p + 4
    for j in range(8):
        if j < 4:
            sc = np.int64(raw[so + j]) & 63
            m = np.int64(raw[so + j + 4]) & 63
        else:
            sc = (np.int64(raw[so + j + 4]) & 15) | ((np.int64(raw[so + j - 4]) >> 6) << 4)
            m = (np.int64(raw[so + j + 4]) >> 4) | ((np.int64(raw[so + j]) >> 6) << 4)
        isc[b * 8 + j] = sc
        imn[b * 8 + j] = m


@njit(cache=True)
def _unpack_q4_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | f16 dmin | u8 scales[12] | u8 qs[128]; sub-block s = (qs[(s//2)*32 + l] >> 4(s%2)) & 15
    for b in range(n_sb):
        p = o + b * 144
        _sc_q4_k(raw, p, b, isc, imn, wd, wm)
        for s in range(8):
            _bits(vec, wq, b * 256 + s * 32, raw, p + 16 + (s >> 1) * 32, 4 * (s & 1), 15,
                  raw, p, 0, 0, 0, 0)


@njit(cache=True)
def _unpack_q5_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]; + ((qh[l] >> s) & 1) << 4
    for b in range(n_sb):
        p = o + b * 176
        _sc_q4_k(raw, p, b, isc, imn, wd, wm)
        for s in range(8):
            _bits(vec, wq, b * 256 + s * 32, raw, p + 48 + (s >> 1) * 32, 4 * (s & 1), 15,
                  raw, p + 16, s, 1, 4, 0)


@njit(cache=True, inline="always")
def _sc_q6_k(raw, p, b, isc, imn, wd, wm):
    # u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d; 16 sub-blocks of 16
    wd[b] = _f16_at(raw, p + 208)
    for g in range(16):
        isc[b * 16 + g] = np.int64(raw[p + 192 + g]) - ((np.int64(raw[p + 192 + g]) >> 7) << 8)


@njit(cache=True)
def _unpack_q6_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    # unsigned (offset 32): element h*128 + k*32 + l =
    #   ((ql[h*64 + (k&1)*32 + l] >> 4(k>>1)) & 15) + (((qh[h*32 + l] >> 2k) & 3) << 4)
    for b in range(n_sb):
        p = o + b * 210
        _sc_q6_k(raw, p, b, isc, imn, wd, wm)
        for h in range(2):
            for k in range(4):
                _bits(vec, wq, b * 256 + h * 128 + k * 32, raw, p + h * 64 + (k & 1) * 32, 4 * (k >> 1), 15,
                      raw, p + 128 + h * 32, 2 * k, 3, 4, 0)


@njit(cache=True, inline="always")
def _sc_q8_k(raw, p, b, isc, imn, wd, wm):
    # f32 d | i8 qs[256] | i16 bsums[16]; 8 sub-blocks of 32, scale 1
    wd[b] = _f32_at(raw, p)
    for s in range(8):
        isc[b * 8 + s] = 1


@njit(cache=True)
def _unpack_q8_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    for b in range(n_sb):
        p = o + b * 292
        _sc_q8_k(raw, p, b, isc, imn, wd, wm)
        for s in range(8):
            _bits(vec, wq, b * 256 + s * 32, raw, p + 4 + s * 32, 0, 255, raw, p, 0, 0, 0, 0)


@njit(cache=True, inline="always")
def _sc_iq4_xs(raw, p, b, isc, imn, wd, wm):
    # f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]; sub-block s: (ls - 32) * kv[q]
    wd[b] = _f16_at(raw, p)
    sh = _u16(raw, p + 2)
    for s in range(8):
        ls = ((np.int64(raw[p + 4 + (s >> 1)]) >> (4 * (s & 1))) & 15) | (((sh >> (2 * s)) & 3) << 4)
        isc[b * 8 + s] = ls - 32


@njit(cache=True)
def _unpack_iq4_xs(vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    for b in range(n_sb):
        p = o + b * 136
        _sc_iq4_xs(raw, p, b, isc, imn, wd, wm)
        for s in range(8):
            _nib32_kv(vec, wq, b * 256 + s * 32, raw, p + 8 + s * 16)


@njit(cache=True)
def _scales_any(tid, raw, o, n_sb, isc, imn, wd, wm):
    """The scales of one row of a super-block type (tid) from byte o, as its unpacker writes them."""
    for b in range(n_sb):
        if tid == 10:
            _sc_q2_k(raw, o + b * 84, b, isc, imn, wd, wm)
        elif tid == 11:
            _sc_q3_k(raw, o + b * 110, b, isc, imn, wd, wm)
        elif tid == 12:
            _sc_q4_k(raw, o + b * 144, b, isc, imn, wd, wm)
        elif tid == 13:
            _sc_q4_k(raw, o + b * 176, b, isc, imn, wd, wm)
        elif tid == 14:
            _sc_q6_k(raw, o + b * 210, b, isc, imn, wd, wm)
        elif tid == 15:
            _sc_q8_k(raw, o + b * 292, b, isc, imn, wd, wm)
        elif tid == 23:
            _sc_iq4_xs(raw, o + b * 136, b, isc, imn, wd, wm)


@njit(cache=True)
def _unpack_any(tid, vec, raw, o, n_sb, wq, isc, imn, wd, wm):
    """The unpacker of ggml type id `tid` (the kernel calls this; Python uses the registry)."""
    if tid == 2:
        _unpack_q4_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 3:
        _unpack_q4_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 6:
        _unpack_q5_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 7:
        _unpack_q5_1(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 8:
        _unpack_q8_0(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 20:
        _unpack_iq4_nl(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 10:
        _unpack_q2_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 11:
        _unpack_q3_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 12:
        _unpack_q4_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 13:
        _unpack_q5_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 14:
        _unpack_q6_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 15:
        _unpack_q8_k(vec, raw, o, n_sb, wq, isc, imn, wd, wm)
    elif tid == 23:
        _unpack_iq4_xs(vec, raw, o, n_sb, wq, isc, imn, wd, wm)


# ---------------------------------------------------------------- the kernel

@njit(cache=True, inline="always")
def _bound(c, n_out, n_chunks):
    # first row of row range c of n_chunks: a multiple of 8 (whole 8-row groups), n_out at the end
    return min(n_out, c * ((n_out + 7) // 8) // n_chunks * 8)


@njit(parallel=True, cache=True)
def _qmatmul(y, aq, ad, am, bsum, raw, tid, n_out, n_in, row_bytes, sub, sb, v_lo, v_hi, split, vec,
             n_chunks, group, r_lo, r_hi):
    # y f32[n_tok, n_out]; aq i8[n_tok * n_in]; ad, am f32[n_tok * n_in/sb] (scale; Q8_1's s or the
    # scale again); bsum i32[n_tok * n_in/sub] (Q8_K sub-block sums); raw: n_out rows of row_bytes;
    # tokens < split in the arithmetic of variant v_lo, the rest v_hi (see QDot.variants).
    # n_chunks row ranges in parallel; in each, `group` rows at a time are unpacked once, then
    # dotted with every token (a token's quants stay in L1 across the group). r_lo, r_hi >= 0: the
    # variants' packed-row intrinsics (_RAW_ROWS), which dot the packed rows without unpacking
    n_tok = y.shape[0]
    n_sb = n_in // sb
    n_sub = n_in // sub
    if vec and r_lo >= 0 and r_hi >= 0:
        for c in prange(n_chunks):
            isc = np.empty(n_sub, dtype=np.int32)            # one row's scales (super-block types)
            imn = np.zeros(n_sub, dtype=np.int32)
            wd = np.empty(n_sb, dtype=np.float32)
            wm = np.zeros(n_sb, dtype=np.float32)
            for r in range(_bound(c, n_out, n_chunks), _bound(c + 1, n_out, n_chunks)):
                if sb > 32:
                    _scales_any(tid, raw, r * row_bytes, n_sb, isc, imn, wd, wm)
                for t in range(n_tok):
                    y[t, r] = _raw_row(r_lo if t < split else r_hi, raw, r * row_bytes, aq, t * n_in, isc, imn,
                                       wd, wm, ad, am, t * n_sb, n_sb, bsum, t * n_sub)
        return
    for c in prange(n_chunks):
        wq = np.empty(group * n_in, dtype=np.int8)       # the group's unpacked rows and scales
        isc = np.empty(group * n_sub, dtype=np.int32)
        imn = np.zeros(group * n_sub, dtype=np.int32)
        wd = np.empty(group * n_sb, dtype=np.float32)
        wm = np.zeros(group * n_sb, dtype=np.float32)
        lanes = np.empty(24, dtype=np.float32)     # plain-loop scratch
        yrow = np.empty(8, dtype=np.float32)       # an 8-row kernel's results
        ilane = np.empty(8, dtype=np.int64)
        r_end = _bound(c + 1, n_out, n_chunks)
        for r0 in range(_bound(c, n_out, n_chunks), r_end, group):
            nr = min(group, r_end - r0)
            for i in range(nr):
                _unpack_any(tid, vec, raw, (r0 + i) * row_bytes, n_sb, wq[i * n_in:(i + 1) * n_in],
                            isc[i * n_sub:(i + 1) * n_sub], imn[i * n_sub:(i + 1) * n_sub],
                            wd[i * n_sb:(i + 1) * n_sb], wm[i * n_sb:(i + 1) * n_sb])
            for t in range(n_tok):
                vid = v_lo if t < split else v_hi
                if vec and nr == 8 and _rows8(vid, wq, 0, n_in, aq, t * n_in, isc, imn, 0, n_sub, wd, wm, 0, n_sb,
                                              ad, am, t * n_sb, n_sb, bsum, t * n_sub, yrow, 0):
                    for i in range(8):
                        y[t, r0 + i] = yrow[i]
                    continue
                for i in range(nr):
                    y[t, r0 + i] = _row(vec, vid, wq, i * n_in, aq, t * n_in, isc, imn, i * n_sub, wd, wm,
                                        i * n_sb, ad, am, t * n_sb, n_sb, bsum, t * n_sub, lanes, ilane)


# ---------------------------------------------------------------- public entry point

@functools.lru_cache(maxsize=4096)
def _plan(ggml_type, n_out: int, n_in: int, n_tok: int, v_n: int, v_off: int, n_threads: int):
    """What a call's shape decides, computed once per shape: (type, row bytes, act, sub, block
    elements, Q8_1 sums?, pos_ties, v_lo, v_hi, split, n_chunks, group, r_lo, r_hi); refusals raise."""
    from ramforge.kernels.registry import kernels_for  # the registry imports this module

    k = kernels_for(ggml_type)
    t = k.ggml_type
    if k.qdot is None:
        raise RamforgeError(f"{t.name} has no integer-dot kernel")
    be, bb = GGML_BLOCK[t]
    if n_in % be:
        raise RamforgeError(f"row length {n_in} is not a multiple of {t.name}'s block size {be}")
    qd = k.qdot
    v_lo, v_hi, split = qd.variants(be, n_out, v_n)
    split = min(max(split - v_off, 0), n_tok)
    group = 1 if n_tok < _GROUP_FROM_TOKENS else _GROUP_ROWS
    r_lo = r_hi = -1
    if group == 1:                      # few tokens: dot the packed rows (v_lo only runs below split)
        r_hi = raw_row_id(qd.raw, v_hi)
        r_lo = raw_row_id(qd.raw, v_lo) if split > 0 else r_hi
    pos_ties = split if qd.repack and n_out % 8 == 0 else 0
    return (t, n_in // be * bb, k.act, qd.sub, be, qd.mins == Q8_1_SUM, pos_ties, v_lo, v_hi, split,
            max(1, min(n_out, _CHUNKS_PER_THREAD * n_threads)), group, r_lo, r_hi)


def qmatmul(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int,
            vector: bool | None = None, view: tuple[int, int] | None = None) -> np.ndarray:
    """y[n_tok, n_out] = x[n_tok, n_in] @ W.T for a packed weight W of n_out rows of n_in elements,
    by integer dots as llama.cpp. vector: LLVM vector intrinsics (default: not RAMFORGE_PORTABLE=1).
    view (v_n, off): the tokens are rows off.. of a batch of v_n, and get that batch's arithmetic."""
    if (not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != n_in or not isinstance(y, np.ndarray)
            or y.shape != (x.shape[0], n_out) or y.dtype != np.float32):
        raise RamforgeError(f"matmul shapes: x {getattr(x, 'shape', x)}, y {getattr(y, 'shape', y)} "
                            f"{getattr(y, 'dtype', '')}, weight {n_out} x {n_in}")
    n_tok = x.shape[0]
    v_n, v_off = view if view is not None and 0 <= view[1] and view[1] + n_tok <= view[0] else (n_tok, 0)
    (t, row_bytes, act, sub, be, q81, pos_ties, v_lo, v_hi, split, n_chunks, group, r_lo,
     r_hi) = _plan(ggml_type, n_out, n_in, n_tok, v_n, v_off, numba.get_num_threads())
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.size != n_out * row_bytes:
        got = f"{raw.size:,} ({raw.dtype})" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise RamforgeError(f"{t.name} weight of {n_out} x {n_in} needs {n_out * row_bytes:,} B, got {got}")
    if n_tok == 0 or n_out == 0 or n_in == 0:
        y[...] = 0
        return y
    a = quantize_activation(x, act, sub, pos_ties=pos_ties)
    ad = a.d.reshape(-1)
    am = a.s.reshape(-1) if q81 else ad
    out = y if y.flags.c_contiguous and y.flags.writeable else np.empty_like(y)
    _qmatmul(out, a.q, ad, am, a.bsum.reshape(-1), np.ascontiguousarray(raw).reshape(-1), int(t), n_out, n_in,
             row_bytes, sub, be, v_lo, v_hi, split, VECTOR if vector is None else bool(vector), n_chunks,
             group, r_lo, r_hi)
    if out is not y:
        y[...] = out
    return y
