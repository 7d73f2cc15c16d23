"""The integer-dot matmul (kernels.qmatmul) against llama.cpp's integer math, the float path, itself,
and (-m oracle) llama.cpp's own CPU backend.

Every value test loops over the registry's types with a `qdot`, so a newly registered type is
covered. The chain of evidence:
- the row unpacker (int8 quants, integer sub-block scales/mins, float scales) rebuilds, in the
  float ops of the dequant kernels, exactly `dequantize`'s values (itself bit-exact vs gguf-py);
- the activation quantization reproduces the float path's `round_activation`, and llama.cpp's
  Q8_1 s = f16(d * sum q) and Q8_K bsums;
- the kernel equals, to f32 accumulation noise, the exact integer reference computed here:
  sum over blocks of (d_w * d_a) * sum_j sc_j * <q_w, q_a>_j  - (dmin_w * d_a) * sum_j m_j * bsum_j
  (K-quant mins) or + m_w * s_a (Q4_1/Q5_1), in int64 / float64, for both of llama.cpp's row
  layouts (37 rows: its vec_dot arithmetic; 40: its repacked one where it repacks);
- the LLVM vector intrinsics equal the plain-loop path bit for bit;
- with llama_cpp importable (-m oracle): ggml's mul_mat, through ctypes, equals qmatmul bit for
  bit over every kernel llama.cpp picks (vec_dot, tinyBLAS, tiled, repacked gemv/gemm).
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import literally, njit

import gguf  # gguf-py: a dev dependency (pip install -e '.[dev]'), the test oracle; never skipped
import gguf.quants as gq

from ramforge.errors import RamforgeError
from ramforge.gguf.constants import GGMLType
from ramforge.kernels import qmatmul as qm
from ramforge.kernels import quantize as qa
from ramforge.kernels import scalars as ks
from ramforge.kernels import tiles as kt
from ramforge.kernels import tunpack
from ramforge.kernels import unpack as ku
from ramforge.kernels import variants as kv
from ramforge.kernels.dequant import dequantize
from ramforge.kernels.matmul import matmul, matmul_reference, round_activation
from ramforge.kernels.registry import REGISTRY, ActType
from tests.test_dequant import _SCALES, random_blocks
from tools.ggml_ctypes import CpuBackend, libraries

INT_TYPES = [t for t, k in REGISTRY.items() if k.qdot is not None]
N_IN, N_OUT = 512, 37          # 2 super-blocks / 16 small blocks per row; 37 rows: a partial task


def _ids(types):
    return [t.name for t in types]


def weight(t: GGMLType, n_out: int, n_in: int, seed: int) -> np.ndarray:
    """n_out rows of type t: gguf-py's quantization of random floats where it has one, else random
    blocks whose float scales are moderate (so that every block counts)."""
    rng = np.random.default_rng(seed)
    k = REGISTRY[t]
    try:
        w = rng.standard_normal((n_out, n_in)).astype(np.float32) * np.float32(0.05)
        return np.ascontiguousarray(gq.quantize(w, gguf.GGMLQuantizationType[t.name])).reshape(-1)
    except (NotImplementedError, KeyError):
        pass
    n_blocks = n_out * n_in // k.block_elems
    raw = random_blocks(t, n_blocks, seed).reshape(n_blocks, k.block_bytes)
    if t in _SCALES:
        kind, offsets = _SCALES[t]
        for o in offsets:
            d = rng.uniform(1e-3, 0.1, n_blocks)
            if kind == "f16":
                raw[:, o:o + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
            elif kind == "f16-nibbles":             # IQ1_M: the f16 in the top nibbles of 4 u16 words
                h = d.astype(np.float16).view(np.uint16)
                words = raw[:, o:o + 8].copy().view(np.uint16) & np.uint16(0x0FFF)
                for j in range(4):
                    words[:, j] |= ((h >> np.uint16(4 * j)) & np.uint16(15)) << np.uint16(12)
                raw[:, o:o + 8] = words.view(np.uint8)
            elif kind == "f32":
                raw[:, o:o + 4] = d.astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    return raw.reshape(-1)


def activation(n_tok: int, n_in: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n_tok, n_in)).astype(np.float32)
    x[0, 32:64] = 0                               # an all-zero Q8_0 block (d = 0)
    if n_tok > 1:
        x[1, :256] = 0                            # an all-zero Q8_K super-block
        x[1, 300] = -3.0                          # a negative signed max
    return x


def unpack(t: GGMLType, raw: np.ndarray, n_rows: int, n_in: int, vec: bool):
    """The registry unpacker over every row: wq i8[rows, n_in], isc/imn i32[rows, n_sub], wd/wm f32[rows, n_sb]."""
    k = REGISTRY[t]
    sb, sub = k.block_elems, k.qdot.sub
    row_bytes = n_in // sb * k.block_bytes
    wq = np.zeros((n_rows, n_in), np.int8)
    isc = np.zeros((n_rows, n_in // sub), np.int32)
    imn = np.zeros((n_rows, n_in // sub), np.int32)
    wd = np.zeros((n_rows, n_in // sb), np.float32)
    wm = np.zeros((n_rows, n_in // sb), np.float32)
    for r in range(n_rows):
        k.qdot.unpack(vec, raw, r * row_bytes, n_in // sb, wq[r], isc[r], imn[r], wd[r], wm[r])
    return wq, isc, imn, wd, wm


# ---------------------------------------------------------------- registry and unpacking

def test_every_quantized_type_has_an_integer_kernel():
    for t, k in REGISTRY.items():
        assert (k.qdot is None) == (k.act in (ActType.F32, ActType.F16, ActType.BF16)), t.name
        if k.qdot is not None:
            assert k.block_elems % k.qdot.sub == 0 and k.qdot.sub in (16, 32)
            assert k.qdot.mins in (kv.NO_MIN, kv.Q8_1_SUM, kv.K_SUM, kv.K_MIN4, kv.K_LANES) + kv.IQ1_MINS
            assert (k.qdot.mins in kv.IQ1_MINS) == (t in (GGMLType.IQ1_S, GGMLType.IQ1_M)), t.name
            assert (k.qdot.mins == kv.Q8_1_SUM) == (k.act == ActType.Q8_1)
            has_mins = t in (GGMLType.Q2_K, GGMLType.Q4_K, GGMLType.Q5_K)
            assert (k.qdot.mins in (kv.K_SUM, kv.K_MIN4, kv.K_LANES)) == has_mins, t.name


@pytest.mark.parametrize("t", INT_TYPES, ids=_ids(INT_TYPES))
def test_unpack_rebuilds_dequantize_exactly(t):
    # random bytes: every bit pattern of quants, scales and mins (finite float scales)
    k = REGISTRY[t]
    n_rows = 3
    raw = random_blocks(t, n_rows * N_IN // k.block_elems, seed=11)
    wq, isc, imn, wd, wm = unpack(t, raw, n_rows, N_IN, vec=True)
    sub, sb = k.qdot.sub, k.block_elems
    q = (wq.astype(np.float32) - k.qdot.offset).reshape(n_rows, -1, sb // sub, sub)
    d = wd[:, :, None, None]
    sc = isc.astype(np.float32).reshape(n_rows, -1, sb // sub)[..., None]
    if k.qdot.post:                                          # codebook types: ((d*sc)*2^-post)*q
        w = ((d * sc) * np.float32(2.0 ** -k.qdot.post)) * q
    elif k.qdot.mins == kv.Q8_1_SUM:                           # d*q + m
        w = d * q + wm[:, :, None, None]
    elif k.qdot.mins in (kv.K_SUM, kv.K_MIN4, kv.K_LANES):   # (d*sc)*q - (dmin*m)
        mn = imn.astype(np.float32).reshape(n_rows, -1, sb // sub)[..., None]
        w = (d * sc) * q - wm[:, :, None, None] * mn
    else:                                                    # (d*sc)*q; IQ1: (d/8 * sc) * (8*grid +- 1)
        w = (d * sc) * q
    ref = dequantize(t, raw)
    assert np.array_equal(w.reshape(-1).view(np.uint32), ref.view(np.uint32)), t.name


@pytest.mark.parametrize("t", INT_TYPES, ids=_ids(INT_TYPES))
def test_types_with_mins_or_an_offset_unpack_to_unsigned_quants(t):
    # the VNNI dot feeds such quants to vpdpbusd as unsigned bytes without the sign trick
    k = REGISTRY[t]
    wq = unpack(t, random_blocks(t, 4 * N_IN // k.block_elems, seed=13), 4, N_IN, vec=True)[0]
    if k.qdot.mins not in (kv.NO_MIN,) + kv.IQ1_MINS or k.qdot.offset != 0:
        assert wq.min() >= 0, t.name
    else:                                    # the others do have negative quants: the sign trick is needed
        assert wq.min() < 0, t.name


@pytest.mark.parametrize("t", INT_TYPES, ids=_ids(INT_TYPES))
def test_unpack_vector_equals_portable(t):
    raw = random_blocks(t, 2 * N_IN // REGISTRY[t].block_elems, seed=12)
    for a, b in zip(unpack(t, raw, 2, N_IN, True), unpack(t, raw, 2, N_IN, False)):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), t.name


FAST_TYPES = [t for t in INT_TYPES if int(t) in tunpack.FAST]


@njit
def _unpack_fast(t, raw, n_rows, row_bytes, n_sb, wq, isc, imn, wd, wm):
    for r in range(n_rows):
        tunpack._vunpack(literally(t), raw, r * row_bytes, n_sb, wq, r * (wq.size // n_rows), isc, imn,
                         r * (isc.size // n_rows), wd, wm, r * n_sb)


@pytest.mark.parametrize("t", FAST_TYPES, ids=_ids(FAST_TYPES))
def test_batch_unpacker_equals_the_row_unpacker(t):
    # tunpack's one-intrinsic unpacker (the batched path's) writes what the registry's does
    k = REGISTRY[t]
    n_rows, n_sb = 3, N_IN // k.block_elems
    raw = random_blocks(t, n_rows * n_sb, seed=14)
    want = unpack(t, raw, n_rows, N_IN, vec=False)
    got = [np.zeros_like(a) for a in want]
    _unpack_fast(int(t), raw, n_rows, n_sb * k.block_bytes, n_sb, *(a.reshape(-1) for a in got))
    for a, b in zip(got, want):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), t.name


@njit
def _widen_all(raw, out, native):
    for i in range(out.size):
        out[i] = ks._f16_at(raw, 2 * i) if native else ks._f16_at_int(raw, 2 * i)


@pytest.mark.parametrize("path", ["auto", "integer"])
def test_f16_widening_is_exact_for_every_bit_pattern(path):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.zeros(1 << 16, np.float32)
    _widen_all(bits.view(np.uint8), got, path == "auto")
    ref = bits.view(np.float16).astype(np.float32)
    if path == "auto":          # F16C's vcvtph2ps quiets signalling NaNs, numpy keeps them
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(got), nan)
        got, ref = got[~nan], ref[~nan]
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_f16_scales_reach_the_unpacked_rows():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    raw = np.zeros((1 << 16, 18), np.uint8)                 # one Q4_0 block per f16 bit pattern
    raw[:, :2] = bits.view(np.uint8).reshape(-1, 2)
    wd = np.zeros(1 << 16, np.float32)
    z = np.zeros(1 << 16, np.int32)
    ku._unpack_q4_0(True, raw.reshape(-1), 0, 1 << 16, np.zeros(32 << 16, np.int8), z, z, wd, wd.copy())
    ref = bits.view(np.float16).astype(np.float32)
    finite = ~np.isnan(ref)
    assert np.array_equal(wd[finite].view(np.uint32), ref[finite].view(np.uint32))
    assert np.isnan(wd[~finite]).all()


# ---------------------------------------------------------------- activation quantization

@pytest.mark.parametrize("act", [ActType.Q8_0, ActType.Q8_1, ActType.Q8_K])
def test_activation_quantization_matches_round_activation(act):
    x = activation(3, 1024, seed=5)
    x[2] *= np.float32(1e-3)
    for sub in (16, 32):
        a = qa.quantize_activation(x, act, sub)
        q = a.q.reshape(3, -1).astype(np.int64)
        blk = 256 if act == ActType.Q8_K else 32
        deq = (q.reshape(3, -1, blk).astype(np.float32) * a.d[..., None]).reshape(3, -1)
        assert np.array_equal(deq, round_activation(x, act))          # values (-0.0 == 0: q is an int)
        assert np.abs(q).max() <= 127
        if act == ActType.Q8_K:
            assert np.array_equal(a.bsum, q.reshape(3, -1, sub).sum(axis=2))
        if act == ActType.Q8_1:
            # llama.cpp: s = f16(d * sum q) with d = amax/127 in f32 (not the f16-rounded scale)
            d32 = np.abs(x.reshape(3, -1, 32)).max(axis=2) / np.float32(127)
            s = (q.reshape(3, -1, 32).sum(axis=2).astype(np.float32) * d32).astype(np.float16)
            assert np.array_equal(a.s, s.astype(np.float32))


def test_f16_rounding_equals_numpy():
    from numba import njit

    @njit
    def rounded(v, out):
        for i in range(v.size):
            out[i] = qa._f16_round(v[i])
    bits = np.random.default_rng(0).integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32)
    edge = [0, -0.0, 65504, 65519.99, 65520, 1e-8, 2**-25, 2**-24, 3 * 2**-25, 2**-14, np.inf, -np.inf]
    v = np.concatenate([bits.view(np.float32), np.array(edge, np.float32)])
    out = np.empty_like(v)
    rounded(v, out)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(out[nan]).all()


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100_003])
def test_whole_array_f16_rounding_equals_numpy(n):
    # half_bits / half_round (the KV cache's F16 rows, attention's q): every finite f16 value, the midpoints
    # between neighbours (ties to even) and a float either side of them, random bit patterns, overflow
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    h = np.sort(h[np.isfinite(h)])
    mid = ((h[:-1].astype(np.float64) + h[1:]) / 2).astype(np.float32)
    bits = np.random.default_rng(n).integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    pool = np.concatenate([h, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
                           bits.view(np.float32), np.array([65520, -65520, np.inf, -np.inf, np.nan], np.float32)])
    for start in range(0, pool.size, max(n, 4099)):
        v = np.ascontiguousarray(pool[start:start + n])
        with np.errstate(over="ignore", invalid="ignore"):
            want = v.astype(np.float16)
        got = ks.half_bits(v, np.empty(v.size, np.uint16))
        nan = np.isnan(want)                     # (F16C keeps a NaN a NaN, its payload as it quiets it)
        assert np.array_equal(got[~nan], want.view(np.uint16)[~nan])
        assert np.isnan(got.view(np.float16)[nan]).all()
        r = ks.half_round(v)
        assert np.array_equal(r[~nan].view(np.uint32), want.astype(np.float32)[~nan].view(np.uint32))
        assert np.isnan(r[nan]).all()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7        # shapes kept, a view as the source
    assert np.array_equal(ks.half_bits(x[:, ::2], np.empty((2, 2, 4), np.uint16)),
                          x[:, ::2].astype(np.float16).view(np.uint16))
    assert ks.half_round(x).shape == x.shape


@pytest.mark.parametrize("n_tok", [1, 200])          # on the calling thread, and tokens in parallel
def test_q8_k_of_infinite_and_nan_activations_follows_ggml(n_tok):
    # quantize_row_q8_K_ref: a NaN never wins the scan for the largest |x|; an infinite one makes iscale
    # -127/big = -+0, every q nearest_int(+-0 or NaN) = 0 and d = 1/iscale = -+inf (no exception)
    x = np.ones((n_tok, 1024), np.float32)
    x[0, 3], x[0, 300], x[0, 301], x[-1, 600], x[0, 768:] = np.inf, -np.inf, np.nan, np.nan, np.nan
    a = qa.quantize_activation(x, ActType.Q8_K, 16)
    r = qa._q8_k_reference(x, 16)
    assert np.array_equal(a.q, r.q) and np.array_equal(a.bsum, r.bsum)
    assert np.array_equal(a.d.view(np.uint32), r.d.view(np.uint32))
    d = a.d.reshape(n_tok, -1)
    assert d[0, 0] == -np.inf and d[0, 1] == np.inf and not a.q[:512].any()
    assert d[-1, 2] == np.float32(-1 / 127) if n_tok > 1 else True     # NaN beside ones: the ones' scale
    assert np.isnan(d[0, 3])                                            # all NaN: big = x[0], a NaN


@pytest.mark.parametrize("n_tok", [1, 3, 6])
def test_numba_quantizers_equal_their_numpy_references(n_tok):
    rng = np.random.default_rng(n_tok)
    same = lambda a, b: np.array_equal(a.view(np.uint32) if a.dtype == np.float32 else a,  # noqa: E731
                                       b.view(np.uint32) if b.dtype == np.float32 else b)
    for n in (256, 2560):
        x = rng.standard_normal((n_tok, n)).astype(np.float32)
        x[0, :32] = 0                                   # an all-zero block
        x[-1, 300:] *= np.float32(1e-6)
        x[0, 10] = -np.abs(x[0, :256]).max()            # a +-max tie in the first Q8_K block
        x[0, 20] = -x[0, 10]
        for with_sum in (False, True):
            a, r = qa._q8_0(x, with_sum), qa._q8_0_reference(x, with_sum)
            assert same(a.q, r.q) and same(a.d, r.d) and (not with_sum or same(a.s, r.s))
        for sub in (16, 32):
            for pos_ties in (0, n_tok):
                a, r = qa._q8_k(x, sub, pos_ties), qa._q8_k_reference(x, sub, pos_ties)
                assert same(a.q, r.q) and same(a.d, r.d) and same(a.bsum, r.bsum), (n, sub, pos_ties)


# ---------------------------------------------------------------- the kernel

def exact_reference(t: GGMLType, raw: np.ndarray, x: np.ndarray, n_out: int, n_in: int):
    """(y, scale): llama.cpp's integer-dot result in int64 / float64, and sum |w*x'| per output."""
    k = REGISTRY[t]
    sb, sub = k.block_elems, k.qdot.sub
    n_tok = x.shape[0]
    a = qa.quantize_activation(x, k.act, sub)
    aq = a.q.reshape(n_tok, -1).astype(np.int64)
    wq, isc, imn, wd, wm = unpack(t, raw, n_out, n_in, vec=False)
    prod = np.einsum("rs,ts->trs", wq.astype(np.int64) - k.qdot.offset, aq)  # [tok, row, n_in]
    isum = (prod.reshape(n_tok, n_out, -1, sub).sum(axis=3) * isc[None].astype(np.int64))      # per sub-block
    isum = isum.reshape(n_tok, n_out, -1, sb // sub).sum(axis=3)              # per super-block
    ad = a.d.reshape(n_tok, 1, -1).astype(np.float64)
    y = (wd[None].astype(np.float64) * ad * isum).sum(axis=2) * 2.0 ** -k.qdot.post
    if k.qdot.mins in (kv.K_SUM, kv.K_MIN4, kv.K_LANES):
        bs = a.bsum.reshape(n_tok, 1, -1, sb // sub).astype(np.int64)
        msum = (imn.reshape(1, n_out, -1, sb // sub) * bs).sum(axis=3)
        y -= (wm[None].astype(np.float64) * ad * msum).sum(axis=2)
    elif k.qdot.mins == kv.Q8_1_SUM:
        y += (wm[None].astype(np.float64) * a.s.reshape(n_tok, 1, -1)).sum(axis=2)
    w = dequantize(t, raw).reshape(n_out, n_in).astype(np.float64)
    scale = np.abs(round_activation(x, k.act)).astype(np.float64) @ np.abs(w).T
    return y, scale


@pytest.mark.parametrize("n_tok", [1, 3, 17])
@pytest.mark.parametrize("t", INT_TYPES, ids=_ids(INT_TYPES))
def test_kernel_matches_integer_reference_and_float_path(t, n_tok):
    for n_out in (N_OUT, N_OUT + 3):        # llama.cpp's vec_dot arithmetic; its repacked one (x 8 rows)
        raw = weight(t, n_out, N_IN, seed=int(t) * 100 + n_tok)
        x = activation(n_tok, N_IN, seed=n_tok)
        y = qm.qmatmul(np.full((n_tok, n_out), np.nan, np.float32), x, t, raw, n_out, N_IN)
        ref, scale = exact_reference(t, raw, x, n_out, N_IN)
        err = np.abs(y - ref) / np.maximum(scale, 1e-30)
        assert err.max() <= 1e-6, f"{t.name}: max error {err.max():.2e} of sum |w*x|"
        yf = matmul_reference(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, N_IN)
        errf = np.abs(y - yf) / np.maximum(scale, 1e-30)
        assert errf.max() <= 1e-5, f"{t.name}: float path differs by {errf.max():.2e} of sum |w*x|"
        # routing: matmul runs the integer kernel for this type
        ym = matmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, N_IN)
        assert np.array_equal(ym, y)


# one type of each family in CI (each compiles its portable kernels: ~10 s a type); every type with -m slow
VECTOR_CI = ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "IQ2_XS"]


@pytest.mark.parametrize("t", [pytest.param(t, id=t.name, marks=[] if t.name in VECTOR_CI else [pytest.mark.slow])
                               for t in INT_TYPES])
def test_vector_path_equals_portable_bit_for_bit(t):
    k = REGISTRY[t]
    n_in = N_IN if k.block_elems > 32 else N_IN + 32          # an odd block count where it can be
    for n_out in (N_OUT, N_OUT + 3):
        raw = random_blocks(t, n_out * n_in // k.block_elems, seed=7)
        for n_tok in (1, 2, 4, 5, kv.TILED_FROM + 1, kt.TT + 1):       # (two token tiles, the last of 1)
            x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
            yv = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in, vector=True)
            yp = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in, vector=False)
            assert np.array_equal(yv.view(np.uint32), yp.view(np.uint32)), (t.name, n_out, n_tok)


_NO_VNNI_SCRIPT = """
import sys, numpy as np
from ramforge.kernels import qmatmul as qm
from ramforge.kernels.registry import REGISTRY
data = np.load(sys.argv[1])
out = {}
for key in data.files:
    if key.startswith("raw-"):
        name, n_out, n_in, n_tok = key[4:].split("-")
        n_out, n_in, n_tok = int(n_out), int(n_in), int(n_tok)
        t = next(t for t in REGISTRY if t.name == name)
        x = data["x-%d-%d" % (n_tok, n_in)]
        y = np.zeros((n_tok, n_out), np.float32)
        out[key] = qm.qmatmul(y, x, t, data[key], n_out, n_in)
np.savez(sys.argv[2], **out)
"""


# one type of each family in CI (its compiles in a fresh process dominate: ~9 s a type); every type slow
NO_VNNI_CI = ["Q4_0", "Q8_0", "Q4_K", "IQ4_XS", "IQ2_XS"]


@pytest.mark.parametrize("names", [pytest.param(NO_VNNI_CI, id="ci"),
                                   pytest.param([t.name for t in INT_TYPES if t.name not in NO_VNNI_CI],
                                                id="rest", marks=pytest.mark.slow)])
def test_generic_ir_equals_the_vnni_path(tmp_path, names):
    # the IR for CPUs without VNNI (RAMFORGE_NO_VNNI=1, compiled in a process with its own cache)
    # gives the same integers, so the same bits, as this machine's path
    import os
    import subprocess
    import sys

    from numba.core.registry import cpu_target

    from ramforge.kernels.llvmir import has_vnni
    if not has_vnni(cpu_target.target_context):   # the switch would compile this host's own path again
        pytest.skip("this host's target has no VNNI: its kernels are already the IR RAMFORGE_NO_VNNI=1 selects")

    cases, want = {}, {}
    for t in (t for t in INT_TYPES if t.name in names):
        k = REGISTRY[t]
        n_in = N_IN if k.block_elems > 32 else N_IN + 32
        for n_out in (N_OUT, N_OUT + 3):
            raw = random_blocks(t, n_out * n_in // k.block_elems, seed=21)
            for n_tok in (1, 5, kv.TILED_FROM + 1, kt.TT + 1):
                x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
                key = f"raw-{t.name}-{n_out}-{n_in}-{n_tok}"
                cases[key], cases[f"x-{n_tok}-{n_in}"] = raw, x
                want[key] = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in)
    np.savez(tmp_path / "in.npz", **cases)
    env = dict(os.environ, RAMFORGE_NO_VNNI="1", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    subprocess.run([sys.executable, "-c", _NO_VNNI_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                   check=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    got = np.load(tmp_path / "out.npz")
    for key, y in want.items():
        assert np.array_equal(got[key].view(np.uint32), y.view(np.uint32)), key


def test_every_arithmetic_variant_is_used_and_reachable():
    # the shapes of the test above reach every variant the kernel has (so each is compared)
    used = set()
    for t in INT_TYPES:
        k = REGISTRY[t]
        for n_out in (N_OUT, N_OUT + 3):
            for n_tok in (1, 5, kv.TILED_FROM + 1):
                used.update(k.qdot.variants(k.block_elems, n_out, n_tok)[:2])
    assert used == set(range(len(kv._VARIANTS)))


def test_batched_variants_have_8_row_kernels():
    # batches of the repacked types (GROUPS), of 8+ tokens of the K-quants (TILED) and of the plain
    # 32-element types (LANES) run 8 rows at a time (the rows' float steps lane by lane, or each row
    # its own lanes); the 40-row shapes above (N_OUT + 3) reach them in the vector-vs-portable and
    # oracle comparisons
    lanes = kv._VARIANT_ID[kv.Spec(32, 1, kv.NO_MIN, kv.LANES, 0, 0)]
    assert set(kv._ROWS8) == {i for i, v in enumerate(kv._VARIANTS) if v[3] in (kv.GROUPS, kv.TILED)} | {lanes}
    assert (N_OUT + 3) % 8 == 0


# the 16-value codebook types unpack first (see variants.RawRow)
CODEBOOK_TYPES = (GGMLType.IQ4_NL, GGMLType.MXFP4)     # unpacked first (IQ4_XS: one pshufb, read packed)


def test_every_few_token_matmul_reads_packed_rows():
    # matmuls of fewer than _GROUP_FROM_TOKENS tokens dot the packed rows directly (no unpacking):
    # every type but IQ4_NL and MXFP4 has a packed-row intrinsic for each such variant, and the
    # shapes of test_vector_path_equals_portable_bit_for_bit reach each intrinsic
    used = set()
    for t in INT_TYPES:
        if t in CODEBOOK_TYPES:
            assert REGISTRY[t].qdot.raw is None
            continue
        k = REGISTRY[t]
        for n_out in (N_OUT, N_OUT + 3):
            for n_tok in range(1, qm._GROUP_FROM_TOKENS):
                lo, hi, split = k.qdot.variants(k.block_elems, n_out, n_tok)
                ids = (kv.raw_row_id(k.qdot.raw, lo if split else hi), kv.raw_row_id(k.qdot.raw, hi))
                assert min(ids) >= 0, (t.name, n_out, n_tok)
                used.update(ids)
            n_tok = qm._PACKED_GEMM_TOKENS          # and a repacked type's batch of 4 in its gemm's arithmetic
            if k.qdot.repack and n_out % 8 == 0 and qm._plan(t, n_out, N_IN, n_tok, n_tok, 0, 1, True, 0).choice.group == 1:
                lo, _, split = k.qdot.variants(k.block_elems, n_out, n_tok)
                assert split == n_tok and kv.raw_row_id(k.qdot.raw, lo) >= 0, (t.name, n_out)
                used.add(kv.raw_row_id(k.qdot.raw, lo))
    assert used == set(range(len(kv._RAW_ROWS)))


def test_strided_inputs_and_outputs():
    t = GGMLType.Q4_K
    raw = weight(t, N_OUT, N_IN, seed=3)
    x = np.asfortranarray(activation(4, N_IN, seed=4))
    want = qm.qmatmul(np.zeros((4, N_OUT), np.float32), np.ascontiguousarray(x), t, raw, N_OUT, N_IN)
    big = np.zeros((4, 2 * N_OUT), np.float32)
    got = qm.qmatmul(big[:, ::2], x, t, raw, N_OUT, N_IN)
    assert np.array_equal(got, want) and np.array_equal(big[:, ::2], want) and not big[:, 1::2].any()


def test_float_types_take_the_float_kernels():
    from ramforge.kernels.matmul import float_matmul

    for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        assert REGISTRY[t].qdot is None
        with pytest.raises(RamforgeError, match="no integer-dot kernel"):
            qm.qmatmul(np.zeros((1, 2), np.float32), np.zeros((1, 32), np.float32), t,
                       random_blocks(t, 64, 1), 2, 32)
    raw = random_blocks(GGMLType.F16, 2 * 32, 1)
    x = activation(1, 32, 2)
    assert np.array_equal(matmul(np.zeros((1, 2), np.float32), x, GGMLType.F16, raw, 2, 32),
                          float_matmul(np.zeros((1, 2), np.float32), x, GGMLType.F16, raw, 2, 32, 1))
    with pytest.raises(RamforgeError, match="not a float type"):
        float_matmul(np.zeros((1, 2), np.float32), x, GGMLType.Q8_0, random_blocks(GGMLType.Q8_0, 2, 1), 2, 32, 1)
    with pytest.raises(RamforgeError, match="needs"):
        float_matmul(np.zeros((1, 2), np.float32), x, GGMLType.F16, raw[:-2], 2, 32, 1)


def test_shapes_and_errors_are_validated():
    t = GGMLType.Q4_0
    raw = weight(t, 4, 64, seed=1)
    x, y = np.zeros((2, 64), np.float32), np.zeros((2, 4), np.float32)
    qm.qmatmul(y, x, t, raw, 4, 64)
    with pytest.raises(RamforgeError, match="multiple of Q4_0's block size 32"):
        qm.qmatmul(y, np.zeros((2, 48), np.float32), t, raw, 4, 48)
    with pytest.raises(RamforgeError, match="needs 144 B, got 143"):
        qm.qmatmul(y, x, t, raw[:-1], 4, 64)
    with pytest.raises(RamforgeError, match="needs 144 B"):
        qm.qmatmul(y, x, t, raw.view(np.int8), 4, 64)
    with pytest.raises(RamforgeError, match="matmul shapes"):
        qm.qmatmul(y, np.zeros((2, 32), np.float32), t, raw, 8, 32)
    with pytest.raises(RamforgeError, match="matmul shapes"):
        qm.qmatmul(np.zeros((3, 4), np.float32), x, t, raw, 4, 64)
    with pytest.raises(RamforgeError, match="matmul shapes"):
        qm.qmatmul(np.zeros((2, 4), np.float64), x, t, raw, 4, 64)
    with pytest.raises(RamforgeError, match="matmul shapes"):
        qm.qmatmul(y, x[0], t, raw, 4, 64)
    with pytest.raises(RamforgeError, match="not supported"):
        qm.qmatmul(y, x, GGMLType.Q8_1, raw, 4, 64)
    # an MXFP4 weight whose row is not a whole number of its 32-element blocks
    with pytest.raises(RamforgeError, match="row length 48 is not a multiple of MXFP4's block size 32"):
        qm.qmatmul(np.zeros((2, 4), np.float32), np.zeros((2, 48), np.float32), GGMLType.MXFP4,
                   np.zeros(4 * 17, np.uint8), 4, 48)
    with pytest.raises(RamforgeError, match="MXFP4 n_elements = 48 is not a whole number of blocks of 32"):
        dequantize(GGMLType.MXFP4, np.zeros(2 * 17, np.uint8), n_elements=48)
    for iq in (GGMLType.IQ2_XXS, GGMLType.IQ3_S):              # the codebook types: rows of whole 256s
        with pytest.raises(RamforgeError, match=f"multiple of {iq.name}'s block size 256"):
            qm.qmatmul(np.zeros((1, 4), np.float32), np.zeros((1, 128), np.float32), iq, raw, 4, 128)
    empty = qm.qmatmul(np.ones((0, 4), np.float32), np.zeros((0, 64), np.float32), t, raw, 4, 64)
    assert empty.shape == (0, 4)


# ---------------------------------------------------------------- llama.cpp's own CPU backend, live

class _GGML(CpuBackend):
    """ggml's CPU backend from llama-cpp-python's shared libraries (ctypes): mul_mat with the weight
    in a repack buffer where llama.cpp would repack it, else a plain CPU buffer."""

    def __init__(self):
        pytest.importorskip("llama_cpp")
        try:
            _, cpu = libraries()
        except OSError as e:
            pytest.skip(f"ggml libraries not loadable: {e}")
        # qmatmul reproduces the x86 build that recorded the oracle (AVX2, FMA, AVX512-VNNI)
        for f in ("avx2", "fma", "f16c", "avx512", "avx512_vnni", "llamafile"):
            if not getattr(cpu, f"ggml_cpu_has_{f}")():
                pytest.skip(f"llama.cpp build without {f}: not the arithmetic qmatmul reproduces")
        try:
            super().__init__(2)
        except AttributeError as e:
            pytest.skip(f"ggml symbol missing: {e}")

    def matmul(self, t: GGMLType, raw: np.ndarray, x: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
        qd = REGISTRY[t].qdot
        repack = qd is not None and qd.repack is not None and n_out % 8 == 0
        cw, cx = self.init(self.Params(1 << 16, None, True)), self.init(self.Params(1 << 16, None, True))
        cg = self.init(self.Params(1 << 20, None, True))
        w, xt = self.new2d(cw, int(t), n_in, n_out), self.new2d(cx, 0, n_in, x.shape[0])
        y = self.mul_mat(cx, w, xt)
        bufs = [self.alloc(cw, self.repack_buft() if repack else self.cpu_buft()), self.alloc(cx, self.cpu_buft())]
        x = np.ascontiguousarray(x, np.float32)
        self.tset(w, raw.ctypes.data, 0, raw.nbytes)
        self.tset(xt, x.ctypes.data, 0, x.nbytes)
        g = self.new_graph(cg)
        self.build(g, y)
        assert self.compute(self.backend, g) == 0
        out = np.zeros((x.shape[0], n_out), np.float32)
        self.tget(y, out.ctypes.data, 0, out.nbytes)
        for b in bufs:
            self.buf_free(b)
        for ctx in (cw, cx, cg):
            self.free(ctx)
        return out


@pytest.fixture(scope="module")
def ggml():
    return _GGML()


GGML_TYPES = [t for t in INT_TYPES if t != GGMLType.Q8_K]       # ggml has no Q8_K x Q8_K dot


@pytest.mark.oracle
@pytest.mark.parametrize("t", GGML_TYPES, ids=_ids(GGML_TYPES))
def test_bit_identical_to_llama_cpp_cpu_backend(ggml, t):
    # every path llama.cpp takes: vec_dot (< 8 tokens), tinyBLAS, the tiled K-quant matmul (8+),
    # repacked gemv / gemm (rows a multiple of 8; gemm per 4 tokens, gemv for the rest); odd block counts
    for n_in in (256, 800, 2304):
        if n_in % REGISTRY[t].block_elems:
            continue
        for n_out in (33, 40):
            raw = weight(t, n_out, n_in, seed=n_in + n_out)
            for n_tok in (1, 2, 3, 4, 5, 8, 17, 21):
                x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
                want = ggml.matmul(t, raw, x, n_out, n_in)
                got = qm.qmatmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in)
                same = got.view(np.uint32) == want.view(np.uint32)
                assert same.all(), (f"{t.name} {n_out}x{n_in}, {n_tok} tokens: {np.count_nonzero(~same)} of "
                                    f"{same.size} differ, max {np.abs(got - want).max():.3g}")


def _tail_case(t: GGMLType, n_out: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(raw, x) of n_out rows of 3 blocks of type t (MXFP4 / IQ4_NL) and one token: the last block's
    codes share one sign pattern over the rows and x is signed as it (|sumi| of 2^13 .. 2^15, so
    that d * sumi rounds), the first two blocks nearly cancel it."""
    bb = REGISTRY[t].block_bytes
    nib = rng.integers(0, 16, (n_out, 3, 32))
    neg = rng.integers(0, 2, 32).astype(bool)
    if t == GGMLType.MXFP4:                   # kv: 0..7 positive, 8..15 negative
        nib[:, 2] = np.where(neg, 8, 0) + rng.integers(1, 8, (n_out, 32))
    else:                                     # IQ4_NL: 0..7 negative, 8..15 positive
        nib[:, 2] = np.where(neg, 0, 12) + rng.integers(0, 4, (n_out, 32))
    raw = np.zeros((n_out, 3, bb), np.uint8)
    raw[..., bb - 16:] = (nib[..., :16] | (nib[..., 16:] << 4)).astype(np.uint8)
    if t == GGMLType.MXFP4:
        raw[..., 0] = rng.integers(120, 130, (n_out, 3))
    else:
        raw[..., :2] = rng.uniform(1e-3, 1e-2, (n_out, 3)).astype(np.float16).view(np.uint8).reshape(n_out, 3, 2)
    x = np.empty((1, 96), np.float32)
    x[0, 64:] = np.where(neg, -1, 1) * rng.uniform(0.5, 1.0, 32)
    x[0, :64] = -rng.uniform(0.0, 0.5, 64) * np.where(rng.integers(0, 4, 64) > 0, 1, -1)
    return raw.reshape(-1), x


@pytest.mark.oracle
@pytest.mark.parametrize("t", [GGMLType.MXFP4, GGMLType.IQ4_NL], ids=_ids([GGMLType.MXFP4, GGMLType.IQ4_NL]))
def test_odd_block_tail_is_one_fma_as_in_llama_cpp(ggml, t):
    # vec_dot's scalar tail for an odd block count, sumf += d * sumi, is an fma (GCC contracts it);
    # an unfused multiply-add differs on these rows (checked below); ggml's mul_mat is matched
    n_out, n_in = 201, 96                     # 3 blocks (a tail); rows not a multiple of 8 (vec_dot)
    raw, x = _tail_case(t, n_out, np.random.default_rng(3))
    want = ggml.matmul(t, raw, x, n_out, n_in)
    got = qm.qmatmul(np.zeros((1, n_out), np.float32), x, t, raw, n_out, n_in)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # r = the first two blocks' hsum (the 2-block matmul), then the tail fused or not
    bb = REGISTRY[t].block_bytes
    r = qm.qmatmul(np.zeros((1, n_out), np.float32), x[:, :64], t,
                   np.ascontiguousarray(raw.reshape(n_out, 3, bb)[:, :2]).reshape(-1), n_out, 64)[0]
    a = qa.quantize_activation(x, REGISTRY[t].act, 32)
    wq, isc, imn, wd, wm = unpack(t, raw, n_out, n_in, vec=False)
    isum = (wq[:, 64:].astype(np.int64) * a.q.reshape(-1)[64:].astype(np.int64)).sum(axis=1)
    d = np.float32(a.d.reshape(-1)[2]) * wd[:, 2]
    fused = (r.astype(np.float64) + d.astype(np.float64) * isum).astype(np.float32)
    unfused = r + d * isum.astype(np.float32)
    assert np.array_equal(got[0], fused) and np.count_nonzero(unfused != fused) >= 3


FLOAT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16]


def float_weight(t: GGMLType, n_out: int, n_in: int, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    if t == GGMLType.F16:
        return w.astype(np.float16).view(np.uint8).reshape(-1)
    if t == GGMLType.BF16:
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    return w.view(np.uint8).reshape(-1)


@pytest.mark.parametrize("t", FLOAT_TYPES, ids=_ids(FLOAT_TYPES))
def test_float_matmul_is_within_rounding_of_the_reference(t):
    from ramforge.kernels.matmul import matmul, matmul_reference

    for n_in, n_out in ((256, 40), (100, 37), (96, 8)):
        raw = float_weight(t, n_out, n_in, seed=n_in)
        for n_tok in (1, 3):
            x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
            got = matmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in)
            want = matmul_reference(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(n_in))


@pytest.mark.oracle
@pytest.mark.parametrize("t", FLOAT_TYPES, ids=_ids(FLOAT_TYPES))
def test_float_matmul_is_bit_identical_to_llama_cpp(ggml, t):
    # tinyBLAS for 2+ tokens where the shape allows (k a multiple of 16, BF16 32; rows of 4),
    # ggml_vec_dot_* for one token and the other shapes, leftovers included (F32's as gcc compiled
    # them: fmatmul's docstring)
    from ramforge.kernels.matmul import matmul

    for n_in, n_out in ((256, 40), (100, 37), (96, 8), (160, 36), (13, 9), (83, 5)):
        raw = float_weight(t, n_out, n_in, seed=n_in + n_out)
        for n_tok in (1, 2, 5):
            x = np.random.default_rng(n_tok).standard_normal((n_tok, n_in)).astype(np.float32)
            want = ggml.matmul(t, raw, x, n_out, n_in)
            got = matmul(np.zeros((n_tok, n_out), np.float32), x, t, raw, n_out, n_in)
            same = got.view(np.uint32) == want.view(np.uint32)
            assert same.all(), (f"{t.name} {n_out}x{n_in}, {n_tok} tokens: {np.count_nonzero(~same)} of "
                                f"{same.size} differ, max {np.abs(got - want).max():.3g}")
