"""The IQ2 / IQ3 codebooks (ramforge/kernels/grids.py): against ggml-common.h parsed at test time
(when the pinned sdist is in the fixture cache), gguf-py's own grids, and committed hashes."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ramforge.kernels import grids
from tools.gen_grids import TABLES, header_tables, header_text

SHA256 = {       # of each table's little-endian bytes
    "KMASK_IQ2XS": "5ac9831b2e30eb285ef34f8501620f878432d5c04331ad1ae47f977a83ba41a5",
    "KSIGNS_IQ2XS": "a76742a603f8beca5212ecce0f1f02f11a4887fd2f7c8b15aca0ea3eb3380c31",
    "IQ2XXS_GRID": "05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54",
    "IQ2XS_GRID": "06e47aaca60b4dc1d9b5a3f34540437058a6b142b4d7a59d5ded769b4d1bf1de",
    "IQ2S_GRID": "e1aa1473412b0552c2174c30ef22ab4073f6a181b85a17056e8249bd2932fd88",
    "IQ3XXS_GRID": "46e35f5a997efdee6c99ce57854c8a0d4f0ff8ca57e5e8a60c0793ea580acf5d",
    "IQ3S_GRID": "bd1af4945a1717c65610b0284e4628b9a1ba3b306fae3a06f6e5f597356e349f",
}


@pytest.mark.parametrize("name", list(SHA256))
def test_table_hash(name):
    a = getattr(grids, name)
    assert hashlib.sha256(a.astype(a.dtype.newbyteorder("<")).tobytes()).hexdigest() == SHA256[name]


def test_tables_equal_the_header():
    text = header_text()
    if text is None:
        pytest.skip("llama-cpp-python sdist not in the fixture cache (tools/fetch_vocab.py fetches it)")
    h = header_tables(text)
    for hname, pname, bits, _ in TABLES:
        a = getattr(grids, pname)
        assert a.dtype == np.dtype(f"uint{bits}") and a.tolist() == h[hname], pname


def test_sign_tables_follow_their_rule():
    i = np.arange(128)
    parity = np.array([bin(v).count("1") & 1 for v in i])
    assert (grids.KSIGNS_IQ2XS == i | parity << 7).all()
    assert (grids.KMASK_IQ2XS == 1 << np.arange(8)).all()


@pytest.mark.parametrize("qtype, grid", [("IQ2_XXS", "IQ2XXS_GRID_I8"), ("IQ2_XS", "IQ2XS_GRID_I8"),
                                         ("IQ2_S", "IQ2S_GRID_I8"), ("IQ3_XXS", "IQ3XXS_GRID_I8"),
                                         ("IQ3_S", "IQ3S_GRID_I8")])
def test_grids_equal_gguf_py(qtype, grid):
    quants = pytest.importorskip("gguf.quants")
    cls = getattr(quants, qtype)
    cls.init_grid()
    want = np.asarray(cls.grid).reshape(cls.grid_shape)
    assert np.array_equal(getattr(grids, grid).astype(np.float32), want)


def test_no_int16_saturation_in_the_vec_dots():
    # ggml's AVX2 vec_dots sum pairs of |grid| * |q8| in int16 (maddubs): with |q8| <= 127 (Q8_K) and
    # the largest grid magnitude, a pair stays below 2^15, so ggml never saturates and the exact
    # integer sums here are its sums
    for name in ("IQ2XXS_GRID_I8", "IQ2XS_GRID_I8", "IQ2S_GRID_I8", "IQ3XXS_GRID_I8", "IQ3S_GRID_I8"):
        g = getattr(grids, name)
        assert g.min() > 0 and 2 * int(g.max()) * 127 < 2**15, name
