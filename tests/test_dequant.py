"""Dequantization kernels are bit-exact against gguf-py's numpy reference (`gguf.quants`).

Every test that checks values loops over the registry, so a newly registered type is covered
automatically (it needs an oracle: gguf.quants or an entry in _LOCAL_ORACLE).
"""
from __future__ import annotations

import numpy as np
import pytest

import gguf  # gguf-py: a dev dependency (pip install -e '.[dev]'), the test oracle (ramforge never imports it)
import gguf.quants as gq

from ramforge.errors import RamforgeError, UnsupportedType  # noqa: E402
from ramforge.gguf.constants import GGML_BLOCK, GGMLType  # noqa: E402
from ramforge.kernels.dequant import DequantError, dequantize  # noqa: E402
from ramforge.kernels.registry import REGISTRY, QuantKernels, is_executable, kernels_for  # noqa: E402

EXECUTABLE = list(REGISTRY)
REFUSED = [t for t in GGMLType if t not in REGISTRY]
N_RANDOM_ELEMS = 4096      # per type: 128 small blocks or 16 super-blocks


def _ids(types):
    return [t.name for t in types]


# ---------------------------------------------------------------- oracle

def _q8_k_ref(raw: np.ndarray) -> np.ndarray:
    # gguf.quants has no Q8_K; ggml: y = d * q with f32 d, int8 q (one f32 multiply)
    blocks = raw.reshape(-1, GGML_BLOCK[GGMLType.Q8_K][1])
    d = blocks[:, :4].copy().view(np.float32)
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


_LOCAL_ORACLE = {GGMLType.Q8_K: _q8_k_ref}


def oracle(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    if t in _LOCAL_ORACLE:
        return _LOCAL_ORACLE[t](raw)
    out = gq.dequantize(np.ascontiguousarray(raw), gguf.GGMLQuantizationType[t.name])
    return np.asarray(out, dtype=np.float32).reshape(-1)


def assert_bits_equal(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.dtype == np.float32 and ref.dtype == np.float32, (got.dtype, ref.dtype)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    g, r = got.view(np.uint32), ref.view(np.uint32)
    if not np.array_equal(g, r):
        i = int(np.flatnonzero(g != r)[0])
        n = int(np.count_nonzero(g != r))
        pytest.fail(f"{what}: {n} of {g.size} values differ; first at {i}: got {got[i]!r} ({g[i]:#010x}), "
                    f"expected {ref[i]!r} ({r[i]:#010x})")


# ---------------------------------------------------------------- random NaN-free blocks

def _finite_bits(rng, n: int, width: int, exp_mask: int) -> np.ndarray:
    """n random float bit patterns (uint16/uint32) with every inf/nan replaced by a finite value."""
    dt = np.uint16 if width == 16 else np.uint32
    bits = rng.integers(0, 1 << width, size=n, dtype=np.uint64).astype(dt)
    nonfinite = (bits & dt(exp_mask)) == dt(exp_mask)
    top_exp_bit = exp_mask & ~(exp_mask >> 1)
    bits[nonfinite] &= dt(((1 << width) - 1) ^ top_exp_bit)
    return bits


def _finite_f16(rng, n):
    return _finite_bits(rng, n, 16, 0x7C00)


# byte offsets (within a block) of float scale fields: (kind, offsets)
_SCALES = {
    GGMLType.Q4_0: ("f16", (0,)), GGMLType.Q4_1: ("f16", (0, 2)),
    GGMLType.Q5_0: ("f16", (0,)), GGMLType.Q5_1: ("f16", (0, 2)),
    GGMLType.Q8_0: ("f16", (0,)), GGMLType.IQ4_NL: ("f16", (0,)),
    GGMLType.Q2_K: ("f16", (80, 82)), GGMLType.Q3_K: ("f16", (108,)),
    GGMLType.Q4_K: ("f16", (0, 2)), GGMLType.Q5_K: ("f16", (0, 2)),
    GGMLType.Q6_K: ("f16", (208,)), GGMLType.IQ4_XS: ("f16", (0,)),
    GGMLType.Q8_K: ("f32", (0,)),
    GGMLType.MXFP4: ("e8m0", (0,)), GGMLType.TQ2_0: ("f16", (64,)), GGMLType.TQ1_0: ("f16", (52,)),
    GGMLType.IQ1_S: ("f16", (0,)), GGMLType.IQ1_M: ("f16-nibbles", (48,)),
    GGMLType.IQ2_XXS: ("f16", (0,)), GGMLType.IQ2_XS: ("f16", (0,)), GGMLType.IQ2_S: ("f16", (0,)),
    GGMLType.IQ3_XXS: ("f16", (0,)), GGMLType.IQ3_S: ("f16", (0,)),
}


def random_blocks(t: GGMLType, n_blocks: int, seed: int) -> np.ndarray:
    """Random uint8 data of n_blocks blocks of type t whose float fields are all finite."""
    rng = np.random.default_rng(seed)
    be, bb = GGML_BLOCK[t]
    if t == GGMLType.F32:
        return _finite_bits(rng, n_blocks, 32, 0x7F800000).view(np.uint8)
    if t == GGMLType.F16:
        return _finite_f16(rng, n_blocks).view(np.uint8)
    if t == GGMLType.BF16:
        return _finite_bits(rng, n_blocks, 16, 0x7F80).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    if t not in _SCALES:
        # unknown layout (a newly registered type): make every 2-byte-aligned f16 and every
        # 4-byte-aligned f32 finite by clearing bit 6 of each odd byte (a top exponent bit of both)
        blocks[:, 1::2] &= 0xBF
        return blocks.reshape(-1)
    kind, offsets = _SCALES[t]
    for o in offsets:
        if kind == "f16":
            blocks[:, o:o + 2] = _finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        elif kind == "e8m0":
            # every exponent whose largest weight (12 * 2^(e-128)) is finite: 0 (subnormal) .. 252
            blocks[:, o] = rng.integers(0, 253, n_blocks, dtype=np.uint8)
            blocks[:3, o] = (0, 1, 252)[:n_blocks]
        elif kind == "f16-nibbles":
            # IQ1_M: an f16 in the top nibbles of the 4 u16 scale words at o
            h = _finite_f16(rng, n_blocks).astype(np.uint16)
            words = blocks[:, o:o + 8].copy().view(np.uint16) & np.uint16(0x0FFF)
            for k in range(4):
                words[:, k] |= ((h >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12)
            blocks[:, o:o + 8] = words.view(np.uint8)
        else:
            # moderate f32 scales, as Q8_K's (finite products with int8)
            d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-8, 4, n_blocks)).astype(np.float32)
            blocks[:, o:o + 4] = d.view(np.uint8).reshape(n_blocks, 4)
    return blocks.reshape(-1)


# ---------------------------------------------------------------- registry

def test_registry_is_the_executable_set():
    want = "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K IQ4_NL IQ4_XS".split()
    want += "MXFP4 TQ2_0 TQ1_0 IQ1_S IQ1_M".split()
    want += "IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S".split()
    assert [t.name for t in REGISTRY] == want
    for t, k in REGISTRY.items():
        assert isinstance(k, QuantKernels) and k.ggml_type == t
        assert (k.block_elems, k.block_bytes) == GGML_BLOCK[t]
        assert is_executable(t) and is_executable(int(t)) and kernels_for(int(t)) is k


@pytest.mark.parametrize("t", REFUSED, ids=_ids(REFUSED))
def test_refused_type_raises_naming_it(t):
    assert not is_executable(t)
    with pytest.raises(UnsupportedType, match=rf"tensor type {t.name} is not supported.*supported: F32, F16"):
        kernels_for(t)
    bb = GGML_BLOCK[t][1]
    with pytest.raises(UnsupportedType, match=t.name):
        dequantize(t, np.zeros(bb, dtype=np.uint8))


def test_unknown_type_id_refused():
    assert not is_executable(99)
    with pytest.raises(UnsupportedType, match="99"):
        kernels_for(99)


# ---------------------------------------------------------------- bit-exactness on random blocks

@pytest.mark.parametrize("t", EXECUTABLE, ids=_ids(EXECUTABLE))
def test_random_blocks_bit_exact(t):
    be, bb = GGML_BLOCK[t]
    n = N_RANDOM_ELEMS // be
    raw = random_blocks(t, n, seed=int(t))
    ref = oracle(t, raw)
    assert np.isfinite(ref).all(), "test data must be NaN/inf-free"
    assert_bits_equal(dequantize(t, raw, n_elements=n * be), ref, f"{t.name} all {n} blocks")
    # a block span in the middle, into a caller-provided buffer
    f, m = n // 3, n // 2
    out = np.full(m * be, np.nan, dtype=np.float32)
    assert dequantize(t, raw, first_block=f, n_blocks=m, out=out) is out
    assert_bits_equal(out, ref[f * be:(f + m) * be], f"{t.name} blocks [{f}, {f + m})")
    assert dequantize(t, raw, first_block=n, n_blocks=0).size == 0


def test_f16_and_bf16_every_bit_pattern():
    # all 65536 patterns, inf and NaN payloads included
    bits = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    for t in (GGMLType.F16, GGMLType.BF16):
        assert_bits_equal(dequantize(t, bits), oracle(t, bits), f"{t.name} every bit pattern")


# ---------------------------------------------------------------- bit-exactness on a real model

@pytest.fixture(scope="module")
def model_source(default_model):
    from ramforge.gguf.reader import GGUFFile

    with GGUFFile(default_model) as f:
        tensors = {n: (i.ggml_type, i.n_elements, i.nbytes) for n, i in f.tensors.items()}

        def read(name, start, nbytes):
            return f.read_tensor(f.tensors[name], start, nbytes)

        yield tensors, read


MAX_REAL_BLOCKS = 2048     # per tensor checked: the whole tensor if smaller, else head and tail spans


def test_real_model_tensors_bit_exact(model_source):
    tensors, read = model_source
    by_type: dict[GGMLType, list[str]] = {}
    for name, (t, _, nbytes) in sorted(tensors.items(), key=lambda kv: kv[1][2]):
        by_type.setdefault(t, []).append(name)
    assert {GGMLType.F32, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q6_K} <= set(by_type)
    checked = 0
    for t, names in by_type.items():
        assert is_executable(t), f"default model holds {t.name}, which has no kernels"
        be, bb = GGML_BLOCK[t]
        for name in {names[0], names[len(names) // 2], names[-1]}:     # smallest, median, largest
            _, n_el, nbytes = tensors[name]
            total = n_el // be
            assert total * bb == nbytes, name
            if total <= MAX_REAL_BLOCKS:
                raw = read(name, 0, nbytes)
                assert_bits_equal(dequantize(t, raw, n_elements=n_el), oracle(t, raw), name)
            else:
                k = MAX_REAL_BLOCKS // 2
                for first in (0, total - k):
                    raw = read(name, first * bb, k * bb)
                    assert_bits_equal(dequantize(t, raw), oracle(t, raw), f"{name} blocks [{first}, {first + k})")
                # a span inside a larger buffer, addressed with first_block
                raw = read(name, (total - k) * bb, k * bb)
                assert_bits_equal(dequantize(t, raw, first_block=k // 2, n_blocks=k // 4),
                                  oracle(t, raw)[k // 2 * be:(k // 2 + k // 4) * be], f"{name} sub-span")
            checked += 1
    assert checked >= 10


# ---------------------------------------------------------------- validation

def test_validation_errors_carry_the_numbers():
    t = GGMLType.Q4_K
    be, bb = GGML_BLOCK[t]
    raw = random_blocks(t, 4, seed=1)
    assert issubclass(DequantError, RamforgeError)
    with pytest.raises(DequantError, match=rf"{4 * bb - 1:,} B is not a whole number of blocks of {bb} B"):
        dequantize(t, raw[:-1])
    with pytest.raises(DequantError, match="n_elements = 1,000 is not a whole number of blocks of 256"):
        dequantize(t, raw, n_elements=1000)
    with pytest.raises(DequantError, match=f"n_elements = 1,280 needs {5 * bb} B but raw data has {4 * bb} B"):
        dequantize(t, raw, n_elements=5 * be)
    with pytest.raises(DequantError, match=r"block span \[3, 5\) is out of range for 4 blocks"):
        dequantize(t, raw, first_block=3, n_blocks=2)
    with pytest.raises(DequantError, match=r"block span \[5, 4\) is out of range"):
        dequantize(t, raw, first_block=5)
    with pytest.raises(DequantError, match=r"block span \[-1, "):
        dequantize(t, raw, first_block=-1, n_blocks=1)
    with pytest.raises(DequantError, match=r"block span \[1, 0\)"):
        dequantize(t, raw, first_block=1, n_blocks=-1)
    with pytest.raises(DequantError, match="uint8 numpy array, got float32"):
        dequantize(t, raw.view(np.float32))
    with pytest.raises(DequantError, match=r"out must be a writable contiguous float32\[512\], got float32\[256\]"):
        dequantize(t, raw, n_blocks=2, out=np.empty(256, np.float32))
    with pytest.raises(DequantError, match="got float64"):
        dequantize(t, raw, n_blocks=1, out=np.empty(256, np.float64))
