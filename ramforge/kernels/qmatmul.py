"""Integer-dot matmul of quantized weights, bit for bit as llama.cpp's CPU backend computes it.

llama.cpp quantizes the activation to its weight type's `vec_dot_type` (Q8_0, Q8_1 or Q8_K) and
dots int8 quants with int8 quants in exact integer arithmetic, scaling once per block. Here:

1. `quantize_activation` (kernels.quantize) quantizes x once per matmul: int8 quants, one f32 scale per block
   of 32 (Q8_0/Q8_1, scale f16-rounded) or 256 (Q8_K), Q8_1's f16 s = d*sum(q) per 32 and Q8_K's
   integer sums per sub-block (llama.cpp's bsums) for the weight mins.
2. A kernel (parallel over row ranges) dots each weight row with every token. Batches (4+
   tokens) unpack a group of 8 rows once into int8 quants, integer sub-block scales / mins and
   float super-block scales (unpack.py, tunpack.py), then dot them with tiles of 16 tokens, the
   tokens in vector lanes (tiles.py: the GROUPS, TILED and 32-element LANES arithmetic), or token
   by token (the other variants: 8 rows at once, or row by row); fewer tokens read the packed rows
   straight into registers (RawRow):
       y = sum_b (d_w*d_a)_b * sum_j sc_j * <q_w, q_a>_j  [- (dmin_w*d_a)_b * sum_j m_j * bsum_j]
                                                          [+ (m_w * s_a)_b  for Q4_1/Q5_1]
   with the integer sums exact and the float steps those of the llama.cpp kernel that would run
   (vec_dot, tinyBLAS, its tiled K-quant matmul, repacked gemv/gemm: chosen, as there, by type,
   row count and batch size; see variants.py and QDot.variants), op for op: the same lanes, fmas
   and horizontal-sum order. The result equals ggml's mul_mat on the x86 build that recorded our
   oracle (AVX2, FMA, AVX512-VNNI) bit for bit; tests/test_qmatmul.py checks it live (-m oracle).
   Elsewhere it is within float rounding of llama.cpp.

The int8 work is numba intrinsics emitting LLVM vector IR (codegen.py, rows.py, unpack.py): generic
IR (LLVM picks vpmaddwd / pmaddwd / NEON, pshufb / tbl per machine), and one target intrinsic,
vpdpbusd, where the CPU has 256-bit VNNI (the integer sums are the same either way). Each has a
plain-loop twin; `vector=False` (or RAMFORGE_PORTABLE=1) runs those, bit for bit equal.

Each kernel is made for one (type, vector?, variants, path) by `_kernel`: a closure whose constants
leave numba only that type's unpacker and those variants' intrinsics to compile (a dispatch on a
constant keeps one branch). A model compiles the few kernels it runs, on first use, and numba's
disk cache keeps them (keyed by the constants).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from ramforge import flags
from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGML_BLOCK, GGMLType

from .batch import Batch
from .blocks import _row_scales
from .codegen import scales_in_registers
from .gemv8 import _vgemv8, gemv8_ok
from .naming import made_for
from .quantize import quantize_activation
from .registry import kernels_for
from .gemvrep import GEMM_Q4_K, _vgemv_rep
from .repack import KINDS as REPACK_KINDS
from .repack import _unpack_rows
from .rows import _prow, _vrow, _vrow_raw, _vrows8
from .tunpack import FAST, _vunpack
from .tiles import (LANES_MODE, SIGNED, TILE_ROWS, TT, UNSIGNED, _tile_acts, _vprep, _vtile, tile_from, tile_mode,
                    tile_rows, tiled)
from .unpack import _unpack_row
from .variants import _ROWS8, Q8_1_SUM, Variant, raw_row_id

VECTOR = not flags.PORTABLE.get()
_CHUNKS_PER_THREAD = 8        # row ranges per thread (load balance vs per-range scratch)
_GROUP_ROWS = 8               # rows unpacked together for a batch of tokens ...
_GROUP_FROM_TOKENS = 4        # ... of at least this many (a single token: one row at a time, in L1)
_PACKED_GEMM_TOKENS = 4       # a repacked type's batch of this many, all in its gemm's arithmetic, reads
#                               its rows packed token by token as 1-3 tokens do (a tile of 16 would be 3/4 idle)


# The @njit code below takes its arguments positionally (numba inlines these helpers into the kernel;
# a record of arrays would cost compile time). Names, as in rows.py and tiles.py:
#   y f32[n_tok, n_out] the result; aq, ad, am, bsum the quantized activation (QuantizedInput); raw u8 the
#   packed rows (row_bytes each); wq i8 a group's unpacked quants (n_in a row); isc, imn i32 their sub-block
#   scales / mins (n_sub a row); wd, wm f32 their super-block scale / min (n_sb a row); r0, nr: a group's
#   first row and row count; t a token; vid, vlo, vhi: Variant ids (lo below split, hi the rest); rlo, rhi:
#   RawRow ids; yrow, lanes, ilane, tout: scratch; corr, act, adt, bst: tiles.py's tile arrays.


@njit(cache=True, inline="always")
def _bound(c, n_out, n_chunks, unit=8):
    # first row of row range c of n_chunks: a multiple of unit (whole 8-row or repacked groups), n_out at the end
    return min(n_out, c * ((n_out + unit - 1) // unit) // n_chunks * unit)


@njit(cache=True, inline="always")
def _dot_group(vec, vid, rows8, nr, r0, t, y, wq, n_in, aq, isc, imn, n_sub, wd, wm, n_sb, ad, am, bsum, yrow,
               lanes, ilane):
    # y[t, r0:r0+nr] = the group's nr unpacked rows . token t, in variant vid: 8 rows at once where
    # the variant has an 8-row kernel (rows8), else row by row (vector or plain loops)
    if rows8 and nr == 8:
        _vrows8(vid, wq, 0, n_in, aq, t * n_in, isc, imn, 0, n_sub, wd, wm, 0, n_sb, ad, am, t * n_sb, n_sb,
                bsum, t * n_sub, yrow, 0)
        for i in range(8):
            y[t, r0 + i] = yrow[i]
    elif vec:
        for i in range(nr):
            y[t, r0 + i] = _vrow(vid, wq, i * n_in, aq, t * n_in, isc, imn, i * n_sub, wd, wm, i * n_sb, ad, am,
                                 t * n_sb, n_sb, bsum, t * n_sub)
    else:
        for i in range(nr):
            y[t, r0 + i] = _prow(wq, i * n_in, aq, t * n_in, isc, imn, i * n_sub, wd, wm, i * n_sb, ad, am, t * n_sb,
                                 n_sb, bsum, t * n_sub, np.int64(vid), lanes, ilane)    # (one compile, all variants)


def _make_packed_one(gt: GGMLType, hi: Variant, rep: int):
    """Rows [r_start, r_end) of type gt's weight . every token, all in variant hi, each row read straight
    from its blocks (few tokens, vector IR): repacked groups of rep rows (_vgemv_rep) where rep, else 8
    rows at once where hi has an 8-row gemv (_vgemv8), else row by row (_vrow_raw). An inline function:
    the one-variant packed path of the qmatmul kernel, and the fused one-token kernel (fused.py)."""
    qd = kernels_for(gt).qdot
    tid, (sb, nbytes), sub = int(gt), GGML_BLOCK[gt], qd.sub
    rhi = int(raw_row_id(qd.raw, hi))
    k_scales = sb > 32 and not scales_in_registers(qd.raw)     # else a row's scales: unpacked first
    g8 = rep == 0 and gemv8_ok(rhi)
    kind = REPACK_KINDS.get(gt, 0)            # (repack.py's layouts)
    gkind = GEMM_Q4_K if gt == GGMLType.Q4_K and hi == Variant.K32_GROUPS64 else kind    # _vgemv_rep's body

    @njit(cache=True, inline="always")
    def _rows(y, aq, ad, am, bsum, raw, r_start, r_end, n_in, row_bytes):
        # y f32[n_tok, n_out] rows r_start..r_end (multiples of rep, or of 8 for g8); aq, ad, am, bsum:
        # the tokens' quantized activation as _qmatmul's
        n_tok = y.shape[0]
        n_sb = n_in // sb
        n_sub = n_in // sub
        if rep:                                                 # rep rows a call, all tokens
            yrep = np.empty(rep, dtype=np.float32)
            for r0 in range(r_start, r_end, rep):
                for t in range(n_tok):
                    _vgemv_rep(gkind, rep, raw, r0 * row_bytes, n_sb, aq, t * n_in, ad, t * n_sb, bsum, t * n_sub,
                               yrep, 0)
                    for i in range(rep):
                        y[t, r0 + i] = yrep[i]
        elif g8:                                                # 8 rows a call, all tokens
            yrow = np.empty(8, dtype=np.float32)
            for r0 in range(r_start, r_end, 8):
                for t in range(n_tok):
                    _vgemv8(rhi, raw, r0 * row_bytes, row_bytes, aq, t * n_in, ad, t * n_sb, n_sb, bsum,
                            t * n_sub, yrow, 0)
                    for i in range(8):
                        y[t, r0 + i] = yrow[i]
        else:                                                   # row by row
            isc = np.empty(n_sub, dtype=np.int32)               # the row's sub-block scales and mins,
            imn = np.zeros(n_sub, dtype=np.int32)
            wd = np.empty(n_sb, dtype=np.float32)               # super-block scales and mins
            wm = np.zeros(n_sb, dtype=np.float32)
            for r in range(r_start, r_end):
                ro = r * row_bytes
                if k_scales:
                    for b in range(n_sb):
                        _row_scales(tid, raw, ro + b * nbytes, b, isc, imn, wd, wm)
                for t in range(n_tok):
                    y[t, r] = _vrow_raw(rhi, raw, ro, aq, t * n_in, isc, imn, wd, wm, ad, am, t * n_sb, n_sb,
                                        bsum, t * n_sub)
    return _rows


def _make_tile_group(vlo: int, wmax: int, tmode: int, t_rows: int):
    """The inline step of a batch kernel that dots a group's unpacked rows with every token tile of
    variant vlo (tiles.py; wmax: the type's QDot.wmax; tmode, t_rows: tile_mode, tile_rows)."""

    @njit(cache=True, inline="always")
    def _tile_group(nr, r0, y, wq, n_in, isc, imn, n_sub, wd, wm, n_sb, corr, act, adt, bst, tout, t_end):
        # y[:t_end, r0:r0+nr]: the group's unpacked rows . each token tile, t_rows rows at a time
        if t_end == 0:
            return
        if tmode != UNSIGNED:
            for i in range(nr):
                _vprep(vlo, wq, i * n_in, n_in, isc, corr, i * n_sub, n_sub)
        for k in range((t_end + TT - 1) // TT):
            for rs in range(0, nr, t_rows):
                _vtile(vlo, wmax, t_rows, wq, rs * n_in, n_in, isc, imn, rs * n_sub, n_sub, wd, wm, rs * n_sb, n_sb,
                       corr, act, k * (n_in // 4) * TT * (2 if tmode == LANES_MODE else 1), adt, k * n_sb * TT, bst,
                       k * (n_sub // 2) * TT, n_sb, tout)
                for i in range(min(t_rows, nr - rs)):
                    for j in range(min(TT, t_end - k * TT)):
                        y[k * TT + j, r0 + rs + i] = tout[i * TT + j]
    return _tile_group


def _make_kernel(gt: GGMLType, vec: bool, lo: Variant, hi: Variant, packed: bool, rep: int):
    """The kernel of type gt for tokens in variants lo (below the split) and hi (the rest): `packed`,
    each row dotted straight from its blocks (RawRow intrinsics; few tokens, vector IR), else
    `group` rows unpacked at a time, then dotted with every token (a token's quants stay in L1).
    rep: the weight is repacked in groups of rep rows (repack.py; 0: rows in order), which one-token
    matmuls read as they lie (_vgemv_rep) and the rest reads back into row order 8 rows at a time."""
    qd = kernels_for(gt).qdot
    tid, (sb, nbytes), sub, one = int(gt), GGML_BLOCK[gt], qd.sub, lo == hi
    vlo, vhi, r8lo, r8hi = int(lo), int(hi), vec and lo in _ROWS8, vec and hi in _ROWS8
    rlo, rhi = (int(raw_row_id(qd.raw, lo)), int(raw_row_id(qd.raw, hi))) if packed else (-1, -1)
    k_scales = sb > 32 and not (packed and scales_in_registers(qd.raw))   # else a packed row's scales: unpacked first
    p1 = packed and one                       # one variant, every row read from its blocks alike:
    packed_one = _make_packed_one(gt, hi, rep) if p1 else None    # _make_packed_one's rows
    kind = REPACK_KINDS.get(gt, 0)            # (repack.py's layouts)
    unit = rep if rep else 8                  # rows a range starts on
    # token tiles (tiles.py) in lo's variant where it has them, batches only: every token for one
    # variant, else those below the split (a repacked type's gemm; its gemv takes at most 3 tokens)
    tiles_on = vec and not packed and tiled(lo)
    tmode, t_from, t_rows = (tile_mode(lo), tile_from(lo), tile_rows(lo)) if tiles_on else (0, 0, 1)
    fast = vec and tid in FAST           # the type's one-intrinsic row unpacker (tunpack.py)
    _tile_group = _make_tile_group(vlo, qd.wmax, tmode, t_rows)     # (wmax: the AVX2 tiles' pmaddubsw bound)

    @njit(parallel=True, cache=True)
    def _qmatmul(y, aq, ad, am, bsum, raw, n_out, n_in, row_bytes, split, n_chunks, group):
        # y f32[n_tok, n_out]; aq i8[n_tok * n_in]; ad, am f32[n_tok * n_in/sb] (scale; Q8_1's s or the
        # scale again); bsum i32[n_tok * n_in/sub] (Q8_K sub-block sums); raw u8: n_out rows of
        # row_bytes; tokens < split in variant lo, the rest hi; n_chunks row ranges in parallel
        n_tok, n_sb, n_sub = y.shape[0], n_in // sb, n_in // sub
        # token tiles: tokens [0, t_end) in lo's variant (tiles.py's layouts; LANES: act and its sums)
        t_end = (n_tok if one else split) if tiles_on else 0
        t_end = t_end if t_end >= t_from else 0
        nt = (t_end + TT - 1) // TT
        # (np.empty, filled whole by _tile_acts: a top-level np.zeros would be a parfor of one task per
        # element under runtime's chunk size of 1, ~25 ns each)
        act = np.empty(nt * n_in // 4 * TT * (2 if tmode == LANES_MODE else 1), dtype=np.int32)
        adt = np.empty(nt * n_sb * TT, dtype=np.float32)
        bst = np.empty(nt * (n_sub // 2) * TT if tmode == UNSIGNED else 0, dtype=np.int32)
        if tiles_on:
            for k in prange(nt):
                _tile_acts(k, k * TT, min(k * TT + TT, t_end), aq, ad, bsum, n_in, n_sb, n_sub, tmode, act, adt, bst)
        for c in prange(n_chunks):
            r_end = _bound(c + 1, n_out, n_chunks, unit)
            if p1:
                packed_one(y, aq, ad, am, bsum, raw, _bound(c, n_out, n_chunks, unit), r_end, n_in, row_bytes)
                continue
            isc, imn = np.empty(group * n_sub, dtype=np.int32), np.zeros(group * n_sub, dtype=np.int32)   # a group's
            wd, wm = np.empty(group * n_sb, dtype=np.float32), np.zeros(group * n_sb, dtype=np.float32)  # scales, mins
            rows = np.empty(_GROUP_ROWS * row_bytes if rep else 0, dtype=np.uint8)     # in row order
            if packed:                                          # (group 1; two variants)
                src, r_start = rows if rep else raw, _bound(c, n_out, n_chunks, unit)
                for r in range(r_start, r_end):
                    ro = r * row_bytes
                    if rep:                                     # 8 rows back in row order
                        ro = (r - r_start) % _GROUP_ROWS * row_bytes
                        if ro == 0:
                            _unpack_rows(kind, raw, r // rep * rep * row_bytes, rep, n_sb, r % rep, _GROUP_ROWS, rows)
                    if k_scales:
                        for b in range(n_sb):
                            _row_scales(tid, src, ro + b * nbytes, b, isc, imn, wd, wm)
                    for t in range(n_tok):
                        if t >= split:
                            y[t, r] = _vrow_raw(rhi, src, ro, aq, t * n_in, isc, imn, wd, wm, ad, am,
                                                t * n_sb, n_sb, bsum, t * n_sub)
                        else:
                            y[t, r] = _vrow_raw(rlo, src, ro, aq, t * n_in, isc, imn, wd, wm, ad, am,
                                                t * n_sb, n_sb, bsum, t * n_sub)
            else:
                wq = np.empty(group * n_in, dtype=np.int8)     # the group's unpacked rows
                lanes = np.empty(24, dtype=np.float32)          # plain-loop scratch
                yrow, ilane = np.empty(8, dtype=np.float32), np.empty(16, dtype=np.int64)   # 8-row results; scratch
                corr = np.zeros(group * n_sub if tmode == SIGNED else 0, dtype=np.int32)  # signed tiles' row terms
                tout = np.empty(TILE_ROWS * TT, dtype=np.float32)              # a tile call's results
                src = rows if rep else raw
                for r0 in range(_bound(c, n_out, n_chunks, unit), r_end, group):
                    nr = min(group, r_end - r0)
                    if rep:                                     # the group's rows back in row order
                        _unpack_rows(kind, raw, r0 // rep * rep * row_bytes, rep, n_sb, r0 % rep, nr, rows)
                    for i in range(nr):
                        so = i * row_bytes if rep else (r0 + i) * row_bytes
                        if fast:
                            _vunpack(tid, src, so, n_sb, wq, i * n_in, isc, imn, i * n_sub, wd, wm, i * n_sb)
                        else:
                            _unpack_row(tid, vec, src, so, n_sb, wq[i * n_in:(i + 1) * n_in],
                                        isc[i * n_sub:(i + 1) * n_sub], imn[i * n_sub:(i + 1) * n_sub],
                                        wd[i * n_sb:(i + 1) * n_sb], wm[i * n_sb:(i + 1) * n_sb])
                    for t in range(n_tok):
                        if t < t_end:
                            continue                                    # (in a tile, below)
                        if one or t >= split:
                            _dot_group(vec, vhi, r8hi, nr, r0, t, y, wq, n_in, aq, isc, imn, n_sub, wd, wm, n_sb, ad,
                                       am, bsum, yrow, lanes, ilane)
                        else:
                            _dot_group(vec, vlo, r8lo, nr, r0, t, y, wq, n_in, aq, isc, imn, n_sub, wd, wm, n_sb, ad,
                                       am, bsum, yrow, lanes, ilane)
                    if tiles_on:
                        _tile_group(nr, r0, y, wq, n_in, isc, imn, n_sub, wd, wm, n_sb, corr, act, adt, bst, tout,
                                    t_end)
    return made_for(_qmatmul, gt, "vec" if vec else "plain", lo, hi, "packed" if packed else "grouped", f"rep{rep}")


_KERNELS: dict[tuple, object] = {}      # (type, vector, lo, hi, packed, rep) -> numba dispatcher, as made


def _kernel(t: GGMLType, vec: bool, lo: Variant, hi: Variant, packed: bool, rep: int = 0):
    """The kernel of (t, vec, lo, hi, packed, rep), made on first use; numba compiles it on its first
    call, for t and these variants alone, and caches it on disk."""
    key = (t, vec, lo, hi, packed, rep)
    if key not in _KERNELS:
        _KERNELS[key] = _make_kernel(*key)
    return _KERNELS[key]


# ---------------------------------------------------------------- one quantization for several matmuls

class QuantizedInput(NamedTuple):
    """x quantized (quantize_activation) as the kernels take it: flat arrays, token-major."""

    aq: np.ndarray          # i8[n_tok * n_in]: the quants
    ad: np.ndarray          # f32[n_tok * n_in / block]: the scale per block
    am: np.ndarray          # f32, as ad: Q8_1's s = d * sum(q) per block (ad again for the other types)
    bsum: np.ndarray        # i32[n_tok * n_in / sub]: Q8_K's quant sums per sub-block (llama.cpp's bsums)


class SharedInput:
    """One input x of several matmuls (q, k and v of one normed state; gate and up), left unchanged
    while they run: given to each (matmul(..., shared=)), x is quantized once per activation type, as
    llama.cpp quantizes src1 once per type for the matmuls that share it. A matmul of another array
    ignores it."""

    __slots__ = ("x", "by_key")

    def __init__(self, x: np.ndarray):
        self.x = x
        self.by_key: dict[tuple, QuantizedInput] = {}       # (act, sub, pos_ties, q81) -> _quantized's


def _quantized(x: np.ndarray, act, sub: int, pos_ties: int, q81: bool,
               shared: SharedInput | None = None) -> QuantizedInput:
    """x quantized (quantize_activation) as the kernel's flat arguments (am: Q8_1's sums where q81);
    once per key where x is shared's input."""
    if shared is not None and shared.x is not x:
        shared = None
    key = (act, sub, pos_ties, q81)
    if shared is not None and key in shared.by_key:
        return shared.by_key[key]
    a = quantize_activation(x, act, sub, pos_ties=pos_ties)
    ad = a.d.reshape(-1)
    q = QuantizedInput(a.q, ad, a.s.reshape(-1) if q81 else ad, a.bsum.reshape(-1))
    if shared is not None:
        shared.by_key[key] = q
    return q


# ---------------------------------------------------------------- public entry point

class Choice(NamedTuple):
    """What a matmul's shape decides (`choice`)."""

    ggml_type: GGMLType
    row_bytes: int          # bytes of one packed weight row
    act: object             # registry.ActType: the activation's quantization
    sub: int                # elements per sub-block of the activation's sums (bsum)
    q81: bool               # am carries Q8_1's sums (Q4_1, Q5_1)
    pos_ties: int           # tokens below it quantize ties away from zero (quantize_activation)
    lo: Variant             # the arithmetic of tokens below split ...
    hi: Variant             # ... and of the rest
    split: int
    packed: bool            # rows dotted straight from their blocks (few tokens), else unpacked in groups
    group: int              # rows unpacked at a time (1: packed or row by row)


class MatmulPlan(NamedTuple):
    """A Choice with its compiled kernel and row ranges (`_plan`)."""

    choice: Choice
    kernel: object          # the numba dispatcher (_kernel), called with KernelArgs
    n_chunks: int           # row ranges run in parallel


class KernelArgs(NamedTuple):
    """The arguments of a `_make_kernel` kernel, in its parameter order: kernel(*KernelArgs(...))."""

    y: np.ndarray           # f32[n_tok, n_out], C-contiguous: the result
    aq: np.ndarray          # the quantized activation (QuantizedInput's four arrays)
    ad: np.ndarray
    am: np.ndarray
    bsum: np.ndarray
    raw: np.ndarray         # u8: n_out packed rows of row_bytes (repacked: in groups)
    n_out: int
    n_in: int
    row_bytes: int
    split: int              # tokens < split in variant lo, the rest hi
    n_chunks: int
    group: int


@functools.lru_cache(maxsize=4096)
def choice(ggml_type, n_out: int, n_in: int, n_tok: int, v_n: int, v_off: int, vec: bool) -> Choice:
    """What a call's shape decides, computed once per shape, for n_tok tokens that are rows v_off.. of a
    batch of v_n; refusals raise."""
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
    if split == 0 or split == n_tok:                # one variant for every token
        v_lo = v_hi = v_lo if split else v_hi
    raw_ok = raw_row_id(qd.raw, v_lo) >= 0 and raw_row_id(qd.raw, v_hi) >= 0
    few = n_tok < _GROUP_FROM_TOKENS or (n_tok == _PACKED_GEMM_TOKENS and vec and raw_ok and v_lo == v_hi
                                         and qd.repack is not None and n_out % 8 == 0)
    group = 1 if few else _GROUP_ROWS
    # few tokens: dot the packed rows, where both variants have a packed-row intrinsic
    packed = vec and group == 1 and raw_ok
    pos_ties = split if qd.repack and n_out % 8 == 0 else 0
    return Choice(t, n_in // be * bb, k.act, qd.sub, qd.mins == Q8_1_SUM, pos_ties, v_lo, v_hi, split, packed, group)


@functools.lru_cache(maxsize=4096)
def _plan(ggml_type, n_out: int, n_in: int, n_tok: int, v_n: int, v_off: int, n_threads: int, vec: bool,
          rep: int) -> MatmulPlan:
    """choice's, with its kernel and row ranges."""
    c = choice(ggml_type, n_out, n_in, n_tok, v_n, v_off, vec)
    return MatmulPlan(c, _kernel(c.ggml_type, vec, c.lo, c.hi, c.packed, rep),
                      max(1, min(n_out, _CHUNKS_PER_THREAD * n_threads)))


_WARM_TOKENS = (1, 2, 3, 4, 5, 8, 9)    # every path _plan takes for a batch of its own: one token, packed rows, groups,
#                                        whole / partial gemm tiles (n % 4), tiled K-quant batches (8+)


def warm(shapes, vector: bool | None = None, tokens=_WARM_TOKENS) -> int:
    """Compile, or load from numba's disk cache, the kernels that matmuls of these weights take for any
    batch of its own (of each size in `tokens`; no call is made); returns how many. shapes: (type,
    n_out, n_in, repacked) tuples. A server calls it as it loads a model: a kernel compiled under a
    request holds the GIL, and with it the event loop, for seconds. Shapes without an integer-dot
    kernel are skipped."""
    made = {own_kernel(shape, n, vector) for shape in shapes for n in tokens} - {None}
    for kernel in made:
        kernel.compile(kernel_signature())
    return len(made)


def own_kernel(shape, n: int, vector: bool | None = None):
    """The kernel a matmul of a weight shape (type, n_out, n_in, repacked) takes for a batch of n tokens of
    its own, or None where the shape has no integer-dot kernel (another path: F16, F32)."""
    t, n_out, n_in, rep = shape
    k = kernels_for(t)
    if k.qdot is None or n_in % GGML_BLOCK[k.ggml_type][0]:
        return None
    vec = VECTOR if vector is None else bool(vector)
    return _plan(t, n_out, n_in, n, n, 0, numba.get_num_threads(), vec, rep).kernel


# A cold process's hook (engine.warmup.FirstPass), None otherwise: called with a kernel before qmatmul
# calls it, so that a kernel a warm-up worker is compiling is waited for rather than compiled twice.
first_call = None
# A warm-up worker's dry pass (engine.warmup.warm_first_pass): inputs quantized, products left at zero,
# so that a pass compiles every kernel but the matmuls' (which have jobs of their own).
dry = False
# A cold process's batch kernels left to the warm-up workers -> their stand-ins, which qmatmul runs meanwhile
# (engine.warmup.stand_in: the packed kernel of the same variants, the same arithmetic, a third of the compile).
deferred: dict = {}


def kernel_signature() -> tuple:
    """The argument types of KernelArgs, as qmatmul calls its kernels (y f32[n_tok, n_out] C; aq i8, ad,
    am f32, bsum i32, raw u8: 1-D C; six int64)."""
    f32, i8 = numba.typeof(np.empty(1, np.float32)), numba.typeof(np.empty(1, np.int8))
    return (numba.typeof(np.empty((1, 1), np.float32)), i8, f32, f32, numba.typeof(np.empty(1, np.int32)),
            numba.typeof(np.empty(1, np.uint8))) + (numba.int64,) * 6


def qmatmul(y: np.ndarray, x: np.ndarray, ggml_type, raw: np.ndarray, n_out: int, n_in: int,
            vector: bool | None = None, batch: Batch | None = None, repacked: int = 0,
            shared: SharedInput | None = None) -> np.ndarray:
    """y[n_tok, n_out] = x[n_tok, n_in] @ W.T for a packed weight W of n_out rows of n_in elements,
    by integer dots as llama.cpp. vector: LLVM vector intrinsics (default: not RAMFORGE_PORTABLE=1).
    batch: the tokens are rows batch.offset.. of a batch of batch.n_tok, and get that batch's
    arithmetic (None, or rows that do not fit in it: a batch of their own). repacked: W's rows are in
    repack.py's groups of that many rows (repack.repack), else 0. shared: x's quantization, shared
    with the other matmuls of x (SharedInput)."""
    if (not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != n_in or not isinstance(y, np.ndarray)
            or y.shape != (x.shape[0], n_out) or y.dtype != np.float32):
        raise RamforgeError(f"matmul shapes: x {getattr(x, 'shape', x)}, y {getattr(y, 'shape', y)} "
                            f"{getattr(y, 'dtype', '')}, weight {n_out} x {n_in}")
    n_tok = x.shape[0]
    inside = batch is not None and 0 <= batch.offset and batch.offset + n_tok <= batch.n_tok
    v_n, v_off = (batch.n_tok, batch.offset) if inside else (n_tok, 0)
    vec = VECTOR if vector is None else bool(vector)
    plan = _plan(ggml_type, n_out, n_in, n_tok, v_n, v_off, numba.get_num_threads(), vec, repacked)
    sub = deferred.get(plan.kernel) if deferred else None  # its stand-in (till a worker ends its job)
    if sub is not None:
        plan = MatmulPlan(plan.choice._replace(packed=True, group=1), sub, plan.n_chunks)
    if first_call is not None:
        first_call(plan.kernel)
    c, row_bytes = plan.choice, plan.choice.row_bytes
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.size != n_out * row_bytes:
        got = f"{raw.size:,} ({raw.dtype})" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise RamforgeError(f"{c.ggml_type.name} weight of {n_out} x {n_in} needs {n_out * row_bytes:,} B, "
                            f"got {got}")
    if n_tok == 0 or n_out == 0 or n_in == 0:
        y[...] = 0
        return y
    q = _quantized(x, c.act, c.sub, c.pos_ties, c.q81, shared)
    out = y if y.flags.c_contiguous and y.flags.writeable else np.empty_like(y)
    if dry:
        out[...] = 0
    else:
        plan.kernel(*KernelArgs(out, q.aq, q.ad, q.am, q.bsum, np.ascontiguousarray(raw).reshape(-1), n_out, n_in,
                                row_bytes, c.split, plan.n_chunks, c.group))
    if out is not y:
        y[...] = out
    return y
