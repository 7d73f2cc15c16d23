"""A pipeline of layer ranges on Ray (ramforge.cluster): identical to one process, and its faults typed.

A local Ray cluster in this process (ray.init, 2 CPUs; stages ask for none, so any count fits one
node). The 2-stage tests run in CI; 3 stages and the killed stage are `slow`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ramforge.cluster.split import parse_budgets, plan_stages, split_layers
from ramforge.cluster.stage import Stage, check_identity
from ramforge.engine.engine import Engine
from ramforge.errors import (ClusterUnreachable, InvalidArgument, StageBudgetTooSmall, StageFailed, StageMismatch,
                             http_status)
from ramforge.gguf.reader import GGUFFile
from ramforge.sampling.params import sampler_params
from ramforge.sampling import LLAMA, Sampler

PROMPT = [1, 415, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]
LONG = PROMPT + PROMPT[1:] * 7                   # 85 tokens: 6 chunks of 16 in ubatches of 32
BATCH, UBATCH = 16, 32


@pytest.fixture(scope="module")
def tiny():
    from tools.make_models import ensure_model

    return str(ensure_model("llama", "F16"))


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from ramforge.cluster import RAY_SYSTEM_CONFIG

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG)
    yield ray
    ray.shutdown()


def _reference(path, prompt, n_ctx=256):
    """One process: every position's logits, greedy and seeded continuations."""
    with Engine.load(path, n_ctx=n_ctx, batch=BATCH) as e:
        e.ubatch = UBATCH
        logits = e.eval(prompt, all_logits=True, aligned=True)
        return logits, list(e.generate(prompt, 12)), list(e.generate(prompt, 12, _sampler(e.hp.n_vocab)))


def _sampler(n_vocab):
    return Sampler(sampler_params({"temperature": 0.9, "top_k": 40, "seed": 1234}), n_vocab, chain=LLAMA)


def _check_identical(pipe, prompt, ref):
    pipe.ubatch = UBATCH
    pipe.reset()
    assert np.array_equal(pipe.eval(prompt, all_logits=True, aligned=True), ref[0])
    assert list(pipe.generate(prompt, 12)) == ref[1]
    assert list(pipe.generate(prompt, 12, _sampler(pipe.hp.n_vocab))) == ref[2]


# ------------------------------------------------------------------------------ no Ray needed

def test_split_balances_bytes_over_budgets():
    assert split_layers([10] * 8, 0, 0, [None] * 2) == [(0, 4), (4, 8)]
    assert split_layers([10] * 8, 0, 0, [100, 300]) == [(0, 2), (2, 8)]
    assert split_layers([10] * 8, 40, 0, [None] * 3) in ([(0, 1), (1, 5), (5, 8)], [(0, 1), (1, 4), (4, 8)])
    assert split_layers([10] * 9, 0, 0, [None] * 3) == [(0, 3), (3, 6), (6, 9)]


def test_stage_counts_and_budgets_are_named(tiny):
    with GGUFFile(tiny) as f:
        for bad in (0, 4, -1):
            with pytest.raises(InvalidArgument, match="1 to 3 stages"):
                plan_stages(f, bad)
        with pytest.raises(StageBudgetTooSmall, match=r"stage 0 \(layers 0-\d\) needs at least") as e:
            plan_stages(f, 2, "1M", 64)
        assert e.value.stage == 0 and e.value.minimum > 1 << 20
        with pytest.raises(InvalidArgument, match="3 stage budgets for 2 stages"):
            parse_budgets("1G,1G,1G", 2)
        cp = plan_stages(f, 3, None, 64)
    assert [s.layers for s in cp.stages] == [(0, 1), (1, 2), (2, 3)]


def test_a_stage_of_another_file_or_ramforge_is_refused(tiny):
    expect = {"sha256": "a" * 64, "version": "0.1.0", "kernels": "k"}
    with pytest.raises(StageMismatch, match="stage 2 on n1: its model file"):
        check_identity(2, expect, {"sha256": "b" * 64, "version": "0.1.0", "kernels": "k"}, "n1")
    with pytest.raises(StageMismatch, match="ramforge version is 0.2.0, the driver's is 0.1.0"):
        check_identity(0, expect, {**expect, "version": "0.2.0"}, "n1")
    s = Stage(1, tiny, (1, 3), None, 64, expect={"version": "0.0.0-driver"})
    with pytest.raises(StageMismatch, match="stage 1 .* ramforge version"):
        s.info()
    assert http_status(StageMismatch("x")) == 503


def test_unreachable_address_fails_within_the_timeout(monkeypatch):
    from ramforge.cluster import pipeline

    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable, match="cannot reach the Ray cluster at ray://127.0.0.1:1: .* within 0.5 s"):
        pipeline._probe("ray://127.0.0.1:1", 0.5)                 # refused

    def silent(addr, timeout):
        raise TimeoutError("timed out")
    monkeypatch.setattr(pipeline.socket, "create_connection", silent)
    with pytest.raises(ClusterUnreachable, match=r"at 10.1.2.3:6379: no answer within 0.5 s"):
        pipeline._probe("10.1.2.3:6379", 0.5)
    with pytest.raises(InvalidArgument, match="expected HOST:PORT"):
        pipeline._probe("host:port", 0.5)
    assert time.monotonic() - t0 < 5


def test_cli_errors_are_one_line(tiny):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ramforge", "run", tiny, "-p", "Hi", "-n", "2", *args],
                              capture_output=True, text=True, timeout=120)
    for args, needle in ((("--ray", "127.0.0.1:1"), "cannot reach the Ray cluster at 127.0.0.1:1"),
                         (("--ray", "--stages", "0"), "--stages 0: a model of 3 layers splits into 1 to 3"),
                         (("--ray", "--stage-ram", "1M"), "stage 0 (layers 0-0) needs at least"),
                         (("--ray", "--stage-timeout", "0"), "Invalid value for '--stage-timeout'")):
        r = run(*args)
        assert r.returncode in (1, 2) and needle in r.stderr, r.stderr
        assert r.returncode == 2 or len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_address_that_answers_but_is_no_ray_head_fails_within_the_timeout(tiny):
    """A port that accepts and says nothing (a firewall's, another service's): ray.init alone retries
    for minutes; --ray-timeout bounds it, one line naming the address and what to check."""
    import socket
    import threading

    srv = socket.create_server(("0.0.0.0", 0))
    port, held = srv.getsockname()[1], []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(64)], daemon=True).start()
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ramforge", "run", tiny, "-p", "Hi", "-n", "2", "--ray",
                        f"127.0.0.1:{port}", "--ray-timeout", "3"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    srv.close()
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"cannot connect to the Ray cluster at 127.0.0.1:{port}: its port answers but Ray did not join within " \
           "3 s" in r.stderr and "ray start --head" in r.stderr and "--ray-timeout" in r.stderr, r.stderr
    assert took < 3 + 20, took                   # the bound plus the interpreter's start and imports


def test_stages_go_one_per_node_or_share_or_are_refused():
    from ramforge.cluster.pipeline import place
    from ramforge.errors import ClusterError

    assert place(2, ["a", "b", "c"]) == ["a", "b"]
    assert place(3, ["a", "b"]) == ["a", "b", "a"]
    with pytest.raises(ClusterError, match="3 stages, one per node, but the Ray cluster has 2 nodes: add nodes"):
        place(3, ["a", "b"], "strict")
    with pytest.raises(ClusterError, match="has 1 node: "):
        place(2, ["a"], "strict")


def test_plan_stages_json(tiny):
    r = subprocess.run([sys.executable, "-m", "ramforge", "plan", tiny, "--stages", "3", "--ram", "64M",
                        "--ctx", "64", "--net-gbit", "1", "--latency-ms", "50", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [s["layers"] for s in d["stages"]] == [[0, 1], [1, 2], [2, 3]]
    assert all(s["verdict"] == "resident" for s in d["stages"])
    est = d["estimate"]
    assert est["hops_s"] == pytest.approx(2 * (0.05 + 4 * 256 / 125e6))                # n_embd 256
    assert est["s_per_token"] == pytest.approx(sum(s["stage_s"] for s in est["stages"]) + est["hops_s"])


# ------------------------------------------------------------------------------ on Ray

def test_model_with_ray_generates_as_one_process(ray_local, tiny):
    from ramforge import Model

    with Model(tiny, n_ctx=128) as one:
        want = one.generate("Hello there", 8, temperature=0.7, seed=7)
    with Model(tiny, n_ctx=128, ray=True, stages=3) as m:
        got = m.generate("Hello there", 8, temperature=0.7, seed=7)
    assert (got.tokens, got.text) == (want.tokens, want.text)

@pytest.mark.parametrize("rid", ["llama-tiny-f16", "gemma3-linear-f16"])
def test_two_stages_equal_one_process(ray_local, rid):
    """Every position's logits across ubatch boundaries (6 chunks of 16 in ubatches of 32, pipelined),
    greedy and seeded continuations: those of one process; and llama.cpp's record through the pipeline."""
    from ramforge.cluster import Pipeline
    from tools.oracle_report import compare, model_path, records

    rec = next(r for r in records() if r["model"]["id"] == rid)
    path, first = str(model_path(rec)), rec["prompts"][0]["tokens"]
    prompt = (first + first[1:] * 20)[:85]
    ref = _reference(path, prompt)
    with Pipeline(path, 2, n_ctx=256, batch=BATCH) as p:
        assert len(p.infos) == 2 and p.infos[0]["layers"][0] == 0 and p.infos[1]["layers"][1] == p.hp.n_layer
        assert [i["gomp_spincount"] for i in p.infos] == ["10000"] * 2       # cluster.STAGE_ENV reached them
        _check_identical(p, prompt, ref)
        for pr in compare(rec, p).prompts:
            assert pr.tokens_equal and pr.max_rel <= 1e-4 and pr.greedy_equal, pr


@pytest.mark.slow
def test_two_stages_equal_one_process_gemma_through_model(ray_local, default_model):
    """Model(ray=...): the prompt's last logits and the greedy text of one process (the whole check,
    every position across ubatches and sampled, is the slow 3-stage test's: numba compiles the
    factory-made matmuls again in every process, ~50 s for gemma's 16-row output matmul)."""
    from ramforge import Model

    prompt = "The capital of France is"
    with Model("default", n_ctx=256) as one:
        ids = one.tokenize(prompt)
        ref = one.engine.eval(ids, aligned=True)
        text = one.generate(prompt, 8, temperature=0).text
    with Model("default", ray=True, stages=2, n_ctx=256) as m:
        assert [i["layers"] for i in m.engine.infos] == [(0, 9), (9, 18)]
        assert np.array_equal(m.engine.eval(ids, aligned=True), ref)
        assert m.generate(prompt, 8, temperature=0).text == text


def test_stage_with_another_file_is_refused_at_start(ray_local, tiny):
    from ramforge.cluster import Pipeline
    from tools.make_models import ensure_model

    other = str(ensure_model("llama", "BF16"))       # another file of the same shape (no quantizer needed)
    with pytest.raises(StageMismatch, match="stage 1 on .*: its model file \\(sha256\\)") as e:
        Pipeline(tiny, 2, n_ctx=64, stage_models=[tiny, other])
    assert e.value.stage == 1


def test_a_stage_running_another_ramforge_version_is_refused_at_start(ray_local, tiny, tmp_path):
    """The stage actors' ramforge says 9.9.9-worker (a sitecustomize in their runtime_env patches it):
    refused before loading, both versions in the message, typed across the process boundary."""
    from ramforge import _version
    from ramforge.cluster import Pipeline

    (tmp_path / "sitecustomize.py").write_text("import ramforge._version as v\nv.__version__ = '9.9.9-worker'\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"env_vars": {"PYTHONPATH": f"{tmp_path}:{repo}"}}
    with pytest.raises(StageMismatch, match=rf"stage [01] on .*: its ramforge version is 9.9.9-worker, the driver's is "
                                            rf"{_version.__version__}; refusing to start") as e:
        Pipeline(tiny, 2, n_ctx=64, runtime_env=env)
    assert e.value.stage in (0, 1)              # whichever Ray reports first


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tiny", "gemma"])
def test_two_and_three_stages_equal_one_process(ray_local, tiny, default_model, which):
    from ramforge.cluster import Pipeline

    path, prompt = (tiny, LONG) if which == "tiny" else (str(default_model), [2] + [818, 5279, 529, 7001] * 12)
    ref = _reference(path, prompt)
    for n in (2, 3):
        with Pipeline(path, n, n_ctx=256, batch=BATCH) as p:
            _check_identical(p, prompt, ref)
    with Pipeline(path, n_ctx=256, batch=BATCH, ranges=[(0, 2), (2, 3)] if which == "tiny"
                  else [(0, 3), (3, 4), (4, 18)]) as p:       # any split, not only the balanced one
        _check_identical(p, prompt, ref)


@pytest.mark.slow
def test_killed_stage_fails_the_request_then_recovers(ray_local, tiny):
    from ramforge.cluster import Pipeline

    ref = _reference(tiny, LONG)
    with Pipeline(tiny, 3, n_ctx=256, batch=BATCH, max_restarts=2) as p:
        p.ubatch = UBATCH
        idle = [i["idle"] for i in p.infos]
        gen = p.generate(LONG, 12)
        assert [next(gen) for _ in range(3)] == ref[1][:3]
        killed = p.infos[1]["pid"]
        os.kill(killed, signal.SIGKILL)                   # the middle stage's process, mid-generation
        with pytest.raises(StageFailed, match=r"stage 1 \(layers 1-1\) failed") as e:
            list(gen)
        assert e.value.stage == 1
        survivors = p.ray.get([p.actors[0].info.remote(), p.actors[2].info.remote()], timeout=60)
        assert [(i["charged"], i["n_past"]) for i in survivors] == [(idle[0], 0), (idle[2], 0)]
        _check_identical(p, LONG, ref)                    # after Ray restarted it
        infos = p.stage_info()                            # each holds its idle charge and the same KV growth
        grown = {i["charged"] - i["idle"] for i in infos}     # (one layer each): the restarted one too
        assert infos[1]["pid"] != killed and [i["idle"] for i in infos] == idle and len(grown) == 1 and grown != {0}


@pytest.mark.slow
def test_hung_stage_fails_the_request_within_the_timeout_then_recovers(ray_local, tiny):
    """A stage stopped (SIGSTOP: alive, not answering) mid-generation: the request fails after
    stage_timeout naming it, the others give back their charges, the stuck one is restarted."""
    from ramforge.cluster import Pipeline

    ref = _reference(tiny, LONG)
    with Pipeline(tiny, 3, n_ctx=256, batch=BATCH, max_restarts=2, stage_timeout=4) as p:
        p.ubatch = UBATCH
        idle = [i["idle"] for i in p.infos]
        gen = p.generate(LONG, 12)
        assert [next(gen) for _ in range(3)] == ref[1][:3]
        stuck = p.infos[1]["pid"]
        os.kill(stuck, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(StageFailed, match=r"stage 1 \(layers 1-1\) did not answer within 4 s") as e:
                list(gen)
            assert e.value.stage == 1 and time.monotonic() - t0 < 4 + 10
            survivors = p.ray.get([p.actors[0].info.remote(), p.actors[2].info.remote()], timeout=60)
            assert [(i["charged"], i["n_past"]) for i in survivors] == [(idle[0], 0), (idle[2], 0)]
        finally:
            try:
                os.kill(stuck, signal.SIGCONT)
            except ProcessLookupError:               # killed by the pipeline, as it should be
                pass
        _check_identical(p, LONG, ref)                    # after Ray restarted it
        assert p.stage_info()[1]["pid"] != stuck
