"""Parsed GBNF (ramforge.structured.gbnf) written as llguidance's Lark, accepting the same language as
llama.cpp's pushdown matcher.

llguidance splits a grammar into lexemes (regular expressions, matched greedily: a lexeme ends only
where the next byte cannot extend it) and a parser over them. A greedy lexeme can cut a parse a
context-free reading allows (`x ::= [a-z]*` before "b"), so every rule stays a parser rule and every
lexeme is one character (a literal is split into its characters), with one exception, for speed: a
repetition of a regular item (no recursion) directly followed by a literal whose first character
cannot start the item (a JSON string's `char*` before its closing quote) becomes one lexeme. There
the lexeme can only be extended by a character that could not begin the literal, so greedy matching
ends it exactly where the parse must go on.

Linear in the grammar: a rule is written once and referenced by name, and the tables the writer
consults (which rules are regular, which may be empty, each regular rule's regex and first
characters) are built once per rule, dependencies first, without recursing along rule references.
A lexeme inlines a regular rule's regex, so it is fused only while that regex stays within
MAX_LEXEME_CHARS (and MAX_LEXEME_NESTING) and all fused lexemes within MAX_FUSED_CHARS; past that the repetition stays a
parser rule (the same language). A lowered grammar over MAX_LARK_CHARS is GrammarTooLarge (400).

The grammar carries `no_forcing`: llguidance would otherwise allow only the canonical tokenization of
text the grammar forces, where llama.cpp allows any token that fits.
"""
from __future__ import annotations

from bisect import bisect_right

from .. import cancel
from .gbnf import GrammarTooLarge, _refs

ANY = r"[\x{0}-\x{10FFFF}]"
MAX_CP = 0x10FFFF
MAX_LEXEME_CHARS = 4096          # the regex of one fused lexeme
MAX_LEXEME_NESTING = 64          # its groups inside one another (llguidance's regex parser stops at 250)
MAX_FUSED_CHARS = 1 << 18        # all fused lexemes of a grammar together
MAX_LARK_CHARS = 8 << 20         # the lowered grammar


def _cp(c: int) -> str:
    return f"\\x{{{c:X}}}"


def _merge(ranges) -> list:
    """Sorted, merged (lo, hi) code point ranges."""
    out: list = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _sccs(rules: dict) -> tuple[list, dict]:
    """(components, refs): Tarjan's strongly connected components of the rule reference graph, each after every
    component it references (dependencies first); iterative, so a long chain of rules is fine."""
    refs = {n: [r for r in dict.fromkeys(_refs(alts)) if r in rules] for n, alts in rules.items()}
    index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
    for root in rules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            for j in range(k, len(refs[v])):
                w = refs[v][j]
                if w not in index:
                    work.append((v, j + 1))
                    work.append((w, 0))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
    return out, refs


class _Writer:
    def __init__(self, rules: dict):
        self.rules = rules
        self.names = {n: ("start" if n == "root" else f"r{i}") for i, n in enumerate(rules)}
        self.fused = 0
        self._nullable()
        order, refs = _sccs(rules)
        self.regular: set = set()
        self.rule_regex: dict = {}           # regular rule -> its regex (None: over MAX_LEXEME_CHARS)
        self.rule_first: dict = {}           # regular rule with a regex -> ranges a match can start with
        self.rule_nesting: dict = {}         # regular rule with a regex -> its groups' nesting
        for comp in order:                   # dependencies first
            n = comp[0]
            if len(comp) > 1 or n in refs[n] or not all(r in self.regular for r in refs[n]):
                continue
            self.regular.add(n)
            rx = self._alts_regex(rules[n])
            self.rule_regex[n] = rx
            if rx is not None:
                self.rule_first[n] = self._seq_first(rules[n])
                self.rule_nesting[n] = 1 + max((self.nesting(x) for seq in rules[n] for x in seq), default=0)

    # ---- which rules and items may match the empty string (a worklist: linear)
    def _nullable(self) -> None:
        """Nodes (rule names; groups and repetitions by id) that may match nothing."""
        self.empty: set = set()
        users: dict = {}
        prods: list = []                     # [owner, items not yet known empty]
        queue: list = []

        def node(it):
            return it[1] if it[0] == "ref" else id(it)

        def add_prods(owner, alts):
            for seq in alts:
                if any(self._terminal(x) and not self._terminal_empty(x) for x in seq):
                    continue
                nodes = [node(x) for x in seq if not self._terminal(x)]
                p = len(prods)
                prods.append([owner, len(nodes)])
                for v in nodes:
                    users.setdefault(v, []).append(p)
                if not nodes:
                    queue.append(owner)
            for seq in alts:
                for x in seq:
                    visit(x)

        def visit(it):
            if it[0] == "group":
                add_prods(id(it), it[1])
            elif it[0] == "rep":
                if it[2] == 0:
                    queue.append(id(it))
                else:
                    add_prods(id(it), [[it[1]]])
                    return
                visit(it[1])

        for name, alts in self.rules.items():
            add_prods(name, alts)
        while queue:
            v = queue.pop()
            if v in self.empty:
                continue
            self.empty.add(v)
            for p in users.get(v, ()):
                prods[p][1] -= 1
                if prods[p][1] == 0:
                    queue.append(prods[p][0])

    @staticmethod
    def _terminal(it) -> bool:
        return it[0] in ("lit", "cls", "any")

    @staticmethod
    def _terminal_empty(it) -> bool:
        return (it[0] == "lit" and not it[1]) or (it[0] == "cls" and not it[2])

    def nullable(self, it) -> bool:
        if self._terminal(it):
            return self._terminal_empty(it)
        return (it[1] if it[0] == "ref" else id(it)) in self.empty

    def is_regular(self, it) -> bool:
        k = it[0]
        if k == "ref":
            return it[1] in self.regular
        if k == "group":
            return all(self.is_regular(x) for seq in it[1] for x in seq)
        if k == "rep":
            return self.is_regular(it[1])
        return True

    def nesting(self, it) -> int:
        """The groups of the item's regex inside one another (regular items with a regex only)."""
        k = it[0]
        if k == "ref":
            return self.rule_nesting[it[1]]
        if k == "group":
            return 1 + max((self.nesting(x) for seq in it[1] for x in seq), default=0)
        if k == "rep":
            return 1 + self.nesting(it[1])
        return 0

    # ---- the code points a match of an item can start with (regular items only)
    def _first(self, it):
        k = it[0]
        if k == "lit":
            return [(it[1][0], it[1][0])] if it[1] else []
        if k == "cls":
            if not it[2]:
                return []
            ranges = _merge((lo, hi) for lo, hi in it[2] if lo <= hi)
            if not it[1]:
                return ranges
            out, at = [], 0
            for lo, hi in ranges:
                if lo > at:
                    out.append((at, lo - 1))
                at = hi + 1
            return out + ([(at, MAX_CP)] if at <= MAX_CP else [])
        if k == "any":
            return [(0, MAX_CP)]
        if k == "ref":
            return self.rule_first[it[1]]
        if k == "group":
            return self._seq_first(it[1])
        return self._first(it[1])

    def _seq_first(self, alts) -> list:
        out: list = []
        for seq in alts:
            for x in seq:
                out += self._first(x)
                if not self.nullable(x):
                    break
        return _merge(out)

    def starts(self, it, c: int) -> bool:
        """Can a match of the (regular) item start with code point c."""
        ranges = self._first(it)
        i = bisect_right(ranges, (c, MAX_CP + 1)) - 1
        return i >= 0 and ranges[i][0] <= c <= ranges[i][1]

    # ---- writing
    def _alts_regex(self, alts) -> str | None:
        parts, size = [], 4
        for seq in alts:
            for x in seq:
                r = self.regex(x)
                if r is None:
                    return None
                parts.append(r)
                size += len(r)
                if size > MAX_LEXEME_CHARS:
                    return None
            parts.append("|")
        return "(?:" + "".join(parts[:-1]) + ")"

    def regex(self, it) -> str | None:
        """The item as one regex (regular items only); None when over MAX_LEXEME_CHARS."""
        k = it[0]
        if k == "lit":
            return "".join(_cp(c) for c in it[1])
        if k == "cls":
            if not it[2]:
                return ""
            ranges = [(lo, hi) for lo, hi in it[2] if lo <= hi]
            body = "".join(_cp(lo) if lo == hi else f"{_cp(lo)}-{_cp(hi)}" for lo, hi in ranges)
            if not body:                         # only reversed ranges: negated any character, else none
                return ANY if it[1] else r"[^\x{0}-\x{10FFFF}]"
            return f"[{'^' if it[1] else ''}{body}]"
        if k == "any":
            return ANY
        if k == "ref":
            return self.rule_regex[it[1]]
        if k == "group":
            return self._alts_regex(it[1])
        inner = self.regex(it[1])
        if inner is None or len(inner) > MAX_LEXEME_CHARS:
            return None
        return f"(?:{inner}){self.count(it[2], it[3])}"

    @staticmethod
    def count(lo: int, hi) -> str:
        if hi is None:
            return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
        return "?" if (lo, hi) == (0, 1) else f"{{{lo},{hi}}}"

    def item(self, it) -> str:
        k = it[0]
        if k == "lit":
            return " ".join(f"/{_cp(c)}/" for c in it[1]) if it[1] else '""'
        if k in ("cls", "any"):
            r = self.regex(it)
            return f"/{r}/" if r else '""'
        if k == "ref":
            return self.names[it[1]]
        if k == "group":
            return "(" + self.alts(it[1]) + ")"
        return f"({self.item(it[1])}){self.count(it[2], it[3])}"

    def lexeme(self, it, nxt) -> str | None:
        """A repetition of a regular item before a literal it cannot start, as one lexeme (the
        module doc), while within the size limits; else None."""
        if not (it[0] == "rep" and nxt is not None and nxt[0] == "lit" and nxt[1] and self.is_regular(it)):
            return None
        r = self.regex(it)
        if r is None or len(r) > MAX_LEXEME_CHARS or self.fused + len(r) > MAX_FUSED_CHARS:
            return None
        if self.nesting(it) > MAX_LEXEME_NESTING:
            return None
        if self.starts(it[1], nxt[1][0]):
            return None
        self.fused += len(r)
        return f"/{r}/"

    def seq(self, seq: list) -> str:
        out = []
        for i, it in enumerate(seq):
            lex = self.lexeme(it, seq[i + 1] if i + 1 < len(seq) else None)
            out.append(lex if lex is not None else self.item(it))
        return " ".join(out) if out else '""'

    def alts(self, alts: list) -> str:
        return " | ".join(self.seq(seq) for seq in alts)


def to_lark(rules: dict) -> str:
    """llguidance's Lark for parsed GBNF rules: root becomes `start`, the others r0, r1, ..."""
    w = _Writer(rules)
    lines, size = ['%llguidance {"no_forcing": true}'], 0
    for n, alts in rules.items():
        cancel.check()                   # a gone client stops the lowering (ramforge.cancel)
        lines.append(f"{w.names[n]}: {w.alts(alts)}")
        size += len(lines[-1])
        if size > MAX_LARK_CHARS:
            raise GrammarTooLarge(f"grammar too large: lowered to over {MAX_LARK_CHARS:,} characters "
                                  f"(ramforge's limit); simplify it")
    return "\n".join(lines) + "\n"
