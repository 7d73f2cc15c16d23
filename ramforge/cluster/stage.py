"""One stage of a pipeline: a layer range of the model under its own budget, with its own KV cache.

`Stage` is a plain class (testable without Ray); `pipeline.py` makes it a Ray actor. It refuses to
start when its model file (sha256) or its ramforge (version, kernel sources) differs from the
driver's: a different file or kernel would round differently, silently.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

import numpy as np

from ..errors import BudgetTooSmall, InvalidArgument, StageBudgetTooSmall, StageFailed, StageMismatch
from ..engine.ubatch import Chunk

_HASH_BLOCK = 1 << 22


def file_sha256(path) -> str:
    """sha256 of a file, remembered in the cache directory by (path, inode, size, mtime): a 2 GB model
    is hashed once, not at every start of every stage."""
    from ..paths import cache_dir

    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    memo = cache_dir() / "digests" / key[:32]
    try:
        return json.loads(memo.read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}")
        tmp.write_text(json.dumps({"path": str(path), "sha256": digest}))
        os.replace(tmp, memo)
    except OSError:
        pass
    return digest


def identity(path) -> dict:
    """What driver and stages must share: the model file's sha256, ramforge's version, its kernels."""
    from .._version import __version__
    from ..paths import kernel_cache_key

    return {"sha256": file_sha256(path), "version": __version__, "kernels": kernel_cache_key()}


def check_identity(index: int, expect: dict, got: dict, where: str) -> None:
    """StageMismatch naming stage `index` and what differs from the driver's."""
    what = {"sha256": "model file (sha256)", "version": "ramforge version", "kernels": "ramforge kernel sources"}
    for k, name in what.items():
        if k in expect and expect[k] != got.get(k):
            raise StageMismatch(f"stage {index} on {where}: its {name} is {got.get(k)}, the driver's is {expect[k]}; "
                                f"refusing to start (every node needs the same file and the same ramforge)", stage=index)


def _unnice() -> int:
    """Back to nice 0 where allowed: Ray starts workers at nice 15 (its worker_niceness), and a stage is
    the foreground work (pipeline.RAY_SYSTEM_CONFIG sets 0 for a cluster ramforge starts)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:                  # not permitted: `RAY_worker_niceness=0 ray start ...` does it
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def _ray_node() -> str | None:
    """The Ray node this stage runs on (None outside Ray)."""
    ray = sys.modules.get("ray")
    try:
        return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return None


class Stage:
    """Layers [a, b) of `model` in this process. forward() takes a chunk (ubatch.Chunk) at position
    pos0: token ids for the first stage, hidden states f32[n, n_embd] otherwise; it returns hidden
    states, or the logits rows for the last stage."""

    def __init__(self, index: int, model: str, layers: tuple[int, int], ram, n_ctx: int | None, io: str = "direct",
                 n_threads: int | None = None, expect: dict | None = None, batch: int | None = None):
        self.index, self.layers = index, tuple(layers)
        self.node = f"{socket.gethostname()} (pid {os.getpid()})"
        self.engine, self.error = None, None
        self.busy_s, self.passes = 0.0, 0          # seconds inside forward(), and its calls (the latency model)
        self.nice = _unnice()
        try:
            self._load(model, ram, n_ctx, io, n_threads, expect, batch)
        except Exception as e:       # raised by info(): a constructor's error would reach the driver untyped
            self.error = e

    def _load(self, model, ram, n_ctx, io, n_threads, expect, batch) -> None:
        from ..engine.engine import Engine
        from ..memory import MemoryBudget
        from ..store.resolve import resolve_model

        path = resolve_model(model)
        if expect:
            check_identity(self.index, expect, identity(path), self.node)
        self.budget = MemoryBudget(ram)
        try:
            self.engine = Engine.load(path, n_ctx=n_ctx, budget=self.budget, io=io, layers=self.layers,
                                      n_threads=n_threads, batch=batch)
        except BudgetTooSmall as e:
            a, b = self.layers
            raise StageBudgetTooSmall(f"stage {self.index} (layers {a}-{b - 1}) needs at least {e.minimum:,} B; its "
                                      f"budget is {e.budget:,} B: raise --stage-ram or add stages",
                                      self.index, e.minimum) from None
        self.idle = self.budget.current            # what the stage holds between requests

    def _ready(self):
        if self.error is not None:
            raise self.error
        return self.engine

    def info(self) -> dict:
        e = self._ready()
        return {"stage": self.index, "node": self.node, "pid": os.getpid(), "layers": self.layers,
                "verdict": e.plan.verdict, "batch": e.plan.batch, "n_ctx": e.n_ctx, "n_past": e.n_past,
                "budget": self.budget.limit, "charged": self.budget.current, "idle": self.idle,
                "peak": self.budget.peak, "planned_peak": e.plan.planned_peak, "load_s": e.timings.load_s,
                "busy_s": self.busy_s, "passes": self.passes, "nice": self.nice, "node_id": _ray_node(),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}

    def forward(self, inp, pos0: int, chunk: Chunk) -> np.ndarray | None:
        """Run one chunk at positions pos0..: positions from pos0 on are forgotten first (a new
        prompt rewinds the cache); a cache shorter than pos0 (a restarted stage) is out of step."""
        kv = self._ready().kv
        if pos0 > kv.n_past:
            raise StageFailed(f"stage {self.index} on {self.node} holds {kv.n_past} positions, the driver expected "
                              f"{pos0} (was it restarted?)", stage=self.index)
        if chunk.size != len(inp):
            raise InvalidArgument(f"stage {self.index}: a chunk of {chunk.size} tokens got {len(inp)} rows")
        kv.n_past = pos0
        t0 = time.perf_counter()
        try:
            return self.engine.run_chunk(inp, chunk)
        finally:
            self.busy_s += time.perf_counter() - t0
            self.passes += 1

    def ping(self) -> int:
        return os.getpid()

    def recover(self) -> int:
        """After a failed request: drop what a pass had in flight, the cached positions and the KV
        cache's grown charge; the bytes charged (back to the idle level)."""
        self._ready().weights.abort()
        self.engine.kv.n_past = 0
        self.engine.kv.shrink(0)
        return self.budget.current

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

