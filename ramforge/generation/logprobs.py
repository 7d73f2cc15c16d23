"""Log-probabilities of generated tokens, as llama.cpp's front ends report them.

The value is llama.cpp's: the softmax of the raw logits row (before any sampler stage: logit bias,
penalties, temperature and cuts change the pick, not the reported distribution), logged. Two ways of
computing it, as the two references do (they agree to ~1e-7):

  LCPP   llama-cpp-python's `Llama.logits_to_logprobs` (float32: x - max - log(sum(exp(x - max))));
         alternatives ranked by (logprob, id) descending (its `sorted(..., reverse=True)`).
  SERVER llama-server's `get_token_probabilities` order: std::partial_sort of the ids by logit for
         the n best (libstdc++'s, so equal logits come out as there). Its values divide by a float32
         running sum over the vocabulary, which drifts by up to ~3e-4 in log p on a 262k vocabulary
         (measured on gemma-3); the values here are LCPP's, within ~1e-7 of the exact softmax.

`Recorder` wraps a sampler: each `sample(logits, history)` first notes the row's `Step` for the
token it picks, so the engine's loops (plain and speculative) need no hook. The shapes: `legacy`
(OpenAI's and llama-cpp-python's text-completion `logprobs`), `content_entry` (llama-server's
chat `logprobs.content[]`: id, token, bytes, logprob, top_logprobs) and `ollama_entry` (Ollama's
`logprobs[]`: token, logprob, bytes, top_logprobs). Token text is the token's piece (control tokens
empty), its bytes exact; a piece that ends inside a UTF-8 character shows only its whole characters
in `token` (llama-server's validate_utf8; llama-cpp-python drops invalid bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from ..kernels import cxxsort

LCPP, SERVER = "llama-cpp-python", "llama-server"
MAX_TOP = 20                    # OpenAI's and llama-server's cap on alternatives
F32 = np.float32


@dataclass
class Step:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)     # best first


def check_top(n, what: str = "top_logprobs") -> int:
    """A requested number of alternatives: an integer in 0..20 (InvalidArgument: 400 otherwise)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_TOP:
        raise InvalidArgument(f"{what} must be an integer between 0 and {MAX_TOP}, got {n!r}")
    return int(n)


def log_softmax(logits) -> np.ndarray:
    """llama-cpp-python's Llama.logits_to_logprobs of one row (float32)."""
    x = np.asarray(logits, dtype=F32)
    m = x.max()
    d = np.subtract(x, m if np.isfinite(m) else F32(0), dtype=F32)
    with np.errstate(divide="ignore"):
        return d - np.log(np.sum(np.exp(d)))


def _top_lcpp(lp: np.ndarray, n: int) -> list[tuple[int, float]]:
    if n <= 0:
        return []
    k = min(n, lp.size)
    thr = np.partition(lp, lp.size - k)[lp.size - k]
    cand = np.flatnonzero(lp >= thr)
    order = np.lexsort((-cand, -lp[cand]))[:k]                 # logprob desc, then id desc
    return [(int(cand[i]), float(lp[cand[i]])) for i in order]


def step_lcpp(logits, token: int, n: int) -> Step:
    lp = log_softmax(logits)
    return Step(int(token), float(lp[token]), _top_lcpp(lp, n))


def step_server(logits, token: int, n: int) -> Step:
    """llama-server's populate_token_probs (probabilities before sampling) for one position: its
    alternatives in its order (std::partial_sort by logit), the values as LCPP computes them."""
    x = np.asarray(logits, dtype=F32)
    lp = log_softmax(x)
    k = min(n, x.size)
    if k <= 0:
        return Step(int(token), float(lp[token]), [])
    ids = np.arange(x.size)
    cxxsort.partial_sort(ids, 0, k, x.size, x)
    return Step(int(token), float(lp[token]), [(int(i), float(lp[i])) for i in ids[:k]])


class Recorder:
    """A sampler wrapper noting each pick's Step (n alternatives, computed as `style` does)."""

    def __init__(self, sampler, n: int, style: str = LCPP):
        if style not in (LCPP, SERVER):
            raise InvalidArgument(f"logprobs style must be {LCPP!r} or {SERVER!r}, got {style!r}")
        self.sampler, self.n, self.style = sampler, check_top(n, "logprobs"), style
        self.steps: list[Step] = []

    def sample(self, logits, history=()):
        row = np.array(logits, dtype=F32)           # before the chain, which may work in place
        tok = self.sampler.sample(logits, history) if self.sampler is not None else int(np.argmax(row))
        self.steps.append((step_lcpp if self.style == LCPP else step_server)(row, tok, self.n))
        return tok

    def __getattr__(self, name):
        return getattr(self.sampler, name)


# ---- shapes ----------------------------------------------------------------------------------------

def _piece(tokenizer, tok: int, special: bool = False) -> bytes:
    return tokenizer.token_to_piece(tok, special)


def _whole_chars(b: bytes) -> str:
    """llama-server's token text: an incomplete trailing UTF-8 character cut (validate_utf8)."""
    n = len(b)
    for i in range(1, min(4, n) + 1):
        c = b[n - i]
        if (c & 0xE0 == 0xC0 and i < 2) or (c & 0xF0 == 0xE0 and i < 3) or (c & 0xF8 == 0xF0 and i < 4):
            n -= i
            break
    return b[:n].decode("utf-8", "replace")


def legacy(steps: list[Step], tokenizer, offset: int = 0, generated: bytes = b"") -> dict:
    """llama-cpp-python's (OpenAI's legacy) completion logprobs: tokens, text_offset, token_logprobs,
    top_logprobs ({text: logprob}, the pick's own entry last). `offset`: characters before the first
    token (llama-cpp-python: len(prompt)); `generated`: the bytes of the tokens before these steps."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    done = generated
    for s in steps:
        piece = _piece(tokenizer, s.token)
        text = piece.decode("utf-8", "ignore")
        out["tokens"].append(text)
        out["text_offset"].append(offset + len(done.decode("utf-8", "ignore")))
        out["token_logprobs"].append(s.logprob)
        top = {_piece(tokenizer, i).decode("utf-8", "ignore"): lp for i, lp in s.top}
        top[text] = s.logprob
        out["top_logprobs"].append(top)
        done += piece
    return out


def chat_from_legacy(lp: dict) -> dict:
    """llama-cpp-python's chat `logprobs` made of its legacy completion ones (bytes: null)."""
    return {"content": [{"token": t, "bytes": None, "logprob": v,
                         "top_logprobs": [{"token": k, "logprob": x, "bytes": None} for k, x in top.items()]}
                        for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])],
            "refusal": None}


def _entry(tokenizer, tok: int, lp: float, special: bool, with_id: bool) -> dict:
    b = _piece(tokenizer, tok, special)
    d = {"id": tok} if with_id else {}
    d.update(token=_whole_chars(b), logprob=lp, bytes=list(b))
    return d


def content_entry(s: Step, tokenizer, special: bool = False) -> dict:
    """One llama-server chat `logprobs.content[]` entry (OpenAI's fields, plus llama-server's `id`)."""
    d = _entry(tokenizer, s.token, s.logprob, special, True)
    d["top_logprobs"] = [_entry(tokenizer, i, lp, special, True) for i, lp in s.top]
    return d


def chat_logprobs(steps: list[Step], tokenizer) -> dict:
    """A chat choice's `logprobs` object."""
    return {"content": [content_entry(s, tokenizer) for s in steps], "refusal": None}


def ollama_entry(s: Step, tokenizer) -> dict:
    """One entry of Ollama's `logprobs` list (token, logprob, bytes, top_logprobs)."""
    d = _entry(tokenizer, s.token, s.logprob, False, False)
    d["top_logprobs"] = [_entry(tokenizer, i, lp, False, False) for i, lp in s.top]
    return d
