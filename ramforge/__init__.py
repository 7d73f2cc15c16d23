"""ramforge: run GGUF language models larger than the RAM you allow.

Numba compiles the kernels on first use and caches them on disk in a directory named after a hash
of the kernels' sources, code switches and versions (ramforge.paths), under $NUMBA_CACHE_DIR or
<ramforge cache>/numba, so that a changed kernel helper is never served stale.
"""
from __future__ import annotations

import os as _os

from ._version import __version__
from .paths import setup_kernel_cache as _setup_kernel_cache

_setup_kernel_cache()

# GNU OpenMP (numba's threading layer) spins 300,000 rounds at each barrier before it sleeps: where
# another process holds a core, the spinning thread loses its turn and every parallel loop waits a
# scheduler slice for it (decode 17x slower beside one busy process on 2 cores). 10,000 rounds cost
# nothing on a quiet machine and keep a busy one at ~0.4x (set before libgomp loads; a user's
# GOMP_SPINCOUNT or OMP_WAIT_POLICY wins).
if "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def __getattr__(name):
    """`ramforge.Model` and friends, imported on first use so `import ramforge` stays light."""
    if name in ("Model", "Response"):
        from .generation import api

        return getattr(api, name)
    if name in ("Llama", "LlamaState"):
        from .generation import llama

        return getattr(llama, name)
    if name in ("PromptLookup", "DraftModel"):
        from .engine import speculative

        return getattr(speculative, name)
    if name in ("PromptCache", "State"):
        from .generation import session

        return getattr(session, name)
    if name in ("MemoryBudget", "parse_memory_size"):
        from . import memory

        return getattr(memory, name)
    raise AttributeError(f"module 'ramforge' has no attribute {name!r}")


__all__ = ["Model", "Response", "Llama", "LlamaState", "PromptLookup", "DraftModel", "MemoryBudget", "parse_memory_size", "__version__"]
