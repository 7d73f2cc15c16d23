"""SentencePiece-style (SPM) segmentation as llama.cpp's llm_tokenizer_spm does it.

Start from single characters, repeatedly merge the adjacent pair whose concatenation is the
highest-scoring vocabulary entry (ties: leftmost first), and emit each final piece as its token,
or as byte tokens (<0xHH>) when the piece is not in the vocabulary.
"""
from __future__ import annotations

from heapq import heappop, heappush

from .utf8 import byte_units, has_surrogates, to_bytes
from .vocab import Vocab


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def spm_segment(vocab: Vocab, text: str, out: list[int]) -> None:
    """Append the tokens of `text` (already whitespace-escaped) to `out`."""
    if not text:
        return
    if has_surrogates(text):
        # invalid UTF-8 input: work on llama.cpp's byte chunks; vocabulary keys are the
        # surrogateescape decodings of the token bytes, so decode each candidate the same way
        syms: list = byte_units(to_bytes(text))
        key = _dec
    else:
        syms = list(text)
        key = None
    n = len(syms)
    get = vocab.token_to_id.get
    scores = vocab.scores
    if n > 1:
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            pair = syms[i] + syms[i + 1]
            tid = get(key(pair) if key else pair)
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, len(pair)))
        heap.sort()   # a sorted list is a valid heap

        while heap:
            _, left, right, size = heappop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue   # one side already merged elsewhere
            merged = ls + rs
            syms[left] = merged
            syms[right] = rs[:0]
            r2 = nxt[right]
            nxt[left] = r2
            if r2 >= 0:
                prv[r2] = left
            p = prv[left]
            if p >= 0:
                pair = syms[p] + merged
                tid = get(key(pair) if key else pair)
                if tid is not None:
                    heappush(heap, (-scores[tid], p, left, len(pair)))
            if r2 >= 0:
                pair = merged + syms[r2]
                tid = get(key(pair) if key else pair)
                if tid is not None:
                    heappush(heap, (-scores[tid], left, r2, len(pair)))
    else:
        nxt = [-1]

    i = 0
    while i != -1:
        piece = syms[i]
        tid = get(key(piece) if key else piece)
        if tid is not None:
            out.append(tid)
        else:
            # every merged piece is a vocabulary entry, so only single characters get here
            raw = piece if key else piece.encode("utf-8")
            for b in raw:
                out.append(vocab.byte_to_token(b))
        i = nxt[i]
