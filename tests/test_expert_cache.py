"""The expert cache (stream/experts.py): eviction policies, read-ahead from the next layer's router,
the figures it reports, and that none of it changes a logit or leaks a budget charge."""
from __future__ import annotations

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.gguf.reader import GGUFFile
from ramforge.errors import InvalidArgument, RamforgeError
from ramforge.memory import MemoryBudget
from ramforge.models.weights import EXPERT_TENSORS
from ramforge.stream.layout import expert_span
from ramforge.stream.plan import plan_for_budget
from ramforge.profiling import ExpertRecord
from ramforge.stream.experts import HALF_LIFE, ExpertCache, Policy
from ramforge.stream.io import ModelFile


@pytest.fixture(scope="module")
def moe():
    from tools.make_models import ensure_model

    return ensure_model("qwen3moe", "F16")


@pytest.fixture
def cache(moe):
    """A factory: ExpertCache(layers, n_slots, policy) over the model file, closed afterwards."""
    from ramforge.gguf.reader import GGUFFile

    made, mf = [], ModelFile(str(moe), "buffered")
    f = GGUFFile(moe)

    def make(layers, n_slots, policy="lru"):
        slot = max(expert_span(_tensors(f, il), e).nbytes for il in layers for e in range(16))
        made.append(ExpertCache(f, mf, layers, n_slots, slot, policy))
        return made[-1]
    make.f = f
    yield make
    for c in made:
        c.close()
    mf.close()
    f.close()


def _tensors(f, il):
    return [f.tensors[f"blk.{il}.{s}.weight"] for s in EXPERT_TENSORS]


def _turn(c, il, ids, n_tokens=1, predict=None):
    """One layer's turn: take every picked expert; returns the record and {e: (gate, up, down) bytes}."""
    rec, got = ExpertRecord(il), {}
    order = c.layer(il, np.asarray(ids), n_tokens, rec)
    try:
        if predict is not None:
            c.predict(il + 1, predict, rec)
        for k in order:
            got[k[1]] = tuple(t.data.copy() for t in c.take(k, rec))
    finally:
        c.end(rec)
    return rec, got


def _settle(c):
    """Wait for every read begun. Else whether a wrong read-ahead is still queued (cancelled, so its guess
    stays uncached and lowers the precision again next turn) or done (cached: scored once) is the runner's
    timing, and so is whether precision keeps reads ahead off later."""
    from concurrent.futures import wait

    wait(list(c._loading.values()))


@pytest.mark.parametrize("policy,kept,evicted", [("lru", 1, 0), ("lfu", 0, 1)])
def test_eviction_policy(cache, moe, policy, kept, evicted):
    c = cache(range(1, 2), 2, policy)
    for ids in ([0], [0], [1]):
        _turn(c, 1, ids)
    rec, got = _turn(c, 1, [2])          # 0 was used twice, 1 last: LRU drops 0, LFU drops 1
    assert (1, kept) in c and (1, evicted) not in c and (1, 2) in c
    assert (rec.hits, rec.misses) == (0, 1) and (c.totals.hits, c.totals.misses) == (1, 3)
    for t, raw in zip(_tensors(cache.f, 1), got[2]):          # expert 2's bytes, as the file holds them
        per = t.nbytes // t.dims[2]
        assert np.array_equal(raw, np.fromfile(moe, np.uint8, count=per, offset=t.offset + 2 * per))
    assert c.totals.bytes_read == sum(expert_span(_tensors(cache.f, 1), e).nbytes for e in (0, 1, 2))


def test_lfu_forgets_old_uses(cache):
    c = cache(range(1, 2), 2, "lfu")
    for _ in range(3):
        _turn(c, 1, [0])
    _turn(c, 1, [1], n_tokens=int(6 * HALF_LIFE))   # a long prompt later, 0's three uses weigh ~3/64
    _turn(c, 1, [1])
    _turn(c, 1, [2])
    assert (1, 0) not in c and (1, 1) in c


@pytest.mark.parametrize("seed", range(6))
def test_compiled_eviction_steps_equal_their_numpy_reference(seed):
    """stream/eviction.py's count_uses and pick_victim against the NumPy arithmetic they replace: the same
    decayed counts within an ulp (NumPy's exp2 and the compiled one may round apart), and the same slot (LFU: lowest count within 1e-9, then least recently used,
    then the lowest slot; LRU: least recently used), on states with ties, held slots and repeated ids."""
    from ramforge.stream.eviction import count_uses, pick_victim

    rng = np.random.default_rng(seed)
    n_layers, n_exp, n = 3, 16, 40
    freq = rng.integers(0, 3, (n_layers, n_exp)).astype(np.float64)    # small integers: ties are common
    freq_t = rng.integers(0, 50, (n_layers, n_exp)).astype(np.float64)
    want_f, want_t = freq.copy(), freq_t.copy()
    for now in (50.0, 51.0, 120.0):
        ids = rng.integers(0, n_exp, 5).astype(np.int64)                 # repeats count once, as NumPy's
        count_uses(freq, freq_t, 1, ids, now, HALF_LIFE)
        want_f[1, ids] = want_f[1, ids] * np.exp2((want_t[1, ids] - now) / HALF_LIFE) + 1.0
        want_t[1, ids] = now
        assert np.allclose(freq, want_f, rtol=2.3e-16, atol=0) and np.array_equal(freq_t, want_t)
    where = np.stack([rng.integers(0, n_layers, n), rng.integers(0, n_exp, n)], 1).astype(np.int64)
    used = rng.integers(0, 8, n).astype(np.float64)                     # ties in recency too
    for held in (rng.random(n) < 0.5, np.zeros(n, bool), np.arange(n) != 7, np.ones(n, bool)):
        for lfu in (True, False):
            cand = np.flatnonzero(~held)
            if cand.size == 0:
                want = -1
            else:
                if lfu:
                    r, e = where[cand, 0], where[cand, 1]
                    score = freq[r, e] * np.exp2((freq_t[r, e] - 130.0) / HALF_LIFE)
                    cand = cand[score <= score.min() * (1 + 1e-9)]
                want = int(cand[np.argmin(used[cand])])
            assert pick_victim(held, where, freq, freq_t, 130.0, HALF_LIFE, used, lfu) == want


def test_more_picks_than_slots_are_read_as_slots_free(cache):
    c = cache(range(1, 2), 2)
    rec, got = _turn(c, 1, [3, 5, 7, 9, 11])
    assert sorted(got) == [3, 5, 7, 9, 11] and rec.misses == 5 and c.n_slots == 2
    whole = _tensors(cache.f, 1)
    for e, raw in got.items():
        per = whole[0].nbytes // whole[0].dims[2]
        assert np.array_equal(raw[0], np.fromfile(cache.f.path, np.uint8, count=per, offset=whole[0].offset + e * per))


def test_a_prompts_misses_are_taken_a_batch_of_finished_reads_at_a_time(cache):
    """take_arrived hands the next miss, awaited, with every other whose read has finished, each at its
    offsets in the pool holding the file's bytes; slots freed by `release` take the misses still waiting.
    Where the next cannot have a slot until an expert held in the turn is given up, it hands none."""
    c = cache(range(1, 2), 3)
    rec = ExpertRecord(1)
    order = c.layer(1, np.array([3, 5, 7, 9, 11]), 4, rec)
    assert len(c.take_ready(order, rec)) == 0 and rec.misses == 5
    left, sizes, whole = list(order), [], _tensors(cache.f, 1)
    while left:
        _settle(c)                                        # every read begun has finished: one batch of them
        got = c.take_arrived(left, rec)
        assert got and got.keys[0] == left[0] and got.offs.shape == (3, len(got)) and got.offs.flags.c_contiguous
        sizes.append(len(got))
        for j, (il, e) in enumerate(got.keys):
            assert not got.packed[j] and c.layout(c._slot[(il, e)]) == (0, 0, 0)   # F16: no repacked layout
            for t, o in zip(whole, got.offs[:, j].tolist()):
                per = t.nbytes // t.dims[2]
                assert np.array_equal(c.pool[o:o + per], np.fromfile(cache.f.path, np.uint8, count=per, offset=t.offset + e * per))
        c.release(got.keys, rec)
        left = [k for k in left if k not in set(got.keys)]
    c.end(rec)
    assert sizes == [3, 2] and len(c.take_arrived([], rec)) == 0
    assert rec.bytes_read == sum(expert_span(whole, e).nbytes for e in (3, 5, 7, 9, 11))

    one = cache(range(1, 2), 1)
    rec = ExpertRecord(1)
    order = one.layer(1, np.array([3, 5]), 2, rec)        # 3 holds the one slot until taken
    try:
        assert len(one.take_arrived(order[1:], rec)) == 0
        assert one.take_arrived(order, rec).keys == [(1, 3)]
        one.release([(1, 3)], rec)
        assert one.take_arrived(order[1:], rec).keys == [(1, 5)]
    finally:
        one.end(rec)


def test_prediction_reads_ahead_and_is_scored(cache):
    c = cache(range(0, 2), 4)
    rec0, _ = _turn(c, 0, [0], predict=[1, 2])          # two slots free: both read ahead
    assert rec0.prefetch_issued == 2 and (1, 1) in c and (1, 2) in c
    rec1, _ = _turn(c, 1, [1, 3])
    assert (rec1.prefetch_hits, rec1.prefetch_wasted, rec1.misses, rec1.hits) == (1, 1, 1, 0)
    assert (rec1.predicted, rec1.predicted_right) == (2, 1)
    assert (rec1.unseen_guessed, rec1.unseen_right) == (2, 1)        # both guesses were reads; one was picked
    t = c.totals.as_dict()
    assert t["prediction_rate"] == 0.5 and t["hit_rate"] == pytest.approx(1 / 3) and t["unseen_precision"] == 0.5
    _turn(c, 0, [0], predict=[1, 3, 4])                  # 1 and 3 cached: only 4 would be read
    rec1, _ = _turn(c, 1, [1, 3])
    assert (rec1.predicted, rec1.predicted_right, rec1.unseen_guessed, rec1.unseen_right) == (2, 2, 1, 0)


def test_wrong_guesses_stop_the_reads_ahead_but_not_the_scoring(cache):
    from ramforge.stream.experts import ACCURACY_TURNS, READ_AHEAD_FROM

    c = cache(range(0, 2), 8)
    skipped = 0
    for t in range(2 * ACCURACY_TURNS):
        rec0, _ = _turn(c, 0, [0], predict=[5, 6])
        _settle(c)
        rec1, _ = _turn(c, 1, [1, 2])                     # never what was guessed
        skipped += rec0.prefetch_skipped
        assert rec1.predicted == 2 and rec1.predicted_right == 0
    assert c.accuracy < READ_AHEAD_FROM and skipped > 0 and rec0.prefetch_issued == 0
    for t in range(2 * ACCURACY_TURNS):                   # right again: reads ahead resume
        _turn(c, 0, [0], predict=[1, 2])
        _turn(c, 1, [1, 2])
    assert c.accuracy >= READ_AHEAD_FROM
    rec0, _ = _turn(c, 0, [0], predict=[3])
    assert rec0.prefetch_issued == 1 and rec0.prefetch_skipped == 0


def test_while_reads_ahead_are_off_one_turn_in_guess_every_still_guesses(cache):
    """A guess costs a router's matvec a layer: every turn asks wants_guess once; while reads ahead are on,
    every turn guesses; once wrong guesses turn them off, one turn in GUESS_EVERY does (and is scored), and
    when those guesses are right again, every turn guesses again."""
    from ramforge.stream.experts import GUESS_EVERY, READ_AHEAD_FROM

    c = cache(range(0, 2), 8)
    assert all(c.wants_guess() for _ in range(3 * GUESS_EVERY))
    while c.accuracy >= READ_AHEAD_FROM:
        _turn(c, 0, [0], predict=[5, 6])
        _settle(c)
        _turn(c, 1, [1, 2])                               # never what was guessed
    asked = [c.wants_guess() for _ in range(4 * GUESS_EVERY)]
    assert sum(asked) == 4 and all(asked[i] == (i % GUESS_EVERY == GUESS_EVERY - 1) for i in range(len(asked)))
    turns = 0
    while c.accuracy < READ_AHEAD_FROM:                   # the sampled turns' guesses, right again
        turns += 1
        guess = c.wants_guess()
        _turn(c, 0, [0], predict=[1, 2] if guess else None)
        _turn(c, 1, [1, 2])
    assert turns >= GUESS_EVERY and all(c.wants_guess() for _ in range(GUESS_EVERY))
    c.prefetch = False
    assert not c.wants_guess()


def _predict_with_reads_held(c, monkeypatch, ids):
    """Layer 0 takes expert 0, then guesses layer 1's `ids`: the reads of those wait at a gate (the
    returned threading.Event), so they are in flight, or queued behind the readers, until it is set."""
    import threading

    hold, gate, real = threading.Event(), threading.Event(), c.file.read_into

    def slow(off, out):
        if hold.is_set():
            gate.wait(10)
        return real(off, out)
    monkeypatch.setattr(c.file, "read_into", slow)
    rec0 = ExpertRecord(0)
    for k in c.layer(0, np.array([0]), 1, rec0):
        c.take(k, rec0)
        hold.set()
        c.predict(1, ids, rec0)
    c.end(rec0)
    return rec0, gate


def test_a_wasted_read_ahead_still_queued_is_cancelled(cache, monkeypatch):
    from ramforge.stream.experts import READERS

    c = cache(range(0, 2), 8)
    rec0, gate = _predict_with_reads_held(c, monkeypatch, [4, 5, 6, 7])   # up to READERS start; the rest queue
    rec1 = ExpertRecord(1)
    order = c.layer(1, np.array([1]), 1, rec1)        # the queued ones are cancelled here
    gate.set()
    for k in order:
        c.take(k, rec1)
    c.end(rec1)
    assert rec0.prefetch_issued == 4 and rec1.prefetch_wasted == 4 and rec1.misses == 1
    read = sum((1, e) in c for e in (4, 5, 6, 7))     # begun before layer 1's turn: at most one per reader
    assert read <= READERS
    assert rec1.bytes_read == (read + 1) * expert_span(_tensors(cache.f, 1), 1).nbytes


def test_prediction_never_takes_this_layers_slots(cache):
    c = cache(range(0, 2), 2)
    rec = ExpertRecord(0)
    order = c.layer(0, np.array([4, 6]), 1, rec)
    c.predict(1, [1, 2], rec)                             # both slots hold layer 0's picks
    assert rec.prefetch_issued == 0
    for k in order:
        c.take(k, rec)
    c.end(rec)
    assert (0, 4) in c and (0, 6) in c


def test_a_failed_read_frees_its_slot_and_the_next_turn_works(cache, monkeypatch):
    c = cache(range(1, 2), 2)
    real = c.file.read_into
    monkeypatch.setattr(c.file, "read_into", lambda off, out: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(OSError):
        _turn(c, 1, [0])
    monkeypatch.setattr(c.file, "read_into", real)
    assert (1, 0) not in c
    rec, got = _turn(c, 1, [0, 1])
    assert rec.misses == 2 and sorted(got) == [0, 1]


def test_the_pool_is_in_memory_from_the_start(cache):
    """Every slot's pages are faulted in when the cache is made (stream.io.populate), not by a decode's reads."""
    from ramforge.stream.io import memory_residency

    c = cache(range(2), 5)
    assert memory_residency(c.pool) == c.pool.nbytes


def test_cache_refuses_what_it_cannot_hold(cache):
    c = cache(range(1, 2), 2)
    with pytest.raises(RamforgeError, match="out of range"):
        _turn(c, 1, [16])
    with pytest.raises(RamforgeError, match="no experts"):
        _turn(c, 0, [0])
    with pytest.raises(InvalidArgument, match="lru, lfu"):
        Policy.parse("fifo")


# ---- in the engine ---------------------------------------------------------------------------

def _budget(moe):
    """A budget whose expert cache holds about half of the model's experts (25 of 48)."""
    from ramforge.gguf.reader import GGUFFile

    with GGUFFile(moe) as f:
        return plan_for_budget(f, None, 128, batch=64).min_budget + (10 << 20)


@pytest.mark.parametrize("policy,prefetch", [("lru", True), ("lfu", False), ("lfu", True)])
def test_policy_and_prefetch_never_change_a_logit(moe, policy, prefetch):
    toks = list(range(3, 30))
    with Engine.load(moe, n_ctx=128, batch=64) as eng:
        want = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (7, 8, 9, 10)]
    b = MemoryBudget(_budget(moe))
    with Engine.load(moe, n_ctx=128, budget=b, batch=64, expert_policy=policy, expert_prefetch=prefetch) as eng:
        got = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (7, 8, 9, 10)]
        c, t = eng.weights.expert_cache, eng.weights.expert_cache.totals
        assert c.policy.value == policy and b.peak == eng.plan.planned_peak
        picks = eng.hp.n_expert_used * 4 * (eng.hp.n_layer)      # the 4 decode tokens alone
        assert t.hits + t.prefetch_hits + t.misses >= picks
        if prefetch:
            assert t.predicted > 0 and 0 < t.predicted_right <= t.predicted
        else:
            assert t.predicted == t.prefetch_issued == t.prefetch_hits == 0
    assert b.current == 0 and b.charges() == []
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_profile_reports_experts_per_layer(moe):
    from ramforge.profiling import PROFILE

    b = MemoryBudget(_budget(moe))
    with Engine.load(moe, n_ctx=128, budget=b, batch=64) as eng:
        PROFILE.enabled = True
        PROFILE.reset()
        try:
            list(eng.generate([1, 5, 9, 14], 4))
            s = PROFILE.summary()
        finally:
            PROFILE.enabled = False
        decode = [p for p in s["passes"] if p["kind"] == "decode"]
        assert decode and all(len(p["experts"]) == eng.hp.n_layer for p in decode)
        r = decode[-1]["experts"][1]
        assert r["layer"] == 1 and r["hits"] + r["prefetch_hits"] + r["misses"] == eng.hp.n_expert_used
        e = s["experts"]
        assert e["bytes_read"] == sum(x["bytes_read"] for p in s["passes"] for x in p["experts"])
        assert e == {**eng.weights.expert_cache.totals.as_dict(), "layer": "all"}


def test_plan_counts_experts(moe):
    from ramforge.gguf.reader import GGUFFile

    with GGUFFile(moe) as f:
        full = plan_for_budget(f, None, 128)
        p = plan_for_budget(f, _budget(moe), 128)
        half = plan_for_budget(f, _budget(moe), 128, hit_rate=0.5)
        with pytest.raises(InvalidArgument, match="fraction"):
            plan_for_budget(f, None, 128, hit_rate=1.5)
        hp_k, n_e = f.metadata["qwen3moe.expert_used_count"], f.metadata["qwen3moe.expert_count"]
        n_layer = f.metadata["qwen3moe.block_count"]
        experts = sum(t.nbytes for n, t in f.tensors.items() if "_exps" in n)
        embd = f.tensors["token_embd.weight"]
        row = embd.nbytes // embd.dims[1]         # the token's embedding row (tied: the output matrix too)
    assert full.active_bytes_per_token == p.active_bytes_per_token < full.model_bytes
    assert full.active_bytes_per_token == full.model_bytes - experts + experts * hp_k // n_e + row
    assert p.experts_apart and p.predictor_bytes > 0 and hp_k < p.expert_slots < n_layer * n_e
    assert p.expert_hit_rate == pytest.approx(min(1, p.expert_slots / (n_layer * n_e)))
    misses = n_layer * hp_k * p.expert_slot_bytes
    assert half.expected_bytes_per_token == p.streamed_bytes_per_token - misses + misses // 2
    assert p.to_json()["expected_bytes_per_token"] == p.expected_bytes_per_token


def test_a_running_wasted_read_ahead_keeps_its_slot(cache, monkeypatch):
    """A read-ahead that turned out wasted but is still being read keeps its slot until the read ends,
    so no other expert is read into the same buffer meanwhile; every expert taken holds its own bytes."""
    import threading

    c = cache(range(0, 2), 2)
    _, gate = _predict_with_reads_held(c, monkeypatch, [4])   # the other slot: its read waits at the gate
    threading.Timer(0.3, gate.set).start()
    rec1, got = _turn(c, 1, [1, 2])
    assert rec1.prefetch_wasted == 1 and rec1.misses == 2
    t = _tensors(cache.f, 1)
    for e in (1, 2):
        for tensor, raw in zip(t, got[e]):
            per = tensor.nbytes // tensor.dims[2]
            assert np.array_equal(raw, np.fromfile(cache.f.path, np.uint8, count=per, offset=tensor.offset + e * per))


# ---- repacked on arrival ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def moe_q4k(tmp_path_factory):
    """Two layers of the Qwen3-30B-A3B shape, small (tools/make_direct: Q4_K gate/up, Q4_K or Q6_K down)."""
    from tools import make_direct as md

    p = md.resolve("qwen3moe-30b-a3b", layers=2, shape={"n_embd": 256, "n_head": 4, "n_head_kv": 2,
                                                       "head_dim": 64, "n_ff_exp": 256, "n_expert": 16})
    return md.write_direct(p, tmp_path_factory.mktemp("direct") / md.default_name(p), progress=False)


@pytest.mark.parametrize("repacked", [True, pytest.param(False, marks=pytest.mark.slow)])   # (file order: its own compiles)
def test_cached_experts_are_repacked_and_every_logit_stays(moe_q4k, repacked, monkeypatch):
    """The cache repacks each Q4_K expert matrix in its slot at the expert's second use since its read
    (kernels.repack's layout, as a pinned layer's), the kernels read each expert as it lies, and the logits
    equal the in-RAM engine's bit for bit, as they do with the experts left in file order
    (RAMFORGE_NO_REPACK_EXPERTS)."""
    from ramforge.gguf.constants import GGMLType
    from ramforge.kernels.repack import repack_group
    from ramforge.stream import weights

    monkeypatch.setattr(weights, "REPACK_EXPERTS", repacked)
    toks = [1, 17, 300, 4000, 52, 9, 77, 1000]
    with Engine.load(moe_q4k, n_ctx=64, batch=64) as eng:
        want = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (5, 6, 7, 8, 9)]
    with GGUFFile(moe_q4k) as f:
        p = plan_for_budget(f, None, 64, batch=64)
        b = MemoryBudget(plan_for_budget(f, p.min_budget, 64, batch=64).min_budget + (1 << 20))
    with Engine.load(moe_q4k, n_ctx=64, budget=b, batch=64) as eng:
        c = eng.weights.expert_cache
        assert c is not None and c.n_slots < eng.hp.n_layer * eng.hp.n_expert
        for il, ts in c.tensors.items():
            want_reps = tuple(repack_group(t.dims[1]) if repacked and t.ggml_type == GGMLType.Q4_K else 0 for t in ts)
            assert c.reps[il] == want_reps and (not repacked or want_reps[0] > 0)   # (16 or 8: the target's group)
        warm = {shape[5] for shape in eng.weights.expert_shapes()}     # what serve warms: both layouts a cached
        assert warm == {c.reps[il] for il in c.reps} | {(0, 0, 0)}      # expert takes
        got = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (5, 6, 7, 8, 9)]
        assert c.totals.misses > 0 and c.totals.hits > 0
        # the experts used since their read (whether a read ahead left unused was cancelled is the reader's timing):
        # those used twice are repacked, and the take below is each one's second use at least
        held = [sl for sl in range(c.n_slots) if c._key[sl] is not None and c._uses[sl] > 0]
        assert any(c.layout(sl) != (0, 0, 0) for sl in held) == repacked
        for il, e in (c._key[held[0]], c._key[held[-1]]):
            rec = ExpertRecord(il)
            c.layer(il, np.array([e]), 1, rec)
            try:
                gate = c.take((il, e), rec)[0]
                assert gate.repacked == c.layout(c._slot[(il, e)])[0] == (c.reps[il][0] if repacked else 0)
                t = c.tensors[il][0]
                raw = np.fromfile(moe_q4k, np.uint8, count=gate.data.size, offset=t.offset + e * gate.data.size)
                assert np.array_equal(gate.data, raw) != repacked      # repacked in the slot, or the file's bytes
            finally:
                c.end(rec)
    assert b.current == 0 and b.charges() == []
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


@pytest.mark.parametrize("repacked", [True, False])          # (file order: the kernels a first use compiles)
def test_a_prefill_runs_the_cached_experts_and_the_arrivals_in_batches(moe_q4k, repacked, monkeypatch):
    """A prompt of several tokens through the expert cache runs its experts as fused_moe.run_batch calls
    over the pool (a lone token's as fused_moe.run calls): the cached ones, repacked (used twice since their read) and in file order, then the
    misses a batch of finished reads at a time, never expert by expert; experts past TILED_FROM rows take
    Q6_K down's tiled matmul (RAMFORGE_NO_REPACK_EXPERTS: file order alone). Every logit equals the in-RAM
    engine's bit for bit."""
    from ramforge.gguf.constants import GGMLType
    from ramforge.models import moe
    from ramforge.stream import weights

    monkeypatch.setattr(weights, "REPACK_EXPERTS", repacked)

    prompts = [[1, 17, 300, 4000, 52, 9, 77, 1000], [5, 6], list(range(40, 64)), [7], list(range(90, 102))]
    with Engine.load(moe_q4k, n_ctx=128, batch=64) as eng:
        want = [eng.eval(p, all_logits=True) for p in prompts]
    with GGUFFile(moe_q4k) as f:
        p = plan_for_budget(f, None, 128, batch=64)
        b = MemoryBudget(plan_for_budget(f, p.min_budget, 128, batch=64).min_budget + (1 << 20))
    calls, taken, alone = [], [], []
    real_batch, real_take = moe._pool_batch, ExpertCache.take
    monkeypatch.setattr(moe, "_pool_batch", lambda kern, reps, *a: (calls.append((reps, len(a[3]))), real_batch(kern, reps, *a)))
    monkeypatch.setattr(ExpertCache, "take", lambda self, *a: (taken.append(a[0]), real_take(self, *a))[1])
    real_rows = moe._expert_rows
    monkeypatch.setattr(moe, "_expert_rows", lambda y, x, t: (alone.append(t.ggml_type), real_rows(y, x, t))[1])
    with Engine.load(moe_q4k, n_ctx=128, budget=b, batch=64) as eng:
        c = eng.weights.expert_cache
        assert c is not None and c.n_slots < eng.hp.n_layer * eng.hp.n_expert
        got, layouts = [], []
        for p in prompts:
            calls.clear(), taken.clear()
            got.append(eng.eval(p, all_logits=True))
            assert not taken                                  # no expert taken one at a time
            if len(p) > 1:
                assert calls
                assert any(m > 1 for _, m in calls)           # several experts in one call
                layouts.append({reps for reps, _ in calls})
        if repacked:
            assert any((0, 0, 0) in ls and ls & set(c.reps.values()) for ls in layouts)   # both layouts in a prefill
        else:
            assert set().union(*layouts) == {(0, 0, 0)}
        assert set(alone) == {GGMLType.Q6_K}                  # down's tiled matmul, for experts of 8+ rows
        t = c.totals
        assert t.misses > 0 and t.hits > 0 and t.bytes_read > 0
    assert b.current == 0 and b.charges() == []
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_reads_ahead_stop_while_the_guesses_not_cached_are_missed(cache, monkeypatch):
    """Guesses naming cached experts rightly keep the accuracy high, but when the guesses a read would fetch
    (those not cached) are seldom picked (READ_AHEAD_PRECISION), they are not read (counted as skipped);
    the cached ones are still kept, and reads resume once such guesses are picked again."""
    from ramforge.stream import experts
    from ramforge.stream.experts import ACCURACY_TURNS, READ_AHEAD_FROM

    monkeypatch.setattr(experts, "READ_AHEAD_PRECISION", 0.5)
    c = cache(range(0, 2), 8)
    _turn(c, 1, [1, 2])
    for t in range(2 * ACCURACY_TURNS):                   # 1, 2 cached and right; the third never picked
        _turn(c, 0, [0], predict=[1, 2, 5 + t % 11])
        _turn(c, 1, [1, 2])
    assert c.accuracy >= READ_AHEAD_FROM and c.precision < experts.READ_AHEAD_PRECISION
    rec0, _ = _turn(c, 0, [0], predict=[1, 2, 4])         # 4: never read (an earlier wasted read-ahead of 5-15
    _turn(c, 1, [1, 2])                                   # may still hold its slot, then it is no read to skip)
    assert (rec0.prefetch_issued, rec0.prefetch_skipped) == (0, 1)
    rec0 = ExpertRecord(0)
    c.layer(0, np.array([0]), 1, rec0)
    c.predict(1, np.array([1, 2, 3]), rec0)
    assert {c._slot[(1, 1)], c._slot[(1, 2)]} <= set(c._kept.values())   # cached guesses still kept
    c.end(rec0)
    _turn(c, 1, [1, 2, 3])
    for t in range(2 * ACCURACY_TURNS):                   # guesses not cached, and picked: reads resume
        e = 4 + t % 11
        _turn(c, 0, [0], predict=[1, 2, e])
        _turn(c, 1, [1, 2, e])
    assert c.precision >= experts.READ_AHEAD_PRECISION
    assert (1, 15) not in c
    rec0, _ = _turn(c, 0, [0], predict=[1, 2, 15])
    assert (rec0.prefetch_issued, rec0.prefetch_skipped) == (1, 0) and (1, 15) in c


def test_handed_experts_go_a_layout_at_a_time():
    """Handed.by_layout: one call for a turn of one layout, else the repacked ones, then those in file order,
    each with its experts' offsets as contiguous i64 rows (the kernels' offsets)."""
    from ramforge.stream.expert_view import NONE_HANDED, Handed

    offs = np.arange(12, dtype=np.int64).reshape(3, 4)
    one = list(Handed([(2, 7), (2, 1), (2, 5), (2, 3)], offs, np.ones(4, bool)).by_layout())
    assert len(one) == 1 and one[0][0] is True and one[0][1] == [7, 1, 5, 3] and one[0][2] is offs
    two = list(Handed([(2, 7), (2, 1), (2, 5), (2, 3)], offs, np.array([False, True, False, True])).by_layout())
    assert [(p, e) for p, e, _ in two] == [(True, [1, 3]), (False, [7, 5])]
    assert np.array_equal(two[0][2], offs[:, [1, 3]]) and np.array_equal(two[1][2], offs[:, [0, 2]])
    assert all(o.flags.c_contiguous and o.dtype == np.int64 for _, _, o in two)
    assert list(NONE_HANDED.by_layout()) == []
