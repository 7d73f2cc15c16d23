"""Fixture tools: synthetic models, llama.cpp oracle records, vocabulary downloads.

    make_models.py     deterministic random-weight GGUFs, quantized by llama.cpp
    record_oracle.py   llama.cpp's tokens and logits for them (tests/fixtures/oracle)
    oracle_report.py   ramforge against those records
    record_chat.py     llama-cpp-python's chat-template renderings (tests/fixtures/chat)
    fetch_vocab.py     llama.cpp's ggml-vocab-*.gguf files
    _fixtures.py       paths and helpers they share

Each runs as a script from the repository root (`python tools/make_models.py`, or
`python -m tools.make_models`). Tests and benchmarks import them as this package
(`from tools.make_models import ensure_model`), never by file path.
"""
