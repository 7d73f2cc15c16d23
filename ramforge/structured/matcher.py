"""Token masks from llguidance, for a grammar as llama.cpp's grammar sampler applies it.

llama.cpp's rules (llama_grammar_apply_impl), reproduced through the tokenizer llguidance is given:
a token's text is its piece with special tokens rendered (`token_to_piece(id, special=True)`), so a
control token whose text fits the grammar is allowed, as there; a token with an empty piece (or one
starting with a NUL byte) never is; the end-of-generation tokens are allowed only where the grammar
may end, and then they are marked special so that no text matches them.

`Grammar` is the compiled grammar (shared, immutable); `GrammarState` one generation's matcher:
`mask()` the allowed tokens as a bool array, `accept(token)` advances it.

llguidance compiles a grammar recursively along its rules (about 3 KiB of native stack per rule of a
chain: a chain of ~2,700 rules overflows a thread's 8 MiB stack and kills the process), so the
compilations run on a thread of their own with a 256 MiB stack (`_on_big_stack`; untouched stack
pages cost nothing); gbnf.MAX_RULES bounds the rules well within it.
"""
from __future__ import annotations

import threading
import weakref

import numba
import numpy as np

from .. import cancel
from ..errors import GrammarError, MissingExtra

_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
BIG_STACK = 256 << 20
_STACK_LOCK = threading.Lock()


def _on_big_stack(fn, *args):
    """fn(*args) on a new thread with a BIG_STACK stack (waited for); its result, or its exception."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    with _STACK_LOCK:                     # threading.stack_size is process-wide: set it only around start()
        old = threading.stack_size(BIG_STACK)
        try:
            t = threading.Thread(target=run, name="ramforge-grammar", daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a dependency
        raise MissingExtra("grammars and JSON schemas need llguidance: pip install llguidance") from None
    return llguidance


class _Vocab:
    """What llguidance's TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tok):
        n = tok.n_vocab
        eog = sorted(tok.eog_ids)
        self.eos_token_id = eog[0] if eog else (tok.eos_id if tok.eos_id is not None else 0)
        self.bos_token_id = tok.bos_id
        pieces = []
        for i in range(n):
            if i in tok.eog_ids:
                pieces.append(b"\xff<eog" + str(i).encode() + b">")    # special: matched by no text
                continue
            p = tok.token_to_piece(i, special=True)
            pieces.append(b"" if not p or p[0] == 0 else p)
        self.tokens = pieces
        self.special_token_ids = list(eog)
        self.eog = eog
        self._tok = tok

    def __call__(self, s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s, add_special=False, parse_special=False)


def lltokenizer(tok):
    """llguidance's LLTokenizer for a ramforge Tokenizer (built once per tokenizer, ~1 s)."""
    with _LOCK:
        lt = _TOKENIZERS.get(tok)
        if lt is None:
            g = _llguidance()
            v = _Vocab(tok)
            lt = g.LLTokenizer(g.TokenizerWrapper(v), n_vocab=tok.n_vocab, eos_token=v.eog or None)
            _TOKENIZERS[tok] = lt
        return lt


@numba.njit(nogil=True, cache=False)
def _apply_bits(logits, words):
    """-inf at every token whose bit in `words` (llguidance's bitmask, 32 tokens a word) is 0."""
    n = logits.size
    for b in range(words.size):
        m = words[b]
        if m == 0xFFFFFFFF:
            continue
        base = b * 32
        for j in range(min(32, n - base)):
            if not (m >> j) & 1:
                logits[base + j] = -np.inf


class Grammar:
    """A GBNF grammar compiled for one tokenizer. `gbnf`: the text (llama.cpp's dialect)."""

    def __init__(self, gbnf: str, tokenizer):
        from .gbnf import parse
        from .lark import to_lark

        self.gbnf = gbnf
        rules = parse(gbnf)
        cancel.check()                  # compiled under the model lock: a gone client stops between phases
        self.lark = to_lark(rules)
        cancel.check()
        g = _llguidance()
        self.tokenizer, self.n_vocab = tokenizer, tokenizer.n_vocab
        self._lltok = lltokenizer(tokenizer)
        try:
            self._spec = g.LLMatcher.grammar_from_lark(self.lark)
        except ValueError as e:
            raise GrammarError(f"the grammar could not be compiled: {e}") from None
        cancel.check()
        bad, msgs = _on_big_stack(g.LLMatcher.validate_grammar_with_warnings, self._spec, self._lltok)
        if bad:
            raise GrammarError(f"the grammar could not be compiled: {'; '.join(msgs)}")

    def state(self) -> "GrammarState":
        return GrammarState(self)


class GrammarState:
    """One generation's position in the grammar."""

    def __init__(self, grammar: Grammar):
        g = _llguidance()
        self.grammar = grammar
        self._m = _on_big_stack(lambda: g.LLMatcher(grammar._lltok, grammar._spec, log_level=0))
        if self._m.is_error():
            raise GrammarError(f"the grammar could not be compiled: {self._m.get_error()}")
        n = grammar.n_vocab
        self._words = np.zeros((n + 31) // 32, dtype=np.uint32)
        self._ptr = self._words.ctypes.data

    def mask(self) -> np.ndarray:
        """bool[n_vocab]: the tokens the grammar allows next."""
        self._m.unsafe_compute_mask_ptr(self._ptr, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        return bits[:self.grammar.n_vocab].view(np.bool_)

    def apply(self, logits: np.ndarray) -> bool:
        """Set the logits of the tokens the grammar does not allow next to -inf, in place (float32,
        n_vocab); False when it allows none."""
        self._m.unsafe_compute_mask_ptr(self._ptr, self._words.nbytes)
        _apply_bits(logits, self._words)
        return bool(self._words.any())

    def accept(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise GrammarError(f"token {token} does not fit the grammar: {self._m.get_error()}")

    def reset(self) -> None:
        self._m.reset()

    @property
    def done(self) -> bool:
        """The grammar cannot continue (only an end-of-generation token is allowed)."""
        return self._m.is_stopped()
