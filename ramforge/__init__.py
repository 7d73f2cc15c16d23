"""ramforge: run GGUF language models larger than the RAM you allow.

Numba compiles the kernels on first use and caches them on disk under $NUMBA_CACHE_DIR, which
defaults to <ramforge cache>/numba so that an installed (read-only) package caches too.
"""
from __future__ import annotations

import os as _os

from .resolve import cache_dir as _cache_dir

_os.environ.setdefault("NUMBA_CACHE_DIR", str(_cache_dir() / "numba"))

__version__ = "0.1.0"


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
