"""Robustness harnesses: what ramforge does with hostile input and under load (docs/RELIABILITY.md).

    fuzz.py           random and mutated GGUF files, tokenizer text, bytes and ids, vocab files
    fuzz_atheris.py   coverage-guided fuzzing of the reader and the tokenizer (atheris)
    load_server.py    `ramforge serve` under concurrent valid, malformed and stalled clients
    gguf_cases.py, tokenizer_cases.py   the fuzz cases and checks, shared with tests/test_fuzz_*.py

Each runs as a script from the repository root (`python robustness/fuzz.py`, or
`python -m robustness.fuzz`). Tests import them as this package (`from robustness import
load_server`, `robustness.gguf_cases`); nothing here imports from tests/
(tests/test_robustness_imports.py checks it).
Speed measurements stay in benchmarks/.
"""
