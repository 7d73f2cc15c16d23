"""Pieces of llama.cpp's JSON-schema converter that stand alone (common/json-schema-to-grammar.cpp):
repetitions, integer ranges as digit rules, literal escaping, and the rule of strings that are none
of a given set (a trie). Each yields the very text llama.cpp writes.
"""
from __future__ import annotations

import json
import re

from .schema import INT64_MAX, INT64_MIN

INT_MAX = 2 ** 31 - 1
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_RE = re.compile(r'[\r\n"\\]')


def format_literal(s: str) -> str:
    """A GBNF string literal: \\r, \\n, \" and \\\\ escaped, everything else as it is."""
    return '"' + _LITERAL_RE.sub(lambda m: _LITERAL_ESCAPES[m.group()], s) + '"'


def dump(value) -> str:
    """A JSON value as nlohmann's compact dump() writes it (UTF-8, no spaces)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def repetition(item: str, lo: int, hi: int, sep: str = "") -> str:
    """item repeated lo..hi times (hi INT_MAX: unbounded), with `sep` between items."""
    has_max = hi != INT_MAX
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return item + "?"
    if not sep:
        if lo == 1 and not has_max:
            return item + "+"
        if lo == 0 and not has_max:
            return item + "*"
        return f"{item}{{{lo},{hi if has_max else ''}}}"
    out = item + " " + repetition(f"({sep} {item})", 0 if lo == 0 else lo - 1, hi - 1 if has_max else hi)
    return f"({out})?" if lo == 0 else out


def min_max_int(lo: int, hi: int, decimals: int = 16, top: bool = True) -> str:
    """Digits of the integers in [lo, hi] (INT64_MIN / INT64_MAX: unbounded), as build_min_max_int."""
    out: list[str] = []
    _min_max(lo, hi, out, decimals, top)
    return "".join(out)


def _digits(out, a: str, b: str) -> None:
    out.append(f"[{a}]" if a == b else f"[{a}-{b}]")


def _more(out, lo: int, hi: int) -> None:
    out.append("[0-9]")
    if lo == hi == 1:
        return
    out.append("{" + str(lo))
    if hi != lo:
        out.append("," + (str(hi) if hi != INT_MAX else ""))
    out.append("}")


def _uniform(out, a: str, b: str) -> None:
    """Same-length decimal strings a <= b: every number between them."""
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    if i > 0:
        out.append(f'"{a[:i]}"')
    if i < len(a) and i < len(b):
        if i > 0:
            out.append(" ")
        n = len(a) - i - 1
        if n > 0:
            a_sub, b_sub, zeros, nines = a[i + 1:], b[i + 1:], "0" * n, "9" * n
            reached = False
            out.append("(")
            if a_sub == zeros:
                _digits(out, a[i], chr(ord(b[i]) - 1))
                out.append(" ")
                _more(out, n, n)
            else:
                out.append(f"[{a[i]}] (")
                _uniform(out, a_sub, nines)
                out.append(")")
                if ord(a[i]) < ord(b[i]) - 1:
                    out.append(" | ")
                    if b_sub == nines:
                        _digits(out, chr(ord(a[i]) + 1), b[i])
                        reached = True
                    else:
                        _digits(out, chr(ord(a[i]) + 1), chr(ord(b[i]) - 1))
                    out.append(" ")
                    _more(out, n, n)
            if not reached:
                out.append(" | ")
                _digits(out, b[i], b[i])
                out.append(" ")
                _uniform(out, zeros, b_sub)
            out.append(")")
        else:
            out.append(f"[{a[i]}-{b[i]}]")


def _min_max(lo: int, hi: int, out: list, decimals: int, top: bool) -> None:
    has_min, has_max = lo != INT64_MIN, hi != INT64_MAX
    if has_min and has_max:
        if lo < 0 and hi < 0:
            out.append('"-" (')
            _min_max(-hi, -lo, out, decimals, True)
            out.append(")")
            return
        if lo < 0:
            out.append('"-" (')
            _min_max(0, -lo, out, decimals, True)
            out.append(") | ")
            lo = 0
        a, b = str(lo), str(hi)
        for d in range(len(a), len(b)):
            _uniform(out, a, "9" * d)
            a = "1" + "0" * d
            out.append(" | ")
        _uniform(out, a, b)
        return
    less = max(decimals - 1, 1)
    if has_min:
        if lo < 0:
            out.append('"-" (')
            _min_max(INT64_MIN, -lo, out, decimals, False)
            out.append(") | [0] | [1-9] ")
            _more(out, 0, decimals - 1)
        elif lo == 0:
            if top:
                out.append("[0] | [1-9] ")
                _more(out, 0, less)
            else:
                _more(out, 1, decimals)
        elif lo <= 9:
            c, start = str(lo), "1" if top else "0"
            if c > start:
                _digits(out, start, chr(ord(c) - 1))
                out.append(" ")
                _more(out, 1, less)
                out.append(" | ")
            _digits(out, c, "9")
            out.append(" ")
            _more(out, 0, less)
        else:
            s = str(lo)
            c = s[0]
            if c > "1":
                _digits(out, "1" if top else "0", chr(ord(c) - 1))
                out.append(" ")
                _more(out, len(s), less)
                out.append(" | ")
            _digits(out, c, c)
            out.append(" (")
            _min_max(int(s[1:]), INT64_MAX, out, less, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                _digits(out, chr(ord(c) + 1), "9")
                out.append(" ")
                _more(out, len(s) - 1, less)
        return
    if has_max:
        if hi >= 0:
            if top:
                out.append('"-" [1-9] ')
                _more(out, 0, less)
                out.append(" | ")
            _min_max(0, hi, out, decimals, True)
        else:
            out.append('"-" (')
            _min_max(-hi, INT64_MAX, out, decimals, False)
            out.append(")")
        return
    raise ValueError("At least one of min_value or max_value must be set")


def not_strings(strings: list[str], char_rule: str) -> str:
    """A JSON string that is none of `strings` (a trie over their code points, children in order)."""
    root: dict = {}
    END = None
    for w in strings:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[END] = True
    out: list[str] = ['["] ( ']

    def kids(node: dict) -> list:
        return sorted((k for k in node if k is not END), key=ord)

    # llama.cpp's recursive walk of the trie, with a stack of its own (a name may be long)
    stack: list = [(root, kids(root), 0)]
    while stack:
        top = stack.pop()
        if top is None:                       # a child's group ends
            out.append(")")
            continue
        node, ks, j = top
        if j == len(ks):
            if ks:
                out.append(f' | [^"{"".join(ks)}] {char_rule}*')
            continue
        stack.append((node, ks, j + 1))
        if j:
            out.append(" | ")
        out.append(f"[{ks[j]}]")
        child = node[ks[j]]
        child_kids = kids(child)
        if child_kids:
            out.append(" (")
            stack += [None, (child, child_kids, 0)]
        else:
            out.append(f" {char_rule}+")
    out.append(" )")
    if END not in root:
        out.append("?")
    out.append(' ["]')
    return "".join(out)
