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
from dataclasses import dataclass
from typing import Callable

from numba.core import event


@dataclass(frozen=True)
class Compiled:
    """One outermost compilation: the kernel's name, its argument types, its seconds (wall) and the
    process's CPU seconds (user + system, every thread) spent meanwhile."""
    kernel: str
    args: str
    seconds: float
    cpu_s: float


def _kernel_name(ev) -> tuple[str, str]:
    data = ev.data or {}
    disp = data.get("dispatcher")
    fn = getattr(disp, "py_func", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}" if fn else repr(disp)
    return name, str(data.get("args", ""))


class CompileClock(event.Listener):
    """Seconds spent compiling kernels in this process (cache misses only; loading from the cache is
    not compiling)."""

    def __init__(self):
        self.seconds = 0.0            # total, outermost compilations only
        self.kernels = 0              # outermost compilations
        self._depth = 0
        self._t0 = self._cpu0 = 0.0
        self.records: list[Compiled] = []    # each outermost compilation, in order
        self._lock = threading.Lock()
        self.begin_hook: Callable[[], None] | None = None          # called as a compilation starts
        self.end_hook: Callable[[float], None] | None = None       # called with its seconds

    def on_start(self, ev) -> None:
        with self._lock:
            self._depth += 1
            first = self._depth == 1
            if first:
                self._t0, self._cpu0 = time.perf_counter(), time.process_time()
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
            self.records.append(Compiled(*_kernel_name(ev), dt, time.process_time() - self._cpu0))
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


# ---------------------------------------------------------------- compiling in worker processes
# A cold compile is CPU-bound and holds the GIL for long stretches. Kernels compiled in child processes
# land in the shared on-disk cache (every kernel is cache=True; ramforge.paths), and this process then
# loads them from there in milliseconds: the work runs on the other cores, and this process's threads
# (an event loop, a prefill) go on meanwhile.
@dataclass(frozen=True)
class WarmJob:
    """A warm function to call in a worker: module.function(*args) (args picklable; function may be
    dotted, e.g. "Class.method")."""
    module: str
    function: str
    args: tuple = ()

    def run(self):
        import importlib

        fn = importlib.import_module(self.module)
        for name in self.function.split("."):
            fn = getattr(fn, name)
        return fn(*self.args)


def cached(dispatcher) -> bool:
    """Whether numba's disk cache holds an index for this kernel (compiled once for some types): a
    look at one file, for telling a fresh kernel cache before anything loads. False when unknown."""
    import os

    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)
    except AttributeError:                  # not cached, or another numba's layout
        return False


def worker_count(reserve: int = 0) -> int:
    """The cores this process may run on, less `reserve` (at least 1)."""
    import os

    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n - reserve)


class Warmup:
    """Jobs compiling in worker processes (`python -c ...`): each worker takes the next job from one
    queue as it ends the last (jobs pickled on its stdin, one at a time), so the first jobs finish first.
    With more=True the workers wait for jobs `add`ed later until `seal()`; else the queue is sealed at
    once. `take(job)` gives a job still queued back to the caller (who then compiles it in-process) or
    waits for it, if a worker is on it. wait() blocks until every worker has ended (ok: every job ran).
    on_job(job) (an attribute) is called from a feeder thread as each job ends in its worker, then
    on_job(None) once every worker has ended, however they ended (cancelled, failed)."""

    def __init__(self, jobs: list[WarmJob], workers: int, on_job: Callable[[WarmJob | None], None] | None = None,
                 more: bool = False):
        import os
        import subprocess
        import sys
        import tempfile

        self.jobs = list(jobs)                  # every job ever queued, in order
        self.ok: bool | None = None
        self.finished: list[WarmJob] = []       # the jobs ended so far, in the order they ended
        self.on_job = on_job
        self._queue = list(jobs)
        self._running: dict[int, threading.Event] = {}     # id(job) -> set as its worker ends it
        self._sealed = not more
        self._cancelled = False
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._procs = []
        n = max(1, workers if more else min(workers, len(self.jobs)))
        env = dict(os.environ, RAMFORGE_WARM_WORKER="1")
        feeders = []
        for _ in range(n if (self.jobs or more) else 0):
            err = tempfile.TemporaryFile()
            p = subprocess.Popen([sys.executable, "-c", "from ramforge.jit import _worker; _worker()"], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            self._procs.append(p)
            feeders.append(threading.Thread(target=self._feed, args=(p, err), daemon=True,
                                            name="ramforge-warm-feeder"))
        for t in feeders:
            t.start()
        threading.Thread(target=self._reap, args=(feeders,), name="ramforge-warm-reaper", daemon=True).start()

    # ---- the queue
    def add(self, jobs) -> None:
        """Queue more jobs, after those queued (a sealed queue refuses: ValueError)."""
        with self._cond:
            if self._sealed:
                raise ValueError("this warm-up's queue is sealed")
            jobs = list(jobs)
            self.jobs += jobs
            self._queue += jobs
            self._cond.notify_all()

    def seal(self) -> None:
        """No more jobs: each worker ends once the queue is empty."""
        with self._cond:
            self._sealed = True
            self._cond.notify_all()

    def take(self, job: WarmJob, wait: bool = True) -> bool:
        """True: the job was still queued and is the caller's now (no worker will run it). False: a
        worker has run it, after waiting for the worker that is on it, if one is and `wait` (its kernels
        are in the disk cache then, unless it failed: a call compiles what is missing)."""
        with self._cond:
            if any(j is job for j in self._queue):
                self._queue = [j for j in self._queue if j is not job]
                return True
            ev = self._running.get(id(job))
        if ev is not None and wait:
            ev.wait()
        return False

    def share(self, job: WarmJob, kernels) -> None:
        """Route this process's first load of each kernel (a numba dispatcher with a disk cache) that `job`
        compiles through take(job), where the disk cache lacks it: still queued, the kernel compiles here;
        else it is loaded from the disk cache after the worker (numba looks there before it compiles, under
        its compiler lock). Once per kernel: its cache's own method is back after that first load."""
        for kernel in kernels:
            cache = getattr(kernel, "_cache", None)
            load = getattr(cache, "load_overload", None)
            if load is None:
                continue

            def load_overload(sig, target_context, cache=cache, load=load):
                cache.__dict__.pop("load_overload", None)          # once: the class's method again
                cres = load(sig, target_context)
                if cres is None and not self.take(job):
                    cres = load(sig, target_context)
                return cres

            cache.load_overload = load_overload

    def _next(self) -> WarmJob | None:
        with self._cond:
            while not self._queue and not self._sealed and not self._cancelled:
                self._cond.wait()
            if self._cancelled or not self._queue:
                return None
            job = self._queue.pop(0)
            self._running[id(job)] = threading.Event()
            return job

    def _ended(self, job: WarmJob, ok: bool) -> None:
        with self._cond:
            ev = self._running.pop(id(job), None)
            if ok:
                self.finished.append(job)
        if ok and self.on_job is not None:
            self.on_job(job)
        if ev is not None:
            ev.set()

    def _feed(self, p, err) -> None:
        # hand the worker one job at a time; it writes one line as each ends
        import pickle

        job = None
        try:
            while (job := self._next()) is not None:
                data = pickle.dumps(job)
                p.stdin.write(len(data).to_bytes(8, "little") + data)
                p.stdin.flush()
                ok = p.stdout.readline().strip() == b"done"
                self._ended(job, ok)
                job = None
                if not ok:
                    break
        except OSError:                     # the worker is gone (killed, failed)
            pass
        finally:
            if job is not None:
                self._ended(job, False)
            try:
                p.stdin.close()
            except OSError:
                pass
        if p.wait() != 0 and not self._cancelled:
            import logging

            err.seek(0)
            logging.getLogger("ramforge").warning("a kernel warm-up worker failed (exit %s): %s", p.returncode,
                                                  err.read().decode(errors="replace")[-2000:])
        err.close()

    def _reap(self, feeders) -> None:
        for t in feeders:
            t.join()
        with self._cond:
            left = bool(self._queue)
        self.ok = all(p.returncode == 0 for p in self._procs) and not left and not self._cancelled
        if self.on_job is not None:
            self.on_job(None)
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every worker has ended within timeout."""
        return self._done.wait(timeout)

    def __enter__(self) -> "Warmup":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop the workers (what they saved stays in the cache) and wait for them to end (idempotent)."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        self._done.wait()


def _worker() -> None:
    """A warm-up worker's main: run the WarmJobs pickled on stdin (each after its 8-byte length), one
    by one, into the on-disk kernel cache, writing "done" as each ends; stdin's end ends it."""
    import os
    import pickle
    import sys

    src = sys.stdin.buffer
    marks = os.fdopen(os.dup(1), "w")       # the progress lines; whatever a job prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while len(head := src.read(8)) == 8:
        pickle.loads(src.read(int.from_bytes(head, "little"))).run()
        marks.write("done\n")              # Warmup._feed: this job has ended
        marks.flush()
