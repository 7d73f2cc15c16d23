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
