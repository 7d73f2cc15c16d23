"""WordPiece (tokenizer.ggml.model = "bert"), as llama.cpp's llm_tokenizer_wpm.

Preprocess: code points mapped to the first code point of their NFD form (which drops accents, as
llama.cpp's table does), whitespace splits words, control characters, NUL and U+FFFD are dropped,
everything lowercased; punctuation, ASCII symbols and CJK ideographs stand alone as words. Each word
gets the phantom-space prefix "\u2581" and is cut greedily into the longest vocabulary tokens from
the left; a word with a part no token matches becomes the unknown token as a whole.
"""
from __future__ import annotations

import unicodedata

from .unidata import CONTROL, PUNCTUATION, SYMBOL, WHITESPACE, char_flags

PHANTOM = "\u2581"
# llama.cpp's is_chinese_char (its 0x2B920 start is HF's, kept as llama.cpp keeps it)
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# WPM's own special token ids when the file names none (llama.cpp's defaults for "bert")
SPECIAL_DEFAULTS = {"bos": 101, "eos": None, "unk": 100, "sep": 102, "pad": 0, "mask": 103}

_NFD: dict[str, str] = {}


def _nfd_first(ch: str) -> str:
    r = _NFD.get(ch)
    if r is None:
        r = _NFD[ch] = unicodedata.normalize("NFD", ch)[0]
    return r


def _is_cjk(cp: int) -> bool:
    return any(a <= cp <= b for a, b in _CJK)


def words(text: str) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the words of text, normalized and lowercased."""
    out = [""]
    for raw in text:
        ch = _nfd_first(raw)
        f = char_flags(ch)
        if f & WHITESPACE:
            if out[-1]:
                out.append("")
            continue
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or f & CONTROL:
            continue
        low = ch.lower()[0]
        if f & PUNCTUATION or (cp < 0x7F and f & SYMBOL) or _is_cjk(cp):
            if out[-1]:
                out.append("")
            out[-1] = low
            out.append("")
        else:
            out[-1] += low
    if not out[-1]:
        out.pop()
    return out


class WPMSegmenter:
    """Greedy longest-match WordPiece over a vocabulary's token texts."""

    def __init__(self, vocab):
        self.t2i = vocab.token_to_id
        self.unk = vocab.special["unk"]
        # the longest token in UTF-8 bytes, as llama.cpp's max_token_len (a bound on the match length)
        self.max_len = max((len(t.encode("utf-8", "surrogatepass")) for t in vocab.tokens), default=0)

    def segment(self, text: str, out: list[int]) -> None:
        t2i, max_len = self.t2i, self.max_len
        for word in words(text):
            w = PHANTOM + word
            b = w.encode("utf-8", "surrogatepass")
            n, start, i = len(b), len(out), 0
            while i < n:
                for j in range(min(n, i + max_len + 1), i, -1):
                    tid = t2i.get(b[i:j].decode("utf-8", "surrogatepass")) if _boundary(b, i, j) else None
                    if tid is not None:
                        out.append(tid)
                        i = j
                        break
                else:                                   # no match: the whole word is discarded
                    del out[start:]
                    break
            if len(out) == start:
                out.append(self.unk)


def _boundary(b: bytes, i: int, j: int) -> bool:
    """b[i:j] starts and ends on UTF-8 character boundaries (llama.cpp compares byte substrings; a
    token text is whole characters, so a cut inside one never matches)."""
    return (j == len(b) or (b[j] & 0xC0) != 0x80) and (b[i] & 0xC0) != 0x80
