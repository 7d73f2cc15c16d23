"""A layer's picked experts as the forward pass sees them (`Weights.experts` yields an `Experts`): the
layer's resident 3-D tensors, or the expert cache's slots (stream.experts.ExpertCache), read ahead for the
next layer where the router's guess allows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..models.weights import EXPERT_TENSORS, LayerExperts
from ..profiling import ExpertRecord


@dataclass(frozen=True, slots=True)
class Handed:
    """Experts of one layer handed out together (take_ready, take_arrived): their keys in compute order, where
    their gate, up and down rows lie in the cache's `pool` (byte offsets i64[3, c], each row contiguous), and
    whether each lies repacked (its layer's groups, ExpertCache.reps) or in file order."""
    keys: list[tuple[int, int]]
    offs: np.ndarray
    packed: np.ndarray      # bool[c]

    def __len__(self) -> int:
        return len(self.keys)

    def by_layout(self) -> Iterator[tuple[bool, list[int], np.ndarray]]:
        """(repacked or not, expert ids, offs i64[3, m]) for each layout present, the repacked first."""
        n = int(np.count_nonzero(self.packed))
        if n in (0, len(self.keys)):                        # (one layout: the usual turn)
            if self.keys:
                yield bool(n), [e for _, e in self.keys], self.offs
            return
        for flag in (True, False):
            m = self.packed == flag
            yield flag, [k[1] for k, x in zip(self.keys, m.tolist()) if x], np.compress(m, self.offs, axis=1)


NONE_HANDED = Handed([], np.zeros((3, 0), np.int64), np.zeros(0, bool))


class Experts:
    """One layer's picked experts for the forward pass (Weights.experts): iterate for (e, (gate, up,
    down)); `predict` names the next layer's likely experts so the cache can read them meanwhile."""

    def __init__(self, w: "Weights", il: int, order: list[tuple[int, int]], rec: ExpertRecord | None,
                 resident: LayerExperts | None = None):
        self.w, self.il, self.order, self.rec, self.resident = w, il, order, rec, resident
        self._ready: list[tuple[int, int]] = []             # keys take_ready gave, until release

    def __iter__(self):
        for key in self.order:
            e = key[1]
            yield e, (self.resident[e] if self.resident is not None else self.w.expert_cache.take(key, self.rec))

    @property
    def pool(self) -> np.ndarray | None:
        """The expert cache's buffer of every slot (take_ready's offsets are into it); None when resident."""
        return None if self.w.expert_cache is None else self.w.expert_cache.pool

    @property
    def tensors(self) -> list:
        """The layer's expert tensors (gate, up, down): the file's TensorInfo (cached), else the layer's."""
        c = self.w.expert_cache
        return c.tensors[self.il] if c is not None else [self.resident.layer.tensors[s] for s in EXPERT_TENSORS]

    @property
    def reps(self) -> tuple[int, int, int]:
        """The repacked groups (gate, up, down) of the layer's experts once repacked (0: file order)."""
        c = self.w.expert_cache
        return c.reps[self.il] if c is not None else tuple(t.repacked for t in self.tensors)

    def take_ready(self, ids=None) -> Handed:
        """The picked experts (of ids, if given) already in the cache, with where they lie in `pool` and their
        layouts (a Handed); iterating then yields only the others. Call `release` once they are
        computed. None handed when resident."""
        c = self.w.expert_cache
        return NONE_HANDED if c is None else self._took(c.take_ready(self._pending(ids), self.rec))

    def take_arrived(self, ids=None) -> Handed:
        """As take_ready, for the next of the picked experts (of ids) not yet taken, waiting for its read,
        and every other whose read has finished meanwhile; none handed when none is left (or see
        ExpertCache.take_arrived). Call `release` before the next."""
        c = self.w.expert_cache
        return NONE_HANDED if c is None else self._took(c.take_arrived(self._pending(ids), self.rec))

    def _pending(self, ids) -> list[tuple[int, int]]:
        return self.order if ids is None else [k for k in self.order if k[1] in ids]

    def _took(self, got: Handed) -> Handed:
        self._ready = got.keys
        if got.keys:
            taken = set(got.keys)
            self.order = [k for k in self.order if k not in taken]
        return got

    def release(self) -> None:
        """The experts take_ready or take_arrived gave are computed: their slots may be reused."""
        keys, self._ready = self._ready, []
        if keys:
            self.w.expert_cache.release(keys, self.rec)

    def wants_prediction(self) -> bool:
        """Whether to guess the next layer's experts now (ExpertCache.wants_guess, which counts the turn: ask
        once a turn)."""
        c = self.w.expert_cache
        return c is not None and self.il + 1 in self.w.predictors and c.wants_guess()

    def predict(self, ids) -> None:
        """Read ahead the next layer's experts ids (best first), where the budget leaves slots."""
        if self.w.expert_cache is not None:
            self.w.expert_cache.predict(self.il + 1, ids, self.rec)
