"""DRY ("don't repeat yourself"), as llama-sampler.cpp's port of koboldcpp's: a token that would
extend a sequence already seen in the last dry_penalty_last_n tokens, beyond dry_allowed_length,
loses multiplier * base^(length - allowed). Sequence breakers (strings) stop the look-back; they are
matched in token space as llama.cpp does (`breaker_table`): a token whose text contains a breaker is
a single-token breaker, and a token whose text ends with a breaker's head is followed by the tokens
of the breaker's rest.
"""
from __future__ import annotations

import weakref

import numpy as np

from . import libm

F32 = np.float32
MAX_CHAR_LEN = 40              # a breaker is cut to this many bytes
MAX_SEQ_LEN = 20               # and its tail to this many tokens
FLOAT_MAX_LOG = F32(88.7228391)

_pieces: "weakref.WeakKeyDictionary[object, list[bytes]]" = weakref.WeakKeyDictionary()
_tables: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def _token_texts(tokenizer) -> list[bytes]:
    """Every token's text as llama_vocab::detokenize({id}, special = true) gives it (kept per tokenizer)."""
    texts = _pieces.get(tokenizer)
    if texts is None:
        texts = [tokenizer.detokenize_bytes([i], special=True) for i in range(tokenizer.n_vocab)]
        _pieces[tokenizer] = texts
    return texts


def breaker_table(tokenizer, breakers) -> dict[int, list[tuple[int, ...]]]:
    """llama.cpp's processed breakers: head token -> its tails (() for a single-token breaker).
    A scan of the vocabulary (~1 s for 262k tokens), kept per tokenizer and breaker list."""
    known = _tables.setdefault(tokenizer, {})
    if tuple(breakers) not in known:
        known[tuple(breakers)] = _breaker_table(tokenizer, breakers)
    return known[tuple(breakers)]


def _breaker_table(tokenizer, breakers) -> dict[int, list[tuple[int, ...]]]:
    table: dict[int, list[tuple[int, ...]]] = {}
    texts = _token_texts(tokenizer) if breakers else []
    for s in breakers:
        s = s.encode("utf-8")[:MAX_CHAR_LEN]
        if not s:
            continue
        for tid, word in enumerate(texts):
            if s in word:
                table.setdefault(tid, []).append(())
                continue
            pos = word.find(s[:1])
            while pos >= 0:
                n = len(word) - pos                     # word's tail is s's head (n < len(s))
                if word[pos:] == s[:n]:
                    tail = tuple(tokenizer.encode(s[n:], add_special=False, parse_special=False)[:MAX_SEQ_LEN])
                    if tail not in table.get(tid, []):
                        table.setdefault(tid, []).append(tail)
                pos = word.find(s[:1], pos + 1)
    return table


def dry_penalties(last: list[int], multiplier: F32, base: F32, allowed: int,
                  breakers: dict[int, list[tuple[int, ...]]]) -> dict[int, F32]:
    """token -> the amount DRY subtracts from its logit, given the last dry_penalty_last_n tokens."""
    n = len(last)
    if n <= allowed:
        return {}

    def rat(i):                                         # i-th token from the end
        return last[n - 1 - i]

    # 1: the nearest sequence breaker limits how far back a repeat may reach
    rep_limit = n
    for i in range(n):
        tails = breakers.get(rat(i))
        if tails is None:
            continue
        longest = -1
        for tail in tails:
            L = len(tail)
            if longest < L <= i and all(tail[o] == rat(i - o - 1) for o in range(L)):
                longest = L
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return {}

    # 2: Z-algorithm over the reversed tokens: how long a suffix repeats ending at each position
    count = [0] * n
    last_i, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            count[last_i - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p, right = k - lt, rt - k + 1
            if count[last_i - p] < right:
                count[last_i - k] = min(count[last_i - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                count[last_i - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1

    # 3: the token after each repeat would extend it
    longest_for: dict[int, int] = {}
    for i in range(n - 1):
        if count[i] >= allowed:
            tok = rat(n - 2 - i)
            if longest_for.get(tok, -1) < count[i]:
                longest_for[tok] = count[i]

    # 4: multiplier * base^(length - allowed), the exponent capped so that the power stays finite
    max_exp = int(FLOAT_MAX_LOG / libm.logf(base)) if base > F32(1.000001) else 0
    out = {}
    for tok, length in longest_for.items():
        if () in breakers.get(tok, ()):
            continue                                    # a single-token breaker is never penalised
        e = length - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = F32(float(multiplier) * float(base) ** e)    # std::pow(float, int) is a double pow
    return out
