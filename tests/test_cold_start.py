"""A first run that does not make people wait: kernels warm up in worker processes (ramforge.jit.Warmup),
from before the model loads on a fresh cache (a dry first pass, the sampler's); `run` and `serve`'s requests
share the matmul kernels with them; `serve` answers /health 503 (llama-server's "Loading model") while a
warm cache loads, and requests wait for that."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from ramforge.engine import warmup
from ramforge.engine.warmup import warm_jobs
from ramforge.jit import Warmup, WarmJob
from ramforge.server.app import create_app
from ramforge.server.common import ServerConfig

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def test_warmup_runs_its_jobs_in_worker_processes(tmp_path):
    marks = [tmp_path / f"m{i}" for i in range(3)]
    w = Warmup([WarmJob("os", "mkdir", (str(m),)) for m in marks], workers=2)
    assert w.wait(60) and w.ok and w.done()
    assert all(m.exists() for m in marks)
    assert len(w._procs) == 2 and all(p.pid != os.getpid() for p in w._procs)


def test_a_failing_worker_is_reported_and_a_cancelled_one_is_not(caplog):
    w = Warmup([WarmJob("math", "sqrt", (-1.0,))], workers=1)
    assert w.wait(60) and w.ok is False
    assert "warm-up worker failed" in caplog.text and "math domain error" in caplog.text
    caplog.clear()
    w = Warmup([WarmJob("time", "sleep", (60,))], workers=1)
    t0 = time.monotonic()
    w.cancel()
    assert w.done() and time.monotonic() - t0 < 30 and "failed" not in caplog.text


@pytest.fixture(scope="module")
def engine(default_model):
    from ramforge.engine.engine import Engine

    eng = Engine.load(default_model, n_ctx=64, n_threads=1)
    yield eng
    eng.close()


def test_warm_jobs_first_needed_first_and_none_twice(engine):
    jobs = warm_jobs(engine)
    assert jobs[0] == WarmJob("ramforge.sampling", "warm", (engine.hp.n_vocab,))
    fused = [j for j in jobs if j.module == "ramforge.kernels.fused"]
    parts = [tuple(j.args[0][0].items()) for j in fused]
    assert len(set(parts)) == len(parts) and len(parts) >= 3
    assert list(parts[0][i][0] for i in range(3)) == ["attn_q", "attn_k", "attn_v"]    # largest groups first
    covered = {n for p in parts for n, _ in p}
    assert covered == {n for layer in engine.weights.layer_matrices() for n in layer}
    decode = warm_jobs(engine, prefill=False)
    assert decode == jobs[:len(decode)] and all(j.module != "ramforge.kernels.qmatmul" for j in decode)
    assert any(j.module == "ramforge.kernels.qmatmul" for j in jobs)
    for j in jobs:
        j.run()                                         # every job runs (from the warm cache here)


def test_health_is_503_while_the_kernels_warm_then_200_and_requests_wait(monkeypatch):
    gate, ran = threading.Event(), []

    def slow_jobs(engine, prefill=True):           # a warm-up held open until the test lets it end
        ran.append(engine)
        return [WarmJob("threading", "Event.wait", (gate, 60))]

    monkeypatch.setattr(warmup, "warm_jobs", slow_jobs)
    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=256, n_threads=1))
    app.state.manager.preload()
    with TestClient(app) as client:
        for path in ("/health", "/v1/health"):
            r = client.get(path)
            assert r.status_code == 503 and r.json() == LOADING, path
        assert client.get("/").status_code == 200                   # Ollama's probes answer at once
        assert client.get("/api/version").status_code == 200
        answer = {}
        body = {"model": "default", "prompt": "Why is the sky blue?", "stream": False,
                "options": {"temperature": 0, "num_predict": 4}}
        t = threading.Thread(target=lambda: answer.update(r=client.post("/api/generate", json=body)))
        t.start()
        time.sleep(1.0)
        assert "r" not in answer                                    # waiting for the warm-up
        gate.set()
        t.join(120)
        assert answer["r"].status_code == 200 and answer["r"].json()["eval_count"] == 4
        r = client.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"] == "default"
    assert len(ran) == 1


def test_a_request_that_outwaits_the_warm_up_is_told_to_retry(monkeypatch):
    from ramforge.server import manager as mgr

    gate = threading.Event()
    monkeypatch.setattr(warmup, "warm_jobs", lambda engine, prefill=True: [WarmJob("threading", "Event.wait",
                                                                                (gate, 60))])
    monkeypatch.setattr(mgr, "WARM_WAIT_S", 0.5)
    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=256, n_threads=1))
    app.state.manager.preload()
    try:
        with TestClient(app) as client:
            r = client.post("/api/generate", json={"model": "default", "prompt": "hi", "stream": False,
                                                   "options": {"num_predict": 1}})
            assert r.status_code == 503 and "still compiling" in r.json()["error"]
    finally:
        gate.set()


@pytest.mark.slow
def test_a_cold_serve_answers_at_once_with_the_warm_servers_tokens(tmp_path):
    """A real cold compile (a fresh kernel cache): /health answers 200 once the model has loaded, the first
    generation runs while the workers compile, and a second server on the now warm cache gives its tokens."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"))
    body = {"model": "default", "prompt": "Why is the sky blue?", "stream": False,
            "options": {"temperature": 0, "num_predict": 8}}
    answers = []
    for run in range(2):
        port = 18000 + (os.getpid() + run) % 1000
        p = subprocess.Popen([sys.executable, "-m", "ramforge", "serve", "default", "--port", str(port)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=Path(__file__).resolve().parents[1])
        try:
            t0, seen = time.monotonic(), []
            while time.monotonic() - t0 < 120 and 200 not in seen:
                try:
                    seen.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            assert seen and seen[-1] == 200
            r = httpx.post(f"http://127.0.0.1:{port}/api/generate", json=body, timeout=900)
            assert r.status_code == 200 and r.json()["eval_count"] == 8
            answers.append(r.json()["context"])
        finally:
            p.terminate()
            p.wait(60)
    assert answers[0] == answers[1]


def test_each_job_is_reported_as_it_ends_then_the_end(tmp_path):
    done, order = threading.Event(), []
    jobs = [WarmJob("os", "mkdir", (str(tmp_path / "a"),)), WarmJob("builtins", "print", ("to stderr",)),
            WarmJob("os", "mkdir", (str(tmp_path / "b"),))]
    w = Warmup(jobs, workers=2, on_job=lambda j: (order.append(j), j is None and done.set()))
    assert done.wait(60) and w.ok
    assert order[-1] is None and sorted(map(id, order[:-1])) == sorted(map(id, jobs))
    assert w.finished and len(w.finished) == 3
    order.clear()
    w = Warmup([WarmJob("time", "sleep", (60,))], workers=1, on_job=order.append)
    w.cancel()
    assert order == [None]                               # a cancelled warm-up ends too


def test_a_deferral_holds_the_fused_kernels_until_their_job_ends(engine):
    from ramforge.kernels import fused

    jobs = warm_jobs(engine, prefill=False)
    fused_jobs = [j for j in jobs if j.module == "ramforge.kernels.fused"]
    fused._plan.cache_clear()                            # fresh dispatchers: none compiled in this process
    fused._fused_kernel.cache_clear()
    first = fused.kernels(fused_jobs[0].args[0])
    with warmup.Deferral(jobs) as d:
        assert all(fused.held(k) for k in first)
        d.on_job(jobs[0])                                # the sampler's: no fused kernel
        assert all(fused.held(k) for k in first)
        d.on_job(fused_jobs[0])
        assert not any(fused.held(k) for k in first)
        assert all(fused.held(k) for k in fused.kernels(fused_jobs[1].args[0]) - first)
        d.on_job(None)                                   # the workers' end: all
        assert not fused._held
    assert not fused._held


def test_a_held_decode_gives_the_fused_decodes_logits(engine):
    # a cold run's first tokens take the per-matrix kernels while the fused ones compile: the same logits
    from ramforge.kernels import fused

    ids = engine.tokenizer.encode("Why is the sky blue?", add_special=True)

    def logits():
        engine.reset()
        out = [engine.eval(ids).copy()]
        for tok in (236743, 1597, 563):
            out.append(engine.eval([tok]).copy())
        return out

    fused_run = logits()
    fused._plan.cache_clear()
    fused._fused_kernel.cache_clear()
    fused.hold()
    try:
        held_run = logits()
        assert all(not k.signatures for k in fused.kernels(engine.weights.layer_matrices()))   # none ran
    finally:
        fused.unhold()
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(fused_run, held_run))


def test_a_warmup_takes_jobs_until_sealed_and_gives_queued_ones_back(tmp_path):
    w = Warmup([], workers=1, more=True)
    slow = WarmJob("time", "sleep", (1.5,))
    a, b = (WarmJob("os", "mkdir", (str(tmp_path / n),)) for n in "ab")
    w.add([slow, a, b])
    assert w.take(b) is True                             # still queued: the caller's now
    t0 = time.monotonic()
    while id(slow) not in w._running:                    # a worker is on it
        assert time.monotonic() - t0 < 60
        time.sleep(0.01)
    assert w.take(slow) is False and slow in w.finished  # waited for it to end
    assert not w.done()                                  # not sealed: the worker waits for more
    w.seal()
    with pytest.raises(ValueError):
        w.add([WarmJob("os", "getpid")])
    assert w.wait(60) and w.ok
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert w.take(a) is False                            # ended: nothing to wait for


def test_a_warmup_whose_worker_dies_wakes_who_waits_for_its_job():
    w = Warmup([WarmJob("os", "_exit", (3,)), WarmJob("os", "getpid")], workers=1)
    assert w.wait(60) and w.ok is False and not w.finished
    assert w.take(w.jobs[0]) is False                    # not waited on forever
    assert w.take(w.jobs[1]) is True                     # left queued: the caller does it


class _Queue:
    """A Warmup's queue as FirstPass uses it, recording the calls."""

    def __init__(self):
        self.added, self.taken = [], []

    def add(self, jobs):
        self.added += list(jobs)

    def take(self, job):
        self.taken.append(job)
        return True


def test_a_first_pass_shares_its_matmul_kernels_from_both_ends(engine):
    # as a cold run: decode takes the per-matrix kernels while the fused ones are held (Deferral)
    from ramforge.kernels import fused, qmatmul

    ids = engine.tokenizer.encode("Why is the sky blue?", add_special=True)
    jobs = warmup.first_pass_jobs(engine, len(ids))
    assert jobs and all(j.module == "ramforge.kernels.qmatmul" and j.args[2] in ((len(ids),), (1,))
                        for j in jobs.values())
    assert len(set(jobs)) == len(jobs)                   # one job a kernel
    for job in jobs.values():
        job.run()                                        # each names its kernel
    assert all(k.signatures for k in jobs)
    engine.reset()
    want = [engine.eval(ids).copy(), engine.eval([236743]).copy()]
    q = _Queue()
    fused._plan.cache_clear()
    fused._fused_kernel.cache_clear()
    fused.hold()
    with warmup.Deferral([]) as deferral, warmup.FirstPass(engine, len(ids), q, deferral):
        assert q.added == list(reversed(list(jobs.values())))    # the workers: last needed first
        assert qmatmul.first_call is not None
        stand = dict(qmatmul.deferred)                   # batch kernels left to the workers: their stand-ins run
        assert stand and all(warmup.stand_in(k) is v for k, v in stand.items())
        engine.reset()
        got = [engine.eval(ids).copy(), engine.eval([236743]).copy()]
        want_jobs = [j for k, j in jobs.items() if k not in stand]   # this process: each once, first needed first
        assert len(q.taken) == len(want_jobs) and all(j in want_jobs for j in q.taken)
        first = stand.get(next(iter(jobs)), next(iter(jobs)))        # the pass's first kernel, or its stand-in
        assert first not in jobs or q.taken[0] == jobs[first]
        assert qmatmul.first_call is None                # all met: the hook is gone
        for job in q.added:
            deferral.on_job(job)                         # the workers end their jobs: the kernels themselves again
        assert not qmatmul.deferred
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(want, got))


@pytest.mark.slow
def test_a_cold_run_gives_the_warm_runs_tokens(tmp_path):
    """A real cold `run` (fresh kernel cache: workers, FirstPass, Deferral) and a warm one: the same tokens."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"))
    cmd = [sys.executable, "-m", "ramforge", "run", "default", "Why is the sky blue?", "-n", "8", "--temp", "0",
           "--json"]
    runs = [subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    cold, warm = (json.loads(r.stdout) for r in runs)
    assert cold["completion_tokens"] == warm["completion_tokens"] and cold["timings"]["compile_s"] > 0


def _bump():
    """A warm-up job that 'compiles' (counts a compilation): what follows goes to the workers."""
    from ramforge.jit import COMPILE

    COMPILE.kernels += 1


def _held_workers(gate: threading.Event, report_jobs: bool = False, taken: list | None = None):
    """A stand-in for jit.Warmup: its workers begin no job until `gate` is set, then end (each job reported
    ended first where report_jobs). A job this process takes back (`take`) is appended to `taken`."""

    class Workers:
        def __init__(self, jobs, workers, on_job=None, more=False):
            self.jobs, self.on_job = list(jobs), on_job

        def add(self, jobs):
            self.jobs += list(jobs)

        def seal(self):
            pass

        def share(self, job, kernels):
            pass

        def take(self, job):
            if taken is not None:
                taken.append(job)
            return True

        def wait(self, timeout=None):
            gate.wait(60)
            for j in self.jobs if report_jobs else ():
                self.on_job(j)
            self.on_job(None)
            return True

        def cancel(self):
            gate.set()

    return Workers


def test_a_cold_serve_answers_on_the_per_matrix_kernels_while_the_fused_ones_compile(monkeypatch, engine):
    import ramforge.jit as jit
    from ramforge.kernels import fused

    fused_jobs = [j for j in warm_jobs(engine) if j.module == "ramforge.kernels.fused"]
    gate, seen = threading.Event(), {}

    monkeypatch.setattr(warmup, "warm_jobs", lambda engine, prefill=True: [WarmJob(__name__, "_bump")] + fused_jobs)
    monkeypatch.setattr(jit, "Warmup", _held_workers(gate, report_jobs=True))
    fused._plan.cache_clear()                            # fresh dispatchers: none compiled in this process
    fused._fused_kernel.cache_clear()
    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=256, n_threads=1))
    app.state.manager.preload()
    body = {"model": "default", "prompt": "Why is the sky blue?", "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 4}}
    try:
        with TestClient(app) as client:
            warming = app.state.manager.current.warming
            assert warming.usable.wait(60) and not warming.done.is_set()
            assert client.get("/health").status_code == 200          # requests run: it says so
            held = client.post("/api/generate", json=body)
            assert fused._held and not any(k.signatures for j in fused_jobs for k in fused.kernels(j.args[0]))
            gate.set()
            assert warming.done.wait(60) and not fused._held
            warm = client.post("/api/generate", json=body)
            assert held.status_code == warm.status_code == 200
            assert held.json()["response"] == warm.json()["response"] and held.json()["eval_count"] == 4
    finally:
        gate.set()


def test_a_warm_cache_is_told_before_anything_loads():
    from numba import njit

    from ramforge import jit, sampling
    from ramforge.cli.generate import cold_start
    from ramforge.kernels import cxxsort

    sampling.warm(64)                                    # the sampler's sort, in the disk cache now
    assert jit.cached(cxxsort.top_sorted)
    assert cold_start({}, "x.gguf", "Hello", None, (None, None), say=False) is None   # a warm `run` starts no worker
    assert not jit.cached(njit(lambda x: x))             # no disk cache: unknown, so not cached


_SHARED_SRC = '''
from numba import njit


@njit(cache=True)
def twice(x):
    return 2 * x
'''


@pytest.mark.parametrize("queued", [True, False])
def test_a_shared_kernel_is_taken_back_if_queued_else_loaded_after_the_worker(tmp_path, monkeypatch, queued):
    # jit.Warmup.share: this process's first cache miss of a kernel a job compiles goes through take(job)
    import importlib

    from ramforge.jit import COMPILE

    name = f"shared_kernel_{os.getpid()}_{int(queued)}"
    (tmp_path / f"{name}.py").write_text(_SHARED_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    mod = importlib.import_module(name)
    job = WarmJob(name, "twice", (21,))
    busy = [WarmJob("time", "sleep", (5.0,))] if queued else []       # the worker busy while this process calls
    w = Warmup(busy + [job], workers=1, more=True)
    try:
        w.share(job, [mod.twice])
        assert "load_overload" in vars(mod.twice._cache)
        if not queued:
            t0 = time.monotonic()
            while job not in w.finished:
                assert time.monotonic() - t0 < 60
                time.sleep(0.05)
        r0 = len(COMPILE.records)
        assert mod.twice(21) == 42
        here = [r for r in COMPILE.records[r0:] if r.kernel == f"{name}.twice"]   # (another thread's compiles apart)
        assert len(here) == (1 if queued else 0)                 # compiled here, or loaded from the worker's save
        assert "load_overload" not in vars(mod.twice._cache)     # the hook is gone after one miss
        w.seal()
        assert w.wait(60) and w.ok
        assert (job in w.finished) is not queued                 # taken back: no worker ran it
    finally:
        w.cancel()


def test_a_cold_serve_runs_requests_at_once_sharing_their_matmul_kernels(monkeypatch, engine):
    # a fresh cache: requests run while the workers compile; a matmul kernel whose job is still queued is
    # taken back (here: loaded from the warm cache), and the answer is the warm one, bit for bit
    import ramforge.jit as jit

    gate, taken = threading.Event(), []

    monkeypatch.setattr(jit, "Warmup", _held_workers(gate, taken=taken))
    monkeypatch.setattr(jit, "cached", lambda dispatcher: False)             # a fresh kernel cache
    body = {"model": "default", "prompt": "Why is the sky blue?", "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 4}}
    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=256, n_threads=1))
    try:
        app.state.manager.preload()
        with TestClient(app) as client:
            warming = app.state.manager.current.warming
            assert warming.usable.wait(60) and not warming.done.is_set()
            assert client.get("/health").status_code == 200
            cold = client.post("/api/generate", json=body)
            eng = app.state.manager.current.model.engine
            from ramforge.kernels import qmatmul
            kernels = {qmatmul.own_kernel(j.args[0][0], j.args[2][0]): j for j in taken}   # each taken once,
            assert None not in kernels                                                  # a matmul kernel's job
            assert taken and len(kernels) == len(taken) and set(kernels) <= set(warmup.matmul_jobs(eng))
            n = cold.json()["prompt_eval_count"]                     # the first pass's, queued first
            first = list(warmup.first_pass_jobs(eng, n))[0]
            assert list(kernels)[0] in (first, warmup.stand_in(first))     # (a batch kernel: its stand-in)
            assert warmup.stand_in(first) in qmatmul.deferred.values()     # left to the held workers
            gate.set()
            assert warming.done.wait(60)
            from ramforge.kernels import qmatmul
            assert qmatmul.first_call is None and not qmatmul.deferred     # the hook went with the workers
            warm = client.post("/api/generate", json=body)
            assert cold.status_code == warm.status_code == 200
            assert cold.json()["context"] == warm.json()["context"] and cold.json()["eval_count"] == 4
    finally:
        gate.set()


def test_a_dry_first_pass_runs_every_kernel_but_the_matmuls(default_model, monkeypatch):
    # warm_first_pass (a worker's job before the load): the pass and a decode step run, no matmul kernel is
    # called (the products stay zero, so the logits do), and the process is left as it was
    from ramforge.engine import engine as engine_mod
    from ramforge.kernels import fused, qmatmul

    seen = {}
    load = engine_mod.Engine.load

    def spy(*a, **kw):
        seen["eng"] = eng = load(*a, **kw)
        evals = eng.eval

        def eval_(ids, *x, **y):
            out = evals(ids, *x, **y)
            seen.setdefault("logits", []).append(np.array(out, copy=True))
            seen.setdefault("dry", []).append((qmatmul.dry, fused._held))
            return out

        eng.eval = eval_
        return eng

    monkeypatch.setattr(engine_mod.Engine, "load", spy)
    fused._plan.cache_clear()                            # fresh dispatchers, as a worker's: none compiled here
    fused._fused_kernel.cache_clear()
    called = []
    monkeypatch.setattr(qmatmul, "first_call", called.append)      # every matmul meets it, dry or not
    warmup.warm_first_pass(default_model, "Why is the sky blue?", 1)
    assert seen["dry"] == [(True, True), (True, True)] and len(seen["logits"]) == 2
    assert all(not lg.any() for lg in seen["logits"])               # every product zero
    assert called                                                   # the matmuls were reached, not run
    assert qmatmul.dry is False and fused._held is False
    assert seen["eng"].weights.mmap


def test_early_jobs_are_a_dry_pass_then_the_sampler_whose_kernels_are_shared(default_model):
    from ramforge.kernels import cxxsort
    from ramforge.sampling import libm

    jobs = warmup.early_jobs({"tokenizer.ggml.tokens": ["a"] * 10}, default_model, "Hello", 2, ("f16", "q8_0"))
    assert [(j.module, j.function) for j, _ in jobs] == [("ramforge.engine.warmup", "warm_first_pass"),
                                                          ("ramforge.sampling", "warm")]
    assert jobs[0][0].args == (str(default_model), "Hello", 2, "f16", "q8_0") and jobs[0][1] == ()
    assert jobs[1][0].args == (10,) and jobs[1][1] == (cxxsort.top_sorted, libm.exp_shifted)
    moe = warmup.early_jobs({"qwen3moe.expert_count": 128}, default_model, "Hello")
    assert [j.function for j, _ in moe] == ["warm"]                 # experts' matmuls are not dry: no pass


@pytest.mark.slow
def test_after_a_dry_pass_a_cold_first_pass_compiles_only_its_matmuls_and_the_load(tmp_path, default_model):
    """The dry pass in one process (a worker's), then a real first pass in another, on a fresh kernel cache:
    the second compiles the load's kernels and the matmuls, nothing the dry pass covers."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"))
    env.pop("NUMBA_NUM_THREADS", None)
    env.pop("RAMFORGE_THREADS", None)
    dry = (f"from ramforge.engine.warmup import warm_first_pass; warm_first_pass({str(default_model)!r}, "
           f"'Why is the sky blue?', None)")
    real = ("import sys; from ramforge.jit import COMPILE; from ramforge.engine.engine import Engine; "
            "from ramforge.kernels import fused; fused.hold(); "
            f"e = Engine.load({str(default_model)!r}); "
            "ids = e.tokenizer.encode('Why is the sky blue?', add_special=True, parse_special=True); "
            "e.eval(ids); e.eval(ids[-1:]); print('\\n'.join(r.kernel for r in COMPILE.records))")
    assert subprocess.run([sys.executable, "-c", dry], env=env, timeout=900).returncode == 0
    r = subprocess.run([sys.executable, "-c", real], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    compiled = r.stdout.split()
    assert any(".qmatmul." in k for k in compiled)
    others = [k for k in compiled if not k.startswith(("ramforge.kernels.qmatmul.", "ramforge.kernels.repack.",
                                                        "ramforge.kernels.decode."))]
    assert others == []
