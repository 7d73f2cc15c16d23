"""Profile records: plain dataclasses and one global switch; rendering lives in the CLI.

When `PROFILE.enabled`, the public ops time themselves by op class (matvec per quant type; a decode's
fused matvecs by their types and what rides in them, e.g. "norm+matvec Q4_K+Q4_K+swiglu";
attention, norms, rope, glu) and the weight store records each layer's read and wait. Seconds
spent compiling kernels (a first run, ramforge.jit) are left out of every op and pass time and
reported once, as compile_s.

While enabled, every call from Python into a compiled (numba) kernel is also timed and counted
(`KERNELS`: numba's Dispatcher gets a Python __call__, removed again when disabled, so a run without
--profile pays nothing); a pass's time minus its kernel time is its Python (orchestration) time.
"""
from __future__ import annotations

import functools
import threading
import time
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
    prefetch_skipped: int = 0 # guesses made but not read ahead: recent ones (or those not cached) mostly wrong
    predicted: int = 0        # picks of layers that had a prediction ...
    predicted_right: int = 0  # ... and those of them the prediction named
    unseen_guessed: int = 0   # guesses for this layer not cached when made (what reads ahead fetch) ...
    unseen_right: int = 0     # ... and those of them picked (READ_AHEAD_PRECISION gates reads ahead on it)
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
                             "prediction_rate": self.predicted_right / self.predicted if self.predicted else 0.0,
                             "unseen_precision": self.unseen_right / self.unseen_guessed if self.unseen_guessed else 0.0}


@dataclass
class PassRecord:
    n_tokens: int
    kind: str                 # "prefill" or "decode"
    layers: list[LayerRecord] = field(default_factory=list)
    experts: list[ExpertRecord] = field(default_factory=list)     # streamed experts, per layer
    kv: list[LayerRecord] = field(default_factory=list)           # spilled K/V read back, per layer (kv_spill)
    seconds: float = 0.0      # wall time, compiling left out
    kernel_s: float = 0.0     # of which inside compiled kernels called from Python (KERNELS)
    kernel_calls: int = 0     # those calls (a kernel's calls of other kernels are inlined or native)

    @property
    def python_s(self) -> float:
        """Orchestration: the pass's time outside compiled kernels (incl. waiting for I/O, see wait_s)."""
        return max(0.0, self.seconds - self.kernel_s)

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.layers) + sum(r.bytes_read for r in self.experts)

    @property
    def wait_s(self) -> float:
        return (sum(r.wait_s for r in self.layers) + sum(r.wait_s for r in self.experts)
                + sum(r.wait_s for r in self.kv))

    @property
    def kv_bytes_read(self) -> int:
        """Spilled K/V read back for this pass (apart from bytes_read, the weights')."""
        return sum(r.bytes_read for r in self.kv)


class KernelClock:
    """Seconds inside compiled kernels and the number of calls, for calls made from Python on the
    thread that enabled profiling (reader threads' kernels are not the token's). Compile time is left out."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.thread: int | None = None


KERNELS = KernelClock()


def _timed_call(self, *args, **kwargs):
    """numba Dispatcher.__call__ while profiling: the C call, timed and counted."""
    if threading.get_ident() != KERNELS.thread:
        return _C_CALL(self, *args, **kwargs)
    from .jit import COMPILE

    c0, t0 = COMPILE.seconds, time.perf_counter()
    try:
        return _C_CALL(self, *args, **kwargs)
    finally:
        KERNELS.seconds += time.perf_counter() - t0 - (COMPILE.seconds - c0)
        KERNELS.calls += 1


_C_CALL = None          # numba's C-level Dispatcher call, set while the clock is installed


def _install_kernel_clock(on: bool) -> None:
    """Put _timed_call on numba's Dispatcher class (on) or take it off, back to the C slot (off)."""
    global _C_CALL
    from numba.core.dispatcher import Dispatcher

    if on:
        _C_CALL = Dispatcher.__call__          # the inherited C slot wrapper
        KERNELS.thread = threading.get_ident()
        Dispatcher.__call__ = _timed_call
    elif "__call__" in vars(Dispatcher):
        del Dispatcher.__call__                # tp_call is the C function again: no cost
        KERNELS.thread = None


@dataclass
class Profile:
    _enabled: bool = False
    ops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    passes: list[PassRecord] = field(default_factory=list)
    compile_s: float = 0.0        # compiling kernels inside timed ops since the last reset

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        on = bool(on)
        if on != self._enabled:
            _install_kernel_clock(on)
            self._enabled = on

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
            # a spilled KV cache (memory.kv_spill): K/V read back, apart from the weights
            "kv_bytes_read": sum(p.kv_bytes_read for p in self.passes),
            "kv_read_s": sum(r.read_s for p in self.passes for r in p.kv),
            "kv_bytes_per_decode_token": (sum(p.kv_bytes_read for p in decode) / len(decode)) if decode else 0,
            # speculative decoding: batched verifications, and what every pass after the prompt read
            "verify_passes": sum(p.kind == "verify" for p in self.passes),
            "bytes_after_prompt": sum(p.bytes_read for p in self.passes if p.kind != "prefill"),
            **per_decode_token(decode),
            "passes": [{"kind": p.kind, "n_tokens": p.n_tokens, "seconds": p.seconds, "bytes_read": p.bytes_read,
                        "kv_bytes_read": p.kv_bytes_read,
                        "wait_s": p.wait_s, "kernel_s": p.kernel_s, "kernel_calls": p.kernel_calls,
                        "python_s": p.python_s,
                        "layers": [vars(r) for r in p.layers], "kv": [vars(r) for r in p.kv],
                        "experts": [r.as_dict() for r in p.experts]} for p in self.passes],
            "experts": experts.as_dict() if any(p.experts for p in self.passes) else None,
        }


def per_decode_token(decode: list[PassRecord]) -> dict:
    """Means over decode passes (one token each): seconds, kernel and Python seconds, kernel calls."""
    n = len(decode)
    mean = (lambda v: sum(v) / n) if n else (lambda v: 0.0)  # noqa: E731
    token_s = mean([p.seconds for p in decode])
    python_s = mean([p.python_s for p in decode])
    return {"decode_token_s": token_s, "decode_kernel_s": mean([p.kernel_s for p in decode]),
            "decode_python_s": python_s, "decode_python_fraction": python_s / token_s if token_s > 0 else 0.0,
            "decode_kernel_calls": mean([p.kernel_calls for p in decode]),
            **latency_percentiles([p.seconds for p in decode], "decode_token")}


PERCENTILES = (50, 90, 99)


def latency_percentiles(seconds: list[float], prefix: str) -> dict:
    """{prefix_p50_s, _p90_s, _p99_s}: the per-token latencies' percentiles (numpy's linear interpolation;
    0.0 without tokens)."""
    import numpy as np

    v = np.asarray(seconds, dtype=np.float64)
    return {f"{prefix}_p{q}_s": float(np.percentile(v, q)) if v.size else 0.0 for q in PERCENTILES}


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
