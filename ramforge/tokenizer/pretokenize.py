"""Pre-tokenizer: split text into words before BPE, as llama.cpp's ``unicode_regex_split`` does.

A pre-tokenizer is a list of regular expressions applied in turn; each one refines the current
segmentation (matches and the gaps between them both become segments).  llama.cpp recognises a
few expressions by their exact text and runs hand-written splitters for them (GPT-2, Llama-3,
Qwen2, Qwen3.5, newline runs); every other expression goes through std::regex.  Unicode
classes (\\p{L}, \\p{N}, ...) are handled by "collapsing" each non-ASCII code point to one
placeholder character for its category and rewriting the classes to those placeholders.

We mirror that: the same hand-written splitters (ported to Python), and Python's ``re`` in place
of std::regex on the same collapsed text.  Positions are counted in code points throughout.
"""
from __future__ import annotations

import re
import warnings

from .unidata import (COLLAPSED, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL, WHITESPACE,
                      byte_encode as _byte_encode, collapse, flags_of, whitespace_to_vt)

# --- the expressions llama.cpp uses (pattern text exactly as llama.cpp's) ------------------
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_ORIG = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NEWLINES = "[^\\n]+|[\\n]+"

_DEEPSEEK_LATIN = (
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    r"\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    r"\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    r"\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    r"\U0001e900-\U0001e943]+"
)
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DS3_MAIN = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
             r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_YOUTU_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[{LM}])([^a-z]))*((?=[{LM}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[{LM}])([^a-z]))+((?=[{LM}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# pre-tokenizer type -> (expressions, byte_encode)
PRE_TYPES: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), True),
    "llama3": ((LLAMA3,), True),
    "deepseek-llm": (("[\r\n]", _DEEPSEEK_LATIN, r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                      r"\s+$", _CJK, r"\p{N}+"), True),
    "deepseek-coder": (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"), True),
    "falcon": ((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"), True),
    "starcoder": ((r"\p{N}", GPT2), True),
    "gpt2": ((GPT2,), True),
    "qwen2": ((QWEN2,), True),
    "qwen35": ((QWEN35,), True),
    "gemma4": ((NEWLINES,), False),
    # --- expressions run by the general regex path only (checked against llama.cpp, no goldens) ---
    "jais2": ((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)"
               r"|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",), True),
    "deepseek3": ((r"\p{N}{1,3}", _CJK_KANA, _DS3_MAIN), True),
    "spark2_5": ((r"\p{N}{1,3}", _CJK_KANA,
                  r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                  r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"), True),
    "youtu": ((r"[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
               r"\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
               _YOUTU_WORDS), True),
    "bloom": ((_BLOOM,), True),
    "viking": ((_BLOOM, r"\p{N}"), True),
    "tekken": ((r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])"
                r"([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "chameleon": ((r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                   r"[\p{P}!-/:-@\[-`{-~]", GPT2), True),
    "gpt4o": ((_GPT4O.replace("{LM}", r"\p{L}"),), True),
    "granite-emb-multi": ((_GPT4O.replace("{LM}", r"\p{L}\p{M}"),), True),
    "bailingmoe": ((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    "seed-coder": ((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}"
                    r"| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "ufakzeka": ((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "laguna": ((NEWLINES, QWEN2), True),
    "exaone-moe": ((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?"
                    r"(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    "minicpm5": ((r"\p{N}{1,3}", r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                  r"|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True),
}


# --- hand-written splitters ----------------------------------------------------------------
_LNW = LETTER | NUMBER | WHITESPACE


def _split_gpt2(text: str, fl: list[int], offsets: list[int]) -> list[int]:
    out: list[int] = []
    start = 0
    for seg in offsets:
        ini, end = start, start + seg
        start = end
        pos = ini
        while pos < end:
            c = text[pos]
            f = fl[pos]
            if c == "'" and pos + 1 < end:
                n = text[pos + 1]
                if n in "stmd":
                    out.append(2); pos += 2
                    continue
                if pos + 2 < end and n + text[pos + 2] in ("re", "ve", "ll"):
                    out.append(3); pos += 3
                    continue
            sp = c == " "
            f2 = (fl[pos + 1] if pos + 1 < end else 0) if sp else f
            if f2 & LETTER or f2 & NUMBER:
                cls = LETTER if f2 & LETTER else NUMBER
                p = pos + sp + 1
                while p < end and fl[p] & cls:
                    p += 1
                out.append(p - pos); pos = p
                continue
            if f2 and not f2 & _LNW:
                p = pos + sp + 1
                while p < end and not fl[p] & _LNW:
                    p += 1
                out.append(p - pos); pos = p
                continue
            p = pos
            while p < end and fl[p] & WHITESPACE:
                p += 1
            nws = p - pos
            if nws > 1 and p < end:
                out.append(nws - 1); pos += nws - 1
                continue
            if nws > 0:
                out.append(nws); pos += nws
                continue
            out.append(1); pos += 1
    return out


def _contraction(text: str, pos: int, end: int) -> int:
    """Length of a case-insensitive 's 't 're 've 'm 'll 'd at pos (text[pos] == "'"), else 0."""
    n = text[pos + 1].lower() if text[pos + 1] < "\x80" else ""
    if n in ("s", "t", "m", "d") and n:
        return 2
    if pos + 2 < end:
        nn = text[pos + 2].lower() if text[pos + 2] < "\x80" else ""
        if n + nn in ("re", "ve", "ll"):
            return 3
    return 0


def _make_llama3_like(max_digits: int, letter_cls: int, punct_excl: int):
    """Splitter for the Llama-3 family: \\p{N}{1,max_digits}; letters may include marks (Qwen3.5)."""

    def split(text: str, fl: list[int], offsets: list[int]) -> list[int]:
        out: list[int] = []
        start = 0
        for seg in offsets:
            ini, end = start, start + seg
            start = end
            pos = ini
            while pos < end:
                c = text[pos]
                f = fl[pos]
                if c == "'" and pos + 1 < end:
                    k = _contraction(text, pos, end)
                    if k:
                        out.append(k); pos += k
                        continue
                # [^\r\n\p{L}\p{N}]?\p{L}+   (letters: letter_cls)
                if not (c == "\r" or c == "\n" or f & NUMBER):
                    if f & letter_cls or (pos + 1 < end and fl[pos + 1] & letter_cls):
                        p = pos + 1
                        while p < end and fl[p] & letter_cls:
                            p += 1
                        out.append(p - pos); pos = p
                        continue
                # \p{N}{1,max_digits}
                if f & NUMBER:
                    p = pos
                    while p < end and fl[p] & NUMBER:
                        p += 1
                    n = p - pos
                    while n > max_digits:
                        out.append(max_digits); n -= max_digits
                    out.append(n); pos = p
                    continue
                # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
                sp = c == " "
                f2 = (fl[pos + 1] if pos + 1 < end else 0) if sp else f
                if not f2 & punct_excl:
                    p = pos + sp
                    while p < end and not fl[p] & punct_excl:
                        p += 1
                    while p < end and text[p] in "\r\n":
                        p += 1
                    out.append(p - pos); pos = p
                    continue
                p = pos
                last_rn = 0
                while p < end and fl[p] & WHITESPACE:
                    if text[p] in "\r\n":
                        last_rn = p + 1
                    p += 1
                nws = p - pos
                if last_rn:
                    out.append(last_rn - pos); pos = last_rn
                    continue
                if nws > 1 and p < end:
                    out.append(nws - 1); pos += nws - 1
                    continue
                if nws > 0:
                    out.append(nws); pos += nws
                    continue
                out.append(1); pos += 1
        return out

    return split


def _split_newlines(text: str, fl: list[int] | None, offsets: list[int]) -> list[int]:
    out: list[int] = []
    start = 0
    for seg in offsets:
        pos, end = start, start + seg
        start = end
        while pos < end:
            nl = text[pos] == "\n"
            p = pos + 1
            while p < end and (text[p] == "\n") == nl:
                p += 1
            out.append(p - pos); pos = p
    return out


_CUSTOM = {
    GPT2: _split_gpt2,
    LLAMA3: _make_llama3_like(3, LETTER, _LNW),
    LLAMA3_ORIG: _make_llama3_like(3, LETTER, _LNW),
    QWEN2: _make_llama3_like(1, LETTER, _LNW),
    QWEN35: _make_llama3_like(1, LETTER | MARK, _LNW | MARK),
    NEWLINES: _split_newlines,
}
_NEEDS_FLAGS = {GPT2, LLAMA3, LLAMA3_ORIG, QWEN2, QWEN35}

# --- general expressions via Python's re ---------------------------------------------------
_UCAT = {"N": NUMBER, "L": LETTER, "P": PUNCTUATION, "M": MARK, "S": SYMBOL,
         "Lu": LETTER, "Ll": LETTER, "Lt": LETTER, "Lm": LETTER, "Lo": LETTER}
_UCAT_ASCII = {
    NUMBER: "0-9",
    LETTER: "A-Za-z",
    PUNCTUATION: r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    MARK: "",
    SYMBOL: r"\$\+<->\^`\|~",
}
_UCAT_RE = re.compile(r"\\p\{(Lu|Ll|Lt|Lm|Lo|N|L|P|M|S)\}")


def uses_categories(expr: str) -> bool:
    return _UCAT_RE.search(expr) is not None


def translate(expr: str) -> str:
    """llama.cpp pattern -> Python pattern over collapsed text (if it uses \\p{..}) or raw text.

    \\p{X} becomes the placeholder for X plus its ASCII members; an unescaped '$' outside a class
    becomes \\Z (ECMAScript '$' without multiline only matches at the very end).
    """
    out = []
    inside = False
    i = 0
    n = len(expr)
    while i < n:
        ch = expr[i]
        if ch == "\\" and i + 1 < n:
            m = _UCAT_RE.match(expr, i)
            if m:
                flag = _UCAT[m.group(1)]
                body = COLLAPSED[flag] + _UCAT_ASCII[flag]
                out.append(body if inside else "[" + body + "]")
                i = m.end()
                continue
            out.append(expr[i:i + 2])
            i += 2
            continue
        if ch == "[" and not inside:
            inside = True
        elif ch == "]" and inside:
            inside = False
        elif ch == "$" and not inside:
            out.append(r"\Z")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


_COMPILED: dict[str, re.Pattern] = {}


def _compiled(expr: str) -> re.Pattern:
    pat = _COMPILED.get(expr)
    if pat is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            pat = re.compile(translate(expr), re.ASCII)
        _COMPILED[expr] = pat
    return pat


def _split_regex(subject: str, expr: str, offsets: list[int]) -> list[int]:
    pat = _compiled(expr)
    out: list[int] = []
    start = 0
    for seg in offsets:
        piece = subject[start:start + seg]
        last = 0
        for m in pat.finditer(piece):
            a, b = m.span()
            if a > last:
                out.append(a - last)
            if b > a:
                out.append(b - a)
            last = b
        if last < seg:
            out.append(seg - last)
        start += seg
    return out


def split_words(text: str, exprs: tuple[str, ...]) -> list[str]:
    """Apply the expressions in turn; return the words (not yet byte-encoded)."""
    if not text:
        return []
    offsets = [len(text)]
    fl = None
    collapsed = None
    vt_text = None
    for expr in exprs:
        custom = _CUSTOM.get(expr)
        if custom is not None:
            if fl is None and expr in _NEEDS_FLAGS:
                fl = flags_of(text)
            offsets = custom(text, fl, offsets)
        elif uses_categories(expr):
            if collapsed is None:
                collapsed = collapse(text)
            offsets = _split_regex(collapsed, expr, offsets)
        else:
            if vt_text is None:
                vt_text = whitespace_to_vt(text)
            offsets = _split_regex(vt_text, expr, offsets)
    words = []
    pos = 0
    for seg in offsets:
        words.append(text[pos:pos + seg])
        pos += seg
    return words


def pre_tokenize(text: str, exprs: tuple[str, ...], byte_encode: bool) -> list[str]:
    words = split_words(text, exprs)
    if byte_encode:
        return [_byte_encode(w) for w in words]
    return words
