"""The batch a computation belongs to, as llama.cpp would see it: a leaf the matmuls and attention read.

llama.cpp picks its arithmetic by batch size (vec_dot for one token, tinyBLAS, its tiled K-quant
matmul, repacked gemm for whole groups of 4), so a prompt's tail after a reused cached prefix,
computed as rows offset.. of its ubatch, rounds exactly as the whole prompt computed afresh.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

_VIEW = threading.local()


@contextmanager
def batch_view(n_tok: int, offset: int):
    """Within it, this thread's matmuls and attention compute their tokens as rows offset.. of a batch
    of n_tok (see the module docstring)."""
    outer = getattr(_VIEW, "v", None)
    _VIEW.v = (n_tok, offset)
    try:
        yield
    finally:
        _VIEW.v = outer


def current_view() -> tuple[int, int] | None:
    """(n_tok, offset) of the innermost batch_view of this thread, or None."""
    return getattr(_VIEW, "v", None)
