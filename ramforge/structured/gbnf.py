"""GBNF, read as llama.cpp's grammar parser reads it (src/llama-grammar.cpp), written out as Lark for
llguidance.

`parse(text)` follows llama.cpp's parser: its escapes (\\x \\u \\U \\t \\r \\n \\\\ \\" \\[ \\] \\-),
comments, `{m,n}` repetitions and their limit, a later definition of a rule replacing an earlier one,
and its checks (undefined rules, a missing `root`, left recursion); its error messages, with the line
and column. ramforge.structured.lark writes the rules for llguidance. Token references (`<[id]>`, `<name>`)
are refused.
"""
from __future__ import annotations

from ..errors import GrammarError

MAX_REPETITION_THRESHOLD = 2000      # llama.cpp's
_HEX = {"x": 2, "u": 4, "U": 8}
_SIMPLE = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}


class GBNFError(GrammarError):
    """A GBNF grammar llama.cpp's parser refuses: its message, the line and column."""


def _word(c: str) -> bool:
    return len(c) == 1 and c.isascii() and (c.isalnum() or c in "-_")


class _Parser:
    def __init__(self, text: str):
        self.s, self.rules, self.order = text, {}, []

    def fail(self, msg: str, pos: int | None = None):
        if pos is None:
            raise GBNFError(f"error parsing grammar: {msg}")
        line = self.s.count("\n", 0, pos) + 1
        col = pos - (self.s.rfind("\n", 0, pos) + 1) + 1
        rest = self.s[pos:pos + 40]
        raise GBNFError(f"error parsing grammar: {msg} at line {line}, column {col}: {rest!r}")

    def ch(self, i: int) -> str:
        return self.s[i] if i < len(self.s) else ""

    def space(self, i: int, newline_ok: bool) -> int:
        while True:
            c = self.ch(i)
            if c == "#":
                while self.ch(i) and self.ch(i) not in "\r\n":
                    i += 1
            elif c in (" ", "\t") or (newline_ok and c in ("\r", "\n")):
                i += 1
            else:
                return i

    def name(self, i: int) -> int:
        j = i
        while _word(self.ch(j)):
            j += 1
        if j == i:
            self.fail("expecting name", i)
        return j

    def int_(self, i: int) -> int:
        j = i
        while self.ch(j).isascii() and self.ch(j).isdigit():
            j += 1
        if j == i:
            self.fail("expecting integer", i)
        return j

    def char(self, i: int) -> tuple[int, int]:
        c = self.ch(i)
        if c == "\\":
            e = self.ch(i + 1)
            if e in _HEX:
                n = _HEX[e]
                h = self.s[i + 2:i + 2 + n]
                if len(h) != n or not all(x in "0123456789abcdefABCDEF" for x in h):
                    self.fail(f"expecting {n} hex chars", i + 2)
                return int(h, 16), i + 2 + n
            if e in _SIMPLE:
                return _SIMPLE[e], i + 2
            self.fail("unknown escape", i)
        if not c:
            self.fail("unexpected end of input")
        return ord(c), i + 1

    def parse(self) -> dict:
        i = self.space(0, True)
        while i < len(self.s):
            i = self.rule(i)
        if "root" not in self.rules:
            raise GBNFError("grammar does not contain a 'root' symbol")
        for name in self.order:
            for ref in _refs(self.rules[name]):
                if ref not in self.rules:
                    raise GBNFError(f"error parsing grammar: Undefined rule identifier '{ref}'")
        _check_left_recursion(self.rules)
        return self.rules

    def rule(self, i: int) -> int:
        j = self.name(i)
        name = self.s[i:j]
        i = self.space(j, False)
        if self.s[i:i + 3] != "::=":
            self.fail("expecting ::=", i)
        alts, i = self.alternates(self.space(i + 3, True), False)
        if name not in self.rules:
            self.order.append(name)
        self.rules[name] = alts
        c = self.ch(i)
        if c == "\r":
            i += 2 if self.ch(i + 1) == "\n" else 1
        elif c == "\n":
            i += 1
        elif c:
            self.fail("expecting newline or end", i)
        return self.space(i, True)

    def alternates(self, i: int, nested: bool) -> tuple[list, int]:
        seq, i = self.sequence(i, nested)
        alts = [seq]
        while self.ch(i) == "|":
            seq, i = self.sequence(self.space(i + 1, True), nested)
            alts.append(seq)
        return alts, i

    def sequence(self, i: int, nested: bool) -> tuple[list, int]:
        items: list = []
        last = False                              # is there an item a repetition can apply to
        while i < len(self.s):
            c = self.s[i]
            if c == '"':
                i += 1
                cps = []
                while self.ch(i) != '"':
                    if not self.ch(i):
                        self.fail("unexpected end of input")
                    cp, i = self.char(i)
                    cps.append(cp)
                items.append(("lit", cps))
                last = True
                i = self.space(i + 1, nested)
            elif c == "[":
                i += 1
                neg = self.ch(i) == "^"
                i += neg
                ranges = []
                while self.ch(i) != "]":
                    if not self.ch(i):
                        self.fail("unexpected end of input")
                    lo, i = self.char(i)
                    hi = lo
                    if self.ch(i) == "-" and self.ch(i + 1) != "]":
                        if not self.ch(i + 1):
                            self.fail("unexpected end of input")
                        hi, i = self.char(i + 1)
                    ranges.append((lo, hi))
                items.append(("cls", neg, ranges))
                last = True
                i = self.space(i + 1, nested)
            elif c in "<!":
                self.fail("token references (<[id]>, <token>) are not supported", i)
            elif _word(c):
                j = self.name(i)
                items.append(("ref", self.s[i:j]))
                last = True
                i = self.space(j, nested)
            elif c == "(":
                alts, i = self.alternates(self.space(i + 1, True), True)
                items.append(("group", alts))
                last = True
                if self.ch(i) != ")":
                    self.fail("expecting ')'", i)
                i = self.space(i + 1, nested)
            elif c == ".":
                items.append(("any",))
                last = True
                i = self.space(i + 1, nested)
            elif c in "*+?":
                i = self.space(i + 1, nested)
                self.repeat(items, last, i, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
            elif c == "{":
                i = self.space(i + 1, nested)
                if not (self.ch(i).isascii() and self.ch(i).isdigit()):
                    self.fail("expecting an int", i)
                j = self.int_(i)
                lo, hi = int(self.s[i:j]), None
                i = self.space(j, nested)
                if self.ch(i) == "}":
                    hi = lo
                    i = self.space(i + 1, nested)
                elif self.ch(i) == ",":
                    i = self.space(i + 1, nested)
                    if self.ch(i).isascii() and self.ch(i).isdigit():
                        j = self.int_(i)
                        hi = int(self.s[i:j])
                        i = self.space(j, nested)
                    if self.ch(i) != "}":
                        self.fail("expecting '}'", i)
                    i = self.space(i + 1, nested)
                else:
                    self.fail("expecting ','", i)
                if lo > MAX_REPETITION_THRESHOLD:
                    self.fail("number of repetitions exceeds sane defaults, please reduce the number of repetitions")
                if hi is not None and hi > MAX_REPETITION_THRESHOLD:
                    hi = None
                self.repeat(items, last, i, lo, hi)
            else:
                break
        return items, i

    def repeat(self, items: list, last: bool, i: int, lo: int, hi: int | None) -> None:
        if not last or not items:
            self.fail("expecting preceding item to */+/?/{", i)
        items[-1] = ("rep", items[-1], lo, hi)


def _walk(alts: list):
    for seq in alts:
        for it in seq:
            yield it
            while it[0] == "rep":
                it = it[1]
                yield it
            if it[0] == "group":
                yield from _walk(it[1])


def _refs(alts: list):
    return [it[1] for it in _walk(alts) if it[0] == "ref"]


def _check_left_recursion(rules: dict) -> None:
    """llama.cpp's check: a rule reachable from itself through leftmost items (past items that may be
    empty: an optional repetition, or a rule / group with an empty alternative)."""
    def empty_alt(alts):
        return any(not seq or all(it[0] == "lit" and not it[1] for it in seq) for seq in alts)

    def may_be_empty(it) -> bool:
        if it[0] == "rep":
            return it[2] == 0
        if it[0] == "group":
            return empty_alt(it[1])
        if it[0] == "ref":
            return empty_alt(rules[it[1]])
        return it[0] == "lit" and not it[1]

    def leftmost(alts):
        for seq in alts:
            for it in seq:
                base = it
                while base[0] == "rep":
                    base = base[1]
                if base[0] == "ref":
                    yield base[1]
                elif base[0] == "group":
                    yield from leftmost(base[1])
                if not may_be_empty(it):
                    break

    state: dict[str, int] = {}              # 1: in progress, 2: done

    def visit(name: str) -> None:
        if state.get(name) == 1:
            raise GBNFError(f"unsupported grammar, left recursion detected for nonterminal {name!r}")
        if state.get(name) == 2:
            return
        state[name] = 1
        for ref in leftmost(rules[name]):
            visit(ref)
        state[name] = 2

    for name in rules:
        visit(name)


def parse(text: str) -> dict:
    """The rules of a GBNF grammar: name -> alternatives (lists of items). GBNFError as llama.cpp refuses it."""
    if not isinstance(text, str):
        raise GBNFError(f"a grammar must be GBNF text, not {type(text).__name__}")
    return _Parser(text).parse()
