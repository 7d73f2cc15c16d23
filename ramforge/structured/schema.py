"""A JSON schema read into the node tree llama.cpp's converter walks (common/json-schema.cpp).

`read_schema(schema)` gives a `Document`: its root `Node` and the `$ref` targets. The rules are
llama.cpp's: `$ref` first (only "#/..." pointers into the same document), then oneOf / anyOf (oneOf
wins), a "type" array as one alternative per type, const, enum, then the type or, without one, the
structural keywords in the converter's order. Integer bounds fold exclusiveMinimum / exclusiveMaximum
in and round a fractional bound inwards. llama.cpp's errors (`SchemaError`) carry its message and
the JSON pointer of the node.

llama.cpp silently ignores the keywords it cannot turn into a grammar (number ranges, multipleOf,
uniqueItems, not, ...); here a schema using one is refused (`UnsupportedSchema`, naming the keyword
and where), unless `ignore_unsupported=True` asks for llama.cpp's behaviour.

Hostile values are refused, not crashed on: schemas nested (or `$ref` chains resolved) deeper than
MAX_SCHEMA_DEPTH (SchemaTooDeep), an infinite or NaN number (nlohmann's parser, which llama.cpp
reads schemas with, refuses `1e999`); an integer bound beyond int64 is clamped to it, where the
rules for an unbounded side already stop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import GrammarError, RequestTooLarge

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_SCHEMA_DEPTH = 64          # ramforge's: schemas inside schemas (and $ref resolutions) at most


class SchemaError(GrammarError):
    """A JSON schema llama.cpp's converter refuses (its message, with the JSON pointer)."""


class UnsupportedSchema(GrammarError):
    """A JSON schema keyword (or pattern) the grammar cannot enforce; the message names it."""


class SchemaTooDeep(SchemaError, RequestTooLarge):
    """A JSON schema nested deeper than MAX_SCHEMA_DEPTH (ramforge's limit)."""


def _clamp64(v: int) -> int:
    return max(INT64_MIN, min(INT64_MAX, v))


def check_finite(value, path: str) -> None:
    """SchemaError for an infinite or NaN number anywhere in a JSON value (walked without recursion)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError(f"JSON schema error at {path}: {v} is not a finite number")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


# Constraining keywords llama.cpp's converter does not turn into grammar; an answer could break them.
IGNORED = ("not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "multipleOf",
           "minProperties", "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
           "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems", "additionalItems")
NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
FORMATS = {"date": "date", "time": "time", "date-time": "date-time", "uuid": "uuid",
           **{f"uuid{i}": "uuid" for i in range(1, 6)}}


@dataclass
class Node:
    """kind: any, ref, anyOf, allOf, const, enum, null, boolean, number, integer, string, array, tuple, object."""

    kind: str
    children: list = field(default_factory=list)     # anyOf / allOf alternatives, tuple items
    value: Any = None                                # const; enum: the list of values
    ref: str = ""
    target: "Node | None" = None
    minimum: int = INT64_MIN
    maximum: int = INT64_MAX
    pattern: str = ""
    format: str = ""                                 # "", uuid, date, time, date-time
    min_len: int = 0
    max_len: int = -1                                # -1: unbounded (min_items / max_items for arrays)
    items: "Node | None" = None
    properties: list = field(default_factory=list)   # [(name, Node, required)] in schema order
    additional: "Node | None" = None                 # None: no additional properties


@dataclass
class Document:
    root: Node
    refs: dict


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float))


class _Builder:
    def __init__(self, root, ignore_unsupported: bool):
        self.root, self.lax = root, ignore_unsupported
        self.refs: dict[str, Node | None] = {}
        self.pending: list[Node] = []
        self.depth = 0

    @staticmethod
    def fail(path: str, msg: str):
        raise SchemaError(f"JSON schema error at {path}: {msg}")

    def unsupported(self, path: str, what: str):
        if not self.lax:
            raise UnsupportedSchema(f"JSON schema at {path}: {what} is not supported (the grammar cannot enforce it)")

    def count(self, s: dict, key: str, path: str, default: int) -> int:
        if key not in s:
            return default
        v = s[key]
        if not _is_int(v) or v < 0:
            self.fail(path, f"{key} must be a non-negative integer")
        return v

    def bound(self, s: dict, key: str, path: str, round_up: bool) -> int:
        v = s[key]
        if _is_int(v):
            return v
        if not _is_num(v):
            self.fail(path, f"{key} must be a number")
        if not math.isfinite(v):
            self.fail(path, f"{key} must be a finite number, got {v}")
        return int(math.ceil(v) if round_up else math.floor(v))

    def format_of(self, s: dict, path: str) -> str:
        if "format" not in s:
            return ""
        if not isinstance(s["format"], str):
            self.fail(path, "format must be a string")
        return FORMATS.get(s["format"], "")

    def resolve(self, ref: str, path: str):
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = int(sel) if sel.isdigit() else len(target)
                if idx >= len(target):
                    self.fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                self.fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def build_ref(self, value, path: str) -> Node:
        if not isinstance(value, str):
            self.fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            self.fail(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value not in self.refs:
            self.refs[value] = None                 # reserved first: a cycle back here stops
            self.refs[value] = self.node(self.resolve(value, path), value)
        n = Node("ref", ref=value)
        self.pending.append(n)
        return n

    def alternatives(self, kind: str, alts, path: str) -> Node:
        if not isinstance(alts, list):
            self.fail(path, "must be an array of schemas")
        if not alts:
            self.fail(path, "must not be empty")
        return Node(kind, children=[self.node(a, f"{path}/{i}") for i, a in enumerate(alts)])

    def build_object(self, s: dict, path: str) -> Node:
        req = {r for r in s.get("required", []) if isinstance(r, str)} if isinstance(s.get("required"), list) else set()
        n = Node("object")
        if "properties" in s:
            props = s["properties"]
            if not isinstance(props, dict):
                self.fail(path, "properties must be an object")
            n.properties = [(k, self.node(v, f"{path}/properties/{k}"), k in req) for k, v in props.items()]
        if "additionalProperties" in s:
            a = s["additionalProperties"]
            if isinstance(a, bool):
                n.additional = Node("any") if a else None
            elif isinstance(a, dict):
                n.additional = self.node(a, f"{path}/additionalProperties")
            else:
                self.fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in s:
            n.additional = Node("any")              # {"type": "object"} alone: any object
        missing = sorted(req - {k for k, _, _ in n.properties})
        if missing and n.additional is None:
            self.unsupported(path, f"required property {missing[0]!r} without a schema in properties")
        return n

    def build_array(self, s: dict, path: str) -> Node:
        if "items" in s or "prefixItems" in s:
            key = "items" if "items" in s else "prefixItems"
            items = s[key]
            if isinstance(items, list):
                return Node("tuple", children=[self.node(x, f"{path}/{key}/{i}") for i, x in enumerate(items)])
            item = self.node(items, f"{path}/{key}")
        else:
            item = Node("any")
        return Node("array", items=item, min_len=self.count(s, "minItems", path, 0),
                    max_len=self.count(s, "maxItems", path, -1))

    def build_string(self, s: dict, path: str) -> Node:
        n = Node("string")
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                self.fail(path, "pattern must be a string")
            n.pattern = s["pattern"]
        n.format = self.format_of(s, path)
        n.min_len = self.count(s, "minLength", path, 0)
        n.max_len = self.count(s, "maxLength", path, -1)
        return n

    def build_integer(self, s: dict, path: str) -> Node:
        n = Node("integer")
        if "minimum" in s:
            n.minimum = self.bound(s, "minimum", path, True)
        elif "exclusiveMinimum" in s:
            n.minimum = self.bound(s, "exclusiveMinimum", path, False) + 1
        if "maximum" in s:
            n.maximum = self.bound(s, "maximum", path, False)
        elif "exclusiveMaximum" in s:
            n.maximum = self.bound(s, "exclusiveMaximum", path, True) - 1
        n.minimum, n.maximum = _clamp64(n.minimum), _clamp64(n.maximum)
        return n

    def check_keywords(self, s: dict, path: str) -> None:
        for k in IGNORED:
            if k in s:
                self.unsupported(path, f"keyword {k!r}")
        if "oneOf" in s and "anyOf" in s:
            self.unsupported(path, "anyOf beside oneOf")

    def node(self, s, path: str) -> Node:
        self.depth += 1
        try:
            if self.depth > MAX_SCHEMA_DEPTH:
                raise SchemaTooDeep(f"JSON schema error at {path[:200]}: nested over {MAX_SCHEMA_DEPTH} deep "
                                    f"(ramforge's limit); use $defs and $ref for shared parts")
            return self._node(s, path)
        finally:
            self.depth -= 1

    def _node(self, s, path: str) -> Node:
        if not isinstance(s, dict):
            self.fail(path, "schema must be an object")
        self.check_keywords(s, path)
        if "$ref" in s:
            return self.build_ref(s["$ref"], path)
        if "oneOf" in s or "anyOf" in s:
            key = "oneOf" if "oneOf" in s else "anyOf"
            return self.alternatives("anyOf", s[key], f"{path}/{key}")
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                self.fail(path, "type must not be empty")
            return Node("anyOf", children=[self.node({**s, "type": x}, f"{path}/type/{i}") for i, x in enumerate(t)])
        if "const" in s:
            check_finite(s["const"], path)
            return Node("const", value=s["const"])
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                self.fail(path, "enum must be a non-empty array")
            check_finite(s["enum"], path)
            return Node("enum", value=list(s["enum"]))
        if t is not None and not isinstance(t, str):
            self.fail(path, "type must be a string or an array of strings")
        has_props = "properties" in s or ("additionalProperties" in s and s["additionalProperties"] is not True)
        if not t:
            if has_props:
                return self.build_object(s, path)
            if "allOf" in s:
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            if "items" in s or "prefixItems" in s:
                return self.build_array(s, path)
            if "pattern" in s or "minLength" in s or "maxLength" in s or self.format_of(s, path):
                return self.build_string(s, path)
            return Node("any")
        if t == "object":
            if not has_props and "allOf" in s:
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            return self.build_object(s, path)
        if t == "string":
            if "allOf" in s:
                return self.alternatives("allOf", s["allOf"], f"{path}/allOf")
            return self.build_string(s, path)
        if t == "array":
            return self.build_array(s, path)
        if t == "integer":
            return self.build_integer(s, path)
        if t in ("number", "boolean", "null"):
            if t == "number":
                for k in NUMBER_BOUNDS:
                    if k in s:
                        self.unsupported(path, f"keyword {k!r} on a number (only integer ranges)")
            return Node(t)
        self.fail(path, f"unrecognized type {t}")

    def build(self) -> Document:
        root = self.node(self.root, "#")
        for n in self.pending:
            n.target = self.refs[n.ref]
        return Document(root, self.refs)


def read_schema(schema, ignore_unsupported: bool = False) -> Document:
    """The node tree of a JSON schema (a parsed JSON value), as llama.cpp's common_chat_schema_from_json."""
    return _Builder(schema, ignore_unsupported).build()
