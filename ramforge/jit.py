"""Numba compilation seen from outside: how long kernels took to compile, and hooks that let a front
end say so while it happens.

Numba compiles a kernel on its first call with new argument types, unless the on-disk cache (see
ramforge.paths) already holds it. Each real compilation (a cache miss) is a "numba:compile" event;
`COMPILE` listens to them, keeps the seconds spent (nested compilations of callees counted once),
and calls `begin_hook()` / `end_hook(seconds)` around each outermost one. The engine subtracts compile
seconds from load, prefill and decode times and reports them apart.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable

from numba.core import event


class CompileClock(event.Listener):
    """Seconds spent compiling kernels in this process (cache misses only; loading from the cache is
    not compiling)."""

    def __init__(self):
        self.seconds = 0.0            # total, outermost compilations only
        self.kernels = 0              # outermost compilations
        self._depth = 0
        self._t0 = 0.0
        self._lock = threading.Lock()
        self.begin_hook: Callable[[], None] | None = None          # called as a compilation starts
        self.end_hook: Callable[[float], None] | None = None       # called with its seconds

    def on_start(self, ev) -> None:
        with self._lock:
            self._depth += 1
            first = self._depth == 1
            if first:
                self._t0 = time.perf_counter()
        if first and self.begin_hook is not None:
            self.begin_hook()

    def on_end(self, ev) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth:
                return
            dt = time.perf_counter() - self._t0
            self.seconds += dt
            self.kernels += 1
        if self.end_hook is not None:
            self.end_hook(dt)

    @contextmanager
    def hooks(self, begin: Callable[[], None] | None, end: Callable[[float], None] | None):
        """Install a front end's hooks for the duration of a block."""
        old = self.begin_hook, self.end_hook
        self.begin_hook, self.end_hook = begin, end
        try:
            yield self
        finally:
            self.begin_hook, self.end_hook = old


class Stopwatch:
    """Wall time of a block minus the compile seconds inside it: `with Stopwatch() as sw: ...` (or
    `sw = Stopwatch().start(); ...; sw.stop()`), then sw.seconds and sw.compile_s."""

    def start(self) -> "Stopwatch":
        self._t0, self._c0 = time.perf_counter(), COMPILE.seconds
        self.seconds = self.compile_s = 0.0
        return self

    __enter__ = start

    def stop(self) -> "Stopwatch":
        self.compile_s = COMPILE.seconds - self._c0
        self.seconds = max(0.0, time.perf_counter() - self._t0 - self.compile_s)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


COMPILE = CompileClock()
event.register("numba:compile", COMPILE)


# ---------------------------------------------------------------- numba's first-use set-up
# The first kernel a process runs (even one loaded from the disk cache) makes numba set up its CPU
# target: import its implementation registries and install them, 0.15-0.2 s. One of them,
# numba.np.arraymath, probes for a BLAS by importing scipy.linalg when scipy is installed (another
# 0.2-0.3 s: scipy.linalg pulls in numpy.f2py, numpy.testing, ...). ramforge's kernels call no BLAS, so
# prepare() imports that module with scipy hidden: numba then takes its plain-loop inner product for
# np.correlate / np.convolve in this process; np.dot and np.linalg still import scipy when compiled.
_prepared = threading.Event()
_prepare_lock = threading.Lock()


def prepare() -> None:
    """Set up numba's CPU target now (idempotent, thread-safe; see above)."""
    if _prepared.is_set():
        return
    import sys

    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with _prepare_lock, global_compiler_lock:
        if _prepared.is_set():
            return
        hide = "scipy.linalg" not in sys.modules and "numba.np.arraymath" not in sys.modules
        if hide:
            sys.modules["scipy.linalg"] = None   # `import scipy.linalg...` raises ImportError meanwhile
        try:
            import numba.np.arraymath  # noqa: F401
        finally:
            if hide and sys.modules.get("scipy.linalg", 0) is None:
                del sys.modules["scipy.linalg"]
        cpu_target.target_context.refresh()      # the registries (typing context included)
        _prepared.set()


def prepare_in_background() -> threading.Thread | None:
    """prepare() in a daemon thread, for a caller about to block on I/O (reads release the GIL);
    a kernel called meanwhile waits for it on numba's compiler lock. None when already done."""
    if _prepared.is_set():
        return None
    t = threading.Thread(target=prepare, name="ramforge-numba-prepare", daemon=True)
    t.start()
    return t
