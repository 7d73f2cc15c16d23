"""KV cells as llama.cpp 0.3.36's llama_kv_cache keeps them, in the configuration llama-server runs
with an explicit `--parallel N`: kv_unified = false, one stream of cells per sequence (N streams of
n_ctx_seq = PAD(n_ctx / N, 256) cells; one stream of n_ctx cells for a single sequence).

A cell holds a position (-1: empty) and the pending K-shift of seq_add. A ubatch's tokens are
placed by find_slot (from the stream's head, holes filled, the head restarting at 0 when enough
cells before it are free); attention for a token runs over its stream's cells in cell order with
a mask, so the SIMD lane of a key is its cell index (`Placement.visible`: the visible cells of
each token, ascending). Streams sit one after another in the cache's rows (stream s: rows
s*n_ctx_seq ..), each a multiple of 256 cells, so a row's lane (row % 16, row % 64) is its cell's.

The sliding-window cache of a model with a window (llama.cpp's iswa, a second set of cells) may
reuse a cell whose key left the window where this cache finds an empty one: `find_slot` checks both
rules and refuses (NotReproduced) where they would place a token differently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextLengthExceeded, NotReproduced
from ..flags import KV_PAD as PAD  # llama.cpp pads n_ctx and n_ctx_seq to 256 cells


def pad_cells(n: int) -> int:
    return -(-n // PAD) * PAD


def kv_rows(n_ctx: int, n_seq: int) -> int:
    """The cache rows of n_seq sequences over a context of n_ctx: n_ctx for one, else n_seq streams of
    llama.cpp's n_ctx_seq = PAD(PAD(n_ctx, 256) / n_seq, 256) (llama_context, kv_unified off)."""
    return n_ctx if n_seq == 1 else n_seq * pad_cells(max(1, pad_cells(n_ctx) // n_seq))


def find_slot(pos: np.ndarray, head: int, n: int, window: int = 0) -> list[int] | None:
    """llama_kv_cache::find_slot (non-contiguous) for n tokens of the one sequence of a stream whose
    cell positions are pos (i32[size], -1 empty): the cell indices, or None if the stream is full.
    window > 0: the sliding-window cache's rule (a cell whose key is out of the window is free too)."""
    size = pos.size
    live = pos >= 0
    used = int(live.sum())
    pmax1 = int(pos.max()) + 1 if used else 0            # seq_pos_max + 1
    if head > used + 2 * n:
        head = 0
    if n > size:
        return None
    idxs, tested = [], 0
    while True:
        if head + 1 > size:
            tested += size - head
            head = 0
            continue
        idx = head
        head += 1
        tested += 1
        if pos[idx] < 0 or (window > 0 and pmax1 - pos[idx] >= window):
            idxs.append(idx)
            if len(idxs) == n:
                return idxs
        if tested >= size:
            return None


@dataclass
class Placement:
    """Where a ubatch's tokens go. rows i64[n]: cache rows (stream * n_ctx_seq + cell); pos i32[n];
    stream i32[n]; single: llama.cpp's attention matmuls for this ubatch have one column per stream
    (ggml_vec_dot_f16) rather than several (tinyBLAS)."""

    rows: np.ndarray
    pos: np.ndarray
    stream: np.ndarray
    n_ctx_seq: int
    single: bool
    _vis: dict = field(default_factory=dict)

    def part(self, a: int, b: int) -> "Placement":
        """Tokens [a, b) of the ubatch (a chunk computed as its rows)."""
        return Placement(self.rows[a:b], self.pos[a:b], self.stream[a:b], self.n_ctx_seq, self.single)

    def visible(self, cell_pos: np.ndarray, window: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(ptr i32[n+1], idx i32[...]): token t sees cache rows idx[ptr[t]:ptr[t+1]], ascending: its
        stream's non-empty cells at positions <= its own (and within the window), as llama.cpp's KQ mask."""
        got = self._vis.get(window)
        if got is None:
            S, parts, ptr = self.n_ctx_seq, [], [0]
            for p, s in zip(self.pos, self.stream):
                base = int(s) * S
                cp = cell_pos[base:base + S]
                m = (cp >= 0) & (cp <= p)
                if window > 0:
                    m &= (p - cp) < window
                parts.append(np.nonzero(m)[0].astype(np.int32) + np.int32(base))
                ptr.append(ptr[-1] + parts[-1].size)
            got = (np.asarray(ptr, np.int32), np.concatenate(parts) if parts else np.empty(0, np.int32))
            self._vis[window] = got
        return got


@dataclass
class PackedPlacement(Placement):
    """A batch of whole sequences, each from position 0, in llama.cpp's unified KV cache after a clear
    (kv_unified = true: what llama-cpp-python's embed() runs): the batch's tokens in cells 0..n-1 in
    order, all in one stream, token t seeing the cells of its own sequence at positions <= its own (and
    within the window), so a key's lane is its row in the batch. starts i64[n]: each token's sequence's
    first row."""

    starts: np.ndarray = None

    @classmethod
    def of(cls, bounds: np.ndarray, single: bool) -> "PackedPlacement":
        n = int(bounds[-1, 1])
        starts = np.repeat(bounds[:, 0], bounds[:, 1] - bounds[:, 0]).astype(np.int64)
        rows = np.arange(n, dtype=np.int64)
        return cls(rows, (rows - starts).astype(np.int32), np.zeros(n, np.int32), n, single, starts=starts)

    def part(self, a: int, b: int) -> "PackedPlacement":
        return PackedPlacement(self.rows[a:b], self.pos[a:b], self.stream[a:b], self.n_ctx_seq, self.single,
                               starts=self.starts[a:b])

    def visible(self, cell_pos: np.ndarray, window: int = 0) -> tuple[np.ndarray, np.ndarray]:
        got = self._vis.get(window)
        if got is None:
            hi = self.rows + 1
            lo = np.maximum(self.starts, hi - window) if window > 0 else self.starts
            ptr = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int32)
            idx = np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in zip(lo, hi)])
            got = self._vis[window] = (ptr, idx)
        return got


def place(kv, seqs: list[tuple[int, int]], single: bool, window: int, swa_size: int) -> Placement:
    """Place a ubatch: seqs lists (stream, n_tokens) in ubatch order, each continuing its sequence at
    seq_pos_max + 1. Finds every stream's cells first (ContextLengthExceeded if one is full), then
    writes positions and heads (llama_kv_cache::apply_ubatch)."""
    S = kv.n_ctx_seq
    found = []
    for s, n in seqs:
        cp = kv.cell_pos[s * S:(s + 1) * S]
        idxs = find_slot(cp, kv.heads[s], n)
        if idxs is None:
            raise ContextLengthExceeded(f"sequence {s}: no room for {n} more tokens in its {S} KV cells "
                                        f"({int((cp >= 0).sum())} used); remove tokens (seq_rm) or raise --ctx")
        if window > 0:
            alt = find_slot(cp, kv.heads[s], n, window)
            if alt != idxs or max(idxs) >= swa_size:
                raise NotReproduced(
                    f"sequence {s}: llama.cpp's sliding-window cache would place these {n} tokens in other cells "
                    f"(it reuses cells whose keys left the window of {window}); not reproduced")
        p0 = int(cp.max()) + 1 if (cp >= 0).any() else 0
        found.append((s, idxs, np.arange(p0, p0 + n, dtype=np.int32)))
    rows, pos, strm = [], [], []
    for s, idxs, p in found:
        r = np.asarray(idxs, np.int64) + s * S
        kv.cell_pos[r] = p
        kv.heads[s] = idxs[-1] + 1
        rows.append(r)
        pos.append(p)
        strm.append(np.full(len(idxs), s, np.int32))
    return Placement(np.concatenate(rows), np.concatenate(pos), np.concatenate(strm), S, single)
