"""Record llama.cpp's JSON-schema converter on a set of schemas: tests/fixtures/grammar/converter.json.

    python tools/record_converter.py        # needs g++ and the llama.cpp source (tools/schema_oracle.py)

Each entry: the schema and the GBNF llama.cpp writes, or its error message. tools/record_grammar.py's
schemas are included. ramforge.structured.json_schema_to_grammar must write the same text.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT  # noqa: E402

OUT = REPO_ROOT / "tests" / "fixtures" / "grammar" / "converter.json"
ADDR = {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        "required": ["street", "city"]}
SCHEMAS = [
    {"type": "object"},
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}, "c": {"type": "boolean"}},
     "required": ["c"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "size": {"type": "string", "enum": ["S", "M", "L"]}},
     "required": ["color", "size"], "additionalProperties": False},
    {"$defs": {"Address": ADDR}, "type": "object", "properties": {"home": {"$ref": "#/$defs/Address"},
                                                                 "work": {"$ref": "#/$defs/Address"}}, "required": ["home"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": {"type": "string"}, "minItems": 2},
    {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    {"type": "integer", "minimum": -5, "maximum": 1000},
    {"type": "integer", "minimum": 17},
    {"type": "integer", "maximum": -3},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
    {"type": "integer", "minimum": 123456},
    {"type": "integer", "maximum": 99999},
    {"type": "integer", "minimum": -123},
    {"type": "integer", "minimum": 1.5, "maximum": 1e3},
    {"type": "integer", "minimum": 0},
    {"type": "integer", "minimum": 0, "maximum": 0},
    {"type": "integer", "minimum": -10, "maximum": -2},
    {"type": "integer", "minimum": 5, "maximum": 300000},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    {"type": "string", "pattern": "^(abc|def)+x?y*\\.z{2,}$"},
    {"type": "string", "pattern": "^a.b(?:cd){1,3}[^x]$"},
    {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"},
    {"type": "string", "pattern": "^\"q\"[\\x41-\\x5A]\\n$"},
    {"type": "string", "pattern": "^(a"},
    {"type": "string", "format": "date"},
    {"type": "string", "format": "time"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"type": "string", "maxLength": 1},
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
    {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    {"type": ["string", "integer"]},
    {"const": {"a": [1, 2.5, "x\"y"]}},
    {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
    {"type": "object", "properties": {"and": {"type": "integer"}, "also": {"type": "integer"}},
     "additionalProperties": True},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
               {"anyOf": [{"type": "object", "properties": {"b": {"type": "integer"}}}]}]},
    {"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["c", "b"]}]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
    {"$ref": "#/definitions/node", "definitions": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"$ref": "#/definitions/node"}}, "required": ["v"]}}},
    {"type": "object", "properties": {"number": {"type": "number"}, "root": {"type": "string"},
                                      "value": {"type": "array"}}},
    {"type": "object", "properties": {"ünï cödé": {"type": "string"}}, "required": ["ünï cödé"]},
    {"type": "object", "properties": {k: {"type": "string"} for k in "abcd"}, "required": ["b"]},
    {"type": "boolean"}, {"type": "null"}, {"type": "number"}, {}, {"items": {"type": "boolean"}},
    {"type": "frog"}, {"$ref": "http://x"}, {"type": "array", "minItems": -1}, {"enum": []},
]


def main() -> int:
    from tools.record_grammar import CASES
    from tools.schema_oracle import llama_cpp_schema_to_grammar

    schemas = SCHEMAS + [spec for _, kind, spec, _ in CASES if kind == "schema" and spec not in SCHEMAS]
    out = []
    for s in schemas:
        try:
            out.append({"schema": s, "gbnf": llama_cpp_schema_to_grammar(s)})
        except RuntimeError as e:
            out.append({"schema": s, "error": str(e)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"oracle": "llama.cpp common/json-schema-to-grammar.cpp (llama-cpp-python 0.3.36's "
                                         "vendored source)", "cases": out}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(out)} schemas -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
