"""A first run that does not make people wait: kernels warm up in worker processes (ramforge.jit.Warmup),
`serve` answers /health 503 (llama-server's "Loading model") while they do, and requests wait for them."""
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
def test_a_cold_serve_answers_health_at_once(tmp_path):
    """A real cold compile (a fresh kernel cache): /health answers (503) within 30 s, then 200."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "kernels"))
    port = 18000 + os.getpid() % 1000
    p = subprocess.Popen([sys.executable, "-m", "ramforge", "serve", "default", "--port", str(port)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=Path(__file__).resolve().parents[1])
    try:
        t0, seen = time.monotonic(), []
        while time.monotonic() - t0 < 900 and 200 not in seen:
            try:
                seen.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
                if len(seen) == 1:
                    assert time.monotonic() - t0 < 30
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert seen[0] == 503 and seen[-1] == 200
    finally:
        p.terminate()
        p.wait(60)


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
    with warmup.FirstPass(engine, len(ids), q), warmup.Deferral([]):
        assert q.added == list(reversed(list(jobs.values())))    # the workers: last needed first
        assert qmatmul.first_call is not None
        engine.reset()
        got = [engine.eval(ids).copy(), engine.eval([236743]).copy()]
        want_jobs = list(jobs.values())                  # this process: each once, the first needed first
        assert len(q.taken) == len(want_jobs) and all(j in want_jobs for j in q.taken)
        assert q.taken[0] == want_jobs[0]
        assert qmatmul.first_call is None                # all met: the hook is gone
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


def test_a_cold_serve_answers_on_the_per_matrix_kernels_while_the_fused_ones_compile(monkeypatch, engine):
    import ramforge.jit as jit
    from ramforge.kernels import fused

    fused_jobs = [j for j in warm_jobs(engine) if j.module == "ramforge.kernels.fused"]
    gate, seen = threading.Event(), {}

    class Workers:                                       # the workers, held until the test lets them end
        def __init__(self, jobs, workers, on_job=None):
            self.jobs, self.on_job = jobs, on_job

        def wait(self, timeout=None):
            gate.wait(60)
            for j in self.jobs:
                self.on_job(j)
            self.on_job(None)
            return True

        def cancel(self):
            gate.set()

    monkeypatch.setattr(warmup, "warm_jobs", lambda engine, prefill=True: [WarmJob(__name__, "_bump")] + fused_jobs)
    monkeypatch.setattr(jit, "Warmup", Workers)
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
    assert cold_start({}, say=False) is None             # a warm `run` starts no worker
    assert not jit.cached(njit(lambda x: x))             # no disk cache: unknown, so not cached
