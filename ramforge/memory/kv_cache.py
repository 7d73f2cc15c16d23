"""The KV cache: F16 (as llama.cpp's default), one slab per layer, charged to the budget."""
from __future__ import annotations

import numpy as np

from ..errors import ContextLengthExceeded
from .budget import MemoryBudget


class KVCache:
    """k[il]: u16[n_ctx, n_head_kv, head_dim_k] and v[il]: u16[n_ctx, n_head_kv, head_dim_v] of f16 bits."""

    def __init__(self, budget: MemoryBudget, n_layer: int, n_ctx: int, n_head_kv: int, hd_k: int, hd_v: int,
                 first_layer: int = 0):
        self.n_ctx, self.first = n_ctx, first_layer
        nbytes = n_layer * n_ctx * n_head_kv * (hd_k + hd_v) * 2
        self.charge = budget.charge("kv cache", nbytes)
        try:
            self.k = np.zeros((n_layer, n_ctx, n_head_kv, hd_k), np.uint16)
            self.v = np.zeros((n_layer, n_ctx, n_head_kv, hd_v), np.uint16)
        except BaseException:
            self.charge.release()
            raise
        self.n_past = 0            # positions 0..n_past-1 hold valid entries

    def check_room(self, n_new: int) -> None:
        if self.n_past + n_new > self.n_ctx:
            raise ContextLengthExceeded(
                f"{self.n_past} cached + {n_new} new tokens exceed the context of {self.n_ctx}; raise --ctx")

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write f32 keys/values for positions pos0.. (rounded to f16, as llama.cpp's cache)."""
        n, i = k.shape[0], il - self.first
        self.k[i, pos0:pos0 + n] = k.astype(np.float16).view(np.uint16)
        self.v[i, pos0:pos0 + n] = v.astype(np.float16).view(np.uint16)

    def layer(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) slabs of model layer il."""
        return self.k[il - self.first], self.v[il - self.first]

    def export(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of positions 0..n-1: k u16[layers, n, n_head_kv, hd_k], v u16[layers, n, n_head_kv, hd_v]."""
        return self.k[:, :n].copy(), self.v[:, :n].copy()

    def restore(self, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions 0..n-1 from export's arrays (shapes checked by the caller); n_past = n."""
        self.k[:, :n] = k
        self.v[:, :n] = v
        self.n_past = n

    def close(self) -> None:
        self.charge.release()
