"""The KV cache: one slab per layer for K and one for V, each F16 (llama.cpp's default), Q8_0 or Q4_0
(llama.cpp's --cache-type-k / --cache-type-v), charged to the budget as the context fills.

Growth on demand: the slabs are reserved for n_ctx positions (np.zeros: pages the kernel maps only
when first written), and the budget is charged in chunks of CHUNK positions as positions are
written, never for positions not yet reached. A chunk the budget cannot take raises KVBudgetExceeded
naming the position reached; the books stay as they were (the charge that failed is not kept), and
an eval that fails later gives back what it had reserved (Engine.eval). Positions forgotten by a
reset keep their charge (their pages stay mapped) until close.
"""
from __future__ import annotations

import numpy as np

from ..errors import BudgetExceeded, ContextLengthExceeded, KVBudgetExceeded
from ..kernels.kvquant import store_rows
from .budget import MemoryBudget
from .kv_types import CHUNK, kv_type, row_bytes


class KVCache:
    """k[il]: [n_ctx, n_head_kv, row] of f16 bits (u16, row = hd_k) or quantized blocks (u8, row = the
    row's bytes); v[il] likewise. `layer(il)` gives a layer's pair; ops.attention reads the type from
    the dtype and row size."""

    def __init__(self, budget: MemoryBudget, n_layer: int, n_ctx: int, n_head_kv: int, hd_k: int, hd_v: int,
                 first_layer: int = 0, type_k: str | int = "f16", type_v: str | int = "f16", chunk: int = CHUNK):
        self.type_k, self.type_v = kv_type(type_k), kv_type(type_v)
        rbk, rbv = row_bytes(self.type_k, hd_k), row_bytes(self.type_v, hd_v)
        self.n_ctx, self.first, self.chunk, self.budget = n_ctx, first_layer, max(1, chunk), budget
        self.bytes_per_pos = n_layer * n_head_kv * (rbk + rbv)
        self.k = self._slab(n_layer, n_ctx, n_head_kv, self.type_k, rbk)
        self.v = self._slab(n_layer, n_ctx, n_head_kv, self.type_v, rbv)
        self.charge = budget.charge("kv cache", 0)
        self.capacity = 0          # positions charged so far
        self.n_past = 0            # positions 0..n_past-1 hold valid entries

    @staticmethod
    def _slab(n_layer, n_ctx, n_head_kv, kind, rb) -> np.ndarray:
        if kind == "f16":
            return np.zeros((n_layer, n_ctx, n_head_kv, rb // 2), np.uint16)
        return np.zeros((n_layer, n_ctx, n_head_kv, rb), np.uint8)

    @property
    def nbytes(self) -> int:
        """Bytes charged now (whole chunks of positions)."""
        return self.charge.nbytes

    @property
    def full_bytes(self) -> int:
        """Bytes of the cache at n_ctx positions."""
        return self.n_ctx * self.bytes_per_pos

    def check_room(self, n_new: int) -> None:
        """Refuse n_new more positions past the context; grow the charge to hold them (KVBudgetExceeded
        naming the position reached if the budget cannot)."""
        if self.n_past + n_new > self.n_ctx:
            raise ContextLengthExceeded(
                f"{self.n_past} cached + {n_new} new tokens exceed the context of {self.n_ctx}; raise --ctx")
        self.reserve(self.n_past + n_new)

    def reserve(self, positions: int) -> None:
        """Charge the budget for the first `positions` positions (rounded up to whole chunks, at most n_ctx)."""
        if positions <= self.capacity:
            return
        cap = min(self.n_ctx, -(-positions // self.chunk) * self.chunk)
        want = cap * self.bytes_per_pos
        try:
            self.charge.settle(want)
        except BudgetExceeded as e:
            raise KVBudgetExceeded(self.n_past, positions, want - self.charge.nbytes, e.current, e.budget) from None
        self.capacity = cap

    def shrink(self, positions: int) -> None:
        """Give back whole chunks past `positions` (never below the positions held): what an eval that
        failed had reserved."""
        cap = min(self.capacity, max(-(-max(positions, self.n_past) // self.chunk) * self.chunk, 0))
        if cap < self.capacity:
            self.charge.settle(min(cap, self.n_ctx) * self.bytes_per_pos)
            self.capacity = cap

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write f32 keys/values for positions pos0.. (rounded to the cache types, as llama.cpp's cache)."""
        n, i = k.shape[0], il - self.first
        if pos0 + n > self.capacity:                 # every eval reserves first (check_room)
            self.reserve(pos0 + n)
        store_rows(self.k[i, pos0:pos0 + n], k, self.type_k, True)
        store_rows(self.v[i, pos0:pos0 + n], v, self.type_v, False)

    def layer(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) slabs of model layer il."""
        return self.k[il - self.first], self.v[il - self.first]

    def export(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of positions 0..n-1 as the slabs hold them: k [layers, n, n_head_kv, row_k], v likewise."""
        return self.k[:, :n].copy(), self.v[:, :n].copy()

    def restore(self, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions 0..n-1 from export's arrays (shapes checked by the caller), charged first
        (KVBudgetExceeded if the budget cannot hold them); n_past = n."""
        self.n_past = 0
        self.reserve(n)
        self.k[:, :n] = k
        self.v[:, :n] = v
        self.n_past = n

    def close(self) -> None:
        self.charge.release()
