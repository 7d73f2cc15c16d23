"""Vocabulary built from GGUF metadata: token table, attributes, special ids, end-of-generation set,
special-token partitioning, token_to_piece and detokenize -- the parts of llama.cpp's llama_vocab
that do not depend on the segmentation algorithm (SPM or BPE)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ModelFileError, TokenIdError, TokenizerInputError, check_token_ids  # noqa: F401

# token attributes (llama_token_attr)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

# GGUF token_type value -> attribute
_TYPE_TO_ATTR = {0: ATTR_UNDEFINED, 1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL,
                 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED, 6: ATTR_BYTE}

KEY = "tokenizer.ggml."
_ASCII_SPACE = " \t\n\v\f\r"   # C isspace() in the "C" locale

# candidates llama.cpp recognises by text (llama-vocab.cpp, "auto-detect special tokens")
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")
_ALWAYS_RENDER = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# special id fields in the order llama.cpp reads them: (field, metadata key suffix)
_SPECIAL_KEYS = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
    ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"),
    ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"),
)


class TokenizerMetadataError(ModelFileError, ValueError):
    """The tokenizer.* metadata is missing, mistyped or inconsistent."""


def _int_array(md: dict, key: str, n: int, what: str) -> np.ndarray | None:
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        arr = v
    elif isinstance(v, (list, tuple)):
        try:
            arr = np.asarray(v)
        except Exception as e:  # pragma: no cover - defensive
            raise TokenizerMetadataError(f"{key}: cannot read as an array of {what}: {e}") from None
    else:
        raise TokenizerMetadataError(f"{key} is a {type(v).__name__}, expected an array of {what}")
    if arr.ndim != 1:
        raise TokenizerMetadataError(f"{key} has shape {arr.shape}, expected a 1-D array of {what}")
    if len(arr) != n:
        raise TokenizerMetadataError(
            f"{key} has {len(arr)} entries but tokenizer.ggml.tokens has {n}; they must be the same length")
    return arr


def _flag(md: dict, key: str) -> bool | None:
    v = md.get(KEY + key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and int(v) in (0, 1):
        return bool(v)
    raise TokenizerMetadataError(f"{KEY}{key} = {v!r}: expected a bool")


class Vocab:
    """Token table plus everything llama.cpp derives from it at load time.

    `kind` is "spm" or "bpe"; `opts` carries the per-pre-tokenizer flags already resolved by the
    caller (add_bos, ignore_merges, clean_spaces, escape_whitespaces, special-id defaults...).
    """

    def __init__(self, md: dict[str, Any], kind: str, opts: dict[str, Any]):
        self.kind = kind
        tokens = md.get(KEY + "tokens")
        if tokens is None:
            raise TokenizerMetadataError(f"{KEY}tokens is missing: the GGUF has no vocabulary")
        if not isinstance(tokens, (list, tuple)) or (len(tokens) and not isinstance(tokens[0], str)):
            raise TokenizerMetadataError(f"{KEY}tokens must be an array of strings, got {type(tokens).__name__}")
        n = len(tokens)
        if n == 0:
            raise TokenizerMetadataError(f"{KEY}tokens is empty")
        tokens = list(tokens)
        if set(map(type, tokens)) != {str}:
            i = next(i for i, t in enumerate(tokens) if type(t) is not str)
            raise TokenizerMetadataError(f"{KEY}tokens[{i}] is a {type(tokens[i]).__name__}, expected a string")
        if not all(tokens):
            for i, t in enumerate(tokens):
                if not t:
                    tokens[i] = f"[EMPTY_{i}]"   # as llama.cpp names empty entries
        self.tokens: list[str] = tokens
        self.n_vocab = n

        scores = _int_array(md, KEY + "scores", n, "float32 scores")
        if scores is not None and scores.dtype.kind not in "fiu":
            raise TokenizerMetadataError(f"{KEY}scores has dtype {scores.dtype}, expected float32 or int32")
        self.scores: list[float] = scores.astype(np.float32).tolist() if scores is not None else [0.0] * n

        ttype = _int_array(md, KEY + "token_type", n, "int32 token types")
        if ttype is not None:
            if ttype.dtype.kind not in "iu":
                raise TokenizerMetadataError(f"{KEY}token_type has dtype {ttype.dtype}, expected int32")
            lut = np.zeros(8, dtype=np.int32)
            for t, a in _TYPE_TO_ATTR.items():
                lut[t] = a
            tt = ttype.astype(np.int64)
            attrs = np.where((tt >= 0) & (tt < 8), lut[np.clip(tt, 0, 7)], ATTR_UNDEFINED).astype(np.int32)
        else:
            attrs = np.full(n, ATTR_NORMAL, np.int32)
        self.attrs = attrs              # i32[n] through the derivations below, then a list[int]

        self.token_to_id: dict[str, int] = dict(zip(tokens, range(n)))
        if len(self.token_to_id) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise TokenizerMetadataError(
                        f"{KEY}tokens has duplicate entry {t!r} at ids {seen[t]} and {i}; llama.cpp refuses such a vocabulary")
                seen[t] = i

        # flags
        self.add_space_prefix = bool(opts.get("add_space_prefix", False))
        self.add_bos = bool(opts.get("add_bos", False))
        self.add_eos = bool(opts.get("add_eos", False))
        self.add_sep = bool(opts.get("add_sep", False))
        self.ignore_merges = bool(opts.get("ignore_merges", False))
        self.clean_spaces = bool(opts.get("clean_spaces", False))
        self.escape_whitespaces = bool(opts.get("escape_whitespaces", True))
        v = _flag(md, "add_space_prefix")
        if v is not None:
            self.add_space_prefix = v
        v = _flag(md, "remove_extra_whitespaces")
        self.remove_extra_whitespaces = bool(v) if v is not None else False

        self._load_special_ids(md, opts)
        self._detect_special_tokens()
        self._build_special_cache()
        self._apply_name_attrs(md)
        self.attrs: list[int] = attrs.tolist()
        self._piece_cache: dict[int, bytes] = {}
        self._partition_lists: tuple[list, list] | None = None
        self._byte_tokens: list[int | None] | None = None

    # ------------------------------------------------------------------ load-time derivations
    def _load_special_ids(self, md: dict, opts: dict) -> None:
        n = self.n_vocab
        ids = dict.fromkeys(("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
                             "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"), None)
        ids.update(opts.get("special_defaults", {}))
        for field, key in _SPECIAL_KEYS:
            cur = ids[field]
            if cur is not None and cur >= n:
                ids[field] = cur = None          # default out of vocab range: disabled
            v = md.get(KEY + key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TokenizerMetadataError(f"{KEY}{key} = {v!r}: expected an unsigned integer token id")
            v = int(v)
            if 0 <= v < n:
                ids[field] = v                   # else: bad id, llama.cpp keeps the default
        self.special = ids

        for key, attr in (("add_bos_token", "add_bos"), ("add_eos_token", "add_eos"), ("add_sep_token", "add_sep")):
            v = _flag(md, key)
            if v is not None:
                setattr(self, attr, v)
        if opts.get("force_add_bos"):
            self.add_bos = True

    def _force_control(self, tid: int) -> None:
        self.attrs[tid] |= ATTR_CONTROL

    def _find_text(self, texts: Sequence[str]) -> int | None:
        # llama.cpp takes the first match in unordered_map order, which is not reproducible; we take
        # the highest id (this agrees with llama.cpp on Llama 3 and Qwen2 vocabularies).
        found = [self.token_to_id[t] for t in texts if t in self.token_to_id]
        return max(found) if found else None

    def _detect_special_tokens(self) -> None:
        sp, t2i, attrs, tokens = self.special, self.token_to_id, self.attrs, self.tokens
        if sp["eot"] is None:
            sp["eot"] = self._find_text(_EOT_TEXTS)
            if sp["eot"] is not None:
                self._force_control(sp["eot"])
        if sp["eom"] is None:
            sp["eom"] = self._find_text(_EOM_TEXTS)
            if sp["eom"] is not None:
                self._force_control(sp["eom"])
        for field, texts in _FIM_TEXTS.items():
            if sp[field] is None:
                sp[field] = self._find_text(texts)
                if sp[field] is not None:
                    self._force_control(sp[field])

        # control tokens whose text says "unused" are unused
        for tid in np.flatnonzero((attrs & (ATTR_CONTROL | ATTR_UNUSED)) == ATTR_CONTROL).tolist():
            if "unused" in tokens[tid]:
                attrs[tid] |= ATTR_UNUSED

        eog: set[int] = set()
        for field in ("fim_pad", "fim_rep", "fim_sep"):
            if sp[field] is not None:
                eog.add(sp[field])
        for t in _EOG_TEXTS:
            tid = t2i.get(t)
            if tid is not None:
                eog.add(tid)
                self._force_control(tid)
        for t in _ALWAYS_RENDER:
            tid = t2i.get(t)
            if tid is not None:
                attrs[tid] = ATTR_USER_DEFINED
        for field in ("eos", "eot", "eom"):
            if sp[field] is not None:
                eog.add(sp[field])

        texts = {tokens[t]: t for t in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
            end_id = texts["<|end|>"]
            eog.discard(end_id)
            attrs[end_id] = ATTR_USER_DEFINED
        texts = {tokens[t]: t for t in eog}
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            s_id = texts["</s>"]
            eog.discard(s_id)
            attrs[s_id] = ATTR_NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _build_special_cache(self) -> None:
        mask = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
        ids = np.flatnonzero(self.attrs & mask).tolist()
        # llama.cpp sorts by byte length, longest first (std::sort, so the order of equal lengths is
        # unspecified there; we keep ascending ids)
        ids.sort(key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogateescape")))
        self.special_cache: list[int] = ids

    def _apply_name_attrs(self, md: dict) -> None:
        # only string values count: a GGUF may carry any type under these keys (an array's truth value
        # would raise ValueError)
        pre, arch, name = (v if isinstance(v, str) else ""
                           for v in (md.get(KEY + "pre"), md.get("general.architecture"), md.get("general.name")))
        name = "".join(c.lower() if c < "\x80" else c for c in name)
        t2i, attrs = self.token_to_id, self.attrs
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in t2i:
                attrs[t2i["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for tid in self.special_cache:
                attrs[tid] |= ATTR_RSTRIP
            if "</s>" in t2i:
                attrs[t2i["</s>"]] |= ATTR_RSTRIP
            for t in ("<unk>", "<s>", "<|endoftext|>"):
                if t in t2i:
                    attrs[t2i[t]] &= ~ATTR_RSTRIP
        elif "modern-bert" in name:
            if "[MASK]" in t2i:
                attrs[t2i["[MASK]"]] |= ATTR_LSTRIP

    # ------------------------------------------------------------------ partitioning
    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split raw text around special tokens (llama.cpp tokenizer_st_partition).

        Returns raw-text fragments (str) and special token ids (int), in order.  User-defined
        tokens are always matched; control and unknown tokens only with parse_special.
        """
        if not text:
            return []
        if self._partition_lists is None:
            every = [(tid, self.tokens[tid], self.attrs[tid]) for tid in self.special_cache]
            self._partition_lists = (every, [e for e in every if not e[2] & (ATTR_CONTROL | ATTR_UNKNOWN)])
        frags: list[str | int] = [text]
        for tid, tt, attr in self._partition_lists[0 if parse_special else 1]:
            if tt not in text:
                continue
            new: list[str | int] = []
            for frag in frags:
                if type(frag) is int or tt not in frag:
                    new.append(frag)
                    continue
                _split_fragment(frag, tt, tid, attr, new)
            frags = new
        return frags

    # ------------------------------------------------------------------ pieces
    def byte_to_token(self, b: int) -> int:
        if self._byte_tokens is None:
            self._byte_tokens = [self._byte_token_lookup(i) for i in range(256)]
        tid = self._byte_tokens[b]
        if tid is None:
            raise TokenizerMetadataError(
                f"the vocabulary has no token for byte 0x{b:02X} (neither <0x{b:02X}> nor the raw byte); "
                "llama.cpp fails on this input too")
        return tid

    def _byte_token_lookup(self, b: int) -> int | None:
        t2i = self.token_to_id
        raw = chr(b) if b < 0x80 else chr(0xDC00 + b)   # a lone byte >= 0x80, as surrogateescape reads it
        if self.kind == "spm":
            tid = t2i.get(f"<0x{b:02X}>")
            return tid if tid is not None else t2i.get(raw)
        from .unidata import BYTE_TO_UNICODE
        return t2i.get(BYTE_TO_UNICODE[b])

    def token_to_piece(self, tid: int, special: bool = False) -> bytes:
        """The bytes a token renders to (llama_token_to_piece with lstrip=0)."""
        check_token_ids((tid,), self.n_vocab)
        attr = self.attrs[tid]
        if not special and attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        p = self._piece_cache.get(tid)
        if p is None:
            p = self._piece_cache[tid] = self._render(tid, attr)
        return p

    def _render(self, tid: int, attr: int) -> bytes:
        text = self.tokens[tid]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & ATTR_NORMAL:
            if self.kind == "spm" or self.escape_whitespaces:
                return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
            return _decode_byte_level(text)
        if attr & ATTR_BYTE:
            return bytes([_strtol16(text[3:5]) & 0xFF])   # "<0xHH>"
        return b""

    def detokenize(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """llama_detokenize: pieces joined, leading space of an SPM prompt removed, spaces cleaned."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        bos, eos = self.special["bos"], self.special["eos"]
        if remove_special and self.add_bos and ids and ids[0] == bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == eos:
            ids = ids[:-1]
        out = bytearray()
        for tid in ids:
            piece = self.token_to_piece(tid, unparse_special)
            if remove_space and piece[:1] == b" ":
                piece = piece[1:]
            remove_space = False
            out += piece
        if self.clean_spaces:
            _clean_spaces(out)
        return bytes(out)


def _split_fragment(s: str, tt: str, tid: int, attr: int, out: list) -> None:
    base, end, n = 0, len(s), len(tt)
    while True:
        m = s.find(tt, base, end)
        if m < 0:
            if base < end:
                out.append(s[base:end])
            return
        left = m
        if attr & ATTR_LSTRIP:
            while left > base and s[left - 1] in _ASCII_SPACE:
                left -= 1
        if left > base:
            out.append(s[base:left])
        out.append(tid)
        r = m + n
        if r >= end:
            return
        if attr & ATTR_RSTRIP:
            while r < end and s[r] in _ASCII_SPACE:
                r += 1
        base = r


def _strtol16(s: str) -> int:
    """C strtol(s, NULL, 16): leading space, sign, optional 0x, then the longest run of hex digits."""
    s = s.lstrip(" \t\n\v\f\r")
    neg = s[:1] == "-"
    if s[:1] in "+-" and s:
        s = s[1:]
    if s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        s = s[2:]
    n = 0
    for c in s:
        if c not in "0123456789abcdefABCDEF":
            break
        n = n * 16 + int(c, 16)
    return -n if neg else n


def _decode_byte_level(text: str) -> bytes:
    from .unidata import UNICODE_TO_BYTE
    out = bytearray()
    for c in text:
        b = UNICODE_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            u = c.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + u.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


def _clean_spaces(t: bytearray) -> None:
    """llama.cpp's three clean-up passes, in place (byte-for-byte the same index arithmetic)."""
    sp, ap = 0x20, 0x27
    # pass 1: " ?", " !", " .", " ," lose the space
    total1 = len(t)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == sp and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    del t[total:]
    # pass 2: " ' " becomes "'"
    total2 = len(t)
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = t[i]
        if x == ap and i + 1 < total2 and t[i - 1] == sp and t[i + 1] == sp:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    del t[total:]
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    total3 = len(t)
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"td":                 # " 't", " 'd" keep the space
                pass
            elif x1 in b"sm":               # " 's", " 'm"
                total -= 1
            elif i + 2 < total3:
                x2 = t[i + 2]
                if x2 == 0x65 and x1 in b"rv":  # " 're", " 've"; " 'll" keeps the space
                    total -= 1
        t[total] = x
        total += 1
    del t[total:]
