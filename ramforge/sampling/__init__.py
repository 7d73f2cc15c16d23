"""Token sampling: llama.cpp's sampler chain, stage for stage and draw for draw.

Two chain orders, one per surface (`Sampler(chain=...)`):

    "llama-cpp-python" (ramforge.Model, both servers), as Llama._init_sampler builds it:
        logit bias -> penalties -> DRY -> greedy (temperature 0)
                                        | mirostat 1 | mirostat 2          (no temperature stage)
                                        | top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC
                                          -> temperature (dynamic) -> dist
    "llama.cpp" (the CLI), as common_sampler_init builds it with the default sampler order:
        logit bias -> penalties -> DRY -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC
                   -> temperature (dynamic; 0 keeps the best token alone) -> dist
        mirostat 1 / 2: logit bias -> temperature -> mirostat (no penalties, no DRY)

llama-cpp-python offers no DRY, top-n-sigma, XTC or dynamic temperature; enabled on that surface they
sit where llama.cpp's order puts them. What the penalties and DRY look back over differs too: the
llama-cpp-python chain sees only the tokens it sampled itself (llama_sampler_sample accepts each; the
prompt is never accepted), the llama.cpp chain the caller's history (llama-completion accepts the
prompt). ``repeat_last_n`` / ``dry_penalty_last_n`` = -1 means the whole history (llama.cpp's older
"-1 = context size"; this llama.cpp refuses negatives, and its sampler turns them into 0, off).

A grammar (`Sampler(grammar=...)`, a ramforge.structured.Grammar) is a stage after DRY, where
llama-cpp-python's chain has llama_sampler_init_grammar: the tokens it does not allow get -inf, and
each sampled token advances it (llama.cpp's accept). On the llama.cpp chain it sits at the same place
(common_sampler's resampling with the grammar first is not reproduced).

Random numbers are llama.cpp's: dist, XTC and mirostat each own a std::mt19937 seeded with the seed
(`rng`); a seed of None, -1 or LLAMA_DEFAULT_SEED draws one at random on each reset. The float steps
are llama.cpp's, with glibc's expf / logf / powf (`libm`), and its sorts are libstdc++'s (`cxxsort`),
so equal logits come out in llama.cpp's order (typical-p's NaN entropy, once a probability is 0,
included). So a seeded request gives llama.cpp's tokens (tests/test_sampling_oracle.py).
"""
from __future__ import annotations

import numbers
import secrets

import numpy as np

from .params import LLAMA_DEFAULT_SEED, SamplerError, SamplerParams  # noqa: F401  (the table lives in params)
from . import stages as S
from .dry import breaker_table, dry_penalties
from .rng import MT19937

LCPP, LLAMA = "llama-cpp-python", "llama.cpp"
CHAINS = (LCPP, LLAMA)
MIROSTAT_M = 100                     # llama-cpp-python and common_sampler_init both pass m = 100
F32 = np.float32


def warm(n_vocab: int) -> None:
    """Compile (or load from numba's cache) the kernels of greedy picking and of the default chain,
    with and without top-k, on a dummy row. A server calls it as it loads a model: a kernel compiled
    on a request's first use holds the GIL for seconds, and its event loop with it."""
    logits = np.random.default_rng(0).standard_normal(n_vocab).astype(F32)
    for params in (SamplerParams(temperature=0.0), SamplerParams(seed=0), SamplerParams(top_k=0, seed=0)):
        Sampler(params, n_vocab).sample(logits)


class Sampler:
    """Picks the next token from one row of logits with llama.cpp's chain (see the module doc).

    State carried between calls, reset by `reset()`: the random generators, mirostat's mu and the
    tokens sampled so far (llama.cpp's accepted tokens), the grammar's position. `tokenizer` is needed
    for DRY's sequence breakers only; `grammar`: a ramforge.structured.Grammar constraining the picks."""

    def __init__(self, params: SamplerParams | None, n_vocab: int, *, chain: str = LCPP, tokenizer=None,
                 grammar=None):
        self.params = p = (params if params is not None else SamplerParams()).validate()
        if isinstance(n_vocab, bool) or not isinstance(n_vocab, numbers.Integral) or n_vocab < 1:
            raise SamplerError("n_vocab", n_vocab, "an integer >= 1")
        if chain not in CHAINS:
            raise SamplerError("chain", chain, " or ".join(CHAINS))
        self.n_vocab, self.chain = int(n_vocab), chain
        self.bias = tuple(p.logit_bias or ())
        for tok, _ in self.bias:
            if tok >= n_vocab:
                raise SamplerError("logit_bias", tok, f"token ids in [0, {n_vocab - 1}]")
        self.temp = F32(p.temperature)
        self.mirostat = p.mirostat
        self.greedy = chain == LCPP and p.temperature == 0     # Llama._init_sampler: temp == 0.0
        pen = (p.repeat_last_n != 0 and not (F32(p.repeat_penalty) == 1 and F32(p.frequency_penalty) == 0
                                              and F32(p.presence_penalty) == 0))
        dry = F32(p.dry_multiplier) != 0 and F32(p.dry_base) >= 1 and p.dry_penalty_last_n != 0
        if chain == LLAMA and p.mirostat:
            pen = dry = False                            # mirostat's chain has no penalties
        self.use_penalties, self.use_dry = pen, dry
        self._breakers = {}
        if dry and p.dry_sequence_breakers:
            if tokenizer is None:
                raise SamplerError("dry_sequence_breakers", p.dry_sequence_breakers,
                                   "a Sampler made with the model's tokenizer")
            self._breakers = breaker_table(tokenizer, p.dry_sequence_breakers)
        if grammar is not None and grammar.n_vocab != self.n_vocab:
            raise SamplerError("grammar", f"a grammar for {grammar.n_vocab} tokens", f"one for n_vocab {n_vocab}")
        self.grammar = grammar
        self._ids = np.arange(self.n_vocab, dtype=np.int64)
        self._work = np.empty(self.n_vocab, dtype=np.float32)
        self.reset()

    def reset(self) -> None:
        """Restart the random streams from the seed (a random seed is drawn afresh, as llama.cpp
        does), mirostat's mu and the accepted tokens."""
        s = self.params.seed
        self.seed = secrets.randbelow(LLAMA_DEFAULT_SEED) if s in (None, -1, LLAMA_DEFAULT_SEED) else int(s)
        self._rng = MT19937(self.seed)                   # dist's, or mirostat's
        self._xtc_rng = MT19937(self.seed) if self.params.xtc_probability > 0 else None
        self.mu = F32(2) * F32(self.params.mirostat_tau)
        self.tokens: list[int] = []
        self.grammar_state = self.grammar.state() if self.grammar is not None else None

    def accept(self, token: int) -> None:
        """Feed a token to the chain's memory without sampling it (llama_sampler_accept)."""
        self.tokens.append(int(token))
        if self.grammar_state is not None:
            self.grammar_state.accept(token)

    # ---- the chain -------------------------------------------------------------------------------
    def _check(self, logits) -> np.ndarray:
        x = np.asarray(logits, dtype=np.float32)
        if x.shape != (self.n_vocab,):
            raise SamplerError("logits", f"array of shape {x.shape}", f"shape ({self.n_vocab},) (n_vocab)")
        m = x.max()
        if not np.isfinite(m):
            raise SamplerError("logits", f"array with max {m}", "no NaN or +inf, and at least one finite value")
        return x

    def _window(self, history) -> np.ndarray:
        if history is None:
            history = self.tokens
        return np.asarray(history, dtype=np.int64).ravel()

    def _last(self, h: np.ndarray, n: int) -> np.ndarray:
        return h if n < 0 else h[max(h.size - n, 0):]

    def _prefix(self, logits, history) -> S.Cands:
        """The candidates after logit bias, penalties and DRY (full vocabulary, id order)."""
        p = self.params
        x = self._check(logits)
        h = self._window(history)
        if self.bias or self.use_penalties or self.use_dry or self.grammar_state is not None:
            np.copyto(self._work, x)
            x = self._work
        c = S.Cands(x, self._ids)
        if self.bias:
            S.logit_bias(c, self.bias)
        if self.use_penalties:
            w = self._last(h, p.repeat_last_n)
            if w.size:
                S.penalties(c, w, F32(p.repeat_penalty), F32(p.frequency_penalty), F32(p.presence_penalty))
        if self.use_dry:
            amounts = dry_penalties(self._last(h, p.dry_penalty_last_n).tolist(), F32(p.dry_multiplier),
                                    F32(p.dry_base), p.dry_allowed_length, self._breakers)
            if amounts:
                S.subtract(c, amounts)
        if self.grammar_state is not None:             # llama_sampler_init_grammar's stage
            if not self.grammar_state.apply(c.logit):
                raise SamplerError("grammar", "a state that allows no token", "a grammar that can continue")
        return c

    def _filters(self, c: S.Cands, xtc_rng) -> None:
        """top-n-sigma .. temperature, in llama.cpp's default order."""
        p, mk = self.params, self.params.min_keep
        S.top_n_sigma(c, F32(p.top_n_sigma))
        S.top_k(c, p.top_k)
        S.typical(c, F32(p.typical_p), mk)
        S.top_p(c, F32(p.top_p), mk)
        S.min_p(c, F32(p.min_p), mk)
        if xtc_rng is not None:
            S.xtc(c, F32(p.xtc_probability), F32(p.xtc_threshold), mk, xtc_rng)
        S.temp_ext(c, self.temp, F32(p.dynatemp_range), F32(p.dynatemp_exponent))

    def _run(self, logits, history, xtc_rng) -> S.Cands:
        """The chain up to its last stage (the draw, greedy or mirostat)."""
        c = self._prefix(logits, history)
        if self.greedy or (self.chain == LCPP and self.mirostat):
            return c
        if self.mirostat:                                # llama.cpp: temperature, then mirostat
            S.temp(c, self.temp)
            return c
        self._filters(c, xtc_rng)
        return c

    def sample(self, logits: np.ndarray, history=()) -> int:
        """The next token id; it joins the sampler's tokens (llama_sampler_sample accepts it).
        ``history``: the tokens so far (prompt included), which the llama.cpp chain's penalties and
        DRY look back over; the llama-cpp-python chain looks at its own sampled tokens instead."""
        c = self._run(logits, history if self.chain == LLAMA else None, self._xtc_rng)
        p = self.params
        if self.greedy:
            S.greedy(c)
        elif self.mirostat == 1:
            self.mu = S.mirostat(c, self.n_vocab, F32(p.mirostat_tau), F32(p.mirostat_eta), MIROSTAT_M,
                                 self.mu, self._rng)
        elif self.mirostat == 2:
            self.mu = S.mirostat_v2(c, F32(p.mirostat_tau), F32(p.mirostat_eta), self.mu, self._rng)
        else:
            S.dist(c, self._rng)
        tok = int(c.ids[c.selected])
        self.tokens.append(tok)
        if self.grammar_state is not None:
            self.grammar_state.accept(tok)
        return tok

    # ---- inspection (no state changes) -----------------------------------------------------------
    def penalize(self, logits: np.ndarray, history=None) -> np.ndarray:
        """The logits after logit bias, penalties and DRY over ``history`` (default: the sampler's
        tokens). The input is not modified; the result may be a buffer the next call overwrites."""
        return self._prefix(logits, history).logit

    def candidates(self, logits: np.ndarray, history=None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and their final logits that the last stage chooses from, in the order it scans
        them (greedy: the single argmax). The random streams are left untouched."""
        xtc = self._xtc_rng.copy() if self._xtc_rng is not None else None
        c = self._run(logits, history, xtc)
        if self.greedy:
            S.greedy(c)
            c.keep([c.selected])
        return c.ids, c.logit

    def probabilities(self, logits: np.ndarray, history=None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the final candidate set: the distribution dist draws from."""
        ids, lg = self.candidates(logits, history)
        e = S.libm.exp_shifted(lg, lg.max()).astype(np.float64)
        return ids, e / e.sum()
