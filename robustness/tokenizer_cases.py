"""Fuzz cases for the tokenizers, shared by tests/test_fuzz_tokenizer.py (under hypothesis) and
robustness/fuzz.py (seeded random cases): the vocabularies (NAMES), the checks (check_text,
check_bytes, check_ids: encode, decode and stream agree; a failure is a Mismatch), the random
inputs (random_text, random_bytes, random_ids) and hostile vocabulary files (random_vocab_file,
check_vocab_file).
"""
from __future__ import annotations

import warnings
from functools import lru_cache

from ramforge.errors import RamforgeError
from .gguf_cases import mutate

NAMES = ["gemma3", "qwen2", "llama-spm"]


# ---- tokenizers --------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def model_path(name: str) -> str:
    if name == "gemma3":
        from ramforge.store.resolve import default_model_path
        return str(default_model_path())
    from tools._fixtures import vocab_path            # llama.cpp's vocab files, fetched once
    return str(vocab_path(name))


@lru_cache(maxsize=None)
def load(name: str):
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer
    with GGUFFile(model_path(name)) as f:
        return load_tokenizer(f.metadata)


def user_defined_texts(tok) -> tuple[str, ...]:
    """Token texts matched even without parse_special (llama.cpp partitions on them)."""
    from ramforge.tokenizer.vocab import ATTR_CONTROL, ATTR_UNKNOWN
    cached = getattr(tok, "_fuzz_user_defined", None)
    if cached is None:
        v = tok.vocab
        cached = tuple(v.tokens[i] for i in v.special_cache if not v.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN))
        tok._fuzz_user_defined = cached
    return cached


class Mismatch(AssertionError):
    """A property failed (not a crash: the code ran, the answer is wrong)."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Mismatch(what)


def round_trips(tok, text: str) -> bool:
    """Whether llama.cpp gives `text` back from detokenize(tokenize(text, add_special=False))."""
    if tok.vocab.clean_spaces:
        return False
    if (tok.vocab.kind == "spm" or tok.vocab.escape_whitespaces) and "\u2581" in text:
        return False      # U+2581 is how these vocabularies spell a space: it decodes to " "
    if tok.vocab.add_space_prefix and any(u in text for u in user_defined_texts(tok)):
        return False
    return True


def _check_decoding(tok, ids: list[int], context: str) -> None:
    """Every decoding entry point on valid ids; streaming equals decode."""
    n = tok.n_vocab
    expect(all(type(i) is int and 0 <= i < n for i in ids), f"{context}: ids out of range {ids[:20]}")
    for special in (False, True):
        raw = tok.decode_bytes(ids, special)
        s = tok.stream(special)
        streamed = "".join(s.feed(i) for i in ids) + s.flush()
        expect(streamed == raw.decode("utf-8", "replace"),
                f"{context}: stream(special={special}) {streamed!r} != decode_bytes {raw!r}")
        full = tok.decode(ids, special=special)
        # llama_detokenize drops the leading space of the first piece of an add_space_prefix vocab
        strip = tok.vocab.add_space_prefix and ids and tok.token_to_piece(ids[0], special)[:1] == b" "
        expect(streamed == (" " + full if strip else full),
                f"{context}: stream(special={special}) {streamed!r} != decode {full!r}")
        tok.decode(ids, special=special, remove_special=True)
        tok.detokenize_bytes(ids, special, remove_special=not special)


def check_text(tok, text: str) -> str | None:
    """Run every property on valid Unicode text. Returns None, or the RamforgeError class name of a
    clean refusal. Raises Mismatch for a wrong answer; anything else that escapes is a crash."""
    refused = None
    for add_special in (False, True):
        for parse_special in (False, True):
            ctx = f"encode({text[:200]!r}, add_special={add_special}, parse_special={parse_special})"
            try:
                ids = tok.encode(text, add_special=add_special, parse_special=parse_special)
            except RamforgeError as e:
                refused = type(e).__name__
                continue
            _check_decoding(tok, ids, ctx)
            if parse_special or not round_trips(tok, text):
                continue
            if not add_special:
                got = tok.decode(ids)
                expect(got == text, f"{ctx}: decode gave {got!r}")
            else:
                got = tok.decode(ids, remove_special=True)
                # with BOS removed llama_detokenize keeps the prefix space (remove_space = false)
                lead = " " if tok.vocab.add_space_prefix and text and tok.add_bos else ""
                expect(got == lead + text, f"{ctx}: decode(remove_special=True) gave {got!r}")
    return refused


def check_bytes(tok, data: bytes) -> str | None:
    """Arbitrary bytes (usually invalid UTF-8), as bytes and as surrogateescape'd str."""
    refused = None
    text = data.decode("utf-8", "surrogateescape")
    for parse_special in (False, True):
        results = []
        for inp in (data, text):
            try:
                results.append(tok.encode(inp, add_special=True, parse_special=parse_special))
            except RamforgeError as e:
                results.append(type(e).__name__)
        ctx = f"encode({data[:100]!r}, parse_special={parse_special})"
        expect(results[0] == results[1], f"{ctx}: bytes gave {results[0]} but the surrogateescape str {results[1]}")
        if isinstance(results[0], str):
            refused = results[0]
            continue
        _check_decoding(tok, results[0], ctx)
        try:
            valid = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        expect(tok.encode(valid, True, parse_special) == results[0], f"{ctx}: bytes and str tokenized differently")
    return refused


def check_ids(tok, ids: list[int]) -> None:
    """Any in-range id sequence decodes; streaming equals decode."""
    _check_decoding(tok, ids, f"decode({ids[:20]})")


def byte_token_ids(tok) -> list[int]:
    """Ids that render to single (often invalid-alone) bytes: the byte-fallback/byte-level tokens."""
    cached = getattr(tok, "_fuzz_byte_ids", None)
    if cached is None:
        cached = []
        for b in range(256):
            try:
                cached.append(tok.vocab.byte_to_token(b))
            except RamforgeError:
                pass
        tok._fuzz_byte_ids = cached
    return cached


# ---- random inputs from a random.Random (robustness/fuzz.py) ----------------------------------

CONTROL = "".join(map(chr, range(0x20))) + "\x7f\x80\x85\x9f\u00ad\u061c\u200b\u200c\u200d\u200e\u200f\u2028\u2029\u2060\ufeff\ufff9\ufffc\ufffd"
COMBINING = "\u0300\u0301\u0302\u0308\u0323\u0327\u036f\u0483\u0591\u05b4\u064b\u0670\u093c\u094d\u0e31\u0e48\u1ab0\u20d0\u20e3\ufe0f\ufe20"
RTL = "\u05d0\u05d1\u05e9\u05dc\u05d5\u05dd\u0627\u0644\u0633\u0645\u06cc\u0710\u0780\u07ca\u0800\u202a\u202b\u202e\u2066\u2067\u2069\ufb1d\ufe70"
WS = " \t\n\r\x0b\x0c\u00a0\u1680\u2000\u2003\u200a\u2028\u202f\u205f\u3000\u2581"
EMOJI = ["\U0001f600", "\U0001f999", "\u2764\ufe0f", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f1ef\U0001f1f5",
          "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f44d\U0001f3fd", "#\ufe0f\u20e3", "\U0001faf6"]
TRICKY = ["'s", "'S", "'ll", "'LL", "'re", " ?", " !", " .", " ,", " ' ", "\u2581", "\u0120", "\u010a", "<0x41>", "<0xE2>",
          "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
          "<start_of_turn>", "<end_of_turn>", "<b>", "</b>", "<table>", "  ", "\r\n", "\n\n\n", "\t\t", "1234567",
          "3.14159", "e\u0301", "\u00e9", "\uac00\ub098", "\u3053\u3093\u306b\u3061\u306f", "\u4e2d\u6587", "\U00010348"]


def _rand_char(rng) -> str:
    r = rng.random()
    if r < 0.35:
        return chr(rng.randint(0x20, 0x7E))
    if r < 0.6:
        c = rng.choice([rng.randint(0, 0x2FFF), rng.randint(0x3000, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
        return chr(c) if not 0xD800 <= c <= 0xDFFF else "\ufffd"
    return rng.choice(rng.choice([CONTROL, COMBINING, RTL, WS]))


def random_text(rng) -> str:
    """Mixed pieces: random code points, classes (control, combining, RTL, emoji, whitespace), long runs
    of one character, runs of spaces/newlines, and special-token-like strings."""
    parts = []
    for _ in range(rng.randint(0, 8)):
        r = rng.random()
        if r < 0.3:
            parts.append("".join(_rand_char(rng) for _ in range(rng.randint(1, 16))))
        elif r < 0.45:
            parts.append(rng.choice(TRICKY))
        elif r < 0.55:
            parts.append(rng.choice(EMOJI) * rng.randint(1, 3))
        elif r < 0.65:
            parts.append(rng.choice(CONTROL + COMBINING + RTL) * rng.randint(1, 8))
        elif r < 0.75:
            parts.append("".join(rng.choice(" \n\t") for _ in range(rng.randint(1, 300))))
        elif r < 0.8:
            parts.append(_rand_char(rng) * rng.randint(100, 3000))
        else:
            parts.append("".join(rng.choice("abcdefghij ABC,.!?'0123") for _ in range(rng.randint(1, 30))))
    return "".join(parts)


def random_bytes(rng) -> bytes:
    """Bytes biased to invalid UTF-8: stray continuations, truncated/overlong sequences, encoded
    surrogates, code points past U+10FFFF, mixed with ASCII and valid text."""
    out = bytearray()
    for _ in range(rng.randint(0, 10)):
        r = rng.random()
        if r < 0.25:
            out += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        elif r < 0.4:
            out += rng.choice([b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                               b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff",
                               b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3"])
        elif r < 0.55:
            out += bytes([rng.choice([0xC2, 0xE2, 0xF0, 0xF4])]) + bytes(rng.randint(0x80, 0xBF) for _ in range(rng.randint(0, 4)))
        else:
            out += random_text(rng)[:40].encode("utf-8")
    return bytes(out)


def random_ids(rng, tok) -> list[int]:
    n = tok.n_vocab
    byte_ids = byte_token_ids(tok) or [0]
    special = tok.vocab.special_cache or [0]
    out = []
    for _ in range(rng.randint(0, 40)):
        r = rng.random()
        out.append(rng.choice(byte_ids) if r < 0.4 else rng.choice(special) if r < 0.5 else rng.randrange(n))
    return out


# ---- hypothesis strategies -----------------------------------------------------------------------

def random_vocab_file(rng) -> bytes:
    """A tiny GGUF vocabulary (SPM or BPE) built with tools/ggufbuild.py, then mutated as the reader
    fuzz mutates files (fields, counts, types, bytes)."""
    from ramforge.gguf.constants import GGUFValueType as VT
    from tools.ggufbuild import GGUFBuilder
    spm = rng.random() < 0.5
    b = GGUFBuilder()
    if rng.random() < 0.3:      # general.name may be any type; a few names switch on vocabulary quirks
        vt = rng.choice([VT.STRING, VT.ARRAY, VT.UINT32])
        if vt == VT.STRING:
            b.add("general.name", VT.STRING, rng.choice(["Phi-3 mini", "modern-bert", "x"]))
        elif vt == VT.ARRAY:
            b.add("general.name", VT.ARRAY, [1, 2], VT.INT32)
        else:
            b.add("general.name", VT.UINT32, 7)
    if spm:
        toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab", "<b>"]
        types = [2, 3, 3] + [6] * 256 + [1, 1, 1, 1, 1, 4]
        b.add("tokenizer.ggml.model", VT.STRING, "llama")
    else:
        from ramforge.tokenizer.unidata import BYTE_TO_UNICODE
        toks = [BYTE_TO_UNICODE[i] for i in range(256)] + ["\u0120a", "ab", "<|endoftext|>", "<|im_end|>"]
        types = [1] * 258 + [3, 3]
        b.add("tokenizer.ggml.model", VT.STRING, "gpt2")
        b.add("tokenizer.ggml.pre", VT.STRING, rng.choice(["qwen2", "gpt-2", "llama-bpe", "default"]))
        b.add("tokenizer.ggml.merges", VT.ARRAY, ["\u0120 a", "a b"], VT.STRING)
    b.add("tokenizer.ggml.tokens", VT.ARRAY, toks, VT.STRING)
    b.add("tokenizer.ggml.scores", VT.ARRAY, [-float(i) for i in range(len(toks))], VT.FLOAT32)
    b.add("tokenizer.ggml.token_type", VT.ARRAY, types, VT.INT32)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if rng.random() < 0.5:
            vt = rng.choice([VT.UINT32] * 8 + [VT.INT32, VT.UINT64, VT.FLOAT32, VT.STRING, VT.BOOL])
            val = rng.choice([0, 1, 2, len(toks) - 1, len(toks), 2**31 - 1])
            b.add("tokenizer.ggml." + key, vt, str(val) if vt == VT.STRING else float(val) if vt == VT.FLOAT32
                  else bool(val & 1) if vt == VT.BOOL else (val if vt != VT.INT32 else -val))
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix", "remove_extra_whitespaces"):
        if rng.random() < 0.3:
            vt = rng.choice([VT.BOOL] * 6 + [VT.UINT8, VT.STRING, VT.INT32])
            b.add("tokenizer.ggml." + key, vt, "yes" if vt == VT.STRING else rng.choice([0, 1, 2]) if vt != VT.BOOL
                  else rng.random() < 0.5)
    data = b.build()
    return mutate(rng, data, n_ops=rng.choice([0, 0, 1, 1, 2, 3]))


VOCAB_TEXTS = ["", "ab a", " <b> ab\n", "<s></s>a", "\xff\x00", "a" * 100, "\u2581\u0120", "<|endoftext|>x"]


def check_vocab_file(data: bytes, path: str) -> str:
    """Parse, load the tokenizer, encode/decode a few texts. Returns 'ok' or the RamforgeError class."""
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer
    with open(path, "wb") as f:
        f.write(data)
    try:
        with GGUFFile(path) as g:
            md = g.metadata
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = load_tokenizer(md)
        for text in VOCAB_TEXTS:
            for flags in ((True, True), (False, False)):
                try:
                    ids = tok.encode(text, *flags)
                except RamforgeError:
                    continue
                _check_decoding(tok, ids, f"vocab file, encode({text!r}, {flags})")
        return "ok"
    except RamforgeError as e:
        return type(e).__name__
