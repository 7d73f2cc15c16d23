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

from ..errors import BudgetExceeded, ContextLengthExceeded, InvalidArgument, KVBudgetExceeded
from ..kernels.kvquant import store_rows
from ..memory.budget import MemoryBudget
from .cells import Placement
from .types import CHUNK, kv_type, row_bytes


class KVBase:
    """What every KV cache answers (KVCache; memory.kv_spill.SpilledKVCache): its charge, the context
    check, and the plain path's positions (row = position, one sequence); a subclass sets charge, n_ctx,
    n_ctx_seq, n_past, bytes_per_pos, and `reserve`. Only KVCache enters the cells mode (ub, celled)."""

    ub: Placement | None = None     # the placement of the cells pass being computed (None: plain path)
    celled = False
    n_seq = 1

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
        if self.n_past + n_new > self.n_ctx_seq:
            raise ContextLengthExceeded(
                f"{self.n_past} cached + {n_new} new tokens exceed the context of {self.n_ctx_seq}; raise --ctx")
        self.reserve(self.n_past + n_new)

    def positions(self, pos0: int, n: int) -> np.ndarray:
        """i32[n]: the positions of the pass's tokens."""
        return np.arange(pos0, pos0 + n, dtype=np.int32) if self.ub is None else self.ub.pos

    def visible(self, window: int = 0):
        """kernels.attention's `cells` for the pass (None on the plain path): see cells.Placement.visible."""
        return None if self.ub is None else (*self.ub.visible(self.cell_pos, window), self.ub.single)

    def pos_max(self, s: int) -> int:
        """llama_memory_seq_pos_max: the largest position of sequence s, -1 if it has none."""
        if not self.celled:
            return self.n_past - 1 if s == 0 else -1
        return int(self.stream_pos(s).max())

    def plain_again(self) -> None:
        """Back to the plain mode where the cells are what it keeps: stream 0 holds positions 0..m-1 in
        cells 0..m-1 with its head at most m, the other streams are empty, no K-shift pending."""
        if not self.celled:
            return
        cp, m = self.stream_pos(0), self.pos_max(0) + 1
        if (self.heads[0] <= m and not self.cell_shift.any() and (self.cell_pos[self.n_ctx_seq:] < 0).all()
                and (cp[:m] == np.arange(m)).all() and (cp[m:] < 0).all()):
            self.celled = False
        self.n_past = self.pos_max(0) + 1 if self.celled else m


class KVCache(KVBase):
    """k[il]: [n_ctx, n_head_kv, row] of f16 bits (u16, row = hd_k) or quantized blocks (u8, row = the
    row's bytes); v[il] likewise. `layer(il)` gives a layer's pair; kernels.attention reads the type from
    the dtype and row size.

    Two modes. Plain (celled False): one sequence, row p = position p, positions 0..n_past-1.
    Cells (memory/cells.py, entered by `cells_on`): n_seq streams of n_ctx_seq rows, cell_pos i32[n_ctx]
    the position of each row (-1 empty), cell_shift i32[n_ctx] the pending K-shift, heads[s] the
    stream's find_slot head; `ub` the placement of the pass being computed (None on the plain path)."""

    def __init__(self, budget: MemoryBudget, n_layer: int, n_ctx: int, n_head_kv: int, hd_k: int, hd_v: int,
                 first_layer: int = 0, type_k: str | int = "f16", type_v: str | int = "f16", chunk: int = CHUNK,
                 n_seq: int = 1):
        self.type_k, self.type_v = kv_type(type_k), kv_type(type_v)
        rbk, rbv = row_bytes(self.type_k, hd_k), row_bytes(self.type_v, hd_v)
        self.n_ctx, self.first, self.chunk, self.budget = n_ctx, first_layer, max(1, chunk), budget
        self.bytes_per_pos = n_layer * n_head_kv * (rbk + rbv)
        self.k = self._slab(n_layer, n_ctx, n_head_kv, self.type_k, rbk)
        self.v = self._slab(n_layer, n_ctx, n_head_kv, self.type_v, rbv)
        self.charge = budget.charge("kv cache", 0)
        self.n_past = 0            # positions 0..n_past-1 hold valid entries (plain); sequence 0's pos_max + 1 (cells)
        if n_seq < 1 or n_ctx % n_seq:
            raise InvalidArgument(f"{n_seq} sequences cannot share {n_ctx} KV cells evenly")
        self.n_seq, self.n_ctx_seq = n_seq, n_ctx // n_seq
        self.caps = [0] * n_seq    # rows charged so far in each stream (sequence), whole chunks
        self.cell_pos = np.full(n_ctx, -1, np.int32)
        self.cell_shift = np.zeros(n_ctx, np.int32)
        self.cell_tok = np.zeros(n_ctx, np.int32)       # the token of each cell (the engine's bookkeeping)
        self.heads = [0] * n_seq
        self.celled = False
        self.ub: Placement | None = None

    @staticmethod
    def _slab(n_layer, n_ctx, n_head_kv, kind, rb) -> np.ndarray:
        if kind == "f16":
            return np.zeros((n_layer, n_ctx, n_head_kv, rb // 2), np.uint16)
        return np.zeros((n_layer, n_ctx, n_head_kv, rb), np.uint8)

    @property
    def capacity(self) -> int:
        """Positions charged so far (stream 0's rows: the plain path's)."""
        return self.caps[0]

    def reserve(self, positions: int, stream: int = 0) -> None:
        """Charge the budget for the first `positions` rows of a stream (rounded up to whole chunks, at
        most n_ctx_seq); each stream (a sequence's slot) is charged for its own rows."""
        if positions <= self.caps[stream]:
            return
        cap = min(self.n_ctx_seq, -(-positions // self.chunk) * self.chunk)
        want = (sum(self.caps) - self.caps[stream] + cap) * self.bytes_per_pos
        try:
            self.charge.settle(want)
        except BudgetExceeded as e:
            raise KVBudgetExceeded(self.n_past, positions, want - self.charge.nbytes, e.current, e.budget) from None
        self.caps[stream] = cap

    def shrink(self, positions: int) -> None:
        """Give back stream 0's whole chunks past `positions` (never below the positions held): what an
        eval that failed had reserved."""
        cap = min(self.caps[0], max(-(-max(positions, self.n_past) // self.chunk) * self.chunk, 0))
        if cap < self.caps[0]:
            self.caps[0] = cap
            self.charge.settle(sum(self.caps) * self.bytes_per_pos)

    def store(self, il: int, pos0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write f32 keys/values for positions pos0.. (rounded to the cache types, as llama.cpp's cache);
        in a cells pass, for the rows of the placement."""
        n, i = k.shape[0], il - self.first
        if self.ub is not None:
            rows = self.ub.rows
            kb, vb = np.empty((n, *self.k.shape[2:]), self.k.dtype), np.empty((n, *self.v.shape[2:]), self.v.dtype)
            store_rows(kb, k, self.type_k, True)
            store_rows(vb, v, self.type_v, False)
            self.k[i, rows] = kb
            self.v[i, rows] = vb
            return
        if pos0 + n > self.capacity:                 # every eval reserves first (check_room)
            self.reserve(pos0 + n)
        store_rows(self.k[i, pos0:pos0 + n], k, self.type_k, True)
        store_rows(self.v[i, pos0:pos0 + n], v, self.type_v, False)

    def cells_on(self) -> None:
        """Enter the cells mode: the plain sequence becomes stream 0's cells 0..n_past-1, head n_past."""
        if not self.celled:
            self.cell_pos[:] = -1
            self.cell_pos[:self.n_past] = np.arange(self.n_past, dtype=np.int32)
            self.cell_shift[:] = 0
            self.heads = [0] * self.n_seq
            self.heads[0] = self.n_past
            self.celled = True

    def stream_pos(self, s: int) -> np.ndarray:
        """The cell positions of stream s (a view)."""
        return self.cell_pos[s * self.n_ctx_seq:(s + 1) * self.n_ctx_seq]

    def layer(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) slabs of model layer il."""
        return self.k[il - self.first], self.v[il - self.first]

    def export(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of positions 0..n-1 as the slabs hold them: k [layers, n, n_head_kv, row_k], v likewise.
        Sequence 0 only, and only while its cells are its positions (plain mode)."""
        self.plain_again()
        if self.celled:
            raise InvalidArgument("the cached sequence is held in shifted or shared KV cells (a context shift, "
                                  "parallel sequences): it cannot be saved as a state; reset it first")
        return self.k[:, :n].copy(), self.v[:, :n].copy()

    def restore(self, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions 0..n-1 from export's arrays (shapes checked by the caller), charged first
        (KVBudgetExceeded if the budget cannot hold them); n_past = n."""
        if self.celled and (self.cell_pos[self.n_ctx_seq:] >= 0).any():
            raise InvalidArgument("other sequences hold KV cells: a state restores into a single-sequence cache")
        self.n_past = 0
        self.celled = False
        self.reserve(n)
        self.k[:, :n] = k
        self.v[:, :n] = v
        self.n_past = n

    def close(self) -> None:
        self.charge.release()
