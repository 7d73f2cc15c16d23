"""ramforge: run GGUF language models larger than the RAM you allow.

Numba compiles the kernels on first use and caches them on disk in a directory named after a hash
of the kernels' sources, code switches and versions (ramforge.paths), under $NUMBA_CACHE_DIR or
<ramforge cache>/numba, so that a changed kernel helper is never served stale.
"""
from __future__ import annotations

from ._version import __version__
from .paths import setup_kernel_cache as _setup_kernel_cache

_setup_kernel_cache()


def __getattr__(name):
    """`ramforge.Model` and friends, imported on first use so `import ramforge` stays light."""
    if name in ("Model", "Response"):
        from . import api

        return getattr(api, name)
    if name in ("MemoryBudget", "parse_memory_size"):
        from . import memory

        return getattr(memory, name)
    raise AttributeError(f"module 'ramforge' has no attribute {name!r}")


__all__ = ["Model", "Response", "MemoryBudget", "parse_memory_size", "__version__"]
