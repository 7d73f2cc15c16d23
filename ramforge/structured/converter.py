"""JSON schema -> GBNF, as llama.cpp's json_schema_to_grammar writes it (common/json-schema-to-grammar.cpp).

Same rules, rule names, property order (the schema's), whitespace rule
(`space ::= | " " | "\\n"{1,2} [ \\t]{0,20}`), primitives, string formats, integer ranges and regex
patterns; the rules are written sorted by name, as llama.cpp's std::map does, so the text is
byte-identical (tests/test_structured.py checks it against records of llama.cpp's converter).
"""
from __future__ import annotations

import re

from .ranges import INT_MAX, dump, format_literal, min_max_int, not_strings, repetition
from .schema import INT64_MAX, INT64_MIN, Document, Node, SchemaError, UnsupportedSchema, read_schema

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (rule, deps)
PRIMITIVES = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?', ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": ("object | array | string | number | boolean | null", ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"', ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""', ()),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}
FORMATS = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) '
             '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
RESERVED = {"root", *PRIMITIVES, *FORMATS}
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9-]+")
MAX_PATTERN_DEPTH = 100
NON_LITERAL = set("|.()[]{}*+?^$")
REGEX_ONLY_ESCAPES = set("^$.[]()|{}*+?")


class _Unsupported(Exception):
    """A valid regex with no grammar equivalent."""


class _Invalid(Exception):
    """Not a valid regex."""


def escape_length(p: str, i: int) -> int:
    """Length of the GBNF escape at p[i] (\\x.., \\u...., \\U........, \\t \\r \\n \\\\ \\" \\[ \\] \\-), else 0."""
    if i + 1 >= len(p) or p[i] != "\\":
        return 0
    c = p[i + 1]
    if c in 'trn\\"[]-':
        return 2
    n = {"x": 2, "u": 4, "U": 8}.get(c, 0)
    if not n or i + 2 + n > len(p):
        return 0
    return 2 + n if all(h in "0123456789abcdefABCDEF" for h in p[i + 2:i + 2 + n]) else 0


class Converter:
    def __init__(self, dotall: bool = False, lax_patterns: bool = False):
        self.dotall, self.lax = dotall, lax_patterns
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.resolving: set[str] = set()
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def add_rule(self, name: str, rule: str) -> str:
        esc = _INVALID_NAME.sub("-", name)
        if esc not in self.rules or self.rules[esc] == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        self.rules[f"{esc}{i}"] = rule
        return f"{esc}{i}"

    def add_primitive(self, name: str, rule: tuple) -> str:
        n = self.add_rule(name, rule[0])
        for dep in rule[1]:
            dep_rule = PRIMITIVES.get(dep) or FORMATS.get(dep)
            if dep_rule is None:
                self.errors.append(f"Rule {dep} not known")
            elif dep not in self.rules:
                self.add_primitive(dep, dep_rule)
        return n

    def primitive(self, rule_name: str, type_: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else type_, PRIMITIVES[type_])

    # ---- patterns -------------------------------------------------------------------------------
    def visit_pattern(self, pattern: str, name: str) -> str:
        snapshot = dict(self.rules)
        try:
            return self.pattern_rule(pattern, name)
        except _Unsupported as e:
            self.rules = snapshot
            if not self.lax:
                raise UnsupportedSchema(f"JSON schema pattern {pattern!r} is not supported ({e})") from None
            self.warnings.append(f"pattern {pattern} is not supported ({e}), accepting any string")
            return self.add_rule(name, self.add_primitive("string", PRIMITIVES["string"]))
        except _Invalid as e:
            self.rules = snapshot
            self.errors.append(f"Invalid pattern {pattern}: {e}")
            return ""

    def pattern_rule(self, pattern: str, name: str) -> str:
        if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            raise _Unsupported("not anchored with '^' and '$'")
        parser = _Pattern(self, pattern[1:-1], name)
        rule = _to_rule(parser.group())
        if parser.depth != 0:
            raise _Invalid("unbalanced parentheses")
        return self.add_rule(name, f'"\\"" ({rule}) "\\""')

    # ---- the schema -----------------------------------------------------------------------------
    def resolve_ref(self, node: Node) -> str:
        frag = node.ref.split("#", 1)[1] if "#" in node.ref else node.ref
        ref_name = "ref" + _INVALID_NAME.sub("-", frag)
        if ref_name not in self.rules and node.ref not in self.resolving:
            if node.target is None:
                self.errors.append(f"Unresolved $ref {node.ref}")
                return ""
            self.resolving.add(node.ref)
            ref_name = self.visit(node.target, ref_name)
            self.resolving.discard(node.ref)
        return ref_name

    def object_rule(self, props: list, required: set, name: str, additional: Node | None) -> str:
        pre = name + ("-" if name else "")
        req, opt, kv, names = [], [], {}, []
        for pname, pnode in props:
            rule = self.visit(pnode, pre + pname)
            kv[pname] = self.add_rule(f"{pre}{pname}-kv", f"{format_literal(dump(pname))} space \":\" space {rule}")
            (req if pname in required else opt).append(pname)
            names.append(pname)
        if additional is not None:
            sub = pre + "additional"
            value = (self.visit(additional, sub + "-value") if additional.kind != "any"
                     else self.add_primitive("value", PRIMITIVES["value"]))
            key = (self.add_primitive("string", PRIMITIVES["string"]) if not names
                   else self.add_rule(sub + "-k", not_strings(names, self.add_primitive("char", PRIMITIVES["char"]))))
            kv["*"] = self.add_rule(sub + "-kv", f'{key} ":" space {value}')
            opt.append("*")
        if not req and not opt:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        # llama.cpp's recursive `rest`: each optional property's rule names the rule of those after
        # it; built from the last one back (the order llama.cpp adds them in), once each
        after: list = [""] * (len(opt) + 1)     # after[i]: " " + the rest rule of opt[i + 1:], or ""
        tail = ""
        for i in range(len(opt) - 1, -1, -1):
            after[i] = tail
            if i:
                k = opt[i]
                comma = f'( "," space {kv[k]} )'
                tail = " " + self.add_rule(f"{pre}{opt[i - 1]}-rest", comma + ("*" if k == "*" else "?") + tail)

        def rest(i: int) -> str:
            k = opt[i]
            comma = f'( "," space {kv[k]} )'
            return kv[k] + (f" {comma}*" if k == "*" else "") + after[i]

        if opt:
            rule += " (" + (' "," space ( ' if req else "")
            rule += " | ".join(rest(i) for i in range(len(opt)))
            rule += (" )" if req else "") + " )?"
        return rule + ' space "}"'

    def all_of(self, node: Node, name: str, rule_name: str) -> str:
        required, props, enums = set(), [], {}

        seen: set = set()

        def add(comp: Node, is_required: bool):
            if comp.kind == "ref":
                if comp.target is not None and id(comp) not in seen:     # a $ref cycle adds nothing more
                    seen.add(id(comp))
                    add(comp.target, is_required)
            elif comp.kind == "object":
                for pname, pnode, _ in comp.properties:
                    props.append((pname, pnode))
                    if is_required:
                        required.add(pname)
            elif comp.kind == "enum":
                for v in comp.value:
                    k = format_literal(dump(v))
                    enums[k] = enums.get(k, 0) + 1

        for child in node.children:
            if child.kind == "anyOf":
                for alt in child.children:
                    add(alt, False)
            else:
                add(child, True)
        inter = [k for k in sorted(enums, key=lambda s: s.encode()) if enums[k] == len(node.children)]
        if inter:
            return self.add_rule(rule_name, "(" + " | ".join(inter) + ")")
        return self.add_rule(rule_name, self.object_rule(props, required, name, None))

    def visit(self, node: Node, name: str) -> str:
        rule_name = name + "-" if name in RESERVED else (name or "root")
        sub = name + ("-" if name else "")
        k = node.kind
        if k == "ref":
            return self.add_rule(rule_name, self.resolve_ref(node))
        if k == "anyOf":
            alts = [self.visit(c, name + ("-" if name else "alternative-") + str(i)) for i, c in enumerate(node.children)]
            return self.add_rule(rule_name, " | ".join(alts))
        if k == "allOf":
            return self.all_of(node, name, rule_name)
        if k == "const":
            return self.add_rule(rule_name, format_literal(dump(node.value)))
        if k == "enum":
            return self.add_rule(rule_name, "(" + " | ".join(format_literal(dump(v)) for v in node.value) + ")")
        if k == "object":
            if not node.properties and node.additional is not None and node.additional.kind == "any":
                return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVES["object"]))
            props = [(pname, pnode) for pname, pnode, _ in node.properties]
            required = {pname for pname, _, req in node.properties if req}
            return self.add_rule(rule_name, self.object_rule(props, required, name, node.additional))
        if k == "tuple":
            items = ' "," space '.join(self.visit(c, f"{sub}tuple-{i}") for i, c in enumerate(node.children))
            return self.add_rule(rule_name, f'"[" space {items} space "]"')
        if k == "array":
            if node.items.kind == "any" and node.min_len == 0 and node.max_len < 0:
                return self.primitive(rule_name, "array")
            item = self.visit(node.items, sub + "item")
            hi = INT_MAX if node.max_len < 0 else node.max_len
            return self.add_rule(rule_name, f'"[" space {repetition(item, node.min_len, hi, chr(34) + "," + chr(34) + " space")} space "]"')
        if k == "string":
            if node.pattern:
                return self.visit_pattern(node.pattern, rule_name)
            if node.format == "uuid":
                return self.primitive(rule_name, "uuid")
            if node.format:
                prim = node.format + "-string"
                return self.add_rule(rule_name, self.add_primitive(prim, FORMATS[prim]))
            if node.min_len > 0 or node.max_len >= 0:
                char = self.add_primitive("char", PRIMITIVES["char"])
                hi = INT_MAX if node.max_len < 0 else node.max_len
                return self.add_rule(rule_name, f'"\\"" {repetition(char, node.min_len, hi)} "\\""')
            return self.primitive(rule_name, "string")
        if k == "integer":
            if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
                return self.primitive(rule_name, "integer")
            return self.add_rule(rule_name, "(" + min_max_int(node.minimum, node.maximum) + ")")
        if k in ("number", "boolean", "null"):
            return self.primitive(rule_name, k)
        return self.add_rule(rule_name, self.add_primitive("value", PRIMITIVES["value"]))   # any

    def format_grammar(self) -> str:
        return "".join(f"{k} ::= {v}\n" for k, v in sorted(self.rules.items(), key=lambda kv: kv[0].encode()))


def _stoi(s: str) -> int:
    """std::stoi: leading whitespace, a sign and digits, the rest ignored; out of int range is an error."""
    m = re.match(r"\s*([+-]?\d+)", s)
    if not m or not -(2 ** 31) <= int(m.group(1)) < 2 ** 31:
        raise ValueError(s)
    return int(m.group(1))


def json_schema_to_grammar(schema, *, ignore_unsupported: bool = False) -> str:
    """llama.cpp's GBNF for a JSON schema (a dict, or its JSON text). SchemaError for what llama.cpp
    refuses; UnsupportedSchema for what it would silently not enforce (see ramforge.structured.schema),
    unless ignore_unsupported."""
    if isinstance(schema, (str, bytes)):
        import json

        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise SchemaError(f"the JSON schema is not valid JSON: {e}") from None
    try:
        doc: Document = read_schema(schema, ignore_unsupported)
    except SchemaError as e:
        raise type(e)(f"JSON schema conversion failed:\n{e}") from None
    conv = Converter(lax_patterns=ignore_unsupported)
    conv.visit(doc.root, "")
    if conv.errors:
        raise SchemaError("JSON schema conversion failed:\n" + "\n".join(conv.errors))
    return conv.format_grammar()


def _to_rule(item: tuple[str, bool]) -> str:
    s, literal = item
    return f'"{s}"' if literal else s


class _Pattern:
    """llama.cpp's _visit_pattern: a regex (without its anchors) to GBNF, one group at a time. A
    sequence item is [text, is_literal]; `group` consumes up to its closing parenthesis."""

    def __init__(self, conv: "Converter", p: str, name: str):
        self.conv, self.p, self.n, self.name = conv, p, len(p), name
        self.i, self.depth, self.sub_ids = 0, 0, {}

    def dot(self) -> str:
        return self.conv.add_rule("dot", "[\\U00000000-\\U0010FFFF]" if self.conv.dotall else "[^\\x0A\\x0D]")

    @staticmethod
    def join(seq: list[list]) -> tuple[str, bool]:
        ret, lit = [], ""
        for s, is_lit in seq:
            if is_lit:
                lit += s
            else:
                if lit:
                    ret.append((lit, True))
                    lit = ""
                ret.append((s, False))
        if lit:
            ret.append((lit, True))
        return " ".join(_to_rule(x) for x in ret), False

    def group(self) -> tuple[str, bool]:
        p, n, seq = self.p, self.n, []
        while self.i < n:
            c = p[self.i]
            if c == ".":
                seq.append([self.dot(), False])
                self.i += 1
            elif c == "(":
                self.open_group()
                seq.append(["(" + _to_rule(self.group()) + ")", False])
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise _Invalid("unbalanced parentheses")
                self.depth -= 1
                return self.join(seq)
            elif c in "^$":
                raise _Unsupported("anchor inside the pattern")
            elif c == "[":
                seq.append([self.char_class(), False])
            elif c == "|":
                seq.append(["|", False])
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise _Invalid("nothing to repeat")
                seq[-1] = [_to_rule(seq[-1]) + c, False]
                self.i += 1
            elif c == "{":
                self.braces(seq)
            else:
                seq.append([self.literal(c), True])
        return self.join(seq)

    def open_group(self) -> None:
        p, n = self.p, self.n
        self.i += 1
        if self.i < n and p[self.i] == "?":
            if self.i + 1 < n and p[self.i + 1] == ":":
                self.i += 2
            else:
                raise _Unsupported("unsupported group syntax")
        self.depth += 1
        if self.depth > MAX_PATTERN_DEPTH:
            raise _Unsupported("pattern nesting too deep")

    def char_class(self) -> str:
        p, n = self.p, self.n
        br, i = "[", self.i + 1
        while i < n and p[i] != "]":
            if p[i] == "\\":
                k = escape_length(p, i)
                if not k:
                    raise _Unsupported(f"unsupported escape in character class: {p[i:i + 2]}")
                br += p[i:i + k]
                i += k
            else:
                br += p[i]
                i += 1
        if i >= n:
            raise _Invalid("unterminated character class")
        self.i = i + 1
        return br + "]"

    def braces(self, seq: list[list]) -> None:
        """x{n}, x{n,}, x{,m}, x{n,m} on the last item (a non-literal item gets a rule of its own)."""
        p, i = self.p, self.i
        j = p.find("}", i + 1)
        if j < 0:
            raise _Unsupported("unterminated curly brackets")
        self.i = j + 1
        nums = p[i + 1:j].split(",")
        if len(nums) not in (1, 2):
            raise _Unsupported("wrong number of values in curly brackets")
        try:
            if len(nums) == 1:
                lo = hi = _stoi(nums[0])
            else:
                lo = _stoi(nums[0]) if nums[0] else 0
                hi = _stoi(nums[1]) if nums[1] else INT_MAX
        except ValueError:
            raise _Unsupported("invalid number in curly brackets") from None
        if not seq:
            raise _Invalid("nothing to repeat")
        sub, is_lit = seq[-1]
        if not is_lit:
            if sub not in self.sub_ids:
                self.sub_ids[sub] = None
                self.sub_ids[sub] = self.conv.add_rule(f"{self.name}-{len(self.sub_ids)}", sub)
            sub = self.sub_ids[sub]
        seq[-1] = [repetition(f'"{sub}"' if is_lit else sub, lo, hi), False]

    def literal(self, c: str) -> str:
        p, n, lit = self.p, self.n, ""
        while self.i < n:
            i = self.i
            if p[i] == "\\":
                if i == n - 1:
                    raise _Invalid("trailing backslash")
                if p[i + 1] in REGEX_ONLY_ESCAPES:
                    lit += p[i + 1]
                    self.i += 2
                else:
                    k = escape_length(p, i)
                    if not k:
                        raise _Unsupported(f"unsupported escape: {p[i:i + 2]}")
                    lit += p[i:i + k]
                    self.i += k
            elif p[i] == '"':
                lit += '\\"'
                self.i += 1
            elif p[i] not in NON_LITERAL and (i == n - 1 or not lit or p[i + 1] == "."
                                              or p[i + 1] not in NON_LITERAL):
                lit += p[i]
                self.i += 1
            else:
                break
        if not lit:
            raise _Unsupported(f"unsupported character: {c}")
        return lit
