"""The batch a computation belongs to, as llama.cpp would see it: an argument the matmuls and attention take.

llama.cpp picks its arithmetic by batch size (vec_dot for one token, tinyBLAS, its tiled K-quant
matmul, repacked gemm for whole groups of 4), so a prompt's tail after a reused cached prefix,
computed as rows offset.. of its ubatch, rounds exactly as the whole prompt computed afresh. The
engine makes the Batch of each pass and hands it down (forward(..., batch=) -> matmul(..., batch=),
attention(..., batch=)); None means the rows in hand are a batch of their own.
"""
from __future__ import annotations

from typing import NamedTuple


class Batch(NamedTuple):
    """Rows offset.. of a llama.cpp batch (ubatch) of n_tok tokens: they get that batch's arithmetic."""

    n_tok: int          # tokens in the batch llama.cpp computes
    offset: int         # where the rows in hand start in it

    def at(self, row: int) -> Batch:
        """The batch of the rows from row `row` of those in hand on."""
        return Batch(self.n_tok, self.offset + row)


def batch_size(batch: Batch | None, n_rows: int) -> int:
    """The size of the batch n_rows rows belong to (their own count where batch is None)."""
    return batch.n_tok if batch is not None else n_rows
