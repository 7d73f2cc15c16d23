"""Routing traces (--trace-routing, ramforge.models.routing_trace) and their offline replay
(tools/replay_routing.py): the trace holds exactly the experts the router picked (checked against a
numpy top-k of the captured router inputs), the CLI writes it, and replay's policies give the known
hit counts on a hand-made trace, Belady never below
LRU or LFU (static pins in-sample and reads its misses past the cache: no such bound)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ramforge.engine.engine import Engine
from ramforge.errors import InvalidArgument
from ramforge.models import moe
from ramforge.models import routing_trace
from ramforge.models.routing_trace import Trace
from tools import make_direct as md
from tools.replay_routing import POLICIES, main as replay_main, replay, simulate

SHAPE = {"n_embd": 256, "n_head": 4, "n_head_kv": 2, "head_dim": 64, "n_ff_exp": 256, "n_expert": 16}


@pytest.fixture(scope="module")
def small_moe(tmp_path_factory):
    p = md.resolve("qwen3moe-30b-a3b", layers=2, shape=SHAPE)
    return md.write_direct(p, tmp_path_factory.mktemp("trace") / md.default_name(p), progress=False)


def test_trace_is_the_routing(small_moe, tmp_path, monkeypatch):
    seen = []                                      # (layer, router input rows) of every call
    ffn = moe.ffn

    def spy(m, s, il, L, xb, x, batch=None):
        t = L.ffn_gate_inp
        seen.append((il, xb @ t.data.view(np.float32).reshape(t.dims[1], t.dims[0]).T))
        ffn(m, s, il, L, xb, x, batch=batch)
    monkeypatch.setattr(moe, "ffn", spy)
    with Engine.load(str(small_moe), n_ctx=64, n_threads=1) as e:
        tr = routing_trace.attach(e, tmp_path / "t.npz")
        e.eval([1, 2, 3, 4, 5], aligned=True)
        for tok in (6, 7, 8):
            e.eval([tok])
    t = Trace.load(tmp_path / "t.npz")
    assert tr.passes == 4 and (t.n_layer, t.n_expert, t.k) == (2, 16, 8) and t.model == str(small_moe)
    assert t.ids.dtype == np.int16 and len(t.ids) == sum(len(lg) for _, lg in seen)
    i = 0
    for il, logits in seen:                       # the top k of the logits, as sets, row by row
        top = np.argsort(-logits, axis=1, kind="stable")[:, :8]
        for r in range(len(logits)):
            assert t.layer[i] == il and t.row[i] == r
            assert set(t.ids[i].tolist()) == set(top[r].tolist()), (il, r)
            i += 1
    assert list(np.unique(t.pass_)) == [0, 1, 2, 3]
    assert (t.row[t.pass_ == 0].max(), t.row[t.pass_ == 3].max()) == (4, 0)     # prefill: 5 rows
    dec = t.decode_rows()
    assert sorted(dec) == [0, 1] and dec[0].shape == (3, 8)
    steps = t.steps()
    assert [(s.pass_, s.layer) for s in steps] == [(p, il) for p in range(4) for il in (0, 1)]
    assert all(len(set(s.experts)) == len(s.experts) for s in steps)


def test_cli_run_writes_a_trace(small_moe, tmp_path):
    from ramforge.cli import cli
    out = tmp_path / "run.npz"
    r = CliRunner().invoke(cli, ["run", str(small_moe), "-p", "Hello there", "-n", "3", "--temp", "0", "--json",
                                 "--threads", "1", "--trace-routing", str(out)])
    assert r.exit_code == 0, r.output
    t = Trace.load(out)
    res = json.loads(r.output.strip().splitlines()[-1])
    assert res["n_completion"] == 3 and res["n_prompt"] > 1
    assert len(np.unique(t.pass_)) == 1 + 2          # the prompt, then the first 2 tokens (the last is not run)
    assert len(t.decode_rows()[0]) == 2 and (t.pass_ == 0).sum() == res["n_prompt"] + 1   # last layer: its output row


def test_dense_model_refused(tmp_path):
    class Dense:
        hp = type("hp", (), {"n_expert": 0, "arch": "llama"})()
        path = "dense.gguf"
    with pytest.raises(InvalidArgument, match="no experts"):
        routing_trace.attach(Dense(), tmp_path / "x.npz")


def _trace(passes: list[list[list[int]]], n_expert: int = 8, k: int = 1) -> Trace:
    """passes[p][layer] = the ids of that layer's rows (k each)."""
    ids, layer, pass_, row = [], [], [], []
    for p, layers in enumerate(passes):
        for il, sel in enumerate(layers):
            sel = np.asarray(sel).reshape(-1, k)
            ids.append(sel)
            layer += [il] * len(sel)
            pass_ += [p] * len(sel)
            row += list(range(len(sel)))
    return Trace(np.concatenate(ids).astype(np.int16), np.array(layer, np.int16), np.array(pass_, np.int32),
                 np.array(row, np.int32), n_expert, len(passes[0]), k, "hand")


SEQ = [0, 1, 2, 0, 1, 3, 0]          # A B C A B D A, one layer, one expert a token


def test_replay_known_counts():
    t = _trace([[[e]] for e in SEQ])
    by = {(r.policy, r.layout): (r.hits, r.misses) for r in replay(t, 2, POLICIES, shared=True)}
    assert by["lru", "per-layer"] == (0, 7)          # every use evicted just before it comes back
    assert by["belady", "per-layer"] == (2, 5)       # keeps A: hits the 4th and 7th
    assert by["static", "per-layer"] == (5, 2)       # A and B pinned (the most used, in-sample): C and D miss
    r3 = {r.policy: (r.hits, r.misses) for r in replay(t, 3, ("lru", "belady"), shared=False)}
    assert r3 == {"lru": (3, 4), "belady": (3, 4)}
    # layers alike: a shared pool of 3 x 2 slots is two per-layer caches of 3
    t2 = _trace([[[e], [e + 4]] for e in SEQ])
    by2 = {r.layout: r.hits for r in replay(t2, 3, ("lru",), shared=True)}
    assert by2 == {"per-layer": 6, "shared": 6}
    # layer 0 needs one slot, layer 1 cycles three experts: a shared pool lends layer 0's spare slot
    t3 = _trace([[[0], [i % 3]] for i in range(7)])
    by3 = {r.layout: r.hits for r in replay(t3, 2, ("lru",), shared=True)}
    assert by3 == {"per-layer": 6, "shared": 6 + 4}


def test_static_calibrated_on_another_trace():
    # pinned by another text's counts (out of sample): C and D were the most used there, so A and B miss here
    t = _trace([[[e]] for e in SEQ])
    other = _trace([[[e]] for e in [2, 3, 2, 3, 0]])
    by = {r.layout: (r.hits, r.misses) for r in replay(t, 2, ("static",), shared=True, calibrate=other)}
    assert by == {"per-layer": (2, 5), "shared": (2, 5)}
    # a layer's pins come from that layer's counts only, per layer and shared alike
    t2 = _trace([[[e], [e + 4]] for e in SEQ])
    other2 = _trace([[[0], [4]], [[1], [4]], [[0], [6]]])
    by2 = {r.layout: r.hits for r in replay(t2, 1, ("static",), shared=True, calibrate=other2)}
    assert by2 == {"per-layer": 3 + 3, "shared": 3 + 3}      # layer 0 pins A (3 hits), layer 1 pins A' (3)


def test_replay_prefill_warms_but_is_not_counted():
    t = _trace([[[0, 1]], [[0]], [[1]], [[2]]])          # a 2-row prefill, then 3 decode steps
    r = replay(t, 2, ("lru",), shared=False)[0]
    assert (r.hits, r.misses) == (2, 1)
    r = replay(t, 2, ("lru",), shared=False, count="all")[0]
    assert (r.hits, r.misses) == (2, 3)


def test_belady_is_never_beaten():
    rng = np.random.default_rng(3)
    pop = rng.dirichlet(np.full(16, 0.3))
    passes = [[rng.choice(16, 4, replace=False, p=pop).tolist() for _ in range(3)] for _ in range(120)]
    t = _trace(passes, n_expert=16, k=4)
    for slots in (4, 6, 8, 12):
        res = replay(t, slots, POLICIES, shared=True)
        for layout in ("per-layer", "shared"):
            rate = {r.policy: r.hit_rate for r in res if r.layout == layout}
            assert rate["belady"] >= max(rate["lru"], rate["lfu"]) - 1e-12, (slots, layout, rate)
            assert 0 < rate["lru"] < 1


def test_lfu_keeps_the_frequent_expert():
    seq = [0, 0, 0, 1, 2, 0]                          # 2 evicts 0 under LRU, 1 under LFU
    steps, counted, tokens = _flat(seq)
    assert simulate(steps, 2, "lru", counted, tokens) == (2, 4)
    assert simulate(steps, 2, "lfu", counted, tokens) == (3, 3)
    assert simulate(steps, 2, "lfu", counted, tokens, half_life=0.01) == (2, 4)   # forgets at once: LRU


def _flat(seq):
    from ramforge.models.routing_trace import Step
    return [Step(i, 0, 1, (e,)) for i, e in enumerate(seq)], [True] * len(seq), [float(i + 1) for i in range(len(seq))]


def test_replay_cli(tmp_path, capsys):
    t = _trace([[[e]] for e in SEQ])
    path = tmp_path / "h.npz"
    np.savez(path, ids=t.ids, layer=t.layer, pass_=t.pass_, row=t.row, n_expert=8, n_layer=1, k=1, model="hand")
    assert replay_main([str(path), "--slots", "3", "--policies", "lru", "belady", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    assert [(r["policy"], r["hits"]) for r in res] == [("lru", 3), ("belady", 3)]
    assert replay_main([str(path), "--slots", "3", "--policies", "lfu", "--half-life", "0.01", "64", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"]
    assert [r["half_life"] for r in res] == [0.01, 64]
    with pytest.raises(SystemExit):
        replay_main([str(path), "--slots", "3", "--half-life", "0"])
    with pytest.raises(SystemExit):
        replay_main([str(path), "--slots", "9"])
    assert replay_main([str(path), "--slots", "2", "--policies", "static", "--calibrate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["calibration"] == str(path) and [r["hits"] for r in out["results"]] == [5]   # its own counts: in-sample
    two = tmp_path / "two.npz"
    np.savez(two, ids=t.ids, layer=t.layer, pass_=t.pass_, row=t.row, n_expert=8, n_layer=2, k=1, model="hand")
    with pytest.raises(SystemExit):
        replay_main([str(path), "--slots", "2", "--calibrate", str(two)])
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(InvalidArgument, match="not a routing trace"):
        Trace.load(tmp_path / "bad.npz")


def test_per_step_misses_and_the_causal_bound(tmp_path):
    """simulate's per-step misses sum to its total; tools.moe_bound replays a trace's measured decode
    steps (after the warm-up) and bounds a token at D + sum over layers of max(E/L, m x + E/(L k))."""
    from tools.moe_bound import causal_bound, replay as bound_replay

    steps, counted, tokens = _flat([0, 0, 0, 1, 2, 0])
    for policy in POLICIES:
        per: list[int] = []
        _, misses = simulate(steps, 2, policy, counted, tokens, per)
        assert len(per) == len(steps) and sum(per) == misses
    # 2 layers, 1 expert a token: a prefill pass, then decode passes (the first is the warm-up)
    t = _trace([[[0, 1], [0, 1]], [[0], [2]], [[0], [3]], [[1], [2]]], n_expert=4, k=1)
    path = tmp_path / "t.npz"
    np.savez(path, ids=t.ids, layer=t.layer, pass_=t.pass_, row=t.row, n_expert=4, n_layer=2, k=1, model="hand")
    # LRU, 4 slots: the prompt fills them; the warm-up's (1,2) evicts (0,1), then (1,3) evicts (1,0):
    # measured (layer 0, layer 1) misses (0, 1) and (1, 0)
    r = bound_replay(path, 4, "lru")
    assert (r.n_tokens, r.n_layers, r.misses) == (2, 2, [0, 1, 1, 0])
    # in RAM 10 s a token, 4 of them in experts (2 a layer); an expert reads in 3 s
    assert causal_bound(10.0, 4.0, 1, 3.0, r) == pytest.approx(6 + (2 + (3 + 2) + (3 + 2) + 2) / 2)
