"""Byte-level BPE as llama.cpp's llm_tokenizer_bpe does it.

Each pre-tokenized word (byte-encoded unless the model uses raw UTF-8 with <0xHH> fallback) is
split into characters; the adjacent pair with the lowest merge rank is merged until no ranked
pair remains (ties: leftmost first).  Pieces missing from the vocabulary fall back to byte tokens.
"""
from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

from .pretokenize import pre_tokenize
from .utf8 import has_surrogates, lenient_decode, to_bytes
from .vocab import KEY, TokenizerMetadataError, Vocab

_WORD_CACHE_MAX = 1 << 16


def load_ranks(md: dict[str, Any]) -> dict[str, int]:
    """Merge rank by merge text "left right"; the first occurrence of a duplicate wins."""
    merges = md.get(KEY + "merges")
    if merges is None:
        raise TokenizerMetadataError(f"{KEY}merges is missing: a BPE vocabulary needs its merge list")
    if not isinstance(merges, (list, tuple)) or (len(merges) and not isinstance(merges[0], str)):
        raise TokenizerMetadataError(f"{KEY}merges must be an array of strings, got {type(merges).__name__}")
    n = len(merges)
    # Lookups are always "left right" with no space inside left or right, so keying by the merge
    # text itself is the same as llama.cpp's split at the first space after position 0.
    return dict(zip(reversed(merges), range(n - 1, -1, -1)))


class BPESegmenter:
    def __init__(self, vocab: Vocab, ranks: dict[str, int], exprs: tuple[str, ...], byte_encode: bool,
                 gemma4_newlines: bool = False):
        self.vocab = vocab
        self.ranks = ranks
        self.exprs = exprs
        self.byte_encode = byte_encode
        self.gemma4_newlines = gemma4_newlines
        self._cache: dict[str, tuple[int, ...]] = {}

    def segment(self, text: str, out: list[int]) -> None:
        if not text:
            return
        if has_surrogates(text):   # invalid UTF-8: read the bytes the way llama.cpp does
            text = lenient_decode(to_bytes(text))
        cache = self._cache
        for word in pre_tokenize(text, self.exprs, self.byte_encode):
            toks = cache.get(word)
            if toks is None:
                toks = self._word(word)
                if len(cache) >= _WORD_CACHE_MAX:
                    cache.clear()
                cache[word] = toks
            out.extend(toks)

    def _word(self, word: str) -> tuple[int, ...]:
        t2i = self.vocab.token_to_id
        if not word:
            return ()
        if self.vocab.ignore_merges or (self.gemma4_newlines and word.strip("\n") == ""):
            tid = t2i.get(word)
            if tid is not None:
                return (tid,)
        n = len(word)
        if n == 1:
            return self._emit([word])
        ranks = self.ranks
        syms = list(word)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            pair = syms[i] + syms[i + 1]
            r = ranks.get(syms[i] + " " + syms[i + 1])
            if r is not None:
                heap.append((r, i, i + 1, pair))
        heap.sort()
        while heap:
            _, left, right, pair = heappop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or ls + rs != pair:
                continue   # stale
            syms[left] = pair
            syms[right] = ""
            r2 = nxt[right]
            nxt[left] = r2
            if r2 >= 0:
                prv[r2] = left
            p = prv[left]
            if p >= 0:
                r = ranks.get(syms[p] + " " + pair)
                if r is not None:
                    heappush(heap, (r, p, left, syms[p] + pair))
            if r2 >= 0:
                r = ranks.get(pair + " " + syms[r2])
                if r is not None:
                    heappush(heap, (r, left, r2, pair + syms[r2]))
        pieces = []
        i = 0
        while i != -1:
            pieces.append(syms[i])
            i = nxt[i]
        return self._emit(pieces)

    def _emit(self, pieces: list[str]) -> tuple[int, ...]:
        t2i = self.vocab.token_to_id
        out: list[int] = []
        for s in pieces:
            tid = t2i.get(s)
            if tid is not None:
                out.append(tid)
                continue
            # unknown piece: one token per byte of its (byte-encoded) text, silently skipping bytes
            # that have no token -- exactly what llama.cpp does
            for b in s.encode("utf-8", "surrogatepass"):
                if self.byte_encode:
                    key = chr(b) if b < 0x80 else chr(0xDC00 + b)
                else:
                    key = f"<0x{b:02X}>"
                tid = t2i.get(key)
                if tid is not None:
                    out.append(tid)
        return tuple(out)
