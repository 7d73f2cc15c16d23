"""Memory sizes as people write them: 8G, 8GiB, 8192M, 512MiB, 1.5G, 800K, 2GB, 1048576."""
from __future__ import annotations

import re

from ..errors import MemorySizeError

# Bare letters and the IEC forms are binary (8G == 8GiB == 8192M, as llama.cpp and Ollama mean it);
# KB/MB/GB/TB are decimal SI units.
_UNITS = {
    "": 1, "B": 1,
    "K": 1 << 10, "KIB": 1 << 10, "KB": 10**3,
    "M": 1 << 20, "MIB": 1 << 20, "MB": 10**6,
    "G": 1 << 30, "GIB": 1 << 30, "GB": 10**9,
    "T": 1 << 40, "TIB": 1 << 40, "TB": 10**12,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_memory_size(text: str | int) -> int:
    """Bytes in a size string. Raises MemorySizeError with the accepted forms on bad input.

    >>> parse_memory_size("1.5G"), parse_memory_size("512MiB"), parse_memory_size("2GB")
    (1610612736, 536870912, 2000000000)
    """
    if isinstance(text, bool):
        raise MemorySizeError(f"memory size {text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise MemorySizeError(f"memory size {text} is negative")
        return text
    m = _PATTERN.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise MemorySizeError(
            f"cannot parse memory size {text!r}: write a number and a unit, e.g. 8G, 8GiB, 8192M, "
            f"512MiB, 1.5G, 800K, 2GB (K/M/G/T and KiB/MiB/GiB/TiB are binary; KB/MB/GB/TB decimal)")
    return int(float(m.group(1)) * _UNITS[unit]) if "." in m.group(1) else int(m.group(1)) * _UNITS[unit]


def format_bytes(n: int | float) -> str:
    """Human-readable binary size: 1.50 GiB, 640.0 KiB, 12 B."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
