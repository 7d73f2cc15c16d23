"""A model's hidden states for embeddings (Engine.hidden, Engine.hidden_batch), as llama.cpp's t_embd.

One sequence from position 0 (`hidden`), or several in one llama_decode (`hidden_batch`): an encoder's
in one pass without a KV cache (each token seeing its own sequence, Engine.seq_bounds read by the
architecture), a causal model's as llama.cpp computes a batch of sequences in its unified KV cache after
a clear (kv_unified = true: llama-cpp-python's embed()): the tokens in cells 0..n-1 in batch order, each
seeing its own sequence's earlier cells (kv.cells.PackedPlacement), one ubatch computed in chunks, each
chunk a pass over the weights, as rows of the whole ubatch (kernels.batch), so any chunk gives the same
vectors. The chunk is stream.embed_plan.pass_chunk's: on an engine that streams its weights (a model
loaded to generate, whose plan's prompt chunk is 64 tokens) as big as the budget left allows, its
activations allocated and charged for the batch and given back after it (`_chunk_state`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .. import cancel
from ..errors import ContextLengthExceeded, EmptyPrompt, NotReproduced, check_token_ids
from ..kernels.batch import Batch
from ..kv.cache import KVCache
from ..kv.cells import PackedPlacement
from ..stream.embed_plan import pass_chunk
from .state import State
from .ubatch import chunks


@dataclass(frozen=True)
class PackedPass:
    """What the last hidden_batch computed (Engine.last_pack): its tokens and the chunk (the most tokens
    a pass over the weights takes; an encoder's: its whole pass)."""

    tokens: int
    chunk: int

    @property
    def passes(self) -> int:
        return -(-self.tokens // self.chunk)


def hidden(eng, tokens) -> np.ndarray:
    """One sequence's final hidden states f32[n, n_embd] (t_embd, every token an output), from
    position 0 (the cache reset first), as one llama_decode of it computes them. An encoder
    (non-causal attention) takes the sequence in one pass, as llama.cpp's encoder takes one ubatch."""
    if not eng.causal:
        return hidden_batch(eng, [tokens])[0]                # checks and resets there
    if eng.kv.celled and eng.kv.n_seq > 1:                   # (before the reset: it would free sequence 0's cells)
        raise NotReproduced(f"a causal model's embeddings take the KV cache of one sequence, and this engine's holds "
                            f"{eng.kv.n_seq} parallel sequences (serve --parallel), whose generations share it; "
                            f"embed with a server or Model of one sequence")
    toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if toks.size == 0:
        raise EmptyPrompt("an embedding needs at least one token")
    check_token_ids(toks, eng.hp.n_vocab)
    eng.reset()
    return eng.eval(toks, all_logits=True, aligned=True, outputs_all=True, embd=True)


def can_pack(layers: tuple[int, int] | None, n_layer: int, n_seq: int, spilled: bool) -> bool:
    """The one rule of which engines pack a causal model's sequences (packs_causal), and load with the
    embedding plan (Engine.load(embed=True)): the whole model, one sequence, the KV cache in RAM (a
    spilled cache, parallel sequences or a layer range evaluate one at a time)."""
    return layers in (None, (0, n_layer)) and n_seq == 1 and not spilled


def packs_causal(eng) -> bool:
    """Whether hidden_batch can pack a causal model's sequences (can_pack, the cache not in KV cells)."""
    return (isinstance(eng.kv, KVCache) and not eng.kv.celled
            and can_pack(eng.layers, eng.hp.n_layer, eng.kv.n_seq, spilled=False))


def hidden_batch(eng, seqs) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states of several sequences in one llama_decode, each from position 0, each token
    attending to its own sequence only: the token lists packed in order. An encoder takes them in
    one pass (llama.cpp's n_ubatch >= n_tokens, no KV cache). A causal model takes them as llama.cpp
    does in its unified KV cache after a clear (llama-cpp-python's embed): cells 0..n-1 in batch
    order, a causal mask per sequence (kv.cells.PackedPlacement), one ubatch computed in chunks of
    plan.batch rows (each a pass over the weights). Returns (f32[n, n_embd], bounds i64[n_seq, 2]:
    each sequence's rows [a, b))."""
    lists = [np.asarray(t, dtype=np.int64).reshape(-1) for t in seqs]
    if not lists or any(t.size == 0 for t in lists):
        raise EmptyPrompt("an embedding needs at least one token in each sequence")
    toks = np.concatenate(lists)
    check_token_ids(toks, eng.hp.n_vocab)
    cap = min(eng.ubatch if eng.causal else eng.plan.batch, eng.n_ctx)
    if toks.size > cap:
        raise ContextLengthExceeded(f"{toks.size} tokens do not fit one {'ubatch' if eng.causal else 'encoder pass'}"
                                    f" of {cap} (llama.cpp's n_ubatch, the context)")
    ends = np.cumsum([t.size for t in lists])
    bounds = np.stack([ends - [t.size for t in lists], ends], axis=1).astype(np.int64)
    n = int(toks.size)
    if eng.causal:
        return _hidden_packed(eng, toks, bounds), bounds
    eng.last_pack = PackedPass(n, eng.plan.batch)
    eng.reset()
    eng.seq_bounds = bounds
    try:
        return eng._pass(n, lambda x: eng.arch.embed(eng, x, toks), slice(0, n), Batch(n, 0), embd=True), bounds
    finally:
        eng.seq_bounds = None
        eng.reset()


def _hidden_packed(eng, toks: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The packed causal batch's t_embd f32[n, n_embd] (hidden_batch); the cache reset before and after."""
    if not packs_causal(eng):
        raise NotReproduced("this engine's KV cache (spilled, parallel sequences, or a layer range) evaluates "
                            "a causal model's sequences one at a time (hidden)")
    n, kv = int(toks.size), eng.kv
    eng.reset()
    pl = PackedPlacement.of(bounds, single=n == 1)
    out = []
    with eng._kv_room(n), _chunk_state(eng, n) as B:
        eng.last_pack = PackedPass(n, B)
        try:
            for c in chunks(n, 0, B, eng.ubatch, all_logits=True, aligned=True, outputs_all=True):
                cancel.check()
                kv.ub = pl.part(c.start, c.stop)
                try:
                    out.append(eng.run_chunk(toks[c.start:c.stop], c, embd=True))
                finally:
                    kv.ub = None
        finally:
            eng.reset()
    return np.concatenate(out)


@contextmanager
def _chunk_state(eng, n: int):
    """The chunk of a packed batch of n tokens (stream.embed_plan.pass_chunk, from the budget left once
    the batch's KV cells are charged); a chunk bigger than the plan's gets activations of its own, charged
    to the budget, in place of the engine's run state until the batch ends (then released)."""
    pc = pass_chunk(eng.hp, eng.plan, n, eng.budget.available, eng.ubatch)
    if pc.batch == eng.plan.batch:
        yield pc.batch
        return
    charge = eng.budget.charge("embedding activations", pc.extra_bytes)
    own, eng.state = eng.state, None
    try:
        eng.state = State.allocate(eng.hp, pc.rows)
        yield pc.batch
    finally:
        eng.state = own
        charge.release()
