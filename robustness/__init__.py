"""Robustness harnesses: what ramforge does with hostile input and under load (docs/RELIABILITY.md).

    fuzz.py           random and mutated GGUF files, tokenizer text, bytes and ids, vocab files
    fuzz_atheris.py   coverage-guided fuzzing of the reader and the tokenizer (atheris)
    load_server.py    `ramforge serve` under concurrent valid, malformed and stalled clients

Each runs as a script from the repository root (`python robustness/fuzz.py`, or
`python -m robustness.fuzz`). Tests import them as this package (`from robustness import
load_server`); the harnesses reuse the tests' case generators (`tests.test_fuzz_reader`, ...).
Speed measurements stay in benchmarks/.
"""
