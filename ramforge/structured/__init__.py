"""Structured output: GBNF grammars and JSON schemas constraining what a model generates.

    >>> from ramforge.structured import json_schema_to_grammar
    >>> print(json_schema_to_grammar({"type": "boolean"}), end="")
    root ::= ("true" | "false")
    space ::= | " " | "\\n"{1,2} [ \\t]{0,20}

A JSON schema becomes the GBNF llama.cpp's json_schema_to_grammar writes (`converter`), a grammar is
read as llama.cpp's parser reads it (`gbnf`), and llguidance computes each step's token mask
(`matcher`); the Sampler applies it where llama-cpp-python's chain has its grammar stage.
JSON mode (`json_object`, Ollama's `format: "json"`) is the schema {"type": "object"}, as llama-server
turns it into a grammar. The request shapes of each surface map to one GBNF text here:
`for_response_format` (OpenAI / llama-cpp-python), `for_ollama_format`, `for_llama_server`.
"""
from __future__ import annotations

import json
from functools import lru_cache

from ..errors import GrammarError
from .converter import json_schema_to_grammar
from .gbnf import GBNFError, parse
from .matcher import Grammar, GrammarState
from .schema import SchemaError, SchemaTooDeep, UnsupportedSchema

__all__ = ["Grammar", "GrammarState", "GrammarError", "GBNFError", "SchemaError", "UnsupportedSchema",
           "json_schema_to_grammar", "schema_grammar", "compile_grammar", "check_gbnf", "for_response_format",
           "for_ollama_format", "for_llama_server", "for_request", "JSON_OBJECT"]

JSON_OBJECT = {"type": "object"}


def schema_grammar(schema) -> str:
    """GBNF of a JSON schema (dict or JSON text); an empty schema, or "json_object", is any object.
    The grammar is checked against the parser's limits here, so a schema that makes a grammar too
    large is refused before a request queues."""
    if schema == "json_object" or schema in ({}, None):
        schema = JSON_OBJECT
    try:
        return check_gbnf(json_schema_to_grammar(schema))
    except RecursionError:          # a backstop: every walk is bounded by MAX_SCHEMA_DEPTH
        raise SchemaTooDeep("JSON schema nested too deeply to convert") from None


def check_gbnf(text: str) -> str:
    """The grammar text, after llama.cpp's parser accepted it (GBNFError otherwise) and it was lowered
    for llguidance within the limits (GrammarTooLarge), both in linear time."""
    from .lark import to_lark

    to_lark(parse(text))
    return text


@lru_cache(maxsize=32)
def _compiled(gbnf: str, tok) -> Grammar:
    return Grammar(gbnf, tok)


def compile_grammar(gbnf: str, tokenizer) -> Grammar:
    """A compiled Grammar for a tokenizer (the last 32 are kept)."""
    return _compiled(gbnf, tokenizer)


def for_response_format(rf) -> str | None:
    """OpenAI's (and llama-cpp-python's) response_format: None for text; {"type": "json_object"}
    (llama-cpp-python's optional "schema" honoured); {"type": "json_schema", "json_schema": {"schema":
    ..., "strict": ...}}."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise GrammarError('response_format must be an object with a "type"')
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_grammar(rf.get("schema") or JSON_OBJECT)
    if kind == "json_schema":
        wrap = rf.get("json_schema")
        if not isinstance(wrap, dict):
            raise GrammarError('response_format json_schema needs a "json_schema" object with a "schema"')
        schema = wrap.get("schema", rf.get("schema"))
        if schema is not None and not isinstance(schema, dict):
            raise GrammarError("response_format json_schema.schema must be a JSON object")
        return schema_grammar(schema)
    raise GrammarError(f'response_format type must be one of "text", "json_object" or "json_schema", got {kind!r}')


def for_ollama_format(fmt) -> str | None:
    """Ollama's `format`: "" / None nothing, "json" JSON mode, an object a JSON schema."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return schema_grammar(JSON_OBJECT)
    if isinstance(fmt, dict):
        return schema_grammar(fmt)
    raise GrammarError(f'format must be "json" or a JSON schema object, got {json.dumps(fmt)[:80]}')


def for_request(grammar=None, json_schema=None, response_format=None) -> str | None:
    """An OpenAI-compatible request's grammar, as llama-server reads it: `grammar` and `json_schema`
    (its extensions; not both), a response_format of json_object / json_schema replacing json_schema."""
    if json_schema is not None and grammar:
        raise GrammarError("Cannot use both json_schema and grammar")
    from_format = for_response_format(response_format)
    if from_format is not None:
        return from_format
    return for_llama_server(grammar, json_schema)


def for_llama_server(grammar, json_schema) -> str | None:
    """llama-server's `grammar` (GBNF text) and `json_schema` fields: both is an error, as there."""
    if json_schema is not None and grammar:
        raise GrammarError("Cannot use both json_schema and grammar")
    if json_schema is not None:
        if not isinstance(json_schema, dict):
            raise GrammarError("json_schema must be a JSON object")
        return schema_grammar(json_schema)
    if grammar:
        if not isinstance(grammar, str):
            raise GrammarError("grammar must be a string of GBNF")
        return check_gbnf(grammar)
    return None
