"""Record llama.cpp's answers under grammars (llama-cpp-python 0.3.36) for ramforge's structured output:
tests/fixtures/grammar/gemma3-270m-q4_k_m.json.

    python tools/record_grammar.py            # record (needs llama_cpp and g++ for llama.cpp's converter)

Per case (a JSON schema, JSON mode or a GBNF grammar) and chat prompt:
  - gbnf: the grammar ramforge's converter writes, and llama_cpp_gbnf: llama.cpp's own converter's
    text (common/json-schema-to-grammar.cpp from the vendored source, built by tools/schema_oracle.py);
  - greedy: the tokens Llama.generate(temp=0, grammar=LlamaGrammar.from_string(gbnf)) yields, the
    final end-of-generation token included (llama-cpp-python's chain: penalties, grammar, greedy);
  - seeded: the same at temperature 0.8 (top_k 40, top_p 0.95, min_p 0.05) for a few seeds.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT  # noqa: E402

OUT = REPO_ROOT / "tests" / "fixtures" / "grammar" / "gemma3-270m-q4_k_m.json"
N_CTX, MAX_GREEDY, MAX_SEEDED = 512, 96, 96
SEEDS = (1, 42, 1234)
SEEDED = dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8)

ADDRESS = {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
           "required": ["street", "city"]}
# (name, kind, schema or GBNF, user message)
CASES = [
    ("json-object", "schema", {"type": "object"}, "Describe a cat as a JSON object."),
    ("person", "schema", {"type": "object", "properties": {"name": {"type": "string"},
                                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                          "required": ["name"]}, "Give me a person as JSON with a name and an age."),
    ("enums", "schema", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                          "size": {"type": "string", "enum": ["S", "M", "L"]}},
                         "required": ["color", "size"], "additionalProperties": False},
     "Pick a t-shirt colour and size, as JSON."),
    ("defs", "schema", {"$defs": {"Address": ADDRESS}, "type": "object",
                        "properties": {"home": {"$ref": "#/$defs/Address"}, "work": {"$ref": "#/$defs/Address"}},
                        "required": ["home"]}, "Where does Alice live and work? Answer in JSON."),
    ("int-array", "schema", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     "List up to three lucky numbers as a JSON array."),
    ("ranges", "schema", {"type": "object", "properties": {"temperature": {"type": "integer", "minimum": -5,
                                                                          "maximum": 1000},
                                                           "humidity": {"type": "number"},
                                                           "floor": {"type": "integer", "exclusiveMinimum": 0}},
                          "required": ["temperature", "humidity", "floor"]}, "Report the weather in JSON."),
    ("pattern", "schema", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                                            "valid": {"type": "boolean"}},
                           "required": ["code", "valid"]}, "Make up a ticket code like ABC-1234, as JSON."),
    ("optional", "schema", {"type": "object", "properties": {k: {"type": "string"} for k in ("title", "author", "year",
                                                                                          "genre")},
                            "required": ["author"]}, "Describe a book in JSON."),
    ("formats", "schema", {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                                            "event": {"type": "string", "maxLength": 20}},
                           "required": ["day", "event"]}, "Name a historical event and its date, as JSON."),
    ("object-array", "schema", {"$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string"},
                                                                                   "qty": {"type": "integer",
                                                                                           "minimum": 1}},
                                                   "required": ["name", "qty"]}},
                                "type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 2},
     "Write a shopping list as a JSON array of items with quantities."),
    ("any-of", "schema", {"type": "object", "properties": {"nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                                           "active": {"type": "boolean"},
                                                           "tags": {"type": "array", "items": {"type": "string"},
                                                                    "maxItems": 2}},
                          "required": ["nickname", "active", "tags"]}, "Describe a user account in JSON."),
    ("recursive", "schema", {"$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                                                "next": {"$ref": "#/$defs/Node"}},
                                                "required": ["value"]}}, "$ref": "#/$defs/Node"},
     "Write a short linked list of numbers as nested JSON."),
    ("gbnf-answer", "gbnf", 'root ::= "Answer: " ("yes" | "no") "."\n', "Is the sky blue?"),
    ("gbnf-list", "gbnf", 'root ::= item{2,4}\nitem ::= "- " [a-z ]+ "\\n"\n', "List some fruits."),
]


def chat_prompt(tok_model, message: str) -> str:
    return tok_model.render_chat([{"role": "user", "content": message}])


def main(argv=None) -> int:
    import llama_cpp
    from llama_cpp import LlamaGrammar

    import ramforge
    from ramforge.store.resolve import default_model_path
    from ramforge.structured import schema_grammar
    from tools.schema_oracle import llama_cpp_schema_to_grammar

    path = str(default_model_path())
    rf = ramforge.Model(path, n_ctx=N_CTX)
    llm = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, n_threads_batch=2,
                          verbose=False, seed=0)
    eog = lambda t: llama_cpp.llama_token_is_eog(llm._model.vocab, t)  # noqa: E731

    def run(tokens, gbnf, n, seed=None, **kw):
        if seed is not None:
            llm.set_seed(seed)
        out = []
        llm.reset()                        # the whole prompt evaluated afresh, as ramforge's replay does
        for t in llm.generate(tokens, grammar=LlamaGrammar.from_string(gbnf, verbose=False), reset=True, **kw):
            out.append(int(t))
            if eog(t) or len(out) >= n:
                break
        return out

    cases = []
    for name, kind, spec, message in CASES:
        gbnf = schema_grammar(spec) if kind == "schema" else spec
        prompt = chat_prompt(rf, message)
        tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        assert tokens == rf.tokenize(prompt, special=True), name
        c = {"name": name, "kind": kind, "spec": spec, "prompt": prompt, "prompt_tokens": tokens, "gbnf": gbnf,
             "greedy": run(tokens, gbnf, MAX_GREEDY, temp=0.0, top_k=40, top_p=0.95, min_p=0.05),
             "seeded": {str(s): run(tokens, gbnf, MAX_SEEDED, seed=s, temp=SEEDED["temperature"], top_k=SEEDED["top_k"],
                                    top_p=SEEDED["top_p"], min_p=SEEDED["min_p"]) for s in SEEDS}}
        if kind == "schema":
            c["llama_cpp_gbnf"] = llama_cpp_schema_to_grammar(spec)
        c["greedy_text"] = llm.detokenize(c["greedy"]).decode("utf-8", "replace")
        print(f"{name}: {c['greedy_text']!r}")
        cases.append(c)
    rf.close()
    rec = {"model": "gemma3-270m-q4_k_m", "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX,
                                                    "max_greedy": MAX_GREEDY, "max_seeded": MAX_SEEDED,
                                                    "seeded_params": SEEDED},
           "cases": cases}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
