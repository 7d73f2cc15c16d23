"""Speculative decoding: several tokens out of one pass over the weights, with the same answer.

A drafter proposes tokens cheaply; the target model evaluates the last sampled token plus the
drafts as one batch (one read of every streamed weight, out of core) and keeps the drafts it agrees
with. The loop is llama-cpp-python's ``Llama.generate`` with a ``draft_model`` (0.3.36), which is
also llama.cpp's ``common_sampler_sample_and_accept_n``:

    prompt: one evaluation, every token an output (llama-cpp-python sets logits_all with a draft model)
    t = sample(logits of the last position)
    loop:  yield t; d = drafter(context + [t])[: room in the context]
           L = eval([t] + d) as one batch, all rows' logits            f32[1 + len(d), n_vocab]
           for i: s = sample(L[i]); if i < len(d) and s == d[i]: yield s (accepted) and go on
                  else: drop the cached positions past [t] + d[:i], t = s, and draft again

Each sample is the target's own draw for its position (the sampler sees the accepted tokens as its
history and draws once per sampled token, as without drafts), so greedy output is the target's
greedy output and a sampled one keeps the target's distribution. Only the rounding of the batched
verification (a batch of 1 + len(d) rows) differs from one token per pass, exactly as in llama.cpp.

Drafters: `PromptLookup` (n-grams of the context: llama-cpp-python's LlamaPromptLookupDecoding,
optionally with an adaptive length) and `DraftModel` (a small resident model with the same
vocabulary, drafting greedily as llama.cpp's common_speculative_gen_draft). Any callable
input_ids -> ids works, as llama-cpp-python's LlamaDraftModel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import InvalidArgument


@dataclass
class SpecStats:
    """What speculation did in one generate call (Engine.timings.spec)."""

    drafted: int = 0          # draft tokens proposed and verified
    accepted: int = 0         # of them, kept
    passes: int = 0           # target passes after the prompt (verifications and plain one-token steps)
    tokens: int = 0           # tokens generated (yielded)

    def as_dict(self) -> dict:
        return {"drafted": self.drafted, "accepted": self.accepted, "passes": self.passes,
                "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
                "tokens_per_pass": self.tokens / self.passes if self.passes else float(self.tokens)}


def _check_count(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InvalidArgument(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


class PromptLookup:
    """Draft by n-gram lookup in the context (prompt and generated text).

    The rules are llama-cpp-python's LlamaPromptLookupDecoding: for n from max_ngram_size down to 1,
    the first earlier occurrence of the context's last n tokens that has a continuation gives up to
    num_pred_tokens tokens that followed it. adaptive=False is exactly those rules (the same batches
    as llama-cpp-python, so the same arithmetic). adaptive=True (ramforge's default on its CLI and
    server) sizes the draft by recent acceptance: a fully accepted draft doubles the length (up to
    num_pred_tokens), a partly accepted one sets it to the accepted count + 1, a rejected one halves
    it; after two rejected drafts in a row it stops proposing for a while (2, 4, ... 64 tokens),
    resumed by the first acceptance, so text that does not repeat its context costs nothing extra.
    """

    MAX_PAUSE = 64

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10, adaptive: bool = False):
        self.max_ngram_size = _check_count("max_ngram_size", max_ngram_size, 1)
        self.num_pred_tokens = _check_count("num_pred_tokens", num_pred_tokens, 1)
        self.adaptive = bool(adaptive)
        self.reset()

    def reset(self) -> None:
        self._k, self._misses, self._pause, self._wait = self.num_pred_tokens, 0, 0, 0

    @staticmethod
    def lookup(ids: np.ndarray, max_ngram_size: int, num_pred_tokens: int) -> np.ndarray:
        """LlamaPromptLookupDecoding.find_candidate_pred_tokens: i32 draft ids (maybe none)."""
        n = ids.shape[0]
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            win = np.lib.stride_tricks.sliding_window_view(ids, size)
            for idx in np.flatnonzero((win == ids[n - size:]).all(axis=1)):
                start = idx + size
                if start < min(start + num_pred_tokens, n):
                    return ids[start:start + num_pred_tokens].astype(np.int32)
        return np.zeros(0, np.int32)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        if self.adaptive and self._wait > 0:
            self._wait -= 1
            return np.zeros(0, np.int32)
        k = self._k if self.adaptive else self.num_pred_tokens
        return self.lookup(np.asarray(input_ids, np.int64).reshape(-1), self.max_ngram_size, k)

    def feedback(self, drafted: int, accepted: int) -> None:
        """The verification's outcome for the last non-empty draft (adaptive length)."""
        if not self.adaptive or drafted == 0:
            return
        if accepted == drafted:
            self._k = min(self.num_pred_tokens, 2 * self._k)
        elif accepted:
            self._k = min(self.num_pred_tokens, accepted + 1)
        else:
            self._k = max(1, self._k // 2)
        if accepted:
            self._misses, self._pause = 0, 0
            return
        self._misses += 1
        if self._misses >= 2:
            self._pause = min(self.MAX_PAUSE, max(2, 2 * self._pause))
            self._wait, self._misses = self._pause, 0


class DraftModel:
    """A small model with the target's vocabulary, resident and charged to the target's budget,
    drafting greedily as llama.cpp's common_speculative_gen_draft: up to n_max tokens, stopping at
    the first whose probability (a softmax over the draft's 10 best logits) is below p_min; a draft
    shorter than n_min is dropped. Its KV cache keeps the longest common prefix between calls.

    `path` is a model file (or a loaded ramforge Engine); the target's loader attaches it (`attach`)
    under the target's budget before the target itself is planned."""

    TOP_K = 10

    def __init__(self, path, n_max: int = 16, n_min: int = 0, p_min: float = 0.75):
        self.path = path
        self.n_max = _check_count("draft n_max (--draft-max)", n_max, 1)
        self.n_min = _check_count("draft n_min (--draft-min)", n_min, 0)
        if self.n_min > self.n_max:
            raise InvalidArgument(f"--draft-min {self.n_min} is above --draft-max {self.n_max}")
        if not (isinstance(p_min, (int, float)) and 0.0 <= p_min <= 1.0):
            raise InvalidArgument(f"draft p_min must be a number in [0, 1], got {p_min!r}")
        self.p_min = float(p_min)
        self.engine = None

    def attach(self, load, budget, n_ctx: int, n_threads: int | None = None) -> "DraftModel":
        """Load the draft fully resident under `budget` with `load` (Engine.load); OutOfBudget names
        what it needs. A DraftModel made from a loaded engine keeps it."""
        from ..errors import OutOfBudget
        from ..gguf.reader import GGUFFile
        from ..stream.plan import plan_for_budget

        if self.engine is None:
            if hasattr(self.path, "eval"):                    # a loaded Engine
                self.engine = self.path
            else:
                with GGUFFile(self.path) as f:
                    need = plan_for_budget(f, None, n_ctx).resident_budget
                if budget.available is not None and budget.available < need:
                    raise OutOfBudget(f"the draft model {self.path} needs {need:,} B to stay resident (weights, "
                                      f"KV cache at context {n_ctx}, activations) and the budget has "
                                      f"{budget.available:,} B left; raise --ram or choose a smaller draft model")
                self.engine = load(self.path, n_ctx=n_ctx, budget=budget, n_threads=n_threads)
        return self

    def check_vocab(self, target_tokenizer) -> None:
        """InvalidArgument naming the first token the draft's vocabulary spells differently."""
        check_same_vocab(target_tokenizer, self.engine.tokenizer)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        eng = self.engine
        ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
        room = eng.n_ctx - len(ids)
        if room <= 0:
            return np.zeros(0, np.int32)
        keep = 0
        limit = min(len(ids) - 1, len(eng.tokens))          # at least the last token is evaluated anew
        while keep < limit and eng.tokens[keep] == ids[keep]:
            keep += 1
        eng.reset(keep)
        logits = eng.eval(ids[keep:])[-1]
        out = []
        for _ in range(min(self.n_max, room)):
            top = np.partition(logits, logits.size - self.TOP_K)[-self.TOP_K:] if logits.size > self.TOP_K else logits
            t = int(np.argmax(logits))
            p = 1.0 / float(np.exp(top.astype(np.float64) - float(logits[t])).sum())
            if p < self.p_min:
                break
            out.append(t)
            if len(out) == min(self.n_max, room):
                break
            logits = eng.eval([t])[-1]
        if len(out) < self.n_min:
            out = []
        return np.asarray(out, np.int32)

    def close(self) -> None:
        if self.engine is not None and self.engine is not self.path:
            self.engine.close()
        self.engine = None


def check_same_vocab(target, draft) -> None:
    """Refuse a draft whose vocabulary differs from the target's, naming the first differing token."""
    a, b = target.n_vocab, draft.n_vocab
    for i in range(min(a, b)):
        ta, tb = target.token_text(i), draft.token_text(i)
        if ta != tb:
            raise InvalidArgument(f"the draft model's vocabulary differs from the target's at token {i}: "
                                  f"{tb!r} vs {ta!r}; a draft model needs the same vocabulary")
    if a != b:
        raise InvalidArgument(f"the draft model has {b:,} tokens, the target {a:,}; a draft model needs the "
                              f"same vocabulary (first missing token: {min(a, b)})")


def speculate(eng, history: list[int], logits: np.ndarray, max_tokens: int, sampler, drafter,
              stop_on_eog: bool) -> Iterator[int]:
    """Engine.generate's loop with drafts (see the module docstring); history is the prompt and grows
    with the generated tokens; logits f32[n_vocab] are the prompt's last."""
    stats = eng.timings.spec = SpecStats()
    feedback = getattr(drafter, "feedback", None)

    def pick(row: np.ndarray) -> int:
        return int(np.argmax(row)) if sampler is None else sampler.sample(row, history)

    tok = pick(logits)
    while True:
        if stop_on_eog and eng.tokenizer.is_eog(tok):
            return
        history.append(tok)
        stats.tokens = eng.timings.gen_tokens = eng.timings.gen_tokens + 1
        yield tok
        if stats.tokens == max_tokens:
            return
        room = eng.n_ctx - eng.n_past - 1                   # context left past tok
        draft = [int(t) for t in np.asarray(drafter(np.asarray(history, np.int32))).reshape(-1)[:max(room, 0)]]
        base = eng.n_past
        rows = eng.eval([tok] + draft, all_logits=True, as_batch=True)     # f32[1 + len(draft), n_vocab]
        stats.passes += 1
        stats.drafted += len(draft)
        n_ok = 0
        for i in range(len(draft) + 1):
            tok = pick(rows[i])
            if i == len(draft) or tok != draft[i]:
                break
            n_ok += 1                                       # an accepted draft is a generated token
            if stop_on_eog and eng.tokenizer.is_eog(tok):
                stats.accepted += n_ok
                return
            history.append(tok)
            stats.tokens = eng.timings.gen_tokens = eng.timings.gen_tokens + 1
            yield tok
            if stats.tokens == max_tokens:
                stats.accepted += n_ok
                return
        stats.accepted += n_ok
        if draft and feedback is not None:
            feedback(len(draft), n_ok)
        if n_ok < len(draft):
            eng.reset(base + 1 + n_ok)                      # drop the rejected drafts' cached positions


def make_drafter(lookup: int | None = None, lookup_ngram: int = 2, lookup_fixed: bool = False,
                 draft: str | None = None, draft_max: int = 16, draft_min: int = 0, draft_p_min: float = 0.75):
    """The drafter the CLI and server options ask for (None: no speculation). lookup: the most tokens
    a prompt-lookup draft proposes (adaptive unless lookup_fixed: llama-cpp-python's rules)."""
    if lookup is not None and draft is not None:
        raise InvalidArgument("--lookup and --draft are two drafters: choose one")
    if lookup is not None:
        return PromptLookup(lookup_ngram, lookup, adaptive=not lookup_fixed)
    if draft is not None:
        return DraftModel(draft, n_max=draft_max, n_min=draft_min, p_min=draft_p_min)
    return None


def check_draft_length(drafter, n_ctx: int) -> None:
    """A draft length that cannot fit the context is refused (--draft-max/--lookup above it)."""
    k = getattr(drafter, "n_max", getattr(drafter, "num_pred_tokens", 0))
    if k >= n_ctx:
        raise InvalidArgument(f"a draft of up to {k} tokens cannot fit a context of {n_ctx}: lower --draft-max "
                              f"(--lookup) below the context or raise --ctx")
