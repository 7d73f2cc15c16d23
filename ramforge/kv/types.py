"""KV cache types: names and ggml type ids, positions' bytes and the spill layout (row sizes are kernels.kvquant's)."""
from __future__ import annotations

import numpy as np

import math
from typing import NamedTuple

from ..errors import KVTypeError
from ..flags import DIRECT_ALIGN as SPILL_ALIGN  # O_DIRECT offset, length and buffer alignment
from ..flags import KV_PAD as CHUNK  # positions the cache is charged for at a time (llama.cpp's 256-cell pad)
from ..kernels.kvquant import KV_TYPES, QK, row_bytes  # noqa: F401  (the cache rows' format is the kernels')

KV_TYPE_NAMES = {int(t): k for k, t in KV_TYPES.items()}    # ggml type id -> name


def kv_type(value) -> str:
    """A KV cache type from its name ("f16", "q8_0", "q4_0"; any case) or ggml type id (1, 8, 2, as
    llama-cpp-python's type_k / type_v take); InvalidArgument for anything else."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in KV_TYPE_NAMES:
            return KV_TYPE_NAMES[int(value)]
    elif isinstance(value, str):
        name = value.strip().lower()
        if name in KV_TYPES:
            return name
        if name.isdigit() and int(name) in KV_TYPE_NAMES:
            return KV_TYPE_NAMES[int(name)]
    raise KVTypeError(f"unknown KV cache type {value!r}: one of {', '.join(KV_TYPES)} "
                          f"(or their ggml type ids {', '.join(str(int(t)) for t in KV_TYPES.values())})")


def bytes_per_position(n_layer: int, n_head_kv: int, hd_k: int, hd_v: int, type_k: str = "f16",
                       type_v: str = "f16") -> int:
    """Cache bytes of one position over n_layer layers (K and V rows of every KV head)."""
    return n_layer * n_head_kv * (row_bytes(kv_type(type_k), hd_k) + row_bytes(kv_type(type_v), hd_v))


SPILL_BUFFERS = 2             # a spilled cache's read buffers: one layer in compute, the next one read meanwhile


class SpillLayout(NamedTuple):
    """A spilled cache's shapes (memory.kv_spill). One layer's spill file: K rows of positions 0..n_ctx-1
    at [0, kb), V rows at [kb, kb + vb); a read buffer has the same layout, so file offset = buffer offset.
    Positions reach the file in groups of `group`, whose K and V rows are whole 4096-byte blocks; the
    `tail` most recent positions (a multiple of group) stay in RAM, a ring per layer."""

    kpos: int                 # bytes of one position's K rows in one layer (n_head_kv rows)
    vpos: int
    group: int
    tail: int
    kb: int                   # the K region, aligned
    vb: int

    @property
    def buffer_bytes(self) -> int:
        return self.kb + self.vb

    def charged(self, n_layer: int, n_buffers: int = SPILL_BUFFERS) -> int:
        """What the budget holds for a spilled cache: the tails and the read buffers."""
        return n_layer * self.tail * (self.kpos + self.vpos) + n_buffers * self.buffer_bytes

    def read_bytes(self, pos0: int, n: int, spilled: int, window: int) -> int:
        """Bytes one layer reads for a pass of n tokens at pos0 with `spilled` positions in its file."""
        lo = 0 if window <= 0 else max(0, pos0 - window + 1)
        if lo >= spilled:
            return 0
        return sum(_up(spilled * r) - lo * r // SPILL_ALIGN * SPILL_ALIGN for r in (self.kpos, self.vpos))

    def spilled_at(self, pos0: int, n: int, spilled: int = 0) -> int:
        """The positions in the files once a pass of n tokens at pos0 has room in the tail."""
        over = pos0 + n - spilled - self.tail
        return spilled + (-(-over // self.group) * self.group if over > 0 else 0)


def _up(n: int) -> int:
    return -(-n // SPILL_ALIGN) * SPILL_ALIGN


def spill_layout(n_ctx: int, n_head_kv: int, hd_k: int, hd_v: int, type_k: str, type_v: str,
                 batch: int, tail: int | None = None) -> SpillLayout:
    """The layout of a spilled cache for chunks of up to `batch` tokens (see SpillLayout); tail: the
    positions a layer keeps in RAM, if more than the least (whole groups, at most the context's)."""
    kpos = n_head_kv * row_bytes(kv_type(type_k), hd_k)
    vpos = n_head_kv * row_bytes(kv_type(type_v), hd_v)
    g = math.lcm(SPILL_ALIGN // math.gcd(SPILL_ALIGN, kpos), SPILL_ALIGN // math.gcd(SPILL_ALIGN, vpos))
    least = -(-(max(CHUNK, g) + batch) // g) * g    # room for a chunk beside a group not yet written
    tail = least if tail is None else max(least, min(tail, n_ctx + g - 1) // g * g)
    return SpillLayout(kpos, vpos, g, tail, _up(n_ctx * kpos), _up(n_ctx * vpos))
