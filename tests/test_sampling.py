"""The sampler's stages against naive references written from llama-sampler.cpp (plain loops over
(id, logit) pairs, float32 and glibc's float functions as there), its random numbers against
libstdc++'s, the two chain orders and validation. llama.cpp's own samplers: tests/test_sampling_oracle.py."""
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ramforge.errors import RamforgeError
from ramforge.sampling import LCPP, LLAMA, LLAMA_DEFAULT_SEED, Sampler, SamplerError, SamplerParams
from ramforge.kernels import cxxsort
from ramforge.sampling import rng as R, stages as S
from ramforge.sampling.dry import dry_penalties
from ramforge.sampling.libm import expf, log2f, logf, powf

F32 = np.float32
OFF = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, temperature=1.0)   # every filter disabled


def make(n_vocab, chain=LCPP, **kw):
    return Sampler(SamplerParams(**{**OFF, "seed": 1234, **kw}), n_vocab, chain=chain)


def ids_of(sampler, logits, history=()):
    return sampler.candidates(np.asarray(logits, F32), history)[0].tolist()


def cands(logits):
    x = np.asarray(logits, F32).copy()
    return S.Cands(x, np.arange(x.size))


def distinct_logits(rng, n, scale=3.0):
    """float32 logits without ties (the references sort stably, llama.cpp's sorts do not)."""
    while True:
        x = (rng.standard_normal(n) * scale).astype(F32)
        if np.unique(x).size == n:
            return x


# ---- naive references ------------------------------------------------------------------------------

def ref_softmax(lg):
    mx = max(lg)
    e = [expf(F32(v - mx)) for v in lg]
    total = F32(0)
    for v in e:
        total = F32(total + v)
    return [F32(v / total) for v in e]


def ref_sorted(pairs):
    return sorted(pairs, key=lambda c: -c[1])


def ref_penalties(logits, window, rp, fp, pp):
    out = [F32(v) for v in logits]
    for tok in set(window):
        if 0 <= tok < len(out):
            c = window.count(tok)
            out[tok] = out[tok] * F32(rp) if out[tok] <= 0 else out[tok] / F32(rp)
            out[tok] = F32(out[tok] - F32(F32(c) * F32(fp) + F32(pp)))
    return np.array(out, F32)


def ref_top_p(pairs, p, min_keep=0):
    probs = ref_softmax([v for _, v in pairs])                  # summed in the current order
    order = sorted(range(len(pairs)), key=lambda i: -pairs[i][1])
    cum = F32(0)
    for n, i in enumerate(order):
        cum = F32(cum + probs[i])
        if cum >= F32(p) and n + 1 >= min_keep:
            return [pairs[j] for j in order[: n + 1]]
    return [pairs[j] for j in order]


def ref_min_p(pairs, p):
    floor = F32(max(v for _, v in pairs) + logf(F32(p)))
    return [c for c in pairs if c[1] >= floor]


def ref_typical(pairs, p):
    pairs = ref_sorted(pairs)
    probs = ref_softmax([v for _, v in pairs])
    ent = F32(0)
    for q in probs:
        ent = F32(ent + F32(-q * logf(q)))
    shifted = [abs(F32(-logf(q) - ent)) for q in probs]
    order = sorted(range(len(pairs)), key=lambda i: shifted[i])
    cum = F32(0)
    for n, i in enumerate(order):
        cum = F32(cum + probs[i])
        if cum > F32(p):
            return [pairs[j] for j in order[: n + 1]]
    return [pairs[j] for j in order]


def ref_top_n_sigma(lg, n):
    fin = [v for v in lg if v != -np.inf]
    mx, total = F32(lg[0]), F32(0)
    for v in fin:
        mx, total = max(mx, v), F32(total + v)
    mean = F32(total / F32(len(fin)))
    acc = F32(0)
    for v in fin:
        acc = F32(float(acc) + float(F32(v - mean)) ** 2)
    sd = F32(math.sqrt(F32(acc / F32(len(fin)))))
    return [F32(-np.inf) if v < F32(mx - F32(F32(n) * sd)) else v for v in lg]


def ref_dynatemp(lg, t, delta, exponent):
    """The logits after dynamic temperature (lg sorted descending, as the stage sorts first)."""
    lo, hi = max(F32(0), F32(F32(t) - F32(delta))), F32(F32(t) + F32(delta))
    probs = ref_softmax(lg)
    ent = F32(0)
    for q in probs:
        if q > 0:
            ent = F32(ent - F32(q * logf(q)))
    norm = F32(ent / F32(-logf(F32(F32(1) / F32(len(lg))))))
    dyn = F32(lo + F32(F32(hi - lo) * powf(norm, F32(exponent))))
    return [F32(v / dyn) for v in lg]


def ref_dry(last, mult, base, allowed, single_breakers=()):
    """token -> penalty, O(n^2): the longest earlier repeat of the context's end that each token would extend."""
    n, longest = len(last), {}
    limit = n
    for i in range(n):                                     # the nearest breaker caps the look-back
        if last[n - 1 - i] in single_breakers:
            limit = i
            break
    if n <= allowed or limit < allowed:
        return {}
    for j in range(n - 1):                                 # last[j + 1] followed an occurrence ending at j
        k = 0
        while k <= j and last[j - k] == last[n - 1 - k]:
            k += 1
        k = min(k, limit)
        if k >= allowed:
            longest[last[j + 1]] = max(longest.get(last[j + 1], 0), k)
    return {t: F32(float(F32(mult)) * float(F32(base)) ** (k - allowed))
            for t, k in longest.items() if t not in single_breakers}


# ---- random numbers: std::mt19937 and libstdc++'s distributions (values from a g++ 12 build) -------

def test_mt19937_is_the_standard_one():
    g = R.MT19937(5489)                                    # the C++ standard's check: 10000th output
    for _ in range(9999):
        g.next()
    assert g.next() == 4123659995
    assert [R.MT19937(1234).next(), R.MT19937(0).next()] == [822569775, 2357136044]


def test_uniform_draws_are_libstdcxx_generate_canonical():
    g, f = R.MT19937(1234), R.MT19937(1234)
    assert [R.canonical_double(g) for _ in range(3)] == [0.49766366630595166, 0.81783844288953322,
                                                          0.61211189358442275]
    assert [float(R.canonical_float(f)) for _ in range(2)] == [float(F32(0.191519454)), float(F32(0.497663677))]
    g = R.MT19937(1)
    assert [R.discrete(g, np.array([.1, .2, .3, .4], F32)) for _ in range(5)] == [3, 3, 1, 3, 1]
    g = R.MT19937(1)
    assert R.discrete(g, np.array([1.0], F32)) == 0 and g.next() == 1791095845   # one weight: no draw


# ---- each stage against its reference ------------------------------------------------------------

def test_penalties_hand_checked():
    logits = np.array([2.0, -1.0, 0.5, 3.0, 0.0], F32)
    kw = dict(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    hist = [0, 1, 1, 4, 3, 0, 0]
    # window [4, 3, 0, 0]: positive logits divided, non-positive multiplied, then c*freq + presence
    np.testing.assert_array_equal(make(5, repeat_last_n=4, **kw).penalize(logits, hist), [-0.25, -1, .5, .75, -.75])
    np.testing.assert_array_equal(make(5, repeat_last_n=-1, **kw).penalize(logits, hist), [-.75, -3.25, .5, .75, -.75])
    np.testing.assert_array_equal(make(5, repeat_last_n=0, **kw).penalize(logits, hist), logits)
    np.testing.assert_array_equal(make(5, repeat_last_n=2, **kw).penalize(logits, [0, 99, -1]), logits)
    np.testing.assert_array_equal(logits, [2.0, -1.0, 0.5, 3.0, 0.0])          # the input is never modified


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_penalties_against_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    x = (rng.standard_normal(n) * 3).astype(F32)
    hist = rng.integers(-2, n + 2, int(rng.integers(0, 40))).tolist()
    last_n, rp = int(rng.integers(-1, 20)), float(rng.uniform(0.5, 2))
    fp, pp = float(rng.uniform(-1, 1)), float(rng.uniform(-1, 1))
    s = make(n, repeat_last_n=last_n, repeat_penalty=rp, frequency_penalty=fp, presence_penalty=pp)
    window = hist if last_n < 0 else hist[max(0, len(hist) - last_n):] if last_n else []
    np.testing.assert_array_equal(s.penalize(x, hist), ref_penalties(x, window, rp, fp, pp))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_filters_against_references(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([3, 40, 300, 2000]))                    # > 1024: top-p's first-guess path
    x = distinct_logits(rng, n, float(rng.uniform(0.3, 4)))
    pairs = list(enumerate(x))
    p = float(rng.uniform(0.05, 0.999))
    for stage, ref in ((S.top_p, ref_top_p), (S.typical, ref_typical)):
        c = cands(x)
        stage(c, F32(p), 0)
        assert sorted(c.ids.tolist()) == sorted(i for i, _ in ref(pairs, p)), (stage.__name__, n, p)
    c = cands(x)
    S.min_p(c, F32(p), 0)
    assert c.ids.tolist() == [i for i, _ in ref_min_p(pairs, p)]     # unsorted: the order is kept
    k = int(rng.integers(1, n + 1))
    c = cands(x)
    S.top_k(c, k)
    assert c.ids.tolist() == [i for i, _ in ref_sorted(pairs)[:k]]
    c = cands(x)
    S.top_n_sigma(c, F32(p * 3))
    np.testing.assert_array_equal(c.logit, ref_top_n_sigma(list(x), p * 3))
    c = cands(x)
    S.temp_ext(c, F32(0.8), F32(0.5), F32(p * 2))
    srt = [v for _, v in ref_sorted(pairs)]
    np.testing.assert_array_equal(c.logit, ref_dynatemp(srt, 0.8, 0.5, p * 2))


def test_top_k_and_ties_follow_libstdcxx():
    x = [1, 5, 3, 5, 2, 4]                                   # the orders a g++ 12 build gives
    assert ids_of(make(6, top_k=3), x) == [3, 1, 5]
    assert ids_of(make(6, top_k=100), x) == [1, 3, 5, 2, 4, 0]
    assert ids_of(make(6, top_k=0), x) == list(range(6))           # disabled: untouched
    # std::partial_sort is a heap select: of 20 equal logits it keeps ids 1, 3, 0, 2 in this order
    # (as a g++ 12 build does), where a stable sort would keep 0, 1, 2, 3
    assert ids_of(make(20, top_k=4), [0] * 20) == [1, 3, 0, 2]
    a = np.arange(20)
    cxxsort.partial_sort(a, 0, 2, 20, np.zeros(20, F32))
    assert a[:2].tolist() == [0, 1]


def test_top_p_boundary_is_inclusive_and_min_keep():
    # four equal logits sort as 1, 3, 0, 2 (std::partial_sort); the running sum 0.5 >= 0.5
    assert ids_of(make(4, top_p=0.5), [0, 0, 0, 0]) == [1, 3]
    assert ids_of(make(4, top_p=0.5001), [0, 0, 0, 0]) == [1, 3, 0]
    assert ids_of(make(3, top_p=0.0), [1, 2, 0]) == [1]
    assert ids_of(make(4, top_p=0.1, min_keep=3), [3, 2, 1, 0]) == [0, 1, 2]
    assert ids_of(make(4, typical_p=0.5), [0, 0, 0, 0]) == [1, 3, 0]  # typical: strictly greater


def test_min_p_hand_checked():
    x = [0, -1, -2, -3]                                      # p / p_max = 1, .368, .135, .0498
    assert ids_of(make(4, min_p=0.1), x) == [0, 1, 2]
    assert ids_of(make(4, min_p=0.04), x) == [0, 1, 2, 3]
    assert ids_of(make(4, min_p=1.0), [1, 3, 3, 2]) == [1, 2]
    assert ids_of(make(4, min_p=0.9, min_keep=3), x) == [0, 1, 2]     # too few: sorted, cut after min_keep


def test_temperature_zero_masks_all_but_the_first_best():
    c = cands([1, 3, 3, 2])
    S.temp(c, F32(0))
    assert c.logit.tolist() == [-np.inf, 3, -np.inf, -np.inf]


def test_xtc_removes_the_top_choices_but_the_last():
    x = np.log(np.array([0.4, 0.3, 0.2, 0.05, 0.05], F32))
    c = cands(x)
    S.xtc(c, F32(1.0), F32(0.15), 0, R.MT19937(1))          # chance <= 1: always
    assert c.ids.tolist() == [2, 3, 4]                       # 0.4 and 0.3 go, 0.2 (the last above) stays
    c = cands(x)
    S.xtc(c, F32(1.0), F32(0.15), 4, R.MT19937(1))          # it would leave 3 < min_keep
    assert c.ids.tolist() == [0, 1, 2, 3, 4]
    for prob, size in ((0.4, 5), (0.42, 3)):                 # seed 1's first chance is 0.417
        c = cands(x)
        S.xtc(c, F32(prob), F32(0.15), 0, R.MT19937(1))
        assert c.size == size


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(0, 3), st.sampled_from([(), (0,), (3,)]))
def test_dry_against_reference(last, allowed, breakers):
    table = {b: [()] for b in breakers}
    got = dry_penalties(last, F32(0.8), F32(1.75), allowed, table)
    assert got == ref_dry(last, 0.8, 1.75, allowed, breakers)


def test_dry_hand_checked_and_multi_token_breakers():
    # "a b c x a b": c would repeat "a b c" (length 2 before it, allowed 1): 0.5 * 2^(2-1)
    assert dry_penalties([1, 2, 3, 9, 1, 2], F32(0.5), F32(2), 1, {}) == {3: F32(1.0)}
    # the breaker "9 1" (head 9, tail (1,)) ends 1 token back: a repeat may reach back 1 token only
    assert dry_penalties([1, 2, 3, 9, 1, 2], F32(0.5), F32(2), 1, {9: [(1,)]}) == {3: F32(0.5)}
    assert dry_penalties([1, 2, 3, 9, 1, 2], F32(0.5), F32(2), 1, {9: [(5,)]}) == {3: F32(1.0)}


def test_dist_picks_first_running_sum_reaching_u_times_total():
    x = np.array([0, math.log(3), math.log(6)], F32)          # weights 1, 3, 6 in id order
    for seed in range(20):
        u = R.canonical_double(R.MT19937(seed))
        want = 0 if u * 10 <= 1 else 1 if u * 10 <= 4 else 2
        c = cands(x)
        S.dist(c, R.MT19937(seed))
        assert c.selected == want, (seed, u)


def test_mirostat2_cuts_at_mu_and_updates_it():
    x = np.log(np.array([0.5, 0.25, 0.125, 0.125], F32))     # surprises 1, 2, 3, 3 bits
    c = cands(x)
    mu = S.mirostat_v2(c, F32(2.0), F32(0.5), F32(2.5), R.MT19937(3))
    assert c.ids.tolist() == [0, 1]                            # renormalised [2/3, 1/3]
    np.testing.assert_allclose(c.p, [2 / 3, 1 / 3], rtol=1e-6)
    pick = R.discrete(R.MT19937(3), c.p)
    assert c.selected == pick
    surprise = F32(-log2f(c.p[pick]))
    assert mu == F32(F32(2.5) - F32(F32(0.5) * F32(surprise - F32(2.0))))


# ---- the chain orders ----------------------------------------------------------------------------

def test_order_penalties_before_top_k_and_top_k_before_top_p():
    assert ids_of(make(3, top_k=1, repeat_penalty=10.0), [3, 2, 1], [0]) == [1]
    assert ids_of(make(3, top_k=2, top_p=0.7), [2, 1, 0]) == [0]


def test_order_temperature_after_the_filters():
    assert ids_of(make(3, top_p=0.8, temperature=0.5), [2, 1, 0]) == [0, 1]
    assert ids_of(make(3, min_p=0.3, temperature=0.5), [2, 1, 0]) == [0, 1]
    ids, lg = make(3, temperature=0.5).candidates(np.array([1, 2, 0], F32))
    assert ids.tolist() == [0, 1, 2] and lg.tolist() == [2, 4, 0]


def test_greedy_surfaces():
    x = np.array([1, 7, 3, 7, 7], F32)
    assert make(5, temperature=0.0).sample(x) == 1                      # llama-cpp-python: lowest id
    assert make(20, temperature=0.0, top_k=4).sample(np.zeros(20, F32)) == 0
    # llama.cpp's chain has no greedy: temperature 0 keeps the first best of the current order,
    # here top-k's heap order (1, 3, 0, 2), and dist still draws
    s = Sampler(SamplerParams(temperature=0.0, top_k=4, seed=1), 20, chain=LLAMA)
    assert s.candidates(np.zeros(20, F32), [])[0].tolist() == [1, 3, 0, 2]
    assert s.sample(np.zeros(20, F32), []) == 1


def test_penalty_windows_by_surface():
    x = np.array([5, 4, 1], F32)
    # llama-cpp-python: only the sampler's own tokens count, not the caller's history (the prompt)
    s = make(3, temperature=0.0, repeat_penalty=2.0)
    assert s.sample(x, [0]) == 0 and s.sample(x, [0]) == 1                # 5 / 2 = 2.5 < 4 once 0 was sampled
    s = make(3, chain=LLAMA, temperature=1e-6, repeat_penalty=2.0)
    assert s.sample(x, [0]) == 1                                          # llama.cpp: the prompt counts


def test_mirostat_surfaces():
    x = (np.random.default_rng(0).standard_normal(500) * 2).astype(F32)
    kw = dict(mirostat=2, mirostat_tau=3.0, seed=5)
    # llama-cpp-python's mirostat has no temperature stage; llama.cpp's has one before it
    a = [make(500, temperature=t, **kw).sample(x) for t in (0.3, 3.0)]
    assert a[0] == a[1]
    b = make(500, chain=LLAMA, temperature=0.3, **kw), make(500, chain=LLAMA, temperature=3.0, **kw)
    assert [b[0].sample(x, []) for _ in range(10)] != [b[1].sample(x, []) for _ in range(10)]


def test_seeds_and_reset():
    rows = (np.random.default_rng(3).standard_normal((100, 64)) * 2).astype(F32)

    def run(seed, **kw):
        s = Sampler(SamplerParams(seed=seed, **{**OFF, **kw}), 64)
        return [s.sample(r) for r in rows]

    assert run(7) == run(7) != run(8)
    assert run(7, xtc_probability=0.5, xtc_threshold=0.05) != run(7)
    s = Sampler(SamplerParams(seed=7, mirostat=2, **OFF), 64)
    first = [s.sample(r) for r in rows]
    s.reset()
    assert [s.sample(r) for r in rows] == first and s.tokens == first
    for seed in (None, -1, LLAMA_DEFAULT_SEED):
        a, b = Sampler(SamplerParams(seed=seed), 8), Sampler(SamplerParams(seed=seed), 8)
        assert a.seed != b.seed and 0 <= a.seed < LLAMA_DEFAULT_SEED


def test_candidates_do_not_draw():
    x = (np.random.default_rng(4).standard_normal(64) * 2).astype(F32)
    s = Sampler(SamplerParams(seed=9, xtc_probability=0.5, xtc_threshold=0.02, **OFF), 64)
    first = s.candidates(x)[0].tolist()
    assert s.candidates(x)[0].tolist() == first
    t = Sampler(SamplerParams(seed=9, xtc_probability=0.5, xtc_threshold=0.02, **OFF), 64)
    assert [s.sample(x) for _ in range(20)] == [t.sample(x) for _ in range(20)]
    ids, probs = s.probabilities(x)
    assert abs(probs.sum() - 1) < 1e-9 and ids.size == probs.size


def test_draws_follow_softmax_of_the_final_candidates():
    x = np.array([2.0, 1.6, 1.5, 1.0, 0.4, -0.5, -1.0, -3.0], F32)
    s = Sampler(SamplerParams(seed=2024, top_k=6, top_p=0.95, min_p=0.1, temperature=0.7), x.size)
    ids, probs = s.probabilities(x)
    assert 3 <= ids.size < 6
    n = 4000
    draws = np.array([s.sample(x) for _ in range(n)])
    observed = np.array([(draws == i).sum() for i in ids])
    assert observed.sum() == n
    chi2 = float((((observed - n * probs) ** 2) / (n * probs)).sum())
    assert chi2 < 20.5, (chi2, observed, n * probs)          # chi-square, df <= 4, p = 0.0004


# ---- validation ----------------------------------------------------------------------------------

BAD = [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "0.8"),
    ("top_k", -1), ("top_k", 1.5), ("top_k", True),
    ("top_p", -0.01), ("top_p", 1.01), ("top_p", float("nan")),
    ("min_p", -0.01), ("min_p", 1.5), ("typical_p", 1.2), ("typical_p", -1.0),
    ("repeat_penalty", 0.0), ("repeat_penalty", -1.1), ("repeat_penalty", float("nan")),
    ("frequency_penalty", float("inf")), ("presence_penalty", float("nan")),
    ("repeat_last_n", -2), ("repeat_last_n", 3.0),
    ("seed", 1.5), ("seed", "1"), ("seed", -2), ("seed", 2**32),
    ("min_keep", -1), ("top_n_sigma", float("nan")), ("xtc_probability", 1.5), ("xtc_threshold", -0.1),
    ("dynatemp_range", float("inf")), ("mirostat", 3), ("mirostat", 1.0), ("mirostat_tau", float("nan")),
    ("dry_base", 0.5), ("dry_allowed_length", -1), ("dry_penalty_last_n", -2), ("dry_multiplier", float("inf")),
    ("dry_sequence_breakers", ("",)), ("dry_sequence_breakers", "abc"), ("logit_bias", ((1, float("inf")),)),
    ("logit_bias", ((-1, 1.0),)), ("logit_bias", {1: 2.0}),
]


@pytest.mark.parametrize("name,value", BAD)
def test_validation_rejects(name, value):
    with pytest.raises(SamplerError) as e:
        SamplerParams(**{name: value}).validate()
    assert isinstance(e.value, ValueError) and isinstance(e.value, RamforgeError)
    msg = str(e.value)
    assert name in msg and repr(value) in msg and "expected" in msg


def test_validation_accepts_edges_and_defaults():
    d = SamplerParams()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.typical_p, d.repeat_last_n, d.seed) == (
        0.8, 40, 0.95, 0.05, 1.0, 64, None)
    assert (d.min_keep, d.top_n_sigma, d.xtc_probability, d.xtc_threshold, d.mirostat, d.dry_multiplier,
            d.dry_base, d.dry_allowed_length, d.dry_penalty_last_n) == (0, -1.0, 0.0, 0.1, 0, 0.0, 1.75, 2, 64)
    assert d.dry_sequence_breakers == ("\n", ":", "\"", "*") and d.logit_bias is None
    for kw in [dict(top_k=0), dict(top_p=0.0), dict(min_p=1.0), dict(temperature=0.0), dict(repeat_last_n=-1),
               dict(seed=LLAMA_DEFAULT_SEED), dict(seed=np.int64(5)), dict(mirostat=2), dict(dry_sequence_breakers=()),
               dict(logit_bias=((3, -math.inf), (3, 2.0))), dict(top_n_sigma=-5.0)]:
        SamplerParams(**kw).validate()


def test_bad_logits_vocab_bias_and_breakers():
    with pytest.raises(SamplerError, match="n_vocab"):
        Sampler(SamplerParams(), 0)
    with pytest.raises(SamplerError, match="logit_bias"):
        Sampler(SamplerParams(logit_bias=((10, 1.0),)), 10)
    with pytest.raises(SamplerError, match="dry_sequence_breakers"):
        Sampler(SamplerParams(dry_multiplier=0.5), 10)                  # breakers need the tokenizer
    with pytest.raises(SamplerError, match="chain"):
        Sampler(SamplerParams(), 10, chain="ollama")
    s = make(4)
    for bad in (np.zeros(5, F32), np.zeros((1, 4), F32), np.array([0, np.nan, 1, 2], F32),
                np.array([0, np.inf, 1, 2], F32), np.full(4, -np.inf, F32)):
        with pytest.raises(SamplerError, match="logits"):
            s.sample(bad)
    assert s.sample(np.array([-np.inf, 0, -np.inf, -np.inf], F32)) == 1
    assert make(4, logit_bias=((1, -math.inf),), temperature=0.0).sample(np.array([0, 5, 1, 2], F32)) == 3


def test_large_vocab_is_fast():
    n = 262_144
    x = (np.random.default_rng(4).standard_normal(n) * 3).astype(F32)
    s = Sampler(SamplerParams(seed=1, repeat_penalty=1.1), n)
    s.sample(x)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        s.sample(x)
        times.append(time.perf_counter() - t)
    assert sorted(times)[3] < 0.03, times                    # ~1 ms when the machine is idle
