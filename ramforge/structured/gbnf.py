"""GBNF, read as llama.cpp's grammar parser reads it (src/llama-grammar.cpp), written out as Lark for
llguidance.

`parse(text)` follows llama.cpp's parser: its escapes (\\x \\u \\U \\t \\r \\n \\\\ \\" \\[ \\] \\-),
comments, `{m,n}` repetitions and their limit, a later definition of a rule replacing an earlier one,
and its checks (undefined rules, a missing `root`, left recursion); its error messages, with the line
and column. ramforge.structured.lark writes the rules for llguidance. Token references (`<[id]>`, `<name>`)
are refused.

Limits of ramforge's own (llama.cpp has none): a grammar of at most MAX_GRAMMAR_CHARS characters
and MAX_RULES rules, items nested (groups and repetitions) at most MAX_NESTING deep; beyond them,
GrammarTooLarge (a 400). No pass over the rules recurses along a chain of rule references, so a chain of thousands of
rules costs no more than their text.
"""
from __future__ import annotations

from ..errors import GrammarError, RequestTooLarge

MAX_REPETITION_THRESHOLD = 2000      # llama.cpp's
MAX_GRAMMAR_CHARS = 256 << 10        # ramforge's: a grammar's text
MAX_NESTING = 100                    # ramforge's: groups and repetitions inside one another
MAX_RULES = 4096                     # ramforge's: rules (see ramforge.structured.matcher on llguidance's stack)
_HEX = {"x": 2, "u": 4, "U": 8}
_SIMPLE = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}


class GBNFError(GrammarError):
    """A GBNF grammar llama.cpp's parser refuses: its message, the line and column."""


class GrammarTooLarge(GBNFError, RequestTooLarge):
    """A grammar over ramforge's limits (MAX_GRAMMAR_CHARS, MAX_NESTING): the limit and the size."""


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
        alts, i, _ = self.alternates(self.space(i + 3, True), False, 0)
        if name not in self.rules:
            self.order.append(name)
            if len(self.order) > MAX_RULES:
                self.too_large(f"over {MAX_RULES:,} rules", i)
        self.rules[name] = alts
        c = self.ch(i)
        if c == "\r":
            i += 2 if self.ch(i + 1) == "\n" else 1
        elif c == "\n":
            i += 1
        elif c:
            self.fail("expecting newline or end", i)
        return self.space(i, True)

    def alternates(self, i: int, nested: bool, depth: int) -> tuple[list, int, int]:
        """(alternatives, end, height). depth: the groups around them; height: the most groups and
        repetitions nested in one of their items (depth + height stays within MAX_NESTING)."""
        seq, i, height = self.sequence(i, nested, depth)
        alts = [seq]
        while self.ch(i) == "|":
            seq, i, h = self.sequence(self.space(i + 1, True), nested, depth)
            alts.append(seq)
            height = max(height, h)
        return alts, i, height

    def sequence(self, i: int, nested: bool, depth: int) -> tuple[list, int, int]:
        items: list = []
        heights: list = []                        # per item: the groups and repetitions in it
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
                heights.append(0)
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
                heights.append(0)
                last = True
                i = self.space(i + 1, nested)
            elif c in "<!":
                self.fail("token references (<[id]>, <token>) are not supported", i)
            elif _word(c):
                j = self.name(i)
                items.append(("ref", self.s[i:j]))
                heights.append(0)
                last = True
                i = self.space(j, nested)
            elif c == "(":
                if depth >= MAX_NESTING:
                    self.too_large(f"groups nested over {MAX_NESTING} deep", i)
                alts, i, h = self.alternates(self.space(i + 1, True), True, depth + 1)
                items.append(("group", alts))
                heights.append(h + 1)
                last = True
                if self.ch(i) != ")":
                    self.fail("expecting ')'", i)
                i = self.space(i + 1, nested)
            elif c == ".":
                items.append(("any",))
                heights.append(0)
                last = True
                i = self.space(i + 1, nested)
            elif c in "*+?":
                i = self.space(i + 1, nested)
                self.repeat(items, heights, depth, last, i, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
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
                self.repeat(items, heights, depth, last, i, lo, hi)
            else:
                break
        return items, i, max(heights, default=0)

    def repeat(self, items: list, heights: list, depth: int, last: bool, i: int, lo: int, hi: int | None) -> None:
        if not last or not items:
            self.fail("expecting preceding item to */+/?/{", i)
        items[-1] = ("rep", items[-1], lo, hi)
        heights[-1] += 1
        if depth + heights[-1] > MAX_NESTING:
            self.too_large(f"groups and repetitions nested over {MAX_NESTING} deep", i)

    def too_large(self, what: str, pos: int):
        line = self.s.count("\n", 0, pos) + 1
        raise GrammarTooLarge(f"grammar too large: {what} (line {line}), over ramforge's limit; "
                              "split it into named rules")


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
    for root in rules:                      # a depth-first search with its own stack
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(leftmost(rules[root])))]
        while stack:
            name, refs = stack[-1]
            ref = next(refs, None)
            if ref is None:
                state[name] = 2
                stack.pop()
            elif state.get(ref) == 1:
                raise GBNFError(f"unsupported grammar, left recursion detected for nonterminal {ref!r}")
            elif ref not in state:
                state[ref] = 1
                stack.append((ref, iter(leftmost(rules[ref]))))


def parse(text: str) -> dict:
    """The rules of a GBNF grammar: name -> alternatives (lists of items). GBNFError as llama.cpp refuses it."""
    if not isinstance(text, str):
        raise GBNFError(f"a grammar must be GBNF text, not {type(text).__name__}")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarTooLarge(f"grammar too large: {len(text):,} characters, over ramforge's limit of "
                              f"{MAX_GRAMMAR_CHARS:,}")
    return _Parser(text).parse()
