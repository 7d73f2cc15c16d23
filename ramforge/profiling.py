"""Profile records: plain dataclasses and one global switch; rendering lives in the CLI.

When `PROFILE.enabled`, the public ops time themselves by op class (matvec per quant type,
attention, norms, rope, glu) and the weight store records each layer's read and wait. Seconds
spent compiling kernels (a first run, ramforge.jit) are left out of every op and pass time and
reported once, as compile_s.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class LayerRecord:
    layer: int | str          # a layer index, or "output[c]" for a streamed output chunk
    resident: bool            # pinned (a hit) or streamed (a miss)
    bytes_read: int = 0
    read_s: float = 0.0       # time the reader thread spent reading it
    wait_s: float = 0.0       # time compute waited for it: I/O not hidden by compute
    compute_s: float = 0.0


@dataclass
class ExpertRecord:
    """One layer's experts in one pass (or the totals): where each came from, what it cost."""

    layer: int | str
    hits: int = 0             # cached from an earlier use
    prefetch_hits: int = 0    # read ahead for this layer by the prediction, and picked
    misses: int = 0           # read when picked
    prefetch_issued: int = 0  # reads this layer's prediction started for the next layer
    prefetch_wasted: int = 0  # read ahead for this layer and not picked (cancelled if not yet read)
    prefetch_skipped: int = 0 # guesses made but not read ahead: recent guesses were mostly wrong
    predicted: int = 0        # picks of layers that had a prediction ...
    predicted_right: int = 0  # ... and those of them the prediction named
    bytes_read: int = 0       # bytes read for this layer: its misses and the read-aheads made for it
    read_s: float = 0.0       # reader threads' time on this layer's reads
    wait_s: float = 0.0       # compute waiting for experts: I/O not hidden
    compute_s: float = 0.0

    def add(self, o: "ExpertRecord") -> None:
        for k, v in vars(o).items():
            if k != "layer":
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        n = self.hits + self.prefetch_hits + self.misses
        return vars(self) | {"hit_rate": (self.hits + self.prefetch_hits) / n if n else 0.0,
                             "prediction_rate": self.predicted_right / self.predicted if self.predicted else 0.0}


@dataclass
class PassRecord:
    n_tokens: int
    kind: str                 # "prefill" or "decode"
    layers: list[LayerRecord] = field(default_factory=list)
    experts: list[ExpertRecord] = field(default_factory=list)     # streamed experts, per layer
    seconds: float = 0.0

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.layers) + sum(r.bytes_read for r in self.experts)

    @property
    def wait_s(self) -> float:
        return sum(r.wait_s for r in self.layers) + sum(r.wait_s for r in self.experts)


@dataclass
class Profile:
    enabled: bool = False
    ops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    passes: list[PassRecord] = field(default_factory=list)
    compile_s: float = 0.0        # compiling kernels inside timed ops since the last reset

    def reset(self) -> None:
        self.ops.clear()
        self.calls.clear()
        self.passes.clear()
        self.compile_s = 0.0

    def summary(self) -> dict:
        streamed = [r for p in self.passes for r in p.layers if not r.resident]
        total_read = sum(r.bytes_read for r in streamed)
        read_s = sum(r.read_s for r in streamed)
        decode = [p for p in self.passes if p.kind == "decode"]
        experts = ExpertRecord("all")
        for p in self.passes:
            for r in p.experts:
                experts.add(r)
        return {
            "compile_s": self.compile_s, "ops_s": dict(self.ops), "op_calls": dict(self.calls),
            "hits": sum(r.resident for p in self.passes for r in p.layers if isinstance(r.layer, int)),
            "misses": sum(not r.resident for p in self.passes for r in p.layers if isinstance(r.layer, int)),
            "bytes_read": total_read + experts.bytes_read, "read_s": read_s + experts.read_s,
            "storage_gb_s": total_read / read_s / 1e9 if read_s > 0 else 0.0,
            "wait_s": sum(p.wait_s for p in self.passes),
            "bytes_per_decode_token": (sum(p.bytes_read for p in decode) / len(decode)) if decode else 0,
            "passes": [{"kind": p.kind, "n_tokens": p.n_tokens, "seconds": p.seconds, "bytes_read": p.bytes_read,
                        "wait_s": p.wait_s,
                        "layers": [vars(r) for r in p.layers],
                        "experts": [r.as_dict() for r in p.experts]} for p in self.passes],
            "experts": experts.as_dict() if any(p.experts for p in self.passes) else None,
        }


PROFILE = Profile()


def timed(op_class):
    """Decorator: time the call under op_class(args) (a str, or a function of the arguments)."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not PROFILE.enabled:
                return fn(*args, **kwargs)
            from .jit import Stopwatch

            sw = Stopwatch().start()
            try:
                return fn(*args, **kwargs)
            finally:
                sw.stop()
                key = op_class if isinstance(op_class, str) else op_class(*args, **kwargs)
                PROFILE.ops[key] += sw.seconds
                PROFILE.compile_s += sw.compile_s
                PROFILE.calls[key] += 1
        return wrapper
    return deco
