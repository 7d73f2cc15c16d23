"""llama.cpp's sampler stages (src/llama-sampler.cpp), each on a candidate array as there.

`Cands` is llama_token_data_array: ids, logits, probabilities (p), `sorted` (descending by logit)
and `selected`. A stage keeps llama.cpp's float32 steps, its libm calls (`libm`), the order it
leaves the candidates in and the order it sums them in; its sorts are libstdc++'s (`cxxsort`), so
equal logits come out in llama.cpp's order too.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels import cxxsort
from . import libm
from .rng import MT19937, canonical_double, canonical_float, discrete

F32 = np.float32
INT32_MIN = -(2 ** 31)


class Cands:
    """A candidate array; `full` while ids is still the whole vocabulary in id order."""

    __slots__ = ("ids", "logit", "p", "sorted", "selected", "full")

    def __init__(self, logits: np.ndarray, ids: np.ndarray):
        self.ids, self.logit, self.p = ids, logits, None
        self.sorted, self.selected, self.full = False, -1, True

    @property
    def size(self) -> int:
        return self.logit.size

    def keep(self, idx) -> None:
        """Keep the candidates at positions idx (a slice or an index array), in that order."""
        self.ids, self.logit = self.ids[idx], self.logit[idx]
        if self.p is not None:
            self.p = self.p[idx]
        self.full = False


# ---- sorting -------------------------------------------------------------------------------------

def sort_top(c: Cands, k: int) -> None:
    """llama_token_data_array_partial_sort_inplace: the k best, sorted; the rest dropped."""
    c.keep(cxxsort.top_sorted(c.logit, k))
    c.sorted = True


def softmax(c: Cands, do_sort: bool) -> None:
    """llama_sampler_softmax_impl: p = expf(l - max) / (float32 running sum in the current order)."""
    if do_sort and not c.sorted:
        sort_top(c, c.size)
    m = c.logit[0] if c.sorted else c.logit.max()
    e = libm.exp_shifted(c.logit, m)
    c.p = e / np.cumsum(e)[-1]


# ---- the stages ----------------------------------------------------------------------------------

def logit_bias(c: Cands, bias: tuple[tuple[int, float], ...]) -> None:
    for tok, b in bias:                                  # first in the chain: position == id
        c.logit[tok] += F32(b)


def penalties(c: Cands, window: np.ndarray, rp: F32, fp: F32, pp: F32) -> None:
    """Repeat, frequency and presence penalties from the counts of the last penalty_last_n tokens."""
    toks, counts = np.unique(window, return_counts=True)
    pos = _positions(c, toks)
    ok = pos >= 0
    pos, counts = pos[ok], counts[ok]
    v = c.logit[pos]
    v = np.where(v <= 0, v * rp, v / rp)
    c.logit[pos] = v - (counts.astype(F32) * fp + pp)   # float(count > 0) * present == present
    c.sorted = False


def _positions(c: Cands, toks: np.ndarray) -> np.ndarray:
    """Positions of token ids toks in c (-1 where absent)."""
    if c.full:
        return np.where((toks >= 0) & (toks < c.size), toks, -1)
    lookup = {int(t): i for i, t in enumerate(c.ids)}
    return np.array([lookup.get(int(t), -1) for t in toks], dtype=np.int64)


def subtract(c: Cands, amounts: dict[int, np.float32]) -> None:
    """logit -= amount for the listed ids (DRY's penalties)."""
    toks = np.fromiter(amounts, dtype=np.int64, count=len(amounts))
    pos = _positions(c, toks)
    for i, t in zip(pos, toks):
        if i >= 0:
            c.logit[i] -= amounts[int(t)]
    c.sorted = False


def top_n_sigma(c: Cands, n: F32) -> None:
    """Mask (to -inf) logits below max - n * std of the finite ones."""
    if n <= 0 or c.size <= 1:
        return
    lg = c.logit
    fin = lg[lg != -np.inf]
    mx = max(lg[0], fin.max()) if fin.size else lg[0]
    mean = np.cumsum(fin)[-1] / F32(fin.size) if fin.size else F32(0)
    acc = libm.sum_sq_f32(fin - mean)
    std = F32(math.sqrt(acc / F32(fin.size))) if fin.size else F32(0)
    c.logit = np.where(lg < mx - n * std, F32(-np.inf), lg)


def top_k(c: Cands, k: int) -> None:
    if k <= 0:
        return
    k = min(k, c.size)
    if not c.sorted:
        sort_top(c, k)
    c.keep(slice(0, k))


def typical(c: Cands, p: F32, min_keep: int) -> None:
    if p >= 1:
        return
    softmax(c, True)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = libm.log_each(c.p)
        entropy = np.cumsum(-c.p * logp)[-1]             # NaN once a probability is 0, as there
        shifted = np.abs(-logp - entropy)
    order = cxxsort.argsort_asc(shifted)
    cum = np.cumsum(c.p[order])
    hit = np.flatnonzero((cum > p) & (np.arange(order.size) >= max(min_keep, 1) - 1))
    c.keep(order[: hit[0] + 1] if hit.size else order)
    c.sorted = False


def top_p(c: Cands, p: F32, min_keep: int) -> None:
    if p >= 1:
        return
    softmax(c, False)
    n = c.size
    if c.sorted:
        order = np.arange(n)
    else:   # a first guess of the 256 best when there are many, else a sort of all
        order = cxxsort.bucket_top(c.logit, 256) if n > 1024 else cxxsort.top_sorted(c.logit, n)

    def cut(order):
        hit = np.flatnonzero((np.cumsum(c.p[order]) >= p) & (np.arange(1, order.size + 1) >= min_keep))
        return hit[0] + 1 if hit.size else None

    last = cut(order)
    if last is None and order.size < n:                  # the first guess was too short: sort all
        order = cxxsort.bucket_top(c.logit, n)
        last = cut(order)
    c.keep(order[: n if last is None else last])
    c.sorted = True


def min_p(c: Cands, p: F32, min_keep: int) -> None:
    if p <= 0 or c.size == 0:
        return
    if not c.sorted:
        keep = c.logit >= c.logit.max() + libm.logf(p)
        if keep.any() and np.count_nonzero(keep) >= min_keep:
            c.keep(np.flatnonzero(keep))
            return
        sort_top(c, c.size)
    below = np.flatnonzero((c.logit < c.logit[0] + libm.logf(p)) & (np.arange(c.size) >= min_keep))
    below = below[below >= 1]
    c.keep(slice(0, below[0] if below.size else c.size))


def xtc(c: Cands, prob: F32, threshold: F32, min_keep: int, rng: MT19937) -> None:
    """Exclude the top choices: with chance prob, drop every token above threshold but the last."""
    if prob <= 0 or threshold > F32(0.5) or c.size < 2:
        return
    if canonical_float(rng) > prob:
        return
    softmax(c, True)
    above = c.p >= threshold
    pos_last = int(np.argmin(above)) - 1 if not above.all() else c.size - 1
    pos_last = max(pos_last, 0)
    if c.size - pos_last >= min_keep and pos_last > 0:
        c.keep(slice(pos_last, None))


def temp(c: Cands, t: F32) -> None:
    """llama_sampler_temp_impl: logits / t; t <= 0 keeps the first max and masks the rest to -inf."""
    if c.size == 0:
        return
    if t <= 0:
        i = int(np.argmax(c.logit))
        lg = np.full(c.size, F32(-np.inf))
        lg[i] = c.logit[i]
        c.logit = lg
        return
    c.logit = c.logit / t


def temp_ext(c: Cands, t: F32, delta: F32, exponent: F32) -> None:
    """Dynamic temperature: t +- delta mapped from the normalized entropy."""
    if delta <= 0:
        temp(c, t)
        return
    lo, hi = max(F32(0), t - delta), t + delta
    if c.size <= 1:
        return
    max_entropy = -libm.logf(F32(1) / F32(c.size))
    softmax(c, True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(c.p > 0, c.p * libm.log_each(c.p), F32(0))
    entropy = -np.cumsum(terms)[-1]                       # entropy -= p * logf(p), in order
    dyn = lo + (hi - lo) * libm.powf(entropy / max_entropy, exponent)
    temp(c, F32(dyn))
    # the probabilities recomputed in double there are read by no later stage of these chains


def greedy(c: Cands) -> None:
    c.selected = int(np.argmax(c.logit))                  # the first maximum


def dist(c: Cands, rng: MT19937) -> None:
    """llama_sampler_dist: softmax with a double sum, then the first running sum >= u * total."""
    if c.size == 0:
        c.selected = -1
        return
    if c.size == 1:
        canonical_double(rng)                             # one draw per token, as the backend path
        c.selected = 0
        return
    m = c.logit[0] if c.sorted else c.logit.max()
    cum = np.cumsum(libm.exp_shifted(c.logit, m).astype(np.float64))
    u = canonical_double(rng)
    i = int(np.searchsorted(cum, cum[-1] * u, side="left"))
    c.selected = min(i, c.size - 1)


def mirostat(c: Cands, n_vocab: int, tau: F32, eta: F32, m: int, mu: F32, rng: MT19937) -> F32:
    """Mirostat 1.0: top-k from the estimated Zipf exponent, a std::discrete_distribution draw; new mu."""
    softmax(c, True)
    sum_tb, sum_tt = F32(0), F32(0)
    with np.errstate(all="ignore"):
        for i in range(min(m - 1, c.size - 1)):
            t_i = libm.logf(F32(i + 2) / F32(i + 1))
            b_i = libm.logf(c.p[i] / c.p[i + 1])
            sum_tb = F32(sum_tb + t_i * b_i)
            sum_tt = F32(sum_tt + t_i * t_i)
        s_hat = F32(sum_tb / sum_tt)
        eps = F32(s_hat - F32(1))
        k = libm.powf(F32(eps * libm.powf(2, mu)) / F32(F32(1) - libm.powf(F32(n_vocab), -eps)), F32(1) / s_hat)
    # int(k) as x86 converts: NaN and out-of-range values become INT32_MIN
    ki = int(k) if math.isfinite(k) and -2.0 ** 31 <= k < 2.0 ** 31 else INT32_MIN
    top_k(c, max(ki, 1))
    softmax(c, True)
    return _mirostat_pick(c, tau, eta, mu, rng)


def mirostat_v2(c: Cands, tau: F32, eta: F32, mu: F32, rng: MT19937) -> F32:
    """Mirostat 2.0: keep the tokens whose surprise is at most mu (at least one); new mu."""
    softmax(c, True)
    c.keep(slice(0, max(libm.first_surprise_over(c.p, mu), 1)))
    softmax(c, True)
    return _mirostat_pick(c, tau, eta, mu, rng)


def _mirostat_pick(c: Cands, tau: F32, eta: F32, mu: F32, rng: MT19937) -> F32:
    c.selected = discrete(rng, c.p)
    e = F32(-libm.log2f(c.p[c.selected]) - tau)
    return F32(mu - eta * e)
