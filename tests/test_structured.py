"""Structured output (ramforge.structured) against llama.cpp.

- The JSON-schema converter writes llama.cpp's GBNF byte for byte: tests/fixtures/grammar/converter.json
  (tools/record_converter.py, llama.cpp's C++ converter), and live with -m oracle.
- Greedy and seeded answers under a grammar are llama-cpp-python's token for token:
  tests/fixtures/grammar/gemma3-270m-q4_k_m.json (tools/record_grammar.py: LlamaGrammar.from_string on
  the same GBNF, Llama.generate), JSON mode and 12 schemas (required/optional fields, enums, nested
  $defs, arrays, integer ranges, a pattern, a format, anyOf, recursion) and two plain grammars.
- The token masks equal llama.cpp's grammar sampler's along random walks (-m oracle).
- Seeded samples parse and validate with jsonschema (CI: a few; -m slow: 200 on 10 bounded schemas).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ramforge.errors import GrammarError, InvalidArgument
from ramforge.structured import (GBNFError, SchemaError, UnsupportedSchema, for_ollama_format, for_request,
                                 json_schema_to_grammar, schema_grammar)
from ramforge.structured.gbnf import parse
from ramforge.structured.lark import to_lark

FIX = Path(__file__).parent / "fixtures" / "grammar"
CONVERTER = json.loads((FIX / "converter.json").read_text())["cases"]
RECORD = json.loads((FIX / "gemma3-270m-q4_k_m.json").read_text())
CASES = {c["name"]: c for c in RECORD["cases"]}
SCHEMA_CASES = [c for c in RECORD["cases"] if c["kind"] == "schema"]


# ---------------------------------------------------------------------------------- the converter

@pytest.mark.parametrize("i", range(len(CONVERTER)))
def test_converter_writes_llama_cpps_gbnf(i):
    case = CONVERTER[i]
    if "error" in case:
        with pytest.raises(SchemaError) as e:
            json_schema_to_grammar(case["schema"], ignore_unsupported=True)
        assert str(e.value) == case["error"]
    else:
        assert json_schema_to_grammar(case["schema"], ignore_unsupported=True) == case["gbnf"]


def test_converter_fixture_covers_the_targets():
    text = json.dumps([c["schema"] for c in CONVERTER])
    for feature in ('"required"', '"enum"', '"$defs"', '"minItems"', '"maxItems"', '"minimum"', '"pattern"',
                    '"format"', '"anyOf"', '"additionalProperties"', '"exclusiveMinimum"'):
        assert feature in text
    assert len(SCHEMA_CASES) >= 11 and "json-object" in CASES
    for c in SCHEMA_CASES:                          # the records' grammars are llama.cpp's converter's
        assert c["gbnf"] == c["llama_cpp_gbnf"] == schema_grammar(c["spec"]), c["name"]


@pytest.mark.oracle
def test_converter_live_against_llama_cpp():
    from tools.schema_oracle import llama_cpp_schema_to_grammar

    for case in CONVERTER:
        try:
            want = llama_cpp_schema_to_grammar(case["schema"])
        except RuntimeError as e:
            with pytest.raises(SchemaError) as got:
                json_schema_to_grammar(case["schema"], ignore_unsupported=True)
            assert str(got.value) == str(e)
            continue
        assert json_schema_to_grammar(case["schema"], ignore_unsupported=True) == want


@pytest.mark.parametrize("schema,what", [
    ({"type": "number", "minimum": 0}, "'minimum' on a number"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "string", "pattern": "^\\d+$"}, "unsupported escape: \\d"),
    ({"type": "string", "pattern": "abc"}, "not anchored"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "#/properties/a: keyword 'not'"),
    ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False}, "'x'"),
])
def test_unsupported_schema_features_are_named(schema, what):
    with pytest.raises(UnsupportedSchema) as e:
        json_schema_to_grammar(schema)
    assert what in str(e.value) and isinstance(e.value, InvalidArgument)
    json_schema_to_grammar(schema, ignore_unsupported=True)     # llama.cpp's behaviour: ignored


# ------------------------------------------------------------------------------------- GBNF

@pytest.mark.parametrize("text,msg", [
    ('root ::= "a" | ', None),
    ('root ::= foo', "Undefined rule identifier 'foo'"),
    ('start ::= "a"', "does not contain a 'root' symbol"),
    ('root ::= "a\n', "unexpected end of input"),
    ('root ::= [a-z', "unexpected end of input"),
    ('root ::= "\\q"', "unknown escape at line 1, column 11"),
    ('root ::= ("a"', "expecting ')'"),
    ('root := "a"', "expecting ::= at line 1, column 6"),
    ('root ::= x\nx ::= x "a" | "b"', "left recursion"),
    ('root ::= "a"{3001}', "number of repetitions exceeds"),
    ('root ::= *', "expecting preceding item"),
])
def test_gbnf_errors_are_llama_cpps(text, msg):
    if msg is None:
        parse(text)                                  # an empty alternative is fine
        return
    with pytest.raises(GBNFError) as e:
        parse(text)
    assert msg in str(e.value) and isinstance(e.value, GrammarError)


def test_gbnf_lowering_keeps_rules_and_splits_literals():
    rules = parse('root ::= "ab" x{2,3} [^a-c] .\nx ::= ("q" | ) # c\nx ::= "z"')
    assert list(rules) == ["root", "x"] and rules["x"] == [[("lit", [ord("z")])]]   # redefinition wins
    lark = to_lark(rules)
    assert 'start: /\\x{61}/ /\\x{62}/ (r1){2,3} /[^\\x{61}-\\x{63}]/ /[\\x{0}-\\x{10FFFF}]/' in lark


def test_request_shapes():
    obj = schema_grammar({"type": "object"})
    assert for_ollama_format("json") == obj and for_ollama_format("") is None
    assert for_request(response_format={"type": "json_object"}) == obj
    assert for_request(response_format={"type": "text"}) is None
    assert for_request(json_schema={}) == obj                           # an empty schema: any object
    assert for_request(grammar='root ::= "x"') == 'root ::= "x"'
    with pytest.raises(GrammarError, match="both json_schema and grammar"):
        for_request(grammar='root ::= "x"', json_schema={})
    with pytest.raises(GrammarError, match="response_format type"):
        for_request(response_format={"type": "xml"})
    with pytest.raises(GrammarError):
        for_ollama_format(["json"])


# ------------------------------------------------------------------------- answers vs llama.cpp

@pytest.fixture(scope="module")
def model():
    import ramforge

    with ramforge.Model("default", n_ctx=RECORD["oracle"]["n_ctx"]) as m:
        yield m


def _run(model, case, n, **sampling):
    from ramforge.sampling import Sampler
    from ramforge.sampling.params import sampler_params

    grammar = model.compile_grammar(case["gbnf"])
    sampler = Sampler(sampler_params(sampling), model.engine.hp.n_vocab, tokenizer=model.tokenizer, grammar=grammar)
    out = list(model.engine.generate(case["prompt_tokens"], n, sampler, reuse_prefix=True))
    if len(out) < n and len(sampler.tokens) > len(out):
        out.append(sampler.tokens[len(out)])        # the end-of-generation token the engine drew
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_under_grammar_matches_llama_cpp(model, name):
    case = CASES[name]
    assert model.tokenize(case["prompt"], special=True) == case["prompt_tokens"]
    assert _run(model, case, RECORD["oracle"]["max_greedy"], temperature=0) == case["greedy"]


# the four longest seeded cases (15-42 s each, mostly sampling under their masks) run with -m slow
LONG_SEEDED = {"recursive", "defs", "ranges", "object-array"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in LONG_SEEDED else [])
                                  for n in CASES])
def test_seeded_under_grammar_matches_llama_cpp(model, name):
    case, p = CASES[name], RECORD["oracle"]["seeded_params"]
    for seed, want in case["seeded"].items():
        got = _run(model, case, RECORD["oracle"]["max_seeded"], seed=int(seed), temperature=p["temperature"],
                   top_k=p["top_k"], top_p=p["top_p"], min_p=p["min_p"])
        assert got == want, f"seed {seed}"


def test_library_surfaces(model):
    case = CASES["person"]
    msgs = [{"role": "user", "content": "Give me a person as JSON with a name and an age."}]
    r = model.create_chat_completion(msgs, temperature=0, max_tokens=96, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": case["spec"], "strict": True}})
    assert r["choices"][0]["message"]["content"] == model.detokenize(case["greedy"][:-1]).decode()
    with pytest.raises(GBNFError):
        model.create_completion("x", grammar='root ::= nothing')
    with pytest.raises(UnsupportedSchema):
        model.create_chat_completion(msgs, response_format={"type": "json_schema", "json_schema": {
            "schema": {"type": "number", "maximum": 3}}})


# ------------------------------------------------------------------------------------ validity

S = {"type": "string", "maxLength": 24}
# Schemas whose every answer ends within max_tokens (bounded strings and arrays): each seeded sample
# must finish by the grammar and validate.
BOUNDED = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L"]}},
     "required": ["color", "size"], "additionalProperties": False},
    {"$defs": {"A": {"type": "object", "properties": {"street": S, "city": S}, "required": ["street", "city"]}},
     "type": "object", "properties": {"home": {"$ref": "#/$defs/A"}, "work": {"$ref": "#/$defs/A"}},
     "required": ["home"]},
    {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"t": {"type": "integer", "minimum": -5, "maximum": 1000}, "h": {"type": "number"},
                                      "ok": {"type": "boolean"}}, "required": ["t", "h", "ok"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, "required": ["code"]},
    {"type": "object", "properties": {k: S for k in ("title", "author", "year", "genre")}, "required": ["author"]},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "event": S}, "required": ["day"]},
    {"type": "array", "items": {"type": "object", "properties": {"item": S, "qty": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 99}},
                                "required": ["item", "qty"]}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"nick": {"anyOf": [S, {"type": "null"}]},
                                      "tags": {"type": "array", "items": S, "maxItems": 2}}, "required": ["nick", "tags"]},
]
ASK = "Answer with JSON only: describe something that fits this form."


def _samples(model, cases, seeds, finished_only: bool):
    """Seeded samples under each (schema, prompt): the ones that fail to parse or validate (of those the
    grammar ended when finished_only; every one otherwise), and the count."""
    import jsonschema

    bad, total = [], 0
    for schema, prompt in cases:
        gbnf = schema_grammar(schema)
        for seed in seeds:
            r = model.create_completion(prompt, max_tokens=None, grammar=gbnf, seed=seed, temperature=0.8)   # the room left
            text, finish = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
            if finished_only and finish != "stop":
                continue
            total += 1
            try:
                jsonschema.validate(json.loads(text), schema)
            except (ValueError, jsonschema.ValidationError) as e:
                bad.append(f"{json.dumps(schema)[:60]} seed {seed} ({finish}): {text[:80]!r}: {e}"[:300])
    return bad, total


def _bounded(model):
    return [(s, model.render_chat([{"role": "user", "content": f"{ASK} {json.dumps(s)}"}])) for s in BOUNDED]


def test_seeded_samples_validate(model):
    bad, total = _samples(model, _bounded(model)[::5], [11], False)
    assert total == 2 and not bad, "\n".join(bad)


@pytest.mark.slow
def test_200_seeded_samples_validate(model):
    bad, total = _samples(model, _bounded(model), range(20), False)
    assert total == 200 and not bad, "\n".join(bad)
    # the records' schemas, unbounded ones included: whatever the grammar ended is valid
    bad, total = _samples(model, [(c["spec"], c["prompt"]) for c in SCHEMA_CASES], [0], True)
    assert total >= 6 and not bad, "\n".join(bad)


@pytest.mark.oracle
def test_masks_equal_llama_cpps_grammar_sampler(model):
    pytest.importorskip("llama_cpp")
    from tools.grammar_masks import LlamaGrammarMasks, never_utf8, walk

    oracle, skip = LlamaGrammarMasks(model.path), never_utf8(model.tokenizer)
    bad = []
    for c in RECORD["cases"]:
        g = model.compile_grammar(c["gbnf"])
        for seed in range(2):
            bad += [f"{c['name']} walk {seed}: {b}" for b in walk(oracle, g, 30, seed, skip)]
    assert not bad, "\n".join(bad)
    assert np.count_nonzero(skip) < 100                 # the exclusion is the handful of never-UTF-8 bytes


def test_forced_tool_call_grammars_accept_the_call_and_nothing_else(model):
    """tool_choice "required" / a named function: each format's grammar (tools_call.call_grammar)
    takes a call as the format writes it, and refuses another function or another answer."""
    from ramforge.generation.tools_call import GENERIC, HERMES, LLAMA3, MISTRAL, call_grammar

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    clock = {"type": "function", "function": {"name": "get_time"}}
    calls = {HERMES: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
             LLAMA3: '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
             MISTRAL: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
             GENERIC: '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}'}

    def takes(gbnf, text):
        st = model.compile_grammar(gbnf).state()
        for t in model.tokenize(text, add_bos=False, special=True):
            if not st.mask()[t]:
                return False
            st.accept(t)
        return bool(st.mask()[min(model.tokenizer.eog_ids)])        # the grammar may end here

    for fmt, text in calls.items():
        for choice in ("required", "get_weather"):
            g = call_grammar(fmt, [weather, clock], choice)
            assert takes(g, text), (fmt, choice)
            assert not takes(g, text.replace('"Oslo"', "12")), (fmt, choice)        # arguments checked
            assert not takes(g, "Sure! " + text), (fmt, choice)                     # a call from the start
        assert not takes(call_grammar(fmt, [weather, clock], "get_time"), text)    # the named one only
        assert call_grammar(fmt, [weather], "auto") is None and call_grammar(fmt, [weather], "none") is None


# ------------------------------------------------------------------ linear lowering, limits (issue 39)

def _doubling(n: int, r0: str = '"a"', root: str = "r{n}") -> str:
    return f"root ::= {root.format(n=n)}\nr0 ::= {r0}\n" + "".join(f"r{i} ::= r{i - 1} r{i - 1}\n" for i in range(1, n + 1))


@pytest.mark.parametrize("text", [_doubling(27), _doubling(27, root='r{n}* "b"'),
                                  _doubling(27, r0='"a"?', root='r{n}* "b"'),
                                  _doubling(27, r0='"a"{0,2000}', root='r{n}* "b"')],
                         ids=["plain", "fused", "nullable", "counted"])
def test_doubling_rules_lower_in_milliseconds_to_a_small_grammar(text):
    """27 rules each twice the one before: 2^27 characters if rule bodies were inlined (the lexeme
    after a repetition inlined them; may-be-empty and first-character checks recursed twice per rule)."""
    import time

    t = time.perf_counter()
    lark = to_lark(parse(text))
    assert time.perf_counter() - t < 0.1 and len(lark) < 2 * len(text)
    assert "r26: r25 r25" in lark


def test_grammar_limits_are_400s():
    from ramforge.errors import RequestTooLarge, http_status
    from ramforge.structured.gbnf import MAX_GRAMMAR_CHARS, MAX_NESTING, MAX_RULES, GrammarTooLarge

    too_big = ["root ::= " + '"a" ' * (MAX_GRAMMAR_CHARS // 4 + 1),
               "root ::= " + "(" * (MAX_NESTING + 1) + '"a"' + ")" * (MAX_NESTING + 1),
               'root ::= "a"' + "*" * (MAX_NESTING + 1),
               'root ::= ("a"+)' + "?" * MAX_NESTING,
               "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(MAX_RULES)) + f'r{MAX_RULES} ::= "a"\n']
    for text in too_big:
        with pytest.raises(GrammarTooLarge) as e:
            for_request(grammar=text)
        assert isinstance(e.value, RequestTooLarge) and http_status(e.value) == 400
    ok = "root ::= " + "(" * (MAX_NESTING - 1) + '"a"' + ")" * (MAX_NESTING - 1)
    assert for_request(grammar=ok) == ok


def test_long_rule_chains_lower_without_recursion():
    text = "root ::= r0* \"b\"\n" + "".join(f"r{i} ::= r{i + 1} | \"a\"\n" for i in range(3000)) + 'r3000 ::= "c"\n'
    lark = to_lark(parse(text))                 # an SCC / worklist pass, not a recursion 3,000 deep
    assert lark.count("\n") == 3003


def test_hostile_schemas_are_400s():
    from ramforge.errors import http_status
    from ramforge.structured.schema import MAX_SCHEMA_DEPTH

    deep = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "array", "items": deep}
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(500)} | {"d500": {"type": "string"}},
             "$ref": "#/$defs/d0"}
    for schema, what in ((deep, "nested over"), (chain, "nested over"),
                         ({"type": "integer", "minimum": float("inf")}, "finite"),
                         ({"type": "integer", "maximum": float("nan")}, "finite"),
                         ({"const": [1, {"a": float("-inf")}]}, "finite"), ({"enum": [float("inf")]}, "finite")):
        with pytest.raises(SchemaError, match=what) as e:
            schema_grammar(schema)
        assert http_status(e.value) == 400
    # an integer bound beyond int64 is clamped to it (llama.cpp reads int64), not a 500
    assert schema_grammar({"type": "integer", "minimum": -(10 ** 400), "maximum": 10 ** 400}) == \
        schema_grammar({"type": "integer"})
    # a $ref cycle inside allOf converts; a long property name beside additionalProperties nests its
    # "none of these names" rule one group per character: 60 convert, 5,000 are a 400 (not a RecursionError)
    schema_grammar({"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]})
    schema_grammar({"type": "object", "properties": {"x" * 60: {"type": "integer"}}, "additionalProperties": True})
    with pytest.raises(GrammarError) as e:
        schema_grammar({"type": "object", "properties": {"x" * 5000: {"type": "integer"}}, "additionalProperties": True})
    assert http_status(e.value) == 400
