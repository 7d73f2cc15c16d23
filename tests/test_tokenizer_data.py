"""Shared fixtures, cases and recorded llama.cpp results for the tokenizer tests (no tests here).

The vocabularies are llama.cpp's own test vocabularies (models/ggml-vocab-*.gguf and their .inp/.out
goldens), fetched from the pinned llama-cpp-python sdist by tools/fetch_vocab.py.

RECORDED_* tables hold results of llama.cpp 0.3.36 itself (through llama-cpp-python), for vocabularies
without .inp/.out goldens and for pre-tokenizers llama.cpp has no golden vocabulary for (run on a
golden vocabulary with tokenizer.ggml.pre overridden).  Regenerate with
``python -m tests.test_tokenizer_oracle --record`` (needs llama_cpp importable).
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import pytest


# every ggml-vocab-*.gguf of the pinned sdist: name -> (tokenizer.ggml.model, tokenizer.ggml.pre)
VOCABS: dict[str, tuple[str, str | None]] = {
    "aquila": ("gpt2", None),
    "baichuan": ("llama", None),
    "bert-bge": ("bert", "bert-bge"),
    "command-r": ("gpt2", "command-r"),
    "deepseek-coder": ("gpt2", "deepseek-coder"),
    "deepseek-llm": ("gpt2", "deepseek-llm"),
    "falcon": ("gpt2", "falcon"),
    "gemma-4": ("gemma4", None),
    "gpt-2": ("gpt2", "gpt-2"),
    "gpt-neox": ("gpt2", None),
    "llama-bpe": ("gpt2", "llama-bpe"),
    "llama-spm": ("llama", "default"),
    "mpt": ("gpt2", "mpt"),
    "nomic-bert-moe": ("t5", "default"),
    "phi-3": ("llama", "default"),
    "qwen2": ("gpt2", "qwen2"),
    "qwen35": ("gpt2", "qwen35"),
    "refact": ("gpt2", "refact"),
    "starcoder": ("gpt2", "starcoder"),
}
HAS_GOLDEN = {"bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
              "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"}


def claimed(model: str, pre: str | None) -> bool:
    from ramforge.tokenizer import SUPPORTED_TOKENIZERS
    pres = SUPPORTED_TOKENIZERS.get(model)
    if pres is None:
        return False
    return "*" in pres or (model == "gemma4") or (pre or "default") in pres


@lru_cache(maxsize=None)
def vocab_path_dir() -> Path:
    env = os.environ.get("RAMFORGE_VOCAB_DIR")
    if env and (Path(env) / "ggml-vocab-llama-spm.gguf").is_file():
        return Path(env)
    from tools.fetch_vocab import fetch_vocab

    return fetch_vocab()


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """Directory with llama.cpp's ggml-vocab-* files (fetched once into the fixture cache)."""
    return vocab_path_dir()


@lru_cache(maxsize=None)
def metadata(name: str) -> dict:
    from ramforge.gguf.reader import GGUFFile
    with GGUFFile(vocab_path_dir() / f"ggml-vocab-{name}.gguf") as f:
        return f.metadata


@lru_cache(maxsize=None)
def tokenizer(name: str, pre: str | None = None, model: str | None = None):
    from ramforge.tokenizer import load_tokenizer
    md = dict(metadata(name))
    if pre is not None:
        md["tokenizer.ggml.pre"] = pre
    if model is not None:
        md["tokenizer.ggml.model"] = model
    return load_tokenizer(md)


def read_golden(path: Path) -> list[tuple[str, list[int]]]:
    """Cases of a .inp/.out pair, split exactly as llama.cpp's test-tokenizer-0 does."""
    raw = Path(str(path) + ".inp").read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(sep)
    outputs = Path(str(path) + ".out").read_text(encoding="utf-8").split("\n")
    if outputs and outputs[-1] == "":
        outputs.pop()
    assert len(inputs) == len(outputs), f"{path}: {len(inputs)} inputs but {len(outputs)} outputs"
    return [(s, [int(x) for x in o.split()]) for s, o in zip(inputs, outputs)]


# texts for recorded results: exercise contractions, case runs, digits, whitespace runs, CJK/Korean/
# kana, marks, emoji, unassigned and recently assigned code points, and special-token texts
EXTRA_TEXTS = [
    "Hello world! I'm here, you're there; we'll see. He'd've DON'T 'S 'll",
    "  leading and trailing spaces   \n\n\n  \t\t mixed\r\nwindows\rlines  ",
    "x = [1, 2, 3]\nfor i in range(10):\n    print(i ** 2)  # comment\n",
    "1234567890 12,345,678.90 ١٢٣ ０１２ ½ Ⅻ ²³",
    "HelloWORLDFoo iPhone McDonald's ABC'S ÉCOLEécole straße İstanbul",
    "中文字符和日本語のテキスト、한국어 텍스트 ㄱㄴㄷ ㄅㄆㄇ ﾊﾝｶｸ！…“quotes”",
    "нещо на Български κόσμος عربي مَرْحَبًا हिन्दी ภาษาไทย ក្រុង e\u0301 a\u0308\u0323",
    "🦙 😶\u200d🌫\ufe0f 👍🏽 🇺🇸 \U0001e4d0\U0001e4ec \U00031350 \u0cf3 \ue000 \U000e0001 \U00050000",
    "\u00a0\u3000\x85\x1c\x1f\u2028\u200b\u2581 ▁▁ tabs\tand\x0bvertical\x0cfeed",
    "<s></s><unk><|endoftext|><|im_end|><|eot_id|><|begin_of_text|><start_of_turn><end_of_turn><bos><eos><pad>",
    "<|eot_id|> text <|im_start|>user\nhi<|im_end|>\n <|endoftext|>  <mask> [MASK]",
    "<sentinel:12> IMGIMGABZ IMGIMGAAAAAZ a/b/ x\n/ ﹏ ・",
    "!!!??? ... --- ==> <= >= != ++ $100 +5 ^_^ ~/path|pipe `code` @user #tag 50% &amp; *bold* _it_",
    "http://example.com/a?b=c&d=e e.g. U.S.A. i.e. Mr. Smith's",
    "' ' '' ''' \" \"\" a ' b ' c 's 't 're 've 'm 'll 'd",
    "",
    " ",
    "\n",
    "a",
    "   \n   ",
]

# pre-tokenizers without a llama.cpp golden vocabulary: recorded on the llama-bpe vocabulary with
# tokenizer.ggml.pre overridden, one name per distinct expression list
RECORDED_PRE_ON_LLAMA_BPE = ["jais-2", "deepseek-v3", "spark2_5", "youtu", "bloom", "viking", "tekken", "chameleon",
                             "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder", "ufakzeka", "laguna",
                             "exaone-moe", "minicpm5"]
# vocabularies shipped without goldens, as they are
RECORDED_PLAIN = ["aquila", "gpt-neox", "baichuan"]


def short_hash(ids) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:8]


def case_hashes(encode, golden_texts: list[str]) -> str:
    """Space-separated short hashes: encode(t, False, False) for golden texts, then
    encode(t, True, True) for EXTRA_TEXTS."""
    hs = [short_hash(encode(t, False, False)) for t in golden_texts]
    hs += [short_hash(encode(t, True, True)) for t in EXTRA_TEXTS]
    return " ".join(hs)


def behaviour_digest(encode, detok, specials: dict, eog: set[int]) -> str:
    """One digest over special ids/flags, the EOG set, encodes and detokenizations of EXTRA_TEXTS.

    encode(text, add_special, parse_special) -> ids; detok(ids, remove_special, unparse_special) -> bytes.
    """
    h = hashlib.sha256()
    h.update(repr(sorted(specials.items())).encode())
    h.update(repr(sorted(eog)).encode())
    for t in EXTRA_TEXTS:
        for add, ps in ((True, True), (False, False)):
            ids = encode(t, add, ps)
            h.update(repr(ids).encode())
            for rm, sp in ((False, False), (True, True)):
                h.update(detok(ids, rm, sp))
    return h.hexdigest()[:16]


def my_specials(tok) -> dict:
    return dict(bos=tok.bos_id, eos=tok.eos_id, eot=tok.eot_id, pad=tok.pad_id, sep=tok.sep_id,
                add_bos=tok.add_bos, add_eos=tok.add_eos)


# ---- recorded from llama.cpp 0.3.36 (python -m tests.test_tokenizer_oracle --record) ----
RECORDED_CASES: dict[str, str] = {
    'jais-2@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 4e2879de 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 677e3bc5 d1113e1b 88820462 '
        '6a33863c f3b2a55a 7de6e70e cbf3796a 4ec9599f f7d96159 cccd34d9 00775e00 e3119681 2359c716 '
        '927e891e ab5bfb95 7097d5dc 065d9883 6a77430f 68c29ef1 5d38c670 efdf11ac 673373a5 6b48632a '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 e38ff85e d0cf07ea 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 3ae64cbc'
    ),
    'deepseek-v3@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 7de6e70e cbf3796a 4ec9599f f7d96159 cccd34d9 00775e00 e3119681 2359c716 '
        '927e891e ab5bfb95 7097d5dc 065d9883 6a77430f 68c29ef1 5d38c670 efdf11ac 90013eec 6b48632a '
        'e18b4288 12ae1559 3eecfa33 c8d60811 1941fe67 9d43dbbb f4a47608 d5ccb491 d0cf07ea 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'spark2_5@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e b7283fd1 ab448bf2 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 4e5ce0a8 5d38c670 9e1a31f8 26eb13b3 a887d663 '
        'e18b4288 12ae1559 3eecfa33 c8d60811 1941fe67 9d43dbbb 04938336 4d98e9c7 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'youtu@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 6520f06d 6a77430f 9000767c 5d38c670 efdf11ac ee1faf29 a887d663 '
        'e18b4288 5bcb7fb7 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 8f289621 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'bloom@llama-bpe': (
        '7cf8a8ea 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a c0265a44 cbf3796a 4ec9599f f7d96159 cccd34d9 c62fc813 f4730ca4 dd05e045 '
        '564e48ce a2239db2 fba6448f 065d9883 6a77430f 64f6e9b7 5d38c670 efdf11ac 6708a84f ba393a04 '
        'e18b4288 12ae1559 3eecfa33 ce19deab dab3928b 9d43dbbb 342e8819 e38ff85e 5b032ccd 284a9f02 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'viking@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 9000767c 5d38c670 efdf11ac e35d6121 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab dab3928b 9d43dbbb 342e8819 dda92921 ecf34a88 284a9f02 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'tekken@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 6520f06d 6a77430f 9000767c 8ab9c2b5 d52e7ad8 c82866e5 947b1d0f '
        '08e8fe7b d13405e2 70b85004 ff9273ef 53b3680a df7d89ea ad6ea5b6 af298b29 7b20dc59 0bef9883 '
        '68783ff9 8eda794b caab3390 93ec8b35 70f190fe b1d6c94f'
    ),
    'chameleon@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 4e2879de 8bcbb4c1 a4e00d7e b7283fd1 ab448bf2 '
        'ea02ccc6 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 b5ff3d59 af38c455 5c55727a 67962c89 834038fc 2b7ce630 41585478 fde22865 dcc29f69 '
        'f4a1286f f3b2a55a ef38f194 53757aca 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f e5ec12a0 eeec3946 7111dae6 ab7d124f 947b1d0f '
        '7af487cd d13405e2 35ec6cfc ff9273ef 4552e8d6 9e45871f e1685909 fd78b1f4 bdc884b2 31e680cc '
        '98dc00ab 8eda794b caab3390 93ec8b35 70f190fe b6d0c8f1'
    ),
    'gpt-4o@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 7de6e70e cbf3796a 4ec9599f f7d96159 cccd34d9 00775e00 e3119681 2359c716 '
        '927e891e ab5bfb95 7097d5dc 065d9883 6a77430f 68c29ef1 5d38c670 efdf11ac 90013eec 6b48632a '
        'd67081b6 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 e38ff85e d0cf07ea 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'granite-embed-multi-97m@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 7de6e70e cbf3796a 4ec9599f f7d96159 cccd34d9 00775e00 e3119681 2359c716 '
        '927e891e ab5bfb95 7097d5dc 6520f06d 6a77430f 68c29ef1 5d38c670 efdf11ac 90013eec 6b48632a '
        'd67081b6 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 e38ff85e d0cf07ea 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'bailingmoe@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 9000767c 5d38c670 efdf11ac ee1faf29 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 dda92921 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'seed-coder@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 9000767c 5d38c670 efdf11ac 26eb13b3 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb 04938336 dda92921 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'ufakzeka@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 9000767c 5d38c670 efdf11ac ee1faf29 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 dda92921 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'laguna@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        'ea02ccc6 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 86618892 5d38c670 9e1a31f8 26eb13b3 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb 04938336 dda92921 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c accf8976'
    ),
    'exaone-moe@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 c171a5e0 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 1647c2bd cbf3796a 4ec9599f c2e76dab 03dc57f2 66290ed0 6f3a2f2a 6d62586c '
        '0d12a564 84bee1ff b965fa29 065d9883 6a77430f 9000767c 5d38c670 efdf11ac ee1faf29 a887d663 '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 dda92921 c42817b9 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'minicpm5@llama-bpe': (
        'ba7be523 760fb047 e3b0c442 36790ecd 51e8ea28 9e6a7255 8bcbb4c1 a4e00d7e 3635a91e 1c053d39 '
        '2f57a2e3 ee79b65a 7bfb794f 44fec6ad 36d9edbf 27df8a45 01a105eb 0a7d132a 3b0e63b1 e2b10397 '
        '12545454 ff421421 fb7d5625 5c55727a 67962c89 ff5c8ab7 2b7ce630 5e8dc5a1 66f5f388 88820462 '
        '6a33863c f3b2a55a 7de6e70e cbf3796a 4ec9599f f7d96159 cccd34d9 00775e00 e3119681 2359c716 '
        '927e891e ab5bfb95 7097d5dc 6520f06d 6a77430f 68c29ef1 5d38c670 efdf11ac 90013eec 6b48632a '
        'e18b4288 12ae1559 3eecfa33 ce19deab 1941fe67 9d43dbbb f4a47608 e38ff85e d0cf07ea 7e153a61 '
        'a1ac60e8 e3b0c442 36790ecd a4e00d7e a68b412c 1affb224'
    ),
    'aquila': (
        'e9f8c700 9528b048 e3b0c442 67e9c3ac 4c970004 b1585fdb a4e00d7e 5a39cadd dff17949 096500d4 '
        '191fa0d9 992e4d4d 6613d20f c4098463 d7c503ef 9f219e81 13106ae2 e2e47801 b29ab76d ed1695c8 '
        '8f81b1d9 2c2eef51 d461ffe8 6daf0309 81b3108e 0530a23a 801887d8 2c9adaad d88530e3 aabf36fe '
        '6d487567 dae99e44 ace301b1 7fac79ed 9400f1b2 beda66e7 22d28ce2 81ff30d2 8ddba97a 78ee8256 '
        '3dae656e 65bd2b31 8eaff293 ad696a20 34affd10 bc3dd185 d9822264 7f72e3bc f09422df cba6b6d4 '
        '7b0a75f0 ed4f3eb2 28607ac7 bd75bdc8 fee10f6b 596a2979 ee89a032 07d0ff92 be00e728 589f9fc6 '
        'eae8ccac e3b0c442 67e9c3ac 5a39cadd 108c995b 3d287969'
    ),
    'gpt-neox': (
        '1213a23d 8b6219aa e3b0c442 83f814f7 0d97c81f ddf2e99a 2811745d 38b2d03f 20ca9816 9087bff4 '
        'be9ba3e5 c39bb7e2 b392f99b 28adc68a 321b0656 55cebb36 98307d0e 3d9617c3 a7b1901d 4566110a '
        'd5885eca b47aaaaf d4b5008b 2a8f5beb a58fced8 c01e0fe2 13a03c46 28c14b5e 643ce413 221663ed '
        'fc1cf542 ae3c528d ef7d5fb4 224c5e5e f5ca38f7 31d8edb9 135b5402 bff072c7 5d6648ee 99bbd03b '
        '18ad7573 8a645f6d f3df8775 09facffa 3ed1375a 7e014a6c e8bb83a8 3b93fb88 fc321351 2ac465f8 '
        'dc6bca2b 2e3cd971 e9d0fa7c 4d10ed8c 5c6632d8 4abe066c b8004299 e29d43c6 35f2a9c3 50356cf5 '
        '22267c3c e3b0c442 83f814f7 38b2d03f 3ada92f2 ca02879b'
    ),
    'baichuan': (
        '3c06db23 0eb39bd8 e3b0c442 5205fa26 8a50b95c 93742fea 9089141d f62976cf 01251d9d 170d1c9a '
        '93aa973a aa9b9651 330928d7 30bf823a e742465c 6fe32780 9d5970fa 68cb1fc6 fd0e3985 8a5de8c8 '
        'c996e720 8956c0c1 e1d2ec7f d981ebd5 4702b9ab ffe59219 18948c3f 4f4de225 d6a9bb2d cf7fb8e3 '
        'e279c857 7003b1cb a88e2578 d1481317 ceede311 18195761 bed0a13b 8b188b0b c527e623 440c6de6 '
        '664c31c0 82598560 9a170153 3993252e 6654d43d 2272e8af 9009e434 28adaaa9 42951714 55b3a0a8 '
        'cfc4483b b4bd9689 cfb5dfc1 eecfcdaa 2b940b84 08c0592f 99fd8b6d ca16460b 01acaff7 76e2cc59 '
        '4b556ded 6b86b273 c2ebf7ae e05a2678 2ff734b3 09d81543'
    ),
}
RECORDED_BEHAVIOUR: dict[str, str] = {
    'a.x-4.0@gpt-2': '8788d9db64a20060',
    'bailingmoe@llama-bpe': '9e7b3de380fe677b',
    'bailingmoe2@llama-bpe': '9e7b3de380fe677b',
    'bloom@llama-bpe': '3bff488bf0dae39b',
    'chameleon@llama-bpe': '51e48d6c1cc76015',
    'chatglm-bpe@llama-bpe': '50993a73ced07aa4',
    'codeshell@starcoder': 'cf011d0a882aaea8',
    'command-r@starcoder': '575fb77f51a2cc71',
    'dbrx@llama-bpe': '50993a73ced07aa4',
    'deepseek-coder@deepseek-coder': '1fe01b9ea8b1492b',
    'deepseek-llm@deepseek-llm': '364ed6f414349171',
    'deepseek-r1-qwen@qwen2': '89985cb6c1d231b5',
    'deepseek-v3@llama-bpe': '8fb2ca5fe3188f94',
    'default@gpt-neox': '79af3661b1ab3376',
    'exaone@starcoder': 'cf011d0a882aaea8',
    'exaone-moe@llama-bpe': 'df4db8100c5aa987',
    'exaone4@gpt-2': '8788d9db64a20060',
    'f2llmv2@qwen2': '89985cb6c1d231b5',
    'falcon@falcon': 'f666ddf13979b8dd',
    'falcon-h1@llama-bpe': '8667b6cd8d28f7bf',
    'falcon3@llama-bpe': '8667b6cd8d28f7bf',
    'gemma4@gemma-4': '82471d58e02bfba9',
    'gigachat@gpt-2': '8788d9db64a20060',
    'glm4@llama-bpe': '50993a73ced07aa4',
    'glm5@llama-bpe': '50993a73ced07aa4',
    'gpt-2@gpt-2': '8788d9db64a20060',
    'gpt-4o@llama-bpe': '708607b52e0c6691',
    'gpt3-finnish@llama-bpe': '3bff488bf0dae39b',
    'granite-docling@gpt-2': '9615aaa15c57bced',
    'granite-embed-multi-311m@gemma-4': '82471d58e02bfba9',
    'granite-embed-multi-97m@llama-bpe': '708607b52e0c6691',
    'grok-2@qwen2': '89985cb6c1d231b5',
    'hunyuan@qwen2': '89985cb6c1d231b5',
    'hunyuan-dense@llama-bpe': '8fb2ca5fe3188f94',
    'hy_v4@llama-bpe': '8fb2ca5fe3188f94',
    'jais@gpt-2': '8788d9db64a20060',
    'jais-2@llama-bpe': '137f0c1ddaea1012',
    'jina-de@gpt-2': '8788d9db64a20060',
    'jina-es@gpt-2': '8788d9db64a20060',
    'jina-v1-en@gpt-2': '8788d9db64a20060',
    'jina-v2-code@gpt-2': '8788d9db64a20060',
    'jina-v2-de@gpt-2': '8788d9db64a20060',
    'jina-v2-es@gpt-2': '8788d9db64a20060',
    'jina-v5-nano@llama-bpe': '8667b6cd8d28f7bf',
    'joyai-llm@llama-bpe': '8fb2ca5fe3188f94',
    'kanana2@llama-bpe': '708607b52e0c6691',
    'kormo@qwen2': '89985cb6c1d231b5',
    'laguna@llama-bpe': '0fb22c35f79da30c',
    'lfm2@llama-bpe': '8667b6cd8d28f7bf',
    'llada-moe@llama-bpe': '9e7b3de380fe677b',
    'llama-bpe@llama-bpe': '8667b6cd8d28f7bf',
    'llama-v3@llama-bpe': '8667b6cd8d28f7bf',
    'llama3@llama-bpe': '8667b6cd8d28f7bf',
    'llama4@llama-bpe': '708607b52e0c6691',
    'megrez@qwen2': '9e9427d99c6e2f21',
    'mellum@gpt-2': '8788d9db64a20060',
    'mellum2@starcoder': 'cf011d0a882aaea8',
    'midm-2.0@llama-bpe': '8667b6cd8d28f7bf',
    'minerva-7b@starcoder': 'cf011d0a882aaea8',
    'minicpm5@llama-bpe': '50993a73ced07aa4',
    'minimax-m2@llama-bpe': '708607b52e0c6691',
    'modern-bert@gpt-2': '8788d9db64a20060',
    'mpt@gpt-2': '8788d9db64a20060',
    'olmo@gpt-2': '8788d9db64a20060',
    'phi-2@gpt-2': '8788d9db64a20060',
    'pixtral@llama-bpe': '8667b6cd8d28f7bf',
    'poro-chat@llama-bpe': '87df8f485b1b0332',
    'qwen2@qwen2': '89985cb6c1d231b5',
    'qwen35@qwen35': '4e0e064e251e2740',
    'refact@starcoder': 'cf011d0a882aaea8',
    'roberta-bpe@gpt-2': '8788d9db64a20060',
    'sarvam-moe@gemma-4': 'a645043f1b3a1ebe',
    'seed-coder@llama-bpe': 'a6c128744269eb3e',
    'smaug-bpe@llama-bpe': '50993a73ced07aa4',
    'smollm@starcoder': '575fb77f51a2cc71',
    'solar-open@qwen2': '89985cb6c1d231b5',
    'spark2_5@llama-bpe': '4ad6e57c7be29196',
    'stablelm2@qwen2': '9e9427d99c6e2f21',
    'starcoder@starcoder': 'cf011d0a882aaea8',
    'talkie@llama-bpe': '708607b52e0c6691',
    'tekken@llama-bpe': 'bc4a84e74595d61c',
    'trillion@gpt-2': '9615aaa15c57bced',
    'ufakzeka@llama-bpe': '9e7b3de380fe677b',
    'viking@llama-bpe': 'f64cfe5d897b31cc',
    'youtu@llama-bpe': '3345e1dc287d424f',
    'aquila': 'd5a06564bee3b12e',
    'baichuan': 'a73667e8c42b4511',
    'command-r': '7a48f7558e0ecc24',
    'deepseek-coder': '1fe01b9ea8b1492b',
    'deepseek-llm': '364ed6f414349171',
    'falcon': 'f666ddf13979b8dd',
    'gemma-4': '82471d58e02bfba9',
    'gpt-2': '8788d9db64a20060',
    'gpt-neox': '79af3661b1ab3376',
    'llama-bpe': '8667b6cd8d28f7bf',
    'llama-spm': '53f83e3367898991',
    'mpt': '2d1bd25d3abc08e4',
    'phi-3': '6ca6a8ac6e83c2fa',
    'qwen2': '89985cb6c1d231b5',
    'qwen35': '4e0e064e251e2740',
    'refact': '936822f4467895f5',
    'starcoder': 'cf011d0a882aaea8',
}
