"""The expert cache: a mixture of experts' experts as their own unit of residency.

When a plan streams experts apart from their layers (plan.experts_apart), an expert (its rows of
ffn_gate_exps, ffn_up_exps and ffn_down_exps: three contiguous byte ranges, each read aligned) is
read alone into one of `n_slots` budget-charged buffers when the router first picks it; the least
recently used expert gives up its slot. An expert's tensors are valid until the next `get`, so the
forward pass holds one expert at a time.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from ..errors import InternalError
from ..gguf.reader import GGUFFile
from ..models.weights import EXPERT_TENSORS, QTensor, gguf_name
from ..plan import Span, expert_span
from .io import ModelFile, aligned_empty


class ExpertCache:
    """Experts (layer, id) in n_slots buffers of slot_bytes, least recently used evicted first."""

    def __init__(self, f: GGUFFile, file: ModelFile, layers: range, n_slots: int, slot_bytes: int):
        if n_slots < 1:
            raise InternalError("the expert cache needs at least one slot")
        self.file = file
        self.tensors = {il: [f.tensors[gguf_name(s, il)] for s in EXPERT_TENSORS] for il in layers}
        self.buffers = [aligned_empty(slot_bytes) for _ in range(n_slots)]
        self.slot_bytes = slot_bytes
        self._slot: OrderedDict[tuple[int, int], int] = OrderedDict()   # (layer, expert) -> slot, LRU first
        self._span: dict[int, Span] = {}                                 # slot -> the read plan it holds
        self._free = list(range(n_slots - 1, -1, -1))
        self.hits = self.misses = self.bytes_read = 0
        self.read_s = 0.0

    @property
    def n_slots(self) -> int:
        return len(self.buffers)

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._slot

    def get(self, il: int, e: int) -> tuple[QTensor, QTensor, QTensor]:
        """Expert e of layer il: (gate, up, down), 2-D QTensors over its slot, read if not cached."""
        key = (il, int(e))
        if il not in self.tensors:
            raise InternalError(f"layer {il} has no experts in this cache")
        slot = self._slot.get(key)
        if slot is None:
            slot = self._read(key)
            self.misses += 1
        else:
            self._slot.move_to_end(key)
            self.hits += 1
        buf, span = self.buffers[slot], self._span[slot]
        out = []
        for t in self.tensors[il]:
            n_in, n_out, _ = t.dims
            at = span.offsets[t.name]
            out.append(QTensor(f"{t.name}[{e}]", t.ggml_type, (n_in, n_out), buf[at:at + t.nbytes // t.dims[2]]))
        return tuple(out)

    def _read(self, key: tuple[int, int]) -> int:
        il, e = key
        if not 0 <= e < self.tensors[il][0].dims[2]:
            raise InternalError(f"layer {il}: expert {e} is out of range for {self.tensors[il][0].dims[2]} experts")
        span = expert_span(self.tensors[il], e)
        if span.nbytes > self.slot_bytes:
            raise InternalError(f"expert ({il}, {e}) needs {span.nbytes:,} B, above the slot of {self.slot_bytes:,}")
        if self._free:
            slot = self._free.pop()
        else:
            _, slot = self._slot.popitem(last=False)       # the least recently used
        buf = self.buffers[slot]
        t0 = time.perf_counter()
        try:
            for off, n, at in span.segments:              # aligned, as a layer's
                self.bytes_read += self.file.read_into(off, buf[at:at + n])
                self.file.drop_cache(off, n)
        except BaseException:
            self._free.append(slot)
            raise
        self.read_s += time.perf_counter() - t0
        self._slot[key] = slot
        self._span[slot] = span
        return slot

    def stats(self) -> dict:
        n = self.hits + self.misses
        return {"slots": self.n_slots, "slot_bytes": self.slot_bytes, "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hits / n if n else 0.0, "bytes_read": self.bytes_read, "read_s": self.read_s}


class CachedExperts:
    """E[e] -> (gate, up, down) of one layer, served by an ExpertCache."""

    def __init__(self, cache: ExpertCache, il: int):
        self.cache, self.il = cache, il

    def __getitem__(self, e) -> tuple[QTensor, QTensor, QTensor]:
        return self.cache.get(self.il, int(e))

