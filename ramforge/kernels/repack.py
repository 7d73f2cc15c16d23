"""Q4_0, Q4_K and Q8_0 weights repacked at load time for 1-3 token matmuls, as llama.cpp repacks Q4_0
and Q4_K (q4_0_8x8, q4_K_8x8): groups of G rows (16 on AVX-512, else 8; 8 where the rows are not a
multiple of 16) interleaved so that one vector load holds 4 quant bytes of every row of the group,
and the rows sit in the lanes of one <G x i32>. The integer sums are exact, so their order is free;
the float steps stay those of the kernel llama.cpp runs (gemvrep.py). A repacked tensor is as large
as its rows, group g at its rows' own offset, so a layer repacks in place (`repack`); batches read
rows back into row order (`_unpack_rows`) and take the unpacking path.

Q5_K and Q6_K stay in file order, as llama.cpp keeps them: a 16-row layout of theirs (the last tree
with it: 750a8d5) ran faster from cache but streamed from memory slower than their rows in file order
on the AMD hosts measured (Zen 5, AVX-512: 1B Q6_K decode 33.6 vs 41.2 tok/s, Q5_K_M 40.4 vs 47.4,
same process; Zen 3, AVX2: 8-13 vs 15-16 GB/s), and decode streams every weight from memory.

A group's super-block b lies at b*G*B from the group's start (B: the type's block bytes):
  Q4_K (B = 144)
    [0, 2G)      d     f16[G]     row r's super-block scale
    [2G, 4G)     dmin  f16[G]
    [4G, 16G)    12 planes u8[G]: plane p, byte r = row r's scales[p] (the 6-bit packing kept)
    [16G, 144G)  32 vectors u8[4G]: vector v, bytes 4r..4r+3 = row r's qs[4v..4v+3]
                 (qs[32c + j]: low nibble element 64c + j, high nibble 64c + 32 + j)
  Q8_0 (B = 34, a block of 32): d f16[G], then 8 vectors u8[4G]: vector k, bytes 4r..4r+3 = row r's
                 qs[4k..4k+3] + 128 (offset binary: unsigned for vpdpbusd, less 128 * the sums after)
  Q4_0 (B = 18, a block of 32): d f16[G], then 4 vectors u8[4G]: vector k, bytes 4r..4r+3 = row r's
                 qs[4k..4k+3] (low nibbles elements 4k.., high 16 + 4k..)
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ramforge.errors import InternalError
from ramforge.gguf.constants import GGMLType

from ..profiling import timed
from .llvmir import I32, dtypes_are, ptr, target_has_512

Q4_0, Q4_K, Q8_0 = GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q8_0
KINDS = {Q4_K: 0, Q8_0: 1, Q4_0: 2}       # the types with a repacked layout, as the kernels name them
_BLOCK = (144, 34, 18)                   # their block bytes, by kind (Q4_K: d, dmin f16, scales u8[12],
#                                          qs u8[128]; Q8_0: d,
#                                          qs i8[32]; Q4_0: d, qs u8[16])
_ELEMS = (256, 32, 32)                   # elements per block
BLOCKS = {t: _BLOCK[k] for t, k in KINDS.items()}


@functools.cache
def wide() -> bool:
    """Whether the target has 512-bit vectors: groups of 16 rows. Else (AVX2: 16 ymm registers, a <16 x
    float> takes two) groups of 8: at 8192^2 from memory, G=8 Q4_K 19-20 GB/s there, G=16 14-15."""
    return target_has_512()


def repack_group(n_out: int, wide_target: bool | None = None) -> int:
    """The group size G of a repacked tensor of n_out rows (16 on a wide target, else 8; 8 where the rows
    are not a multiple of 16), 0 where it cannot be repacked (rows not a multiple of 8: llama.cpp keeps
    those unrepacked too)."""
    w = wide() if wide_target is None else wide_target
    return 16 if w and n_out % 16 == 0 else 8 if n_out % 8 == 0 else 0


def repackable(ggml_type, dims: tuple[int, ...]) -> bool:
    """Whether a weight of this type and GGUF dims (row length, rows) takes the repacked layout."""
    return (ggml_type in BLOCKS and len(dims) == 2 and dims[0] % _ELEMS[KINDS[ggml_type]] == 0
            and repack_group(dims[1]) > 0)


@intrinsic
def _copy4(typingctx, src, so, dst, do, flip):
    """dst[do:do+4] = src[so:so+4] ^ flip (u8 arrays; one unaligned 32-bit load and store)."""
    if not dtypes_are((src, dst), (types.uint8, types.uint8)):
        return None

    def codegen(context, builder, sig, args):
        def at(k, o):
            return ptr(context, builder, sig.args[k], args[k], args[o], I32)
        v = builder.xor(builder.load(at(0, 1), align=1), builder.trunc(args[4], I32))
        builder.store(v, at(2, 3), align=1)
        return context.get_dummy_value()
    return types.void(src, so, dst, do, flip), codegen


_LO, _HI = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]          # unpack{lo,hi}_epi32
_LO2, _HI2 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]      # unpack{lo,hi}_epi64
_HALF0, _HALF1 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]  # permute2x128 0x20, 0x31


@intrinsic
def _transpose8(typingctx, src, so, sstride, dst, do, dstride):
    """dst[do + i*dstride + r] = src[so + r*sstride + i] for r, i < 8 (u32 arrays, offsets in u32): an 8x8
    block transposed in registers (8 unaligned <8 x i32> loads, 24 shuffles, 8 stores) where a u32 at a
    time took a load and a store each."""
    if not dtypes_are((src, dst), (types.uint32, types.uint32)):
        return None

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(I32, 8)

        def at(k, o):
            return ptr(context, builder, sig.args[k], args[k], o, v8)

        def sh(a, b, mask):
            return builder.shuffle_vector(a, b, ir.Constant(v8, mask))

        so_, ss, do_, ds = args[1], args[2], args[4], args[5]
        rows = [builder.load(at(0, builder.add(so_, builder.mul(ss, ir.Constant(ss.type, r)))), align=4)
                for r in range(8)]
        t = [sh(rows[p - p % 2], rows[p - p % 2 + 1], _LO if p % 2 == 0 else _HI) for p in range(8)]
        u = [sh(t[q + s], t[q + 2 + s], m) for q in (0, 4) for s in (0, 1) for m in (_LO2, _HI2)]
        for c in range(4):                                  # u[c]: column c (rows 0-3, 4-7 per 128-bit half)
            for i, half in ((c, _HALF0), (c + 4, _HALF1)):
                o = builder.add(do_, builder.mul(ds, ir.Constant(ds.type, i)))
                builder.store(sh(u[c], u[4 + c], half), at(3, o), align=4)
        return context.get_dummy_value()
    return types.void(src, so, sstride, dst, do, dstride), codegen


@njit(cache=True, nogil=True, inline="always")
def _mv(a, ao, b, bo, n, to_group, flip=0):
    # n bytes between a[ao:] (row order) and b[bo:] (the group), either way, each xor flip
    if n == 4:
        if to_group:
            _copy4(a, ao, b, bo, flip * 0x01010101)
        else:
            _copy4(b, bo, a, ao, flip * 0x01010101)
        return
    for i in range(n):
        if to_group:
            b[bo + i] = a[ao + i] ^ flip
        else:
            a[ao + i] = b[bo + i] ^ flip


@njit(cache=True, nogil=True)
def _move_block(kind, row, so, grp, do, G, r, to_group):
    # one row's block (at row[so:]) <-> row r of a group's super-block (at grp[do:]), either way
    if kind == 2:                               # Q4_0: d, then 4-byte quads
        _mv(row, so, grp, do + 2 * r, 2, to_group)
        for k in range(4):
            _mv(row, so + 2 + 4 * k, grp, do + 2 * G + k * 4 * G + 4 * r, 4, to_group)
    elif kind == 1:                             # Q8_0: d, then 4-byte quads + 128
        _mv(row, so, grp, do + 2 * r, 2, to_group)
        for k in range(8):
            _mv(row, so + 2 + 4 * k, grp, do + 2 * G + k * 4 * G + 4 * r, 4, to_group, 0x80)
    else:                                       # Q4_K: d, dmin, 12 scale planes, 4-byte quads
        _mv(row, so, grp, do + 2 * r, 2, to_group)
        _mv(row, so + 2, grp, do + 2 * G + 2 * r, 2, to_group)
        for p in range(12):
            _mv(row, so + 4 + p, grp, do + (4 + p) * G + r, 1, to_group)
        for v in range(32):
            _mv(row, so + 16 + 4 * v, grp, do + 16 * G + v * 4 * G + 4 * r, 4, to_group)


@njit(cache=True, nogil=True)
def _pack_group(kind, rows, out, o, G, n_sb):
    # rows u8[G * n_sb * B] (G rows in row order) -> out[o:o + G*n_sb*B] in the group layout
    B = _BLOCK[kind]
    for b in range(n_sb):
        for r in range(G):
            _move_block(kind, rows, r * n_sb * B + b * B, out, o + b * G * B, G, r, True)


@njit(cache=True, nogil=True)
def _unpack_rows(kind, raw, o, G, n_sb, r_lo, nr, rows):
    # rows r_lo..r_lo+nr of the group at raw[o:] -> rows u8[nr * n_sb * B], in row order
    B = _BLOCK[kind]
    for i in range(nr):
        for b in range(n_sb):
            _move_block(kind, rows, i * n_sb * B + b * B, raw, o + b * G * B, G, r_lo + i, False)


@njit(cache=True, nogil=True)
def _repack_in_place(kind, raw, n_out, row_bytes, G):
    # raw u8[n_out * row_bytes]: every group of G rows into the group layout, in place
    n_sb = row_bytes // _BLOCK[kind]
    tmp = np.empty(G * row_bytes, dtype=np.uint8)
    for g in range(n_out // G):
        o = g * G * row_bytes
        tmp[:] = raw[o:o + G * row_bytes]
        _pack_group(kind, tmp, raw, o, G, n_sb)


@njit(cache=True, nogil=True)
def _q4k_group(tmp8, tmp32, raw8, raw32, o, G, row_bytes):
    # the group of G Q4_K rows at raw8[o:] (o 4-aligned; raw32 the u32 view of raw8), copied to tmp8 (tmp32
    # its u32 view) first, into the group layout by u32s: d and dmin (the row's first u32, halves), the scale
    # planes (4 rows' bytes of a plane packed into a u32, little-endian), the quads (8 of every 9 bytes: 8x8 u32
    # blocks transposed, _transpose8; a u32 at a time they took the repack twice as long)
    n_sb, rw = row_bytes // 144, row_bytes // 4
    tmp32[:G * rw] = raw32[o // 4:o // 4 + G * rw]
    for b in range(n_sb):
        d0 = (o + b * G * 144) // 4                              # the group's super-block b, in u32
        for r in range(0, G, 2):                                 # d, dmin f16 of rows r, r + 1
            a, c = tmp32[r * rw + b * 36], tmp32[(r + 1) * rw + b * 36]
            raw32[d0 + r // 2] = (a & 0xFFFF) | ((c & 0xFFFF) << 16)
            raw32[d0 + G // 2 + r // 2] = (a >> 16) | (c & 0xFFFF0000)
        for w in range(3):                                       # scales bytes 4w..4w+3: planes 4w..4w+3
            for r in range(0, G, 4):
                s0, s1 = tmp32[r * rw + b * 36 + 1 + w], tmp32[(r + 1) * rw + b * 36 + 1 + w]
                s2, s3 = tmp32[(r + 2) * rw + b * 36 + 1 + w], tmp32[(r + 3) * rw + b * 36 + 1 + w]
                for q in range(4):                               # plane 4w + q, rows r..r+3
                    sh = 8 * q
                    raw32[d0 + (4 + 4 * w + q) * G // 4 + r // 4] = (((s0 >> sh) & 0xFF) | (((s1 >> sh) & 0xFF) << 8)
                                                                     | (((s2 >> sh) & 0xFF) << 16)
                                                                     | (((s3 >> sh) & 0xFF) << 24))
        q0 = d0 + 4 * G                                          # quad vector v: G u32 from q0 + v * G
        for r in range(0, G, 8):                                 # 8 rows x 8 quads at a time, transposed
            for v in range(0, 32, 8):
                _transpose8(tmp32, r * rw + b * 36 + 4 + v, rw, raw32, q0 + v * G + r, G)


@njit(cache=True, nogil=True)
def _repack_q4k_in_place(raw8, raw32, n_out, row_bytes, G):
    # _repack_in_place for a 4-aligned Q4_K weight raw8 (raw32: its u32 view)
    tmp32 = np.empty(G * row_bytes // 4, dtype=np.uint32)
    tmp8 = tmp32.view(np.uint8)
    for g in range(n_out // G):
        _q4k_group(tmp8, tmp32, raw8, raw32, g * G * row_bytes, G, row_bytes)


@njit(cache=True, parallel=True, nogil=True)
def _repack_many(raw8, raw32, offs, kinds, n_outs, row_bytes, groups, n_threads):
    # weights m = 0.. at raw8[offs[m]:] (kind kinds[m], n_outs[m] rows of row_bytes[m] in groups of groups[m]),
    # every one repacked in place; the groups of all of them split evenly over n_threads
    m = offs.shape[0]
    first = np.zeros(m + 1, dtype=np.int64)                      # weight i's groups: first[i]..first[i+1]
    most = 0
    for i in range(m):
        first[i + 1] = first[i] + n_outs[i] // groups[i]
        most = max(most, groups[i] * row_bytes[i])
    total = first[m]
    for c in prange(n_threads):
        tmp32 = np.empty((most + 3) // 4, dtype=np.uint32)
        tmp8 = tmp32.view(np.uint8)
        i = 0
        for j in range(total * c // n_threads, total * (c + 1) // n_threads):
            while j >= first[i + 1]:
                i += 1
            G, rb = groups[i], row_bytes[i]
            o = offs[i] + (j - first[i]) * G * rb
            if kinds[i] == 0 and o % 4 == 0:
                _q4k_group(tmp8, tmp32, raw8, raw32, o, G, rb)
            else:
                tmp8[:G * rb] = raw8[o:o + G * rb]
                _pack_group(kinds[i], tmp8, raw8, o, G, rb // _BLOCK[kinds[i]])


@timed("repack")
def repack_many(raw: np.ndarray, weights: list[tuple], n_threads: int) -> None:
    """Repack several `repackable` weights lying in one writable u8 array raw (size a multiple of 4), in
    place, over n_threads threads: weights (ggml type, byte offset in raw, GGUF dims (row length, rows))."""
    if not weights:
        return
    if raw.dtype != np.uint8 or raw.ndim != 1 or raw.size % 4 or raw.ctypes.data % 4:
        raise InternalError(f"repack_many: raw must be 4-aligned u8 of a size divisible by 4, got {raw.dtype}{raw.shape}")
    types_, offs, dims = zip(*weights)
    kinds = np.array([KINDS[t] for t in types_], np.int64)
    n_outs = np.array([d[1] for d in dims], np.int64)
    rbs = np.array([d[0] // _ELEMS[k] * _BLOCK[k] for d, k in zip(dims, kinds)], np.int64)
    groups = np.array([repack_group(d[1]) for d in dims], np.int64)
    _repack_many(raw, raw.view(np.uint32), np.array(offs, np.int64), kinds, n_outs, rbs, groups, n_threads)


def repack(ggml_type, raw: np.ndarray, dims: tuple[int, ...]) -> int:
    """Repack a weight's rows (raw: writable u8 bytes of a `repackable` weight) in place; its G."""
    n_in, n_out = dims
    G = repack_group(n_out)
    k = KINDS[ggml_type]
    flat = raw.reshape(-1)
    row_bytes = n_in // _ELEMS[k] * _BLOCK[k]
    if ggml_type == Q4_K and flat.ctypes.data % 4 == 0:        # (the aligned buffers ramforge reads into)
        _repack_q4k_in_place(flat, flat.view(np.uint32), n_out, row_bytes, G)
    else:
        _repack_in_place(k, flat, n_out, row_bytes, G)
    return G
