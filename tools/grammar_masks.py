"""Compare ramforge's grammar masks (llguidance) with llama.cpp's grammar sampler, token for token.

    python tools/grammar_masks.py [--walks 4] [--steps 40]     # gemma3's vocabulary, tools/record_grammar.py's grammars

Along random walks through each grammar (each step a token llama.cpp's mask allows, chosen at random,
accepted by both), the set of allowed tokens over the whole vocabulary must be the same at every
step: llama_sampler_init_grammar + llama_sampler_apply on a vocab-only llama_cpp model, against
ramforge.structured.GrammarState.mask(). Used by tests/test_structured.py (-m oracle).
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_TD = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class LlamaGrammarMasks:
    """llama.cpp's grammar sampler on a vocab-only model."""

    def __init__(self, model_path: str):
        import llama_cpp

        self.L = llama_cpp.llama_cpp
        self.llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.n = self.llm.n_vocab()

    def sampler(self, gbnf: str):
        s = self.L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not s:
            raise ValueError("llama.cpp refused the grammar")
        return s

    def mask(self, s) -> np.ndarray:
        data = np.zeros(self.n, dtype=_TD)
        data["id"] = np.arange(self.n)
        arr = self.L.llama_token_data_array(data=data.ctypes.data_as(ctypes.POINTER(self.L.llama_token_data)),
                                           size=self.n, selected=-1, sorted=False)
        self.L.llama_sampler_apply(s, ctypes.byref(arr))
        return np.isfinite(data["logit"])

    def accept(self, s, tok: int) -> None:
        self.L.llama_sampler_accept(s, tok)

    def free(self, s) -> None:
        self.L.llama_sampler_free(s)


def never_utf8(tokenizer) -> np.ndarray:
    """bool[n_vocab]: tokens holding a byte no UTF-8 text has (C0, C1, F5-FF). llama.cpp's grammar
    decodes UTF-8 leniently (such a byte starts a sequence there); llguidance admits valid UTF-8 only."""
    bad = set(b"\xc0\xc1") | set(range(0xF5, 0x100))
    return np.array([bool(set(tokenizer.token_to_piece(i, special=True)) & bad) for i in range(tokenizer.n_vocab)])


def _complete_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def walk(oracle: LlamaGrammarMasks, grammar, steps: int, seed: int, skip: np.ndarray | None = None) -> list[str]:
    """Differences between the two masks along one random walk (empty: identical everywhere), outside
    the tokens `skip` (never_utf8); the walk takes tokens of complete UTF-8 text only."""
    rng = np.random.default_rng(seed)
    s, st, bad = oracle.sampler(grammar.gbnf), grammar.state(), []
    eog = set(grammar.tokenizer.eog_ids)
    piece = lambda t: grammar.tokenizer.token_to_piece(t, special=True)  # noqa: E731
    try:
        for step in range(steps):
            want, got = oracle.mask(s), st.mask()
            if skip is not None:
                want, got = want & ~skip, got & ~skip
            if not np.array_equal(want, got):
                d = np.flatnonzero(want != got)[:8]
                bad.append(f"step {step}: {len(np.flatnonzero(want != got))} tokens differ, e.g. "
                           + ", ".join(f"{i} {grammar.tokenizer.token_to_piece(int(i), special=True)!r} "
                                       f"llama.cpp={bool(want[i])}" for i in d))
                return bad
            allowed = [int(i) for i in np.flatnonzero(want) if int(i) not in eog and _complete_utf8(piece(int(i)))]
            if not allowed:
                return bad
            tok = allowed[int(rng.integers(len(allowed)))] if rng.random() < 0.7 else \
                min(allowed, key=lambda t: len(piece(t)))
            oracle.accept(s, tok)
            st.accept(tok)
    finally:
        oracle.free(s)
    return bad


def main(argv=None) -> int:
    import argparse

    from ramforge.store.resolve import default_model_path
    from ramforge.structured import Grammar, schema_grammar
    from ramforge.tokenizer import load_tokenizer
    from ramforge.gguf.reader import GGUFFile
    from tools.record_grammar import CASES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--walks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args(argv)
    path = str(default_model_path())
    with GGUFFile(path) as f:
        tok = load_tokenizer(f.metadata)
    oracle, failed, skip = LlamaGrammarMasks(path), 0, never_utf8(tok)
    for name, kind, spec, _ in CASES:
        g = Grammar(schema_grammar(spec) if kind == "schema" else spec, tok)
        for w in range(a.walks):
            bad = walk(oracle, g, a.steps, seed=w, skip=skip)
            print(f"{name} walk {w}: {'ok' if not bad else bad[0]}")
            failed += bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
