"""Fuzzing the tokenizers: any text, any bytes, any ids -- no crash, lossless round trips, streaming
decode equal to decode.

Vocabularies: Gemma 3 (the embedded default model; SPM, 262k tokens, add_space_prefix off, many
user-defined whitespace/HTML tokens), qwen2 (byte-level BPE, no space clean-up) and llama-spm (SPM
with add_space_prefix and byte fallback) from llama.cpp's test vocabularies.

Properties, for every input:
  * encode(text | bytes, add_special, parse_special) returns in-range ids or raises a RamforgeError
    (TokenizerInputError for bytes llama.cpp itself cannot tokenize); bytes and the same bytes as a
    surrogateescape'd str give the same result; decode/decode_bytes/detokenize of valid ids never raise.
  * decode(encode(text, add_special=False)) == text for valid Unicode text -- llama.cpp round-trips
    these too: an SPM add_space_prefix vocabulary adds a leading space that detokenize removes again
    (and with a BOS in front, remove_special=True leaves it, as llama.cpp does); texts containing a
    user-defined token string are excluded for such vocabularies (llama.cpp adds a space after each),
    and for SPM texts containing U+2581, the vocabulary's spelling of a space (it decodes to " ").
  * streaming (stream().feed over the ids, then flush) equals decode of all the ids (up to that
    leading space), and equals decode_bytes(...).decode("utf-8", "replace"), for any id sequence.
  * an id outside the vocabulary is a TokenIdError (a RamforgeError and an IndexError).

The checks are plain functions (check_text, check_bytes, check_ids) that robustness/fuzz.py also
runs on 10k+ seeded random cases; they live in robustness/tokenizer_cases.py, which both use.
test_oracle_* (``-m oracle``) compares ids and detokenization with live llama.cpp
(llama-cpp-python) on a few hundred random strings per vocabulary.
"""
from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ramforge.errors import RamforgeError

from robustness.tokenizer_cases import (CONTROL, EMOJI, NAMES, RTL, TRICKY, WS, check_bytes, check_ids,
                                        check_text, check_vocab_file, expect, load, model_path, random_bytes,
                                        random_ids, random_text, random_vocab_file)


@pytest.fixture(scope="module", params=NAMES)
def tok(request):
    try:
        t = load(request.param)
    except Exception as e:   # noqa: BLE001 - no default model / vocab fetch impossible here
        pytest.skip(f"{request.param} vocabulary unavailable: {e}")
    assert not t.vocab.clean_spaces, "round trips below assume no clean-up of spaces"
    return t


# ---- the checks (shared with robustness/fuzz.py) -------------------------------------------------

NO_SURROGATES = st.characters(blacklist_categories=("Cs",))
CLASSES = st.one_of(
    st.characters(max_codepoint=0x1F), st.sampled_from(list(CONTROL)),           # control and format
    st.characters(whitelist_categories=("Mn", "Mc", "Me")),                        # combining marks
    st.characters(min_codepoint=0x0590, max_codepoint=0x08FF), st.sampled_from(list(RTL)),   # RTL
    st.characters(min_codepoint=0x1F000, max_codepoint=0x1FAFF),                  # emoji
    st.sampled_from(list(WS)),
)
PIECE = st.one_of(
    st.text(NO_SURROGATES, max_size=24),
    st.text(CLASSES, max_size=16),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from(list(" \n\t")), max_size=40),
    st.builds(lambda c, n: c * n, NO_SURROGATES, st.integers(1, 3000)),            # long runs of one char
    st.text(st.sampled_from(list(" \n")), min_size=1, max_size=400),              # many spaces/newlines
    st.sampled_from(TRICKY + EMOJI),
)
TEXTS = st.lists(PIECE, max_size=6).map("".join)
INVALID_UTF8 = st.binary(max_size=48) | st.randoms(use_true_random=False).map(random_bytes)

# deadline: generous per case (a text case is 4 encodes and ~20 decodes of up to ~10k characters,
# on a shared machine); a hang or a quadratic blow-up still trips it
FUZZ = dict(derandomize=True, database=None, deadline=timedelta(seconds=5), print_blob=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.data_too_large, HealthCheck.large_base_example])


@settings(max_examples=150, **FUZZ)
@given(text=TEXTS)
def test_any_text_encodes_decodes_and_round_trips(tok, text):
    check_text(tok, text)


@settings(max_examples=80, **FUZZ)
@given(data=INVALID_UTF8)
def test_invalid_utf8_never_crashes(tok, data):
    check_bytes(tok, data)


@settings(max_examples=60, **FUZZ)
@given(r=st.randoms(use_true_random=False))
def test_streaming_equals_decode_for_any_ids(tok, r):
    check_ids(tok, random_ids(r, tok))


def test_out_of_range_ids_are_refused(tok):
    from ramforge.tokenizer import TokenIdError, TokenizerInputError
    for bad in (tok.n_vocab, -1, 2**40):
        for call in (lambda: tok.decode([1, bad]), lambda: tok.decode_bytes([bad]), lambda: tok.token_to_piece(bad),
                     lambda: tok.stream().feed(bad)):
            with pytest.raises(TokenIdError) as e:
                call()
            assert isinstance(e.value, (RamforgeError, TokenizerInputError, IndexError))


def test_known_hard_inputs(tok):
    """Fixed cases the random generators reach only rarely."""
    for text in ["", " ", "  ", "\n" * 1000, " " * 5000, "a" * 20000, "\u0301" * 500, "\U0001f468\u200d" * 200,
                 "\u202e" + "abc" * 50, "\x00" * 64, "\ufeff\ufeffx", " \n" * 1000, "7" * 5000, "'s" * 500,
                 "".join(chr(c) for c in range(0x20, 0x3000, 7))]:
        check_text(tok, text)
    for data in [b"\xff" * 100, b"\xed\xa0\x80" * 10, b"\xf4\x90\x80\x80", b"\xc3" * 50, b"a\x80b\xc0\xafc",
                 bytes(range(256))]:
        check_bytes(tok, data)


# ---- tokenizer metadata from hostile GGUF files -----------------------------------------------------

@settings(max_examples=150, **FUZZ)
@given(r=st.randoms(use_true_random=False))
def test_hostile_vocabulary_files_load_or_are_refused(tmp_path_factory, r):
    path = str(tmp_path_factory.getbasetemp() / "vocab-fuzz.gguf")
    check_vocab_file(random_vocab_file(r), path)


def test_vocabulary_with_array_general_name_loads():
    """Regression: general.name (any type in a GGUF) as an array made load_tokenizer raise ValueError."""
    from ramforge.gguf.constants import GGUFValueType as VT
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer
    from tools.ggufbuild import GGUFBuilder
    b = GGUFBuilder().add("general.name", VT.ARRAY, [1, 2], VT.INT32).add("tokenizer.ggml.model", VT.STRING, "llama")
    b.add("tokenizer.ggml.tokens", VT.ARRAY, ["<unk>", "<s>", "</s>", "\u2581a"], VT.STRING)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "v.gguf")
        with open(p, "wb") as f:
            f.write(b.build())
        with GGUFFile(p) as g:
            tok = load_tokenizer(g.metadata)
    assert tok.encode("a", add_special=False) == [3]


# ---- live llama.cpp ------------------------------------------------------------------------------

_LLAMAS: dict = {}


def llama(name: str):
    if name not in _LLAMAS:
        import llama_cpp
        _LLAMAS[name] = llama_cpp.Llama(model_path(name), vocab_only=True, verbose=False)
    return _LLAMAS[name]


@pytest.fixture(scope="module", autouse=True)
def _close_llamas():
    yield
    while _LLAMAS:     # close now: at interpreter exit Llama.__del__ finds llama_cpp half torn down
        _LLAMAS.popitem()[1].close()


def llama_detokenize(llm, ids: list[int], special: bool = False) -> bytes:
    """Llama.detokenize, with a buffer that fits every piece.

    llama-cpp-python 0.3.36's Llama.detokenize reads each piece into a 32-byte buffer and slices it
    with llama_token_to_piece's return value, which is negative for a longer piece: such a piece
    (qwen2's 100-space token, say) comes out as b"" or garbage.  Same calls, bigger buffer here.
    """
    import ctypes
    import llama_cpp
    out = b""
    size = 256
    buf = ctypes.create_string_buffer(size)
    for t in ids:
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, t, buf, size, 0, special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(llm._model.vocab, t, buf, size, 0, special)
        out += buf.raw[:n]
    if ids and ids[0] == llm.token_bos() and out[:1] == b" ":
        out = out[1:]
    return out


def _ours_like_llama_py(tok, ids: list[int], special: bool = False) -> bytes:
    """What Llama.detokenize computes: pieces joined, one leading space dropped after a leading BOS."""
    out = tok.decode_bytes(ids, special)
    if ids and ids[0] == tok.bos_id and out[:1] == b" ":
        out = out[1:]
    return out


def compare_with_llama(tok, llm, data: bytes) -> None:
    """ids equal llama.cpp's; detokenization equal; where llama.cpp round-trips, we do too."""
    for add_bos, special in ((False, False), (True, False), (True, True)):
        ctx = f"tokenize({data[:200]!r}, add_bos={add_bos}, special={special})"
        try:
            ours = tok.encode(data, add_special=add_bos, parse_special=special)
        except RamforgeError:
            continue      # llama.cpp aborts the process on these (see TokenizerInputError); not called
        theirs = llm.tokenize(data, add_bos=add_bos, special=special)
        expect(ours == theirs, f"{ctx}: ramforge {ours[:30]} != llama.cpp {theirs[:30]}")
        for sp in (False, True):
            mine, ref = _ours_like_llama_py(tok, ours, sp), llama_detokenize(llm, theirs, sp)
            expect(mine == ref, f"{ctx}: detokenize(special={sp}) {mine[:200]!r} != llama.cpp {ref[:200]!r}")
        if llama_detokenize(llm, theirs) == data:
            expect(_ours_like_llama_py(tok, ours) == data, f"{ctx}: llama.cpp round-trips, ramforge does not")
            if not add_bos:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                expect(tok.decode(ours) == text, f"{ctx}: llama.cpp round-trips, ramforge's decode does not")


ORACLE = dict(FUZZ, max_examples=250)


@pytest.mark.oracle
@pytest.mark.parametrize("name", NAMES)
@settings(**ORACLE)
@given(text=TEXTS | st.randoms(use_true_random=False).map(random_text))
def test_oracle_random_text_matches_llama_cpp(name, text):
    pytest.importorskip("llama_cpp")
    compare_with_llama(load(name), llama(name), text.encode("utf-8"))


@pytest.mark.oracle
@pytest.mark.parametrize("name", NAMES)
@settings(**dict(ORACLE, max_examples=100))
@given(data=INVALID_UTF8)
def test_oracle_invalid_utf8_matches_llama_cpp(name, data):
    pytest.importorskip("llama_cpp")
    compare_with_llama(load(name), llama(name), data)
