"""Write ramforge/kernels/grids.py: the codebook tables of the IQ2 / IQ3 types, from ggml-common.h.

    python tools/gen_grids.py                       # the header from the pinned sdist in the cache
    python tools/gen_grids.py --header path/to/ggml-common.h

`header_tables` parses the header's GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END() blocks;
tests/test_grids.py checks the written tables against it (and against a committed hash).
Tools and tests only; the ramforge package never imports this.
"""
from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT, cache_dir  # noqa: E402

HEADER_MEMBER = "vendor/llama.cpp/ggml/src/ggml-common.h"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
OUT = REPO_ROOT / "ramforge" / "kernels" / "grids.py"
# (header name, python name, element bits, values per line)
TABLES = (("kmask_iq2xs", "KMASK_IQ2XS", 8, 8), ("ksigns_iq2xs", "KSIGNS_IQ2XS", 8, 16),
          ("iq2xxs_grid", "IQ2XXS_GRID", 64, 4), ("iq2xs_grid", "IQ2XS_GRID", 64, 4),
          ("iq2s_grid", "IQ2S_GRID", 64, 4), ("iq3xxs_grid", "IQ3XXS_GRID", 32, 8),
          ("iq3s_grid", "IQ3S_GRID", 32, 8))

_TABLE = re.compile(r"GGML_TABLE_BEGIN\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END\(\)", re.S)


def header_text(path: str | Path | None = None) -> str | None:
    """ggml-common.h: the file `path`, else from the sdist in the fixture cache; None if neither."""
    if path is not None:
        return Path(path).read_text()
    sdist = cache_dir() / SDIST
    if not sdist.is_file():
        return None
    with tarfile.open(sdist, "r:*") as tar:
        for m in tar:
            if m.isfile() and m.name.endswith("/" + HEADER_MEMBER):
                f = tar.extractfile(m)
                assert f is not None
                return f.read().decode()
    return None


def header_tables(text: str) -> dict[str, list[int]]:
    """name -> values of every GGML_TABLE_BEGIN ... GGML_TABLE_END() table of a numeric size."""
    out = {}
    for _type, name, size, body in _TABLE.findall(text):
        vals = [int(v, 0) for v in re.findall(r"-?0x[0-9a-fA-F]+|-?\d+", body)]
        if size.isdigit() and len(vals) != int(size):
            raise ValueError(f"{name}: {len(vals)} values, header says {size}")
        out[name] = vals
    return out


def render(tables: dict[str, list[int]]) -> str:
    lines = ['"""The codebooks of the IQ2 / IQ3 quant types, as ggml-common.h defines them (written by',
             "tools/gen_grids.py; tests/test_grids.py checks them against the header and a hash).",
             "",
             "A grid entry packs 8 (u64: IQ2) or 4 (u32: IQ3) unsigned magnitudes, one byte each, first",
             "element in the low byte; KSIGNS_IQ2XS[i] is i (7 sign bits) with bit 7 = the parity of i;",
             "KMASK_IQ2XS[j] = 1 << j. `*_I8`: each grid as i8[n, 8 or 4], the bytes in element order.",
             '"""',
             "from __future__ import annotations",
             "",
             "import numpy as np",
             "",
             "# fmt: off"]
    for hname, pname, bits, per in TABLES:
        vals = tables[hname]
        width = bits // 4
        fmt = (lambda v: f"0x{v:0{width}x}") if bits > 8 else str
        lines.append(f"{pname} = np.array([")
        for i in range(0, len(vals), per):
            lines.append("    " + ", ".join(fmt(v) for v in vals[i:i + per]) + ",")
        lines.append(f"], dtype=np.uint{bits})")
    lines += ["# fmt: on",
              "",
              "",
              "def _bytes(grid: np.ndarray) -> np.ndarray:",
              "    # u64 / u32 entries -> i8[n, bytes per entry], the low byte first (values < 128)",
              "    return grid.astype(grid.dtype.newbyteorder(\"<\")).view(np.int8).reshape(len(grid), -1)",
              "",
              "",
              "IQ2XXS_GRID_I8, IQ2XS_GRID_I8 = _bytes(IQ2XXS_GRID), _bytes(IQ2XS_GRID)",
              "IQ2S_GRID_I8 = _bytes(IQ2S_GRID)",
              "IQ3XXS_GRID_I8, IQ3S_GRID_I8 = _bytes(IQ3XXS_GRID), _bytes(IQ3S_GRID)",
              ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--header", help="ggml-common.h (default: from the sdist in the fixture cache)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    text = header_text(a.header)
    if text is None:
        ap.error(f"no header: pass --header, or put {SDIST} in {cache_dir()} (tools/fetch_vocab.py)")
    a.out.write_text(render(header_tables(text)))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
