"""Distinct names for the kernels a factory makes (one closure per type or variant).

Numba names a compiled function's symbol after its __qualname__ and a per-process counter, so two
closures of one factory compiled in different processes can get the same symbol; loaded together
from the on-disk cache, a caller linked against one then runs the other (seen: Q6_K's unpacker
running Q2_K's scale decoder, after another process compiled them in another order). Naming each
closure after what it was made for makes the symbols distinct whatever the counters.
"""
from __future__ import annotations


def made_for(dispatcher, *tags):
    """The numba dispatcher of a factory-made closure, its function renamed <qualname>__<tags>
    (before its first compilation, which names the symbols); returns the dispatcher."""
    f = dispatcher.py_func
    f.__qualname__ = f.__qualname__ + "__" + "_".join(str(getattr(t, "name", t)) for t in tags)
    return dispatcher


# ---- stable cache keys -------------------------------------------------------------------------
# numba keys a cached closure by a pickle of its cells; a cell holding another dispatcher (or an
# intrinsic) pickles with that object's per-process uuid, so a factory-made kernel missed the disk
# cache in every new process and was compiled again (~40 s for gemma's batch paths). A compiled
# object in a ramforge closure is keyed instead by what defines it: module, name, bytecode and its
# own cells. The cache directory is already named after a hash of every kernel source (paths.py).

def _stable(x, depth: int = 0):
    if isinstance(x, (tuple, list)) and depth <= 16:
        return (type(x).__name__, tuple(_stable(y, depth + 1) for y in x))
    f = getattr(x, "py_func", None) or getattr(x, "_defn", None)
    if f is None or not hasattr(f, "__code__") or depth > 16:
        return x
    cells = tuple(_stable(c.cell_contents, depth + 1) for c in (f.__closure__ or ()))
    return ("compiled", type(x).__name__, f.__module__, f.__qualname__, f.__code__.co_code, cells)


def stable_cache_keys() -> None:
    """Key ramforge's cached closures by their cells' definitions (once per process)."""
    import hashlib

    from numba.core import caching, serialize

    original = caching.Cache._index_key
    if getattr(original, "ramforge", False):
        return

    def _index_key(self, sig, codegen):
        f = self._py_func
        if f.__closure__ is None or not f.__module__.startswith("ramforge."):
            return original(self, sig, codegen)
        cells = serialize.dumps(tuple(_stable(c.cell_contents) for c in f.__closure__))
        return (sig, codegen.magic_tuple(), (hashlib.sha256(f.__code__.co_code).hexdigest(),
                                             hashlib.sha256(cells).hexdigest()))

    _index_key.ramforge = True
    caching.Cache._index_key = _index_key
