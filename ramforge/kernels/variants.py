"""The arithmetic variants of the integer-dot matmul, by name: how llama.cpp's x86 CPU backend
finishes a row dot for a type, row count and batch size (the build that recorded our oracle:
AVX2, FMA, AVX512-VNNI; REPACK, LLAMAFILE and its tiled K-quant matmul), which codegen.py and
rows.py reproduce op for op so that our results round as its results do.

A `Variant` names one (sub, nsub, mins, mode, offset, grp, post) of `SPECS`; `QDot.variants` picks them
for a call's shape; `RawRow` names the (type, variant) pairs that also have a packed-row intrinsic;
`ROWS8` the variants with an 8-row kernel. All are IntEnums: numba code takes them as ints.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from ramforge.gguf.constants import GGMLType


class Mode(IntEnum):
    """How the float steps of a row dot run."""

    LANES = 0     # vec_dot / tinyBLAS: per 32 elements 8 int32 lanes of 4 products, one fma per lane and
    #               (super-)block into 8 f32 lanes, hsum_float_8 at the end
    LANES2 = 1    # IQ4_NL's vec_dot: as LANES, even and odd blocks in two accumulators
    GROUPS = 2    # repacked gemv / gemm: the whole integer sum of each group of `grp` elements, one
    #               scalar fma per group (and one for the mins), acc - acc_min
    TILED = 3     # tiled K-quant matmul (8+ tokens): per super-block r = S1*d_w - dmin_w*S2 (an fma),
    #               acc = fma(r, d_a, acc)


class Mins(IntEnum):
    """The min / offset terms of a type in LANES mode (llama.cpp's handling, per type)."""

    NO_MIN = 0        # none
    Q8_1_SUM = 1      # Q4_1/Q5_1: summs += m * s per block (an fma), added after hsum
    K_SUM = 2         # Q5_K: summs += (-d_a*dmin) * sum_j min_j*bsum_j per super-block (an fma), added
    K_MIN4 = 3        # Q4_K: 4 f32 lanes of min pairs, fma'd, summed, added
    K_LANES = 4       # Q2_K: 8 lanes of min pairs fma'd into the main lanes before the dot
    K_MINS = 5        # GROUPS / TILED modes: the type has mins
    IQ1_DELTA = 6     # IQ1_S: unpacked quants are 8*grid + delta8; the grid lanes as LANES with d = d_a * 8*wd,
    #                   the delta8 sums (an integer per super-block) fma'd with d into a scalar, + 1/8 of it
    IQ1_DLANES = 7    # IQ1_M: as IQ1_DELTA, the delta8 sums in 8 lanes of their own, + 1/8 of their hsum


LANES, LANES2, GROUPS, TILED = Mode
NO_MIN, Q8_1_SUM, K_SUM, K_MIN4, K_LANES, K_MINS, IQ1_DELTA, IQ1_DLANES = Mins
IQ1_MINS = (IQ1_DELTA, IQ1_DLANES)           # signed quants, split into grid and delta in registers
SCALAR_FMA = True    # llama.cpp's scalar `summs += a * b` is contracted to an fma (GCC, -march=native)
TERNARY_OFFSET = 1   # the ternary types' quant offset (TQ1_0, TQ2_0: w = q - 1); their sub-block scales are
#                      all 1, so a Spec with this offset applies none (codegen skips the multiplies)
TILED_FROM = 8       # llama.cpp's tiled K-quant matmul takes batches of at least this many tokens


class Spec(NamedTuple):
    """One arithmetic: sub-blocks of `sub` elements, `nsub` per super-block, the `mins` terms, the
    `mode`, the quant `offset` (w = q - offset), the GROUPS group size `grp` and `post`: the
    codebook types' power of two (IQ2: 0.125f, IQ3_XXS: 0.25f = 2^-post) that LANES multiplies the
    hsum by and TILED the weight scale by (d_w * 2^-post, as ggml's tiled unpack stores it)."""

    sub: int
    nsub: int
    mins: Mins
    mode: Mode
    offset: int
    grp: int
    post: int = 0


class Variant(IntEnum):
    """Every arithmetic the registry's types use. B32: 32-element blocks; K32 / K16: super-blocks of
    8 sub-blocks of 32 / 16 of 16."""

    B32_LANES = 0           # Q4_0, Q5_0, Q8_0, IQ4_NL vec_dot
    B32_LANES_Q81 = 1       # Q4_1, Q5_1
    B32_LANES2 = 2          # IQ4_NL, one token
    B32_GROUPS32 = 3        # Q4_0, IQ4_NL repacked
    K32_LANES = 4           # Q8_K, IQ4_XS
    K32_LANES_KSUM = 5      # Q5_K
    K32_LANES_KMIN4 = 6     # Q4_K
    K32_TILED = 7           # IQ4_XS 8+ tokens
    K32_TILED_MINS = 8      # Q4_K, Q5_K 8+ tokens
    K32_GROUPS64 = 9        # Q4_K repacked gemm
    K32_GROUPS256 = 10      # Q4_K repacked gemv
    K16_LANES = 11          # Q3_K
    K16_LANES_OFF32 = 12    # Q6_K
    K16_LANES_KLANES = 13   # Q2_K
    K16_TILED = 14          # Q3_K 8+ tokens
    K16_TILED_OFF32 = 15    # Q6_K 8+ tokens
    K16_TILED_MINS = 16     # Q2_K 8+ tokens
    K16_GROUPS128 = 17      # Q2_K repacked gemm
    K16_GROUPS256 = 18      # Q2_K repacked gemv
    K16_LANES_OFF1 = 19     # TQ1_0, TQ2_0
    K32_LANES_IQ1S = 20     # IQ1_S (8+ tokens: K32_TILED)
    K16_LANES_IQ1M = 21     # IQ1_M (8+ tokens: K16_TILED)
    K32_LANES_P3 = 22       # IQ2_XXS: 0.125f * hsum
    K16_LANES_P3 = 23       # IQ2_XS, IQ2_S
    K32_LANES_P2 = 24       # IQ3_XXS: 0.25f * hsum
    K32_TILED_P3 = 25       # IQ2_XXS 8+ tokens: d_w * 0.125f
    K16_TILED_P3 = 26       # IQ2_XS, IQ2_S 8+ tokens
    K32_TILED_P2 = 27       # IQ3_XXS 8+ tokens: d_w * 0.25f


V = Variant
SPECS: dict[Variant, Spec] = {
    V.B32_LANES: Spec(32, 1, NO_MIN, LANES, 0, 0),
    V.B32_LANES_Q81: Spec(32, 1, Q8_1_SUM, LANES, 0, 0),
    V.B32_LANES2: Spec(32, 1, NO_MIN, LANES2, 0, 0),
    V.B32_GROUPS32: Spec(32, 1, NO_MIN, GROUPS, 0, 32),
    V.K32_LANES: Spec(32, 8, NO_MIN, LANES, 0, 0),
    V.K32_LANES_KSUM: Spec(32, 8, K_SUM, LANES, 0, 0),
    V.K32_LANES_KMIN4: Spec(32, 8, K_MIN4, LANES, 0, 0),
    V.K32_TILED: Spec(32, 8, NO_MIN, TILED, 0, 0),
    V.K32_TILED_MINS: Spec(32, 8, K_MINS, TILED, 0, 0),
    V.K32_GROUPS64: Spec(32, 8, K_MINS, GROUPS, 0, 64),
    V.K32_GROUPS256: Spec(32, 8, K_MINS, GROUPS, 0, 256),
    V.K16_LANES: Spec(16, 16, NO_MIN, LANES, 0, 0),
    V.K16_LANES_OFF32: Spec(16, 16, NO_MIN, LANES, 32, 0),
    V.K16_LANES_KLANES: Spec(16, 16, K_LANES, LANES, 0, 0),
    V.K16_TILED: Spec(16, 16, NO_MIN, TILED, 0, 0),
    V.K16_TILED_OFF32: Spec(16, 16, NO_MIN, TILED, 32, 0),
    V.K16_TILED_MINS: Spec(16, 16, K_MINS, TILED, 0, 0),
    V.K16_GROUPS128: Spec(16, 16, K_MINS, GROUPS, 0, 128),
    V.K16_GROUPS256: Spec(16, 16, K_MINS, GROUPS, 0, 256),
    V.K16_LANES_OFF1: Spec(16, 16, NO_MIN, LANES, 1, 0),
    V.K32_LANES_IQ1S: Spec(32, 8, IQ1_DELTA, LANES, 0, 0),
    V.K16_LANES_IQ1M: Spec(16, 16, IQ1_DLANES, LANES, 0, 0),
    V.K32_LANES_P3: Spec(32, 8, NO_MIN, LANES, 0, 0, 3),
    V.K16_LANES_P3: Spec(16, 16, NO_MIN, LANES, 0, 0, 3),
    V.K32_LANES_P2: Spec(32, 8, NO_MIN, LANES, 0, 0, 2),
    V.K32_TILED_P3: Spec(32, 8, NO_MIN, TILED, 0, 0, 3),
    V.K16_TILED_P3: Spec(16, 16, NO_MIN, TILED, 0, 0, 3),
    V.K32_TILED_P2: Spec(32, 8, NO_MIN, TILED, 0, 0, 2),
}
_VARIANTS: tuple[Spec, ...] = tuple(SPECS[v] for v in Variant)       # by Variant value
_VARIANT_ID: dict[tuple, Variant] = {s: v for v, s in SPECS.items()}

# The GROUPS (repacked types), TILED (K-quants, 8+ tokens) and plain B32_LANES variants run 8 unpacked
# rows at a time in the batched path (rows.py, _vrows8).
_ROWS8: frozenset[Variant] = frozenset(
    [v for v, s in SPECS.items() if s.mode in (GROUPS, TILED)] + [V.B32_LANES])


class RawRow(IntEnum):
    """The packed-row intrinsics: each (type, variant) of a one-token matmul that reads its rows
    straight from their packed blocks. IQ4_XS looks its codebook up with the x86 32-byte pshufb
    intrinsic (IQ4_NL and MXFP4 are left to the unpacking path: in generic IR, two 16-byte lookups
    joined into one vector become a scalarized gather, 3.9 GB/s against 11.8 unpacked). IQ1_S / IQ1_M gather four 8-byte
    rows of a table per 32 quants (lowbit_ir.py); the IQ2 / IQ3 grids are scalar table loads either
    way (4 or 8 entries per 32 weights), which the packed rows keep in registers (iquants.raw_source)."""

    Q4_0_LANES = 0
    Q4_0_GROUPS32 = 1
    Q4_1_LANES = 2
    Q5_0_LANES = 3
    Q5_1_LANES = 4
    Q8_0_LANES = 5
    Q2_K_LANES = 6
    Q2_K_GROUPS256 = 7
    Q3_K_LANES = 8
    Q4_K_LANES = 9
    Q4_K_GROUPS256 = 10
    Q5_K_LANES = 11
    Q6_K_LANES = 12
    Q8_K_LANES = 13
    TQ2_0_LANES = 14
    TQ1_0_LANES = 15
    IQ1_S_LANES = 16
    IQ1_M_LANES = 17
    IQ2_XXS_LANES = 18      # the codebook types: grid entries gathered into registers (iquants.raw_source)
    IQ2_XS_LANES = 19
    IQ2_S_LANES = 20
    IQ3_XXS_LANES = 21
    IQ3_S_LANES = 22
    IQ4_XS_LANES = 23       # its 16-value codebook looked up by one pshufb (x86 AVX2; elsewhere two tbl)
    Q4_K_GROUPS64 = 24      # the repacked gemm's arithmetic, for a batch of 4 read packed (qmatmul._plan)


_G, R = GGMLType, RawRow
RAW_ROWS: dict[RawRow, tuple[GGMLType, Variant]] = {
    R.Q4_0_LANES: (_G.Q4_0, V.B32_LANES), R.Q4_0_GROUPS32: (_G.Q4_0, V.B32_GROUPS32),
    R.Q4_1_LANES: (_G.Q4_1, V.B32_LANES_Q81), R.Q5_0_LANES: (_G.Q5_0, V.B32_LANES),
    R.Q5_1_LANES: (_G.Q5_1, V.B32_LANES_Q81), R.Q8_0_LANES: (_G.Q8_0, V.B32_LANES),
    R.Q2_K_LANES: (_G.Q2_K, V.K16_LANES_KLANES), R.Q2_K_GROUPS256: (_G.Q2_K, V.K16_GROUPS256),
    R.Q3_K_LANES: (_G.Q3_K, V.K16_LANES), R.Q4_K_LANES: (_G.Q4_K, V.K32_LANES_KMIN4),
    R.Q4_K_GROUPS256: (_G.Q4_K, V.K32_GROUPS256), R.Q5_K_LANES: (_G.Q5_K, V.K32_LANES_KSUM),
    R.Q6_K_LANES: (_G.Q6_K, V.K16_LANES_OFF32), R.Q8_K_LANES: (_G.Q8_K, V.K32_LANES),
    R.TQ2_0_LANES: (_G.TQ2_0, V.K16_LANES_OFF1), R.TQ1_0_LANES: (_G.TQ1_0, V.K16_LANES_OFF1),
    R.IQ1_S_LANES: (_G.IQ1_S, V.K32_LANES_IQ1S), R.IQ1_M_LANES: (_G.IQ1_M, V.K16_LANES_IQ1M),
    R.IQ2_XXS_LANES: (_G.IQ2_XXS, V.K32_LANES_P3), R.IQ2_XS_LANES: (_G.IQ2_XS, V.K16_LANES_P3),
    R.IQ2_S_LANES: (_G.IQ2_S, V.K16_LANES_P3), R.IQ3_XXS_LANES: (_G.IQ3_XXS, V.K32_LANES_P2),
    R.IQ3_S_LANES: (_G.IQ3_S, V.K32_LANES), R.IQ4_XS_LANES: (_G.IQ4_XS, V.K32_LANES),
    R.Q4_K_GROUPS64: (_G.Q4_K, V.K32_GROUPS64),
}
del _G, R
_RAW_ROWS: tuple[tuple[GGMLType, Variant], ...] = tuple(RAW_ROWS[r] for r in RawRow)
_RAW_ID: dict[tuple[GGMLType, Variant], RawRow] = {rv: r for r, rv in RAW_ROWS.items()}


def raw_row_id(layout: GGMLType | None, vid: Variant) -> RawRow | int:
    """The packed-row intrinsic of a type's `layout` (QDot.raw) in variant vid, or -1 (unpack first)."""
    return _RAW_ID.get((layout, vid), -1)


@dataclass(frozen=True)
class QDot:
    """How a type runs through the integer-dot kernel.

    unpack(vec, raw, o, n_sb, wq, isc, imn, wd, wm) writes one row of n_sb super-blocks: int8
    quants wq, per sub-block of `sub` elements an integer scale isc and min imn, per super-block
    float scales wd and wm; weight = wd*isc*(wq - offset) [- wm*imn]. The rest says which
    arithmetic llama.cpp's x86 backend uses: `mins` in its vec_dot; `repack`: the (gemm, gemv)
    group sizes when it repacks the type (rows a multiple of 8; gemm for whole groups of 4
    tokens); `tiled`: batches of TILED_FROM+ tokens go to its tiled matmul; `lanes2`: one token
    takes the LANES2 vec_dot (more take tinyBLAS's LANES), every batch size where `vec_dot_only`
    (no tinyBLAS for the type). `raw`: the block layout (a type) that one-token matmuls read
    packed, or None to unpack first. `post`: see Spec. `wmax`: the largest |quant - offset| the
    unpacker writes (AVX2 tiles sum pmaddubsw's pairs as i16 where a pair fits: tiles.py)."""

    unpack: object
    sub: int
    mins: Mins = NO_MIN
    repack: tuple | None = None
    tiled: bool = False
    offset: int = 0
    lanes2: bool = False
    raw: GGMLType | None = None
    vec_dot_only: bool = False
    post: int = 0
    wmax: int = 127

    def variants(self, sb: int, n_out: int, n_tok: int) -> tuple[Variant, Variant, int]:
        """(variant for tokens < split, variant for the rest, split) for super-blocks of sb elements,
        n_out rows and n_tok tokens."""
        nsub = sb // self.sub
        has_min = self.mins in (K_SUM, K_MIN4, K_LANES)
        if self.repack and n_out % 8 == 0:
            gemm, gemv = self.repack
            m = K_MINS if has_min else NO_MIN
            return (_VARIANT_ID[Spec(self.sub, nsub, m, GROUPS, self.offset, gemm, self.post)],
                    _VARIANT_ID[Spec(self.sub, nsub, m, GROUPS, self.offset, gemv, self.post)], n_tok - n_tok % 4)
        if self.tiled and n_tok >= TILED_FROM:
            v = _VARIANT_ID[Spec(self.sub, nsub, K_MINS if has_min else NO_MIN, TILED, self.offset, 0, self.post)]
        elif self.lanes2 and (n_tok == 1 or self.vec_dot_only):
            v = _VARIANT_ID[Spec(self.sub, nsub, self.mins, LANES2, self.offset, 0, self.post)]
        else:
            v = _VARIANT_ID[Spec(self.sub, nsub, self.mins, LANES, self.offset, 0, self.post)]
        return v, v, n_tok
