"""How a submission of tokens is cut into forward passes: llama.cpp's ubatches, and chunks within them.

A pure function, shared by `Engine.eval` (one process) and `cluster.Pipeline` (stages on Ray), so
both compute every token with the same arithmetic (kernels.batch.Batch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..kernels.batch import Batch


@dataclass(frozen=True)
class Chunk:
    """One forward pass: tokens [start, stop) of the submission."""

    start: int
    stop: int
    view: Batch | None              # (ubatch tokens, offset of this chunk in it): computed as its rows
    rows: slice | None              # the logits rows wanted, relative to the chunk (None: no logits)
    only: slice | None              # the rows the last layer carries past attention (None: all)
    kind: str | None                # the profiler's name for the pass (None: prefill / decode by size)

    @property
    def size(self) -> int:
        return self.stop - self.start


def chunks(n_tok: int, n_past: int, batch: int, ubatch: int, *, all_logits: bool = False, aligned: bool = False,
           as_batch: bool = False, outputs_all: bool = False) -> list[Chunk]:
    """The passes of n_tok tokens appended after n_past cached ones, in chunks of at most `batch`
    (see Engine.eval for aligned, as_batch, outputs_all and all_logits)."""
    viewed = aligned or as_batch                             # chunks computed as rows of their ubatch
    U = max(batch, ubatch // batch * batch) if viewed else batch   # whole chunks per ubatch
    base = n_past if viewed else 0
    end, c0, out = base + n_tok, base, []
    while c0 < end:
        ub = c0 - c0 % U if aligned else c0 - (c0 - base) % U
        ue = min(end, ub + U)                                # ubatch [ub, ue) ...
        c1 = min(ue, c0 - (c0 - ub) % batch + batch)         # ... chunk [c0, c1) of it
        n = c1 - c0
        want = all_logits or c1 == end
        rows = slice(0, n) if all_logits else slice(n - 1, n)
        only = (None if outputs_all or rows == slice(0, n) else rows) if want else slice(n, n)
        out.append(Chunk(c0 - base, c1 - base, Batch(ue - ub, c0 - ub) if viewed else None, rows if want else None,
                         only, "verify" if as_batch and n_tok > 1 else None))
        c0 = c1
    return out
