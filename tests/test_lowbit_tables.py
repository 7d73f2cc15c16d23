"""The low-bit tables (ramforge.kernels.lowbit_tables) against ggml's own text and committed hashes.

Two independent checks: the vendored llama.cpp headers, parsed here at test time (skipped where the
llama-cpp-python sdist is not unpacked: RAMFORGE_LLAMA_SRC, default /tmp/llsrc/...), and sha256
hashes of the tables' bytes committed below (always run), plus gguf-py's own copies where it has them.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ramforge.kernels import lowbit_tables as lt

_SRC = Path(os.environ.get("RAMFORGE_LLAMA_SRC", "/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp"))
_COMMON = _SRC / "ggml" / "src" / "ggml-common.h"

HASHES = {      # sha256 of each table's bytes (the dtype as stored in lowbit_tables)
    "KVALUES_MXFP4_I8": "adf76b672d47eb7fc0afd4db132d548d59d3190aa0ad118fdbf569d5fd478f97",
    "IQ1S_GRID": "07540ffc1aeaf6ad4d97e96b0fcc765aae39671d4ae4a27bbd0e796fde167c6a",
    "E8M0_HALF": "ce2e76164e8f7ad49e6c322ac935defdae65f2286a654765fdc00caf29ab37bd",
}


@pytest.mark.parametrize("name", sorted(HASHES))
def test_tables_match_their_committed_hashes(name):
    a = getattr(lt, name)
    assert hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() == HASHES[name]


def test_table_shapes_and_constants():
    assert lt.KVALUES_MXFP4_I8.shape == (16,) and lt.IQ1S_GRID.shape == (2048, 8)
    assert set(np.unique(lt.IQ1S_GRID)) == {-1, 0, 1}
    assert lt.E8M0_HALF.dtype == np.float32 and lt.E8M0_HALF.shape == (256,)
    assert (lt.IQ1S_DELTA, lt.IQ1M_DELTA, lt.POW3) == (0.125, 0.125, (1, 3, 9, 27, 81))
    # e8m0_half(e) = 2^(e - 128): e = 0, 1 are the f32 subnormals 0x00200000, 0x00400000
    assert lt.E8M0_HALF[:2].view(np.uint32).tolist() == [0x00200000, 0x00400000]
    assert (lt.E8M0_HALF[2:].view(np.uint32) == (np.arange(2, 256, dtype=np.uint32) - 1) << 23).all()


def test_tables_equal_gguf_py():
    gq = pytest.importorskip("gguf.quants")
    assert lt.KVALUES_MXFP4 == tuple(gq.MXFP4.kvalues)
    e = np.arange(256, dtype=np.uint8)
    assert np.array_equal(gq.MXFP4.e8m0_to_fp32_half(e).view(np.uint32), lt.E8M0_HALF.view(np.uint32))
    gq.IQ1_S.init_grid()
    assert np.array_equal(np.asarray(gq.IQ1_S.grid).reshape(2048, 8), lt.IQ1S_GRID)
    assert gq.IQ1_S.delta == lt.IQ1S_DELTA and gq.IQ1_M.delta == lt.IQ1M_DELTA


def _table(text: str, ctype: str, name: str) -> list[int]:
    m = re.search(rf"GGML_TABLE_BEGIN\({ctype},\s*{name},\s*\w+\)(.*?)GGML_TABLE_END\(\)", text, re.S)
    assert m, name
    return [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", m.group(1))]


@pytest.fixture(scope="module")
def common_h() -> str:
    if not _COMMON.is_file():
        pytest.skip(f"llama.cpp source not unpacked at {_SRC} (set RAMFORGE_LLAMA_SRC)")
    return _COMMON.read_text()


def test_tables_equal_the_vendored_header(common_h):
    assert _table(common_h, "int8_t", "kvalues_fp4") == list(lt.KVALUES_MXFP4)
    assert re.search(r"#define\s+kvalues_mxfp4\s+kvalues_fp4", common_h)
    grid = np.array(_table(common_h, "uint64_t", "iq1s_grid"), dtype=np.uint64)
    assert grid.shape == (2048,)
    assert np.array_equal(grid.view(np.int8).reshape(2048, 8), lt.IQ1S_GRID)    # byte j = value j
    for name, v in (("IQ1S_DELTA", lt.IQ1S_DELTA), ("IQ1M_DELTA", lt.IQ1M_DELTA)):
        m = re.search(rf"#define\s+{name}\s+([0-9.]+)f", common_h)
        assert m and float(m.group(1)) == v, name
    assert re.search(r"#define\s+NGRID_IQ1S\s+2048\b", common_h)


def test_e8m0_half_equals_the_vendored_rule():
    impl = _SRC / "ggml" / "src" / "ggml-impl.h"
    if not impl.is_file():
        pytest.skip(f"llama.cpp source not unpacked at {_SRC}")
    body = re.search(r"ggml_e8m0_to_fp32_half\(uint8_t x\)\s*\{(.*?)\n\}", impl.read_text(), re.S).group(1)
    # its two cases: x < 2 -> 0x00200000 << x; else (x - 1) << 23 (the f32 bits)
    small = int(re.search(r"bits = (0x[0-9a-fA-F]+) << x", body).group(1), 16)
    assert re.search(r"if \(x < 2\)", body) and re.search(r"\(uint32_t\)\(x - 1\) << 23", body)
    want = np.array([small << x if x < 2 else (x - 1) << 23 for x in range(256)], dtype=np.uint32)
    assert np.array_equal(lt.E8M0_HALF.view(np.uint32), want)
