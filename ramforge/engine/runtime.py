"""Numba's thread settings: the kernel thread count, and dynamic scheduling of parallel loops.

numba keeps both per calling thread (a server's worker thread starts from numba's defaults), so
the engine applies them (`bind`) in the thread that runs a forward pass.

Dynamic scheduling (numba's parallel chunk size 1): a parallel loop's iterations are handed out one
at a time, so a thread whose core is busy with another process does less of the work instead of
holding up the others at the loop's end (numba's default splits the loop into one static share per
thread); and a loop of one iteration (a one-token op) runs on the calling thread alone.
"""
from __future__ import annotations

import os
import threading

import psutil

from .. import flags
from ..errors import InvalidArgument


def default_threads() -> int:
    """RAMFORGE_THREADS, else the number of physical cores (as llama.cpp's default), at most the threads
    numba was started with ($NUMBA_NUM_THREADS): a default never exceeds what can run."""
    import numba

    n = flags.THREADS.get()
    if n is not None:
        return n
    return min(psutil.cpu_count(logical=False) or os.cpu_count() or 1, numba.config.NUMBA_NUM_THREADS)


def set_threads(n: int | None = None) -> int:
    """Set numba's kernel threads to n (None: default_threads()); returns the count in use."""
    import numba

    n = default_threads() if n is None else n
    top = numba.config.NUMBA_NUM_THREADS
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= top:
        raise InvalidArgument(f"threads = {n!r}: expected an integer from 1 to {top} (NUMBA_NUM_THREADS)")
    numba.set_num_threads(n)
    numba.set_parallel_chunksize(1)
    _bound.n = n
    return n


_bound = threading.local()          # .n: the thread count this thread's numba settings were made for


def bind(n: int) -> None:
    """Apply set_threads(n) in the calling thread, unless already done there (cheap to repeat)."""
    if getattr(_bound, "n", None) != n:
        set_threads(n)
