"""Routing traces (`--trace-routing FILE`): every forward pass's per-layer expert selection, as the
engine routed it, saved for offline cache studies (tools/replay_routing.py replays a trace against
cache policies and layouts without running the model).

models.moe calls `record(m, il, sel)` right after routing; it costs nothing unless a trace is
attached to the engine (`attach`). A pass is a call of the forward pass over a chunk of tokens: one
token per decode step, a prompt's chunk in prefill. A new pass begins whenever a layer index does
not grow. On a pass's last layer only its output rows run the FFN (llama.cpp's inp_out_ids), so a
prefill pass records fewer rows there.

The file (numpy .npz, compressed), one row per (pass, layer, token row):
    ids     i16[R, k]  the k selected experts, in routing order (most probable first)
    layer   i16[R]     the layer index
    pass_   i32[R]     the pass, from 0
    row     i32[R]     the row within the pass at that layer
    n_expert, n_layer, k: scalars; model: the model's path
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument


@dataclass
class RoutingTrace:
    """The selections recorded so far; `save` writes them to path."""

    path: Path
    n_layer: int
    n_expert: int
    k: int
    model: str = ""
    passes: int = 0
    _last_layer: int | None = None
    _chunks: list = field(default_factory=list)        # (pass, layer, i16[n, k])

    def add(self, il: int, sel: np.ndarray) -> None:
        if self._last_layer is None or il <= self._last_layer:
            self.passes += 1
        self._last_layer = il
        self._chunks.append((self.passes - 1, il, np.array(sel, dtype=np.int16)))

    def arrays(self) -> dict:
        n = [len(s) for _, _, s in self._chunks]
        ids = np.concatenate([s for _, _, s in self._chunks]) if self._chunks else np.zeros((0, self.k), np.int16)
        return {"ids": ids,
                "layer": np.repeat(np.array([il for _, il, _ in self._chunks], np.int16), n),
                "pass_": np.repeat(np.array([p for p, _, _ in self._chunks], np.int32), n),
                "row": np.concatenate([np.arange(c, dtype=np.int32) for c in n]) if n else np.zeros(0, np.int32),
                "n_expert": np.int32(self.n_expert), "n_layer": np.int32(self.n_layer), "k": np.int32(self.k),
                "model": np.str_(self.model)}

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as f:               # a path without .npz keeps its name
            np.savez_compressed(f, **self.arrays())
        return self.path


def attach(engine, path) -> RoutingTrace:
    """Record engine's routing from now on; the file is written when the engine closes."""
    hp = engine.hp
    if not hp.n_expert:
        raise InvalidArgument(f"--trace-routing: {engine.path} has no experts ({hp.arch}, a dense model)")
    tr = RoutingTrace(Path(path), hp.n_layer, hp.n_expert, hp.n_expert_used, str(engine.path))
    engine.routing_trace = tr
    engine.closing.append(tr.save)
    return tr


def record(m, il: int, sel: np.ndarray) -> None:
    """The hook models.moe calls after routing: sel i32[n, k] of layer il, kept if m has a trace."""
    tr = getattr(m, "routing_trace", None)
    if tr is not None:
        tr.add(il, sel)


@dataclass(frozen=True)
class Trace:
    """A trace file's contents."""

    ids: np.ndarray
    layer: np.ndarray
    pass_: np.ndarray
    row: np.ndarray
    n_expert: int
    n_layer: int
    k: int
    model: str

    @classmethod
    def load(cls, path) -> "Trace":
        try:
            with np.load(path) as z:
                return cls(z["ids"], z["layer"], z["pass_"], z["row"], int(z["n_expert"]), int(z["n_layer"]),
                           int(z["k"]), str(z["model"]))
        except (OSError, KeyError, ValueError) as ex:
            raise InvalidArgument(f"{path}: not a routing trace ({ex})") from None

    def steps(self) -> list["Step"]:
        """(pass, layer) in the order the engine ran them, each with its distinct experts."""
        out = []
        if not len(self.layer):
            return out
        key = self.pass_.astype(np.int64) * (self.n_layer + 1) + self.layer
        cut = np.flatnonzero(np.diff(key)) + 1
        for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(key)]):
            sel = self.ids[lo:hi]
            out.append(Step(int(self.pass_[lo]), int(self.layer[lo]), hi - lo,
                            tuple(int(e) for e in dict.fromkeys(sel.ravel().tolist()))))
        return out

    def decode_rows(self) -> dict[int, np.ndarray]:
        """layer -> i16[T, k]: the selections of the one-row passes (decode steps), in order."""
        n = int(self.pass_.max(initial=-1)) + 1
        rows, layers = np.bincount(self.pass_, minlength=n), np.bincount(self.pass_[self.row == 0], minlength=n)
        dec = np.isin(self.pass_, np.flatnonzero(rows == layers))     # one row on each of its layers
        return {il: self.ids[dec & (self.layer == il)] for il in np.unique(self.layer).tolist()}


@dataclass(frozen=True)
class Step:
    pass_: int
    layer: int
    rows: int                      # token rows routed in this step
    experts: tuple[int, ...]       # distinct, in first-selected order
