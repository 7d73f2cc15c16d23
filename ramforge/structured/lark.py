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

The grammar carries `no_forcing`: llguidance would otherwise allow only the canonical tokenization of
text the grammar forces, where llama.cpp allows any token that fits.
"""
from __future__ import annotations

ANY = r"[\x{0}-\x{10FFFF}]"


def _cp(c: int) -> str:
    return f"\\x{{{c:X}}}"


class _Writer:
    def __init__(self, rules: dict):
        self.rules = rules
        self.names = {n: ("start" if n == "root" else f"r{i}") for i, n in enumerate(rules)}
        self.regular = self._regular()

    def _regular(self) -> set:
        """Rules that reference no rule that can reach themselves (their language is regular)."""
        state, out = {}, set()

        def visit(name) -> bool:
            if name in state:
                return state[name]
            state[name] = False                  # in progress: a cycle is not regular
            ok = all(self._item_regular(it, visit) for seq in self.rules[name] for it in seq)
            state[name] = ok
            if ok:
                out.add(name)
            return ok

        for n in self.rules:
            visit(n)
        return out

    def _item_regular(self, it, visit) -> bool:
        k = it[0]
        if k == "ref":
            return visit(it[1])
        if k == "group":
            return all(self._item_regular(x, visit) for seq in it[1] for x in seq)
        if k == "rep":
            return self._item_regular(it[1], visit)
        return True

    def is_regular(self, it) -> bool:
        return self._item_regular(it, lambda n: n in self.regular)

    # ---- can a match of `it` start with code point c (and can it be empty)
    def starts(self, it, c: int) -> bool:
        k = it[0]
        if k == "lit":
            return bool(it[1]) and it[1][0] == c
        if k == "cls":
            inside = any(lo <= c <= hi for lo, hi in it[2])
            return bool(it[2]) and inside != it[1]
        if k == "any":
            return True
        if k == "ref":
            return self.seq_starts(self.rules[it[1]], c)
        if k == "group":
            return self.seq_starts(it[1], c)
        return self.starts(it[1], c)               # rep

    def seq_starts(self, alts, c: int) -> bool:
        for seq in alts:
            for x in seq:
                if self.starts(x, c):
                    return True
                if not self.nullable(x):
                    break
        return False

    def nullable(self, it) -> bool:
        k = it[0]
        if k == "lit":
            return not it[1]
        if k == "cls":
            return not it[2]
        if k == "any":
            return False
        if k == "ref":
            return any(all(self.nullable(x) for x in seq) for seq in self.rules[it[1]])
        if k == "group":
            return any(all(self.nullable(x) for x in seq) for seq in it[1])
        return it[2] == 0 or self.nullable(it[1])

    # ---- writing
    def regex(self, it) -> str:
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
        if k in ("ref", "group"):
            alts = self.rules[it[1]] if k == "ref" else it[1]
            return "(?:" + "|".join("".join(self.regex(x) for x in seq) for seq in alts) + ")"
        return f"(?:{self.regex(it[1])}){self.count(it[2], it[3])}"

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

    def seq(self, seq: list) -> str:
        out = []
        for i, it in enumerate(seq):
            nxt = seq[i + 1] if i + 1 < len(seq) else None
            if (it[0] == "rep" and nxt is not None and nxt[0] == "lit" and nxt[1] and self.is_regular(it)
                    and not self.starts(it[1], nxt[1][0])):
                out.append(f"/{self.regex(it)}/")      # one lexeme: see the module doc
            else:
                out.append(self.item(it))
        return " ".join(out) if out else '""'

    def alts(self, alts: list) -> str:
        return " | ".join(self.seq(seq) for seq in alts)


def to_lark(rules: dict) -> str:
    """llguidance's Lark for parsed GBNF rules: root becomes `start`, the others r0, r1, ..."""
    w = _Writer(rules)
    lines = ['%llguidance {"no_forcing": true}']
    lines += [f"{w.names[n]}: {w.alts(alts)}" for n, alts in rules.items()]
    return "\n".join(lines) + "\n"
