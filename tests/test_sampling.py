"""The sampler against small references written from llama.cpp's definitions (and, marked oracle,
against llama.cpp's own samplers through llama_cpp's ctypes API)."""
import ctypes
import math
import time

import numpy as np
import pytest

from ramforge.errors import RamforgeError
from ramforge.sampling import LLAMA_DEFAULT_SEED, Sampler, SamplerError, SamplerParams

F32 = np.float32
OFF = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temperature=1.0)   # every filter disabled


def make(n_vocab, **kw):
    return Sampler(SamplerParams(**{**OFF, "seed": 1234, **kw}), n_vocab)


def ids_of(sampler, logits, history=()):
    return sampler.candidates(np.asarray(logits, F32), history)[0].tolist()


# ---- naive references: plain loops over (id, logit) pairs, float32 as llama.cpp ----------------

def ref_penalties(logits, history, last_n, rp, fp, pp):
    out = [F32(v) for v in logits]
    window = list(history) if last_n < 0 else (list(history)[-last_n:] if last_n > 0 else [])
    for tok in set(window):
        if 0 <= tok < len(out):
            c = window.count(tok)
            out[tok] = out[tok] * F32(rp) if out[tok] <= 0 else out[tok] / F32(rp)
            out[tok] = F32(out[tok] - (F32(c) * F32(fp) + F32(pp)))
    return np.array(out, F32)


def ref_sort(cands):
    return sorted(cands, key=lambda c: (-c[1], c[0]))


def ref_softmax(cands):
    lg = np.array([c[1] for c in cands], F32)
    e = np.exp(lg - lg.max())
    total = F32(0)
    for v in e:
        total = F32(total + v)
    return [F32(v / total) for v in e]


def ref_top_k(cands, k):
    return ref_sort(cands)[:k] if k > 0 else cands


def ref_top_p(cands, p):
    cands = ref_sort(cands)
    cum = F32(0)
    for i, prob in enumerate(ref_softmax(cands)):
        cum = F32(cum + prob)
        if cum >= F32(p):
            return cands[: i + 1]
    return cands


def ref_min_p(cands, p):
    lmax = max(c[1] for c in cands)
    return [c for c in cands if c[1] >= F32(lmax + np.log(F32(p)))]


def ref_chain(logits, top_k, top_p, min_p, temperature):
    cands = [(i, F32(v)) for i, v in enumerate(logits)]
    cands = ref_top_k(cands, top_k)
    if F32(top_p) < 1:
        cands = ref_top_p(cands, top_p)
    if min_p > 0:
        cands = ref_min_p(cands, min_p)
    return [(i, F32(v / F32(temperature))) for i, v in cands]


# ---- greedy --------------------------------------------------------------------------------------

def test_greedy_is_argmax_and_ignores_filters():
    rng = np.random.default_rng(0)
    s = Sampler(SamplerParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9), 50_000)
    for _ in range(5):
        x = rng.standard_normal(50_000).astype(F32)
        assert s.sample(x, []) == int(np.argmax(x))


def test_greedy_ties_take_lowest_id_and_see_penalties():
    s = make(5, temperature=0.0)
    assert s.sample(np.array([1, 7, 3, 7, 7], F32)) == 1
    s = make(3, temperature=0.0, repeat_penalty=2.0)
    assert s.sample(np.array([5, 4, 1], F32), [0]) == 1      # 5 / 2 = 2.5 < 4


# ---- each stage against hand-checked vectors and the references ----------------------------------

def test_penalties_hand_checked():
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0], F32)
    hist = [0, 1, 1, 4, 3, 0, 0]
    kw = dict(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    # window [4, 3, 0, 0]: positive logits divided, non-positive multiplied, then c*freq + presence
    got = make(5, repeat_last_n=4, **kw).penalize(logits, hist)
    np.testing.assert_array_equal(got, [-0.25, -1.0, 0.5, 0.75, -0.75])
    got = make(5, repeat_last_n=-1, **kw).penalize(logits, hist)   # the whole history
    np.testing.assert_array_equal(got, [-0.75, -3.25, 0.5, 0.75, -0.75])
    np.testing.assert_array_equal(make(5, repeat_last_n=0, **kw).penalize(logits, hist), logits)
    # out-of-range ids take window slots but penalise nothing; the input is never modified
    np.testing.assert_array_equal(make(5, repeat_last_n=2, **kw).penalize(logits, [0, 99, -1]), logits)
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, 3.0, 0.0])


def test_penalties_against_reference():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(2, 30))
        x = (rng.standard_normal(n) * 3).astype(F32)
        hist = rng.integers(-2, n + 2, int(rng.integers(0, 40))).tolist()
        last_n, rp = int(rng.integers(-1, 20)), float(rng.uniform(0.5, 2))
        fp, pp = float(rng.uniform(-1, 1)), float(rng.uniform(-1, 1))
        s = make(n, repeat_last_n=last_n, repeat_penalty=rp, frequency_penalty=fp, presence_penalty=pp)
        np.testing.assert_array_equal(s.penalize(x, hist), ref_penalties(x, hist, last_n, rp, fp, pp))


def test_top_k_hand_checked():
    x = [1, 5, 3, 5, 2, 4]
    assert ids_of(make(6, top_k=3), x) == [1, 3, 5]          # sorted; the tie at 5 by lowest id
    assert ids_of(make(6, top_k=1), x) == [1]
    assert ids_of(make(6, top_k=100), x) == [1, 3, 5, 2, 4, 0]   # k >= n: no cut, but sorted
    assert ids_of(make(6, top_k=0), x) == list(range(6))         # disabled: untouched


def test_top_p_boundary_is_inclusive():
    # two equal logits: p = 0.5 exactly; llama.cpp stops at the first running sum >= top_p
    assert ids_of(make(2, top_p=0.5), [0, 0]) == [0]
    assert ids_of(make(4, top_p=0.5), [0, 0, 0, 0]) == [0, 1]
    assert ids_of(make(4, top_p=0.5001), [0, 0, 0, 0]) == [0, 1, 2]
    # probabilities [.245, .665, .090]: 0.6 keeps one, 0.7 two, 0.95 all three, 0 one
    assert ids_of(make(3, top_p=0.6), [1, 2, 0]) == [1]
    assert ids_of(make(3, top_p=0.7), [1, 2, 0]) == [1, 0]
    assert ids_of(make(3, top_p=0.95), [1, 2, 0]) == [1, 0, 2]
    assert ids_of(make(3, top_p=0.0), [1, 2, 0]) == [1]


def test_min_p_hand_checked():
    x = [0, -1, -2, -3]                                      # p / p_max = 1, .368, .135, .0498
    assert ids_of(make(4, min_p=0.1), x) == [0, 1, 2]
    assert ids_of(make(4, min_p=0.05), x) == [0, 1, 2]
    assert ids_of(make(4, min_p=0.04), x) == [0, 1, 2, 3]
    assert ids_of(make(4, min_p=1.0), [1, 3, 3, 2]) == [1, 2]   # only ties of the max survive


def test_temperature_scales_after_filters():
    ids, lg = make(3, temperature=0.5).candidates(np.array([1, 2, 0], F32))
    assert ids.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(lg, [2, 4, 0])


def test_chain_against_reference():
    rng = np.random.default_rng(2)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        x = (rng.standard_normal(n) * rng.uniform(0.1, 5)).astype(F32)
        kw = dict(top_k=int(rng.integers(0, n + 3)), top_p=float(rng.choice([1.0, rng.uniform(0, 1)])),
                  min_p=float(rng.choice([0.0, rng.uniform(0, 1)])), temperature=float(rng.uniform(0.1, 2)))
        ids, lg = make(n, **kw).candidates(x)
        ref = ref_chain(x, **kw)
        assert sorted(ids.tolist()) == sorted(i for i, _ in ref), kw
        np.testing.assert_array_equal(lg[np.argsort(ids)], [v for _, v in sorted(ref)])


# ---- the order of the stages ---------------------------------------------------------------------

def test_order_penalties_before_top_k():
    # penalised first, token 0 falls out of top-1; top-k first would have kept it
    assert ids_of(make(3, top_k=1, repeat_penalty=10.0), [3, 2, 1], [0]) == [1]


def test_order_top_k_before_top_p():
    # top-2 renormalises to [.731, .269] so top-p 0.7 keeps one; top-p first would keep two
    assert ids_of(make(3, top_k=2, top_p=0.7), [2, 1, 0]) == [0]


def test_order_temperature_after_top_p_and_min_p():
    # untempered probabilities [.665, .245, .090]: top-p 0.8 keeps two. Tempering first (T=0.5:
    # [.867, .117, .016]) would keep one, T=3 would keep three
    assert ids_of(make(3, top_p=0.8, temperature=0.5), [2, 1, 0]) == [0, 1]
    assert ids_of(make(3, top_p=0.8, temperature=3.0), [2, 1, 0]) == [0, 1]
    # min-p 0.3 against untempered p / p_max = [1, .368, .135]; at T=0.5 it would be [1, .135, .018]
    assert ids_of(make(3, min_p=0.3, temperature=0.5), [2, 1, 0]) == [0, 1]


def test_typical_keeps_the_typical_tokens_first():
    # head p = 0.3, 1000 tail tokens at 0.0007: entropy 5.44 nats, so the tail's -log p = 7.26
    # is nearer it than the head's 1.20; typical keeps ~715 tail tokens and drops the head token,
    # which no other filter ever does
    x = np.array([math.log(3000 / 7)] + [0.0] * 1000, F32)
    ids = ids_of(make(1001, typical_p=0.5), x)
    assert 0 not in ids and 700 < len(ids) < 730
    # unlike top-p, typical stops only once the running sum is strictly greater than typical_p
    assert ids_of(make(4, typical_p=0.5), [0, 0, 0, 0]) == [0, 1, 2]


# ---- the draw ------------------------------------------------------------------------------------

class FixedU:
    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


def test_draw_picks_first_running_sum_reaching_u_times_total():
    s = make(3)
    x = np.array([0, math.log(3), math.log(6)], F32)   # candidates kept in id order: weights 1, 3, 6
    for u, want in [(0.0, 0), (0.05, 0), (0.11, 1), (0.39, 1), (0.41, 2), (0.999, 2)]:
        s._rng = FixedU(u)
        assert s.sample(x) == want, u


def test_seeded_draws_are_reproducible_and_seeds_differ():
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((200, 64)) * 2).astype(F32)

    def run(seed):
        s = Sampler(SamplerParams(seed=seed, top_k=0, top_p=1.0, min_p=0.0), 64)
        return [s.sample(r) for r in rows]

    assert run(7) == run(7)
    assert run(7) != run(8)
    s = Sampler(SamplerParams(seed=7, top_k=0, top_p=1.0, min_p=0.0), 64)
    first = [s.sample(r) for r in rows]
    s.reset()
    assert [s.sample(r) for r in rows] == first == run(7)


def test_unset_seed_is_random():
    for seed in (None, -1, LLAMA_DEFAULT_SEED):
        a, b = Sampler(SamplerParams(seed=seed), 8), Sampler(SamplerParams(seed=seed), 8)
        assert a.seed != b.seed and 0 <= a.seed < LLAMA_DEFAULT_SEED
    assert Sampler(SamplerParams(seed=0), 8).seed == 0


def test_draws_follow_softmax_of_tempered_filtered_logits():
    x = np.array([2.0, 1.6, 1.5, 1.0, 0.4, -0.5, -1.0, -3.0], F32)
    kw = dict(top_k=6, top_p=0.95, min_p=0.1, temperature=0.7)
    ref = ref_chain(x, **kw)
    ref_ids = [i for i, _ in ref]
    lg = np.array([v for _, v in ref], np.float64)
    expect = np.exp(lg - lg.max())
    expect /= expect.sum()
    assert 3 <= len(ref_ids) < 6                            # the filters did cut something
    s = Sampler(SamplerParams(seed=2024, **kw), x.size)
    ids, probs = s.probabilities(x)
    assert ids.tolist() == ref_ids
    np.testing.assert_allclose(probs, expect, rtol=1e-6)
    n = 5000
    draws = np.array([s.sample(x) for _ in range(n)])
    assert set(draws.tolist()) <= set(ref_ids)
    observed = np.array([(draws == i).sum() for i in ref_ids])
    chi2 = float((((observed - n * expect) ** 2) / (n * expect)).sum())
    assert chi2 < 20.5, (chi2, observed, n * expect)         # chi-square, df <= 4, p = 0.0004


# ---- validation ----------------------------------------------------------------------------------

BAD = [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "0.8"),
    ("top_k", -1), ("top_k", 1.5), ("top_k", True),
    ("top_p", -0.01), ("top_p", 1.01), ("top_p", float("nan")),
    ("min_p", -0.01), ("min_p", 1.5), ("min_p", float("nan")),
    ("typical_p", 1.2), ("typical_p", -1.0),
    ("repeat_penalty", 0.0), ("repeat_penalty", -1.1), ("repeat_penalty", float("nan")),
    ("frequency_penalty", float("nan")), ("frequency_penalty", float("inf")), ("presence_penalty", float("nan")),
    ("repeat_last_n", -2), ("repeat_last_n", 3.0),
    ("seed", 1.5), ("seed", "1"), ("seed", -2), ("seed", 2**32),
]


@pytest.mark.parametrize("name,value", BAD)
def test_validation_rejects(name, value):
    with pytest.raises(SamplerError) as e:
        SamplerParams(**{name: value}).validate()
    assert isinstance(e.value, ValueError) and isinstance(e.value, RamforgeError)
    msg = str(e.value)
    assert name in msg and repr(value) in msg and "expected" in msg
    with pytest.raises(SamplerError):
        Sampler(SamplerParams(**{name: value}), 10)


def test_validation_accepts_edges_and_defaults():
    d = SamplerParams()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (d.repeat_penalty, d.frequency_penalty, d.presence_penalty, d.repeat_last_n, d.seed) == (
        1.0, 0.0, 0.0, 64, None)
    for kw in [dict(top_k=0), dict(top_p=0.0), dict(top_p=1.0), dict(min_p=1.0), dict(temperature=0.0),
               dict(repeat_last_n=-1), dict(seed=0), dict(seed=LLAMA_DEFAULT_SEED), dict(seed=np.int64(5)),
               dict(frequency_penalty=-2.0)]:
        SamplerParams(**kw).validate()


def test_bad_logits_and_vocab():
    with pytest.raises(SamplerError, match="n_vocab"):
        Sampler(SamplerParams(), 0)
    s = make(4)
    for bad in (np.zeros(5, F32), np.zeros((1, 4), F32), np.array([0, np.nan, 1, 2], F32),
                np.array([0, np.inf, 1, 2], F32), np.full(4, -np.inf, F32)):
        with pytest.raises(SamplerError, match="logits"):
            s.sample(bad)
    assert s.sample(np.array([-np.inf, 0, -np.inf, -np.inf], F32)) == 1   # -inf masks are fine


def test_large_vocab_is_fast():
    n = 262_144
    x = (np.random.default_rng(4).standard_normal(n) * 3).astype(F32)
    s = Sampler(SamplerParams(seed=1, repeat_penalty=1.1), n)
    hist = list(range(0, 6400, 100))
    times = []
    for _ in range(7):
        t = time.perf_counter()
        s.sample(x, hist)
        times.append(time.perf_counter() - t)
    assert sorted(times)[3] < 0.02, times                    # ~0.3 ms when the machine is idle


# ---- oracle: llama.cpp's own samplers on a llama_token_data_array -------------------------------

def llama_apply(make_samplers, logits, history=()):
    """Candidate (ids, logits) and `selected` after llama.cpp's chain, via llama_cpp's ctypes API."""
    L = pytest.importorskip("llama_cpp").llama_cpp
    n = logits.size
    arr = (L.llama_token_data * n)()
    view = np.ctypeslib.as_array(arr)
    view["id"], view["logit"], view["p"] = np.arange(n), logits, 0
    cur = L.llama_token_data_array(arr, n, -1, False)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    try:
        for smpl in make_samplers(L):
            L.llama_sampler_chain_add(chain, smpl)
        for tok in history:
            L.llama_sampler_accept(chain, int(tok))
        L.llama_sampler_apply(chain, ctypes.byref(cur))
        out = view[: cur.size].copy()
        return out["id"].astype(np.int64), out["logit"], cur.selected
    finally:
        L.llama_sampler_free(chain)


@pytest.mark.oracle
def test_oracle_candidate_sets_match_llama_cpp():
    rng = np.random.default_rng(5)
    for trial in range(40):
        n = int(rng.choice([50, 700, 3000]))                 # > 1024 takes llama.cpp's partial-sort path
        x = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(F32)
        p = SamplerParams(top_k=int(rng.choice([0, 1, 40, 5000])), top_p=float(rng.choice([1.0, 0.95, 0.5])),
                          min_p=float(rng.choice([0.0, 0.05, 0.2])), typical_p=float(rng.choice([1.0, 1.0, 0.9])),
                          temperature=float(rng.choice([0.8, 1.0, 1.7])), repeat_penalty=float(rng.uniform(1, 1.5)),
                          frequency_penalty=float(rng.uniform(0, 0.5)), presence_penalty=float(rng.uniform(0, 0.5)),
                          repeat_last_n=int(rng.choice([0, 16, 64])), seed=trial)
        hist = rng.integers(0, n, 100)

        def chain(L, p=p, n=n):
            return [L.llama_sampler_init_penalties(n, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                                   p.presence_penalty),
                    L.llama_sampler_init_top_k(p.top_k), L.llama_sampler_init_typical(p.typical_p, 1),
                    L.llama_sampler_init_top_p(p.top_p, 1), L.llama_sampler_init_min_p(p.min_p, 1),
                    L.llama_sampler_init_temp(p.temperature)]

        want_ids, want_lg, _ = llama_apply(chain, x, hist)
        ids, lg = Sampler(p, n).candidates(x, hist)
        assert sorted(ids.tolist()) == sorted(want_ids.tolist()), (trial, p)
        np.testing.assert_allclose(lg[np.argsort(ids)], want_lg[np.argsort(want_ids)], rtol=1e-6, atol=1e-6)


@pytest.mark.oracle
def test_oracle_greedy_matches_llama_cpp():
    rng = np.random.default_rng(6)
    for trial in range(20):
        n = 5000
        x = (rng.standard_normal(n) * 3).astype(F32)
        x[rng.integers(0, n, 3)] = x.max()                   # ties at the top
        hist = rng.integers(0, n, 64)

        def chain(L, n=n):
            return [L.llama_sampler_init_penalties(n, 64, 1.3, 0.1, 0.1), L.llama_sampler_init_greedy()]

        want_ids, _, sel = llama_apply(chain, x, hist)
        s = Sampler(SamplerParams(temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.1,
                                  presence_penalty=0.1, repeat_last_n=64), n)
        assert s.sample(x, hist) == int(want_ids[sel]), trial
