"""Process-wide settings: numba's thread count."""
from __future__ import annotations

import os

import psutil

from .errors import InvalidArgument


def default_threads() -> int:
    """RAMFORGE_THREADS, else the number of physical cores (as llama.cpp's default)."""
    env = os.environ.get("RAMFORGE_THREADS")
    if env:
        try:
            return int(env)
        except ValueError:
            raise InvalidArgument(f"RAMFORGE_THREADS={env!r} is not an integer") from None
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def set_threads(n: int | None = None) -> int:
    """Set numba's kernel threads to n (None: default_threads()); returns the count in use."""
    import numba

    n = default_threads() if n is None else n
    top = numba.config.NUMBA_NUM_THREADS
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
        raise InvalidArgument(f"threads = {n!r}: expected an integer from 1 to {top} (NUMBA_NUM_THREADS)")
    numba.set_num_threads(n)
    return n
