"""Tokenizers built from GGUF metadata alone, reproducing llama.cpp's tokenization exactly.

    tok = load_tokenizer(metadata)          # metadata: dict from ramforge.gguf.reader.GGUFFile
    ids = tok.encode("Hello", add_special=True, parse_special=False)   # == llama_tokenize(...)
    text = tok.decode(ids)                                             # == llama_detokenize(...)

Supported: SPM ("llama", e.g. Llama 2, Gemma 3, Phi-3) and byte-level BPE ("gpt2") with the
pre-tokenizers listed in SUPPORTED_TOKENIZERS, plus Gemma 4's BPE ("gemma4").  Anything else is
refused with UnsupportedTokenizer rather than tokenized differently from llama.cpp.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable, Sequence

from ..errors import Unsupported
from .bpe import BPESegmenter, load_ranks
from .pretokenize import PRE_TYPES
from .spm import spm_segment
from .vocab import ATTR_CONTROL, KEY, TokenIdError, TokenizerInputError, TokenizerMetadataError, Vocab

__all__ = ["load_tokenizer", "Tokenizer", "StreamDecoder", "UnsupportedTokenizer", "TokenizerMetadataError",
           "TokenizerInputError", "TokenIdError", "SUPPORTED_TOKENIZERS"]


class UnsupportedTokenizer(Unsupported):
    """The GGUF's tokenizer.ggml.model / tokenizer.ggml.pre is one ramforge does not implement."""


# tokenizer.ggml.pre -> (pre-tokenizer type, flags) for BPE vocabularies, as llama.cpp sets them.
# The first group shares its expressions with llama.cpp's golden vocabularies; the second runs only
# through the general regex path and was checked against llama.cpp itself on golden vocabularies
# with the pre-tokenizer overridden (results recorded in tests/test_tokenizer_data.py).
# Not here (refused): kimi-k2, afmoe, tiny_aya/cohere2moe, superbpe (llama.cpp-specific splitters or
# empty-match expressions) and whitespace.
_NOCLEAN = {"clean_spaces": False}
_BPE_PRE: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("default", {}),
    **{p: ("llama3", {"ignore_merges": True, "add_bos": True}) for p in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")},
    "dbrx": ("llama3", {}),
    "smaug-bpe": ("llama3", {}),
    "chatglm-bpe": ("llama3", {"special_defaults": {"bos": None}}),
    "glm4": ("llama3", {"special_defaults": {"bos": None}, "ignore_merges": True}),
    "glm5": ("llama3", {"special_defaults": {"bos": None}, "ignore_merges": True}),
    "deepseek-llm": ("deepseek-llm", _NOCLEAN),
    "deepseek-coder": ("deepseek-coder", _NOCLEAN),
    "falcon": ("falcon", {}),
    **{p: ("gpt2", {}) for p in (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "mpt", "olmo", "jais", "exaone4")},
    **{p: ("gpt2", {"add_sep": True}) for p in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    "trillion": ("gpt2", _NOCLEAN),
    "granite-docling": ("gpt2", _NOCLEAN),
    **{p: ("starcoder", {}) for p in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2")},
    "command-r": ("starcoder", _NOCLEAN),
    "smollm": ("starcoder", _NOCLEAN),
    **{p: ("qwen2", _NOCLEAN) for p in (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "grok-2", "solar-open")},
    "stablelm2": ("qwen2", {}),
    "megrez": ("qwen2", {}),
    "qwen35": ("qwen35", _NOCLEAN),
    # gemma4_quirks: llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 forces add_bos and keeps newline runs whole
    "gemma4": ("gemma4", {"escape_whitespaces": True, "gemma4_quirks": True}),
    "granite-embed-multi-311m": ("gemma4", {"escape_whitespaces": True, "gemma4_quirks": True}),
    "sarvam-moe": ("gemma4", {"escape_whitespaces": True, "clean_spaces": False}),
    # expressions only the general regex path runs; checked against llama.cpp on real vocabularies
    # with the pre-tokenizer overridden (no llama.cpp goldens exist for them)
    "jais-2": ("jais2", {}),
    **{p: ("deepseek3", _NOCLEAN) for p in ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm")},
    "spark2_5": ("spark2_5", _NOCLEAN),
    "youtu": ("youtu", {"clean_spaces": False, "ignore_merges": True}),
    "poro-chat": ("bloom", _NOCLEAN),
    "bloom": ("bloom", {}),
    "gpt3-finnish": ("bloom", {}),
    "viking": ("viking", _NOCLEAN),
    "tekken": ("tekken", {"clean_spaces": False, "ignore_merges": True, "add_bos": True}),
    "chameleon": ("chameleon", {"clean_spaces": False, "add_bos": True}),
    **{p: ("gpt4o", _NOCLEAN) for p in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    "granite-embed-multi-97m": ("granite-emb-multi", {"clean_spaces": False, "ignore_merges": True}),
    **{p: ("bailingmoe", _NOCLEAN) for p in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "seed-coder": ("seed-coder", _NOCLEAN),
    "ufakzeka": ("ufakzeka", _NOCLEAN),
    "laguna": ("laguna", _NOCLEAN),
    "exaone-moe": ("exaone-moe", {}),
    "minicpm5": ("minicpm5", {"ignore_merges": True}),
}

SPM_MODEL = "llama"
WPM_MODEL = "bert"
SUPPORTED_TOKENIZERS: dict[str, list[str]] = {
    # SPM ignores tokenizer.ggml.pre (llama.cpp does too); any value is accepted
    "llama": ["*"],
    "gpt2": sorted(_BPE_PRE),
    "gemma4": ["gemma4"],
    "bert": ["*"],
}

_REFUSED_MODELS = {
    "t5": "Unigram (UGM)", "rwkv": "RWKV", "plamo2": "PLaMo-2",
    "hybriddna": "hybrid DNA BPE", "whitespace": "whitespace BPE", "no_vocab": "no vocabulary",
    "none": "no vocabulary", "test": "test",
}


def _supported_text() -> str:
    return ("supported: tokenizer.ggml.model 'llama' (SPM, any pre), 'bert' (WordPiece), 'gemma4', or 'gpt2' with "
            "tokenizer.ggml.pre in {" + ", ".join(sorted(_BPE_PRE)) + "}")


class Tokenizer:
    """A llama.cpp-exact tokenizer for one vocabulary."""

    def __init__(self, md: dict[str, Any]):
        model = md.get(KEY + "model")
        if model is None:
            raise TokenizerMetadataError(f"{KEY}model is missing; cannot tell which tokenizer the model uses")
        if not isinstance(model, str):
            raise TokenizerMetadataError(f"{KEY}model = {model!r}: expected a string")
        pre = md.get(KEY + "pre")
        if pre is not None and not isinstance(pre, str):
            raise TokenizerMetadataError(f"{KEY}pre = {pre!r}: expected a string")
        self.model = model
        self.pre_type: str | None = None   # pre-tokenizer expression set (BPE only)
        self._bpe: BPESegmenter | None = None

        if model == SPM_MODEL:
            self.kind = "spm"
            self.pre = pre or "default"
            opts = {"add_space_prefix": True, "add_bos": True, "add_eos": False, "clean_spaces": False,
                    "escape_whitespaces": True,
                    "special_defaults": {"bos": 1, "eos": 2, "unk": 0}}
            self.vocab = Vocab(md, "spm", opts)
            return

        if model in ("gpt2", "gemma4"):
            if model == "gemma4":
                pre = "gemma4"
            elif not pre:
                warnings.warn(f"{KEY}pre is missing; using the 'default' pre-tokenizer as llama.cpp does "
                              "(generation quality may be degraded; consider regenerating the GGUF)",
                              stacklevel=3)
                pre = "default"
            entry = _BPE_PRE.get(pre)
            if entry is None:
                raise UnsupportedTokenizer(
                    f"unsupported BPE pre-tokenizer {KEY}pre = {pre!r} (model {model!r}); {_supported_text()}")
            pre_type, flags = entry
            self.kind = "bpe"
            self.pre = pre
            self.pre_type = pre_type
            opts = {"add_space_prefix": False, "escape_whitespaces": False, "clean_spaces": True,
                    "add_bos": False, "add_eos": False,
                    "special_defaults": ({"bos": 11, "eos": 11} if model == "gpt2" else {})}
            quirks = bool(flags.get("gemma4_quirks"))
            for k, v in flags.items():
                if k == "special_defaults":
                    opts["special_defaults"] = {**opts["special_defaults"], **v}
                elif k != "gemma4_quirks":
                    opts[k] = v
            opts["force_add_bos"] = quirks
            ranks = load_ranks(md)
            self.vocab = Vocab(md, "bpe", opts)
            exprs, byte_encode = PRE_TYPES[pre_type]
            self._bpe = BPESegmenter(self.vocab, ranks, exprs, byte_encode, gemma4_newlines=quirks)
            return

        if model == WPM_MODEL:                         # WordPiece: tokenizer/wpm.py
            from .wpm import SPECIAL_DEFAULTS, WPMSegmenter
            self.kind, self.pre = "wpm", pre or "default"
            self.vocab = Vocab(md, "wpm", {"add_bos": True, "add_sep": True, "clean_spaces": True,
                                           "escape_whitespaces": True, "special_defaults": SPECIAL_DEFAULTS})
            self._wpm = WPMSegmenter(self.vocab)
            return

        what = _REFUSED_MODELS.get(model)
        kind = f"{what} tokenizer" if what else "tokenizer"
        raise UnsupportedTokenizer(
            f"unsupported {kind} {KEY}model = {model!r}" + (f" (pre {pre!r})" if pre else "") + f"; {_supported_text()}")

    # ------------------------------------------------------------------ encode
    def encode(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, exactly as llama_tokenize(vocab, text, add_special, parse_special)."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "surrogateescape")
        v = self.vocab
        out: list[int] = []
        frags = v.partition(text, parse_special)
        if self.kind == "wpm":                          # [CLS] words [SEP], whatever add_bos says
            if add_special:
                out.append(v.special["bos"])
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                else:
                    self._wpm.segment(frag, out)
            if add_special:
                out.append(v.special["sep"])
            return [t for t in out if t is not None]
        if self.kind == "spm":
            bos = v.special["bos"]
            if add_special and v.add_bos:
                if bos is None:
                    raise TokenizerMetadataError("add_bos is set but the vocabulary has no BOS token")
                out.append(bos)
            prev_special = True
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                    prev_special = True
                    continue
                if v.add_space_prefix and prev_special:
                    frag = " " + frag
                spm_segment(v, frag.replace(" ", "\u2581"), out)
                prev_special = False
        else:
            if add_special and v.add_bos:
                if v.special["bos"] is None:
                    raise TokenizerMetadataError("add_bos is set but the vocabulary has no BOS token")
                out.append(v.special["bos"])
            seg = self._bpe
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                    continue
                if v.escape_whitespaces:
                    frag = frag.replace(" ", "\u2581")
                seg.segment(frag, out)
        if add_special and v.add_eos:
            if v.special["eos"] is None:
                raise TokenizerMetadataError("add_eos is set but the vocabulary has no EOS token")
            out.append(v.special["eos"])
        return out

    # ------------------------------------------------------------------ decode
    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """Bytes of one token (llama_token_to_piece, lstrip 0). Control tokens are b'' unless special."""
        return self.vocab.token_to_piece(int(token_id), special)

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        """Pieces concatenated with no clean-up: what a streaming caller prints token by token."""
        tp = self.vocab.token_to_piece
        return b"".join(tp(int(t), special) for t in ids)

    def detokenize_bytes(self, ids: Sequence[int], special: bool = False, remove_special: bool = False) -> bytes:
        """llama_detokenize(ids, remove_special, unparse_special=special) as raw bytes."""
        return self.vocab.detokenize([int(t) for t in ids], remove_special, special)

    def decode(self, ids: Sequence[int], special: bool = False, remove_special: bool = False) -> str:
        """llama_detokenize as text; invalid UTF-8 (a split multi-byte character) becomes U+FFFD."""
        return self.detokenize_bytes(ids, special, remove_special).decode("utf-8", "replace")

    detokenize = decode

    def stream(self, special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, special)

    # ------------------------------------------------------------------ properties
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def eom_id(self) -> int | None:
        return self.vocab.special["eom"]

    @property
    def unk_id(self) -> int | None:
        return self.vocab.special["unk"]

    @property
    def pad_id(self) -> int | None:
        return self.vocab.special["pad"]

    @property
    def sep_id(self) -> int | None:
        return self.vocab.special["sep"]

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def is_control(self, token_id: int) -> bool:
        return bool(self.vocab.attrs[token_id] & ATTR_CONTROL)

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary entry (e.g. '▁Hello', 'Ġworld', '<0x0A>')."""
        return self.vocab.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        return self.vocab.token_to_id.get(text)

    def describe(self) -> str:
        pre = f", pre {self.pre!r}" if self.kind == "bpe" else ""
        return f"{self.kind.upper()} tokenizer (model {self.model!r}{pre}), {self.n_vocab} tokens"

    def __repr__(self) -> str:
        return f"<Tokenizer {self.describe()}>"


class StreamDecoder:
    """Incremental detokenizer: feed token ids, get text as soon as it is complete UTF-8."""

    def __init__(self, tok: Tokenizer, special: bool = False):
        self._tok = tok
        self._special = special
        self._buf = b""

    def feed(self, token_id: int) -> str:
        self._buf += self._tok.token_to_piece(token_id, self._special)
        buf = self._buf
        # keep an incomplete trailing sequence (at most 3 bytes) for the next token
        cut = len(buf)
        for k in range(1, min(4, len(buf)) + 1):
            b = buf[-k]
            if b & 0xC0 == 0x80:
                continue   # continuation byte, look further back
            if b >= 0xC0:
                need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
                if need > k:
                    cut = len(buf) - k
            break
        text, self._buf = buf[:cut], buf[cut:]
        return text.decode("utf-8", "replace")

    def flush(self) -> str:
        text, self._buf = self._buf, b""
        return text.decode("utf-8", "replace")


def load_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """Build the tokenizer described by a GGUF's metadata (see module docstring)."""
    if not isinstance(metadata, dict):
        raise TokenizerMetadataError(f"metadata must be a dict, got {type(metadata).__name__}")
    return Tokenizer(metadata)
