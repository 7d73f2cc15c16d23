"""The engine: a model file, its weights, KV cache and run state under one memory budget.

Python orchestrates (chunks of tokens, layers, sampling); the @njit kernels compute.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import (BudgetTooSmall, ContextLengthExceeded, EmptyPrompt, InexactWarning, InvalidArgument,
                      NotReproduced, Unsupported, check_token_ids)
from ..gguf.constants import Keys
from ..gguf.reader import GGUFFile
from ..jit import Stopwatch, prepare_in_background
from ..kernels.batch import Batch
from ..kernels.ops import rms_norm, softcap
from ..memory import MemoryBudget
from ..kv.cells import kv_rows
from ..kv.cache import KVCache
from ..stream.kv_spill import SpilledKVCache, spill_dir, spill_mode
from .. import cancel
from . import embedding, parallel
from ..models import arch_of
from ..models.arch import Arch
from ..models.config import HParams
from ..stream.embed_plan import embed_plan
from ..stream.plan import UBATCH, Plan, n_vocab_of, plan_for_budget
from ..profiling import KERNELS, PROFILE, PassRecord
from .checks import _refuse_unknown_tensors, _refuse_unsupported_keys, kv_types  # noqa: F401 (re-exported)
from .runtime import bind
from .state import State, Timings
from .ubatch import Chunk, chunks
from ..stream.io import IOMode
from ..stream.weights import Weights


class _InThread(threading.Thread):
    """fn(*args) in a daemon thread; result() waits, then returns its value or raises its exception."""

    def __init__(self, fn, *args):
        super().__init__(name=f"ramforge-{fn.__name__}", daemon=True)
        self._fn, self._args, self._value, self._error = fn, args, None, None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as e:       # re-raised in the caller's thread
            self._error = e

    def result(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class Engine:
    """A loaded model under a memory budget. `eval` advances the KV cache; `generate` samples.

    >>> eng = Engine.load("model.gguf", n_ctx=512, budget=MemoryBudget("1G"))   # doctest: +SKIP
    >>> list(eng.generate(eng.tokenizer.encode("Hello"), max_tokens=8))          # doctest: +SKIP
    """

    path: str
    hp: HParams
    arch: Arch                                      # the architecture's record: its forward pass and facts
    plan: Plan
    weights: Weights
    kv: KVCache | SpilledKVCache
    state: State
    tokenizer: object
    budget: MemoryBudget
    timings: Timings = field(default_factory=Timings)
    tokens: list = field(default_factory=list)      # the token ids whose keys and values are cached
    _charges: list = field(default_factory=list)
    _prompt: tuple | list = field(default_factory=list)   # (prompt, outputs_all) of state.prompt_logits
    ubatch: int = UBATCH                            # llama.cpp's n_ubatch, whose arithmetic aligned evals take
    _warned: bool = False                           # InexactWarning issued
    _load_compile_s: float = 0.0                    # compile seconds of the load, reported by the first generate
    n_threads: int = 0                              # kernel threads (runtime.bind in the thread of each pass)
    closing: list = field(default_factory=list)     # callables close() runs too (a draft model's close)
    seq_tokens: dict = field(default_factory=dict)  # the token ids of sequences 1.. (parallel.py; 0's: tokens)
    seq_bounds: np.ndarray | None = None            # an encoder pass's sequences' rows [a, b) i64[n_seq, 2]
                                                    # (hidden_batch; None: the batch is one sequence)
    last_pack: object = None                        # embedding.PackedPass: the last hidden_batch's tokens and chunk

    @classmethod
    def load(cls, path, n_ctx: int | None = None, budget: MemoryBudget | None = None, batch: int | None = None,
             io: IOMode | str = IOMode.DIRECT, layers: tuple[int, int] | None = None,
             n_threads: int | None = None, expert_policy: str | None = None, expert_prefetch: bool = True,
             type_k: str | int | None = None, type_v: str | int | None = None,
             kv_spill: bool | str | None = None, n_seq: int = 1, embed: bool = False) -> "Engine":
        """Plan under the budget, then read what stays resident. layers=(a, b) runs only that range.
        expert_policy ("lru", "lfu"; default stream.experts.DEFAULT_POLICY) and expert_prefetch: the
        expert cache, where experts stream apart from their layers. type_k, type_v: the KV cache types
        ("f16", "q8_0", "q4_0" or their ggml ids; default $RAMFORGE_KV_TYPE, else f16), see kv_types.
        kv_spill: None spills the KV cache to storage (memory.kv_spill, files in a temporary directory) when
        the budget cannot hold it for the whole context; True always; a path: always, its files there;
        False never (growing past what the budget holds fails with KVBudgetExceeded).
        n_seq > 1: that many sequences (parallel.py), each a stream of PAD(n_ctx / n_seq, 256) KV cells
        as llama.cpp's non-unified cache (llama-server --parallel N); the cache stays in RAM.
        embed: an engine that embeds documents (`ramforge embed`): the plan of stream.embed_plan, its
        chunk sized from the budget, its context one packed batch (EmbedBudgetTooSmall if not one fits)."""
        from .runtime import set_threads
        from ..tokenizer import load_tokenizer

        clock = Stopwatch().start()
        n_threads = set_threads(n_threads)
        budget = budget or MemoryBudget()
        type_k, type_v = kv_types(type_k, type_v)
        with GGUFFile(path) as f:
            md = f.metadata
            arch = arch_of(md.get(Keys.ARCHITECTURE))
            hp = HParams.from_metadata(md, n_vocab_of(f))
            _refuse_unsupported_keys(md, hp.arch, arch)
            if arch.check_metadata is not None:
                arch.check_metadata(md)                 # keys of its own it cannot run
            if batch is None and not arch.causal:
                batch = UBATCH          # an encoder's sequence is one pass (llama.cpp: n_ubatch >= n_tokens)
            _refuse_unknown_tensors(f, hp, arch)
            if not (isinstance(n_seq, int) and 1 <= n_seq <= 64):
                raise InvalidArgument(f"n_seq = {n_seq!r}: between 1 and 64 sequences")
            if embed and batch is None and embedding.can_pack(layers, hp.n_layer, n_seq, bool(kv_spill)):
                plan = embed_plan(f, budget.available, n_ctx, type_k=type_k, type_v=type_v)[0]
            else:
                plan = plan_for_budget(f, budget.available, n_ctx, layers, batch, type_k=type_k, type_v=type_v,
                                       kv_spill=spill_mode(kv_spill), n_seq=n_seq)
            if plan.verdict == "insufficient":
                raise BudgetTooSmall(budget.available, plan.min_budget, plan.n_ctx)
            # reading the weights releases the GIL: meanwhile build the tokenizer (~0.15 s for a 262k
            # vocabulary) and set numba up (~0.2 s) in threads
            tok = _InThread(load_tokenizer, md)
            prepare_in_background()
            weights = Weights(f, plan, hp, arch, budget, io, expert_policy, expert_prefetch)
            try:
                tokenizer = tok.result()
            except BaseException:
                weights.close()
                raise
        charges = []
        try:
            a, b = plan.layers
            if plan.kv_spill and n_seq > 1:
                raise InvalidArgument(f"{n_seq} parallel sequences need their KV cells in RAM, and the cache "
                                      f"spills to storage: --kv-spill off (or a larger --ram), or one sequence")
            if plan.kv_spill:
                kv = SpilledKVCache(budget, b - a, plan.n_ctx, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, a, type_k,
                                    type_v, plan.batch, spill_dir(kv_spill), weights.reader,
                                    arch.windows(hp, (a, b)), plan.kv_tail, plan.kv_spill_file_bytes)
                charges.append(kv)        # closed (files removed, reader stopped) with the engine
            else:
                kv = KVCache(budget, b - a, kv_rows(plan.n_ctx, n_seq), hp.n_head_kv, hp.head_dim_k, hp.head_dim_v,
                             first_layer=a, type_k=type_k, type_v=type_v, n_seq=n_seq)
            charges.append(kv.charge)
            charges.append(budget.charge("activations", plan.state_bytes))
            state = State.allocate(hp, plan.batch)
        except BaseException:
            for c in charges:
                (c.close if isinstance(c, SpilledKVCache) else c.release)()
            weights.close()
            raise
        eng = cls(str(path), hp, arch, plan, weights, kv, state, tokenizer, budget, _charges=charges,
                  n_threads=n_threads)
        clock.stop()
        eng.timings.load_s = clock.seconds
        eng.timings.compile_s = eng._load_compile_s = clock.compile_s
        return eng

    @property
    def layers(self) -> tuple[int, int]:
        return self.plan.layers

    @property
    def n_ctx(self) -> int:
        """The context of one sequence (of the whole cache with one sequence)."""
        return self.kv.n_ctx_seq

    @property
    def n_past(self) -> int:
        return self.kv.n_past

    def reset(self, n_past: int = 0) -> None:
        """Forget cached positions from n_past on (0: the whole context)."""
        if self.kv.celled:
            parallel.seq_rm(self, 0, max(0, n_past), -1)
            return
        self.kv.n_past = max(0, min(n_past, self.kv.n_past))
        del self.tokens[self.kv.n_past:]
        if self._prompt and len(self._prompt[0]) > self.kv.n_past:
            self._prompt = []

    def eval(self, tokens, all_logits: bool = False, aligned: bool = False, as_batch: bool = False,
             outputs_all: bool = False, embd: bool = False) -> np.ndarray:
        """Append tokens to the context; return logits f32[n, n_vocab] (all_logits) or f32[1, n_vocab].

        aligned: the tokens continue a sequence from position 0 (a prompt, perhaps after a reused
        prefix) and round exactly as llama.cpp rounds that whole sequence submitted in one
        llama_decode: split into ubatches of self.ubatch tokens from position 0 (chunks of
        plan.batch within them), every chunk computed as rows of its ubatch (a kernels.batch.Batch).
        as_batch: the tokens are one llama_decode of their own (a speculative verification): ubatches
        of self.ubatch from their first token. Otherwise chunks of plan.batch are batches of their own.
        outputs_all: computed as llama.cpp computes a batch whose every token is an output (logits_all),
        though only the rows all_logits asks for are returned: the last layer runs on every row and the
        output rows round as rows of the whole batch.
        embd: return the final hidden states f32[n, n_embd] of those rows instead of their logits
        (llama.cpp's t_embd: after the output norm, before the output matrix; see `hidden`)."""
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if self.layers != (0, self.hp.n_layer):
            raise InvalidArgument(f"this engine runs layers {self.layers}; use eval_hidden")
        if not embd and not self.plan.logits:     # loaded for embedding: no output matrix planned
            raise Unsupported("this engine was loaded for embeddings (Engine.load(embed=True)): its plan keeps no "
                              "output matrix, so it cannot compute logits; load it without embed=True to generate")
        if toks.size == 0:
            raise EmptyPrompt("eval needs at least one token")
        check_token_ids(toks, self.hp.n_vocab)
        if self.kv.celled:                          # sequence 0 in KV cells (a context shift, parallel sequences)
            if all_logits or outputs_all:
                raise NotReproduced("all logits of a sequence held in shifted or shared KV cells")
            return self.eval_batch([(0, toks)])[0][None]
        with self._kv_room(toks.size):
            B, out = self.plan.batch, []
            for c in chunks(toks.size, self.kv.n_past, B, self.ubatch, all_logits=all_logits, aligned=aligned,
                            as_batch=as_batch, outputs_all=outputs_all):
                if c.view and self.hp.n_expert and c.view[0] > B:
                    self._warn_chunked_experts(c.view[0])
                cancel.check()                      # a client gone stops a long prefill between chunks
                out.append(self.run_chunk(toks[c.start:c.stop], c, embd))
                self.tokens.extend(int(t) for t in toks[c.start:c.stop])
        return np.concatenate([o for o in out if o is not None])

    @contextlib.contextmanager
    def _kv_room(self, n: int):
        """The KV cache grown for n more positions (KVBudgetExceeded if the budget cannot); what a
        failed evaluation reserved is given back."""
        cap = self.kv.capacity
        self.kv.check_room(n)
        try:
            yield
        except BaseException:
            self.kv.shrink(cap)
            raise

    def run_chunk(self, inp: np.ndarray, c: Chunk, embd: bool = False) -> np.ndarray | None:
        """One pass of ubatch.chunks through this engine's layer range: inp is token ids (a range
        from layer 0) or hidden states f32[n, n_embd]. Returns the logits c.rows asks for where the
        range ends the model (None if it asks none), else the hidden states after the range (a copy)."""
        ends = self.layers[1] == self.hp.n_layer
        if self.layers[0] == 0:
            def fill(x):
                self.arch.embed(self, x, inp)
        else:
            def fill(x):
                x[:] = inp
        res = self._pass(c.size, fill, c.rows if ends else None, c.view, c.only, c.kind, embd)
        return res if ends else self.state.x[:c.size].copy()

    def _warn_chunked_experts(self, n: int) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(InexactWarning(
                f"a ubatch of {n} tokens is computed in chunks of {self.plan.batch} under this budget: an expert's "
                f"rows are counted per chunk, where llama.cpp counts them per ubatch to pick mul_mat_id's "
                f"arithmetic, so these logits can differ from llama.cpp's in the last bits; `ramforge plan` "
                f"gives the budget that makes chunks whole ubatches"),
                stacklevel=3)

    def eval_hidden(self, hidden: np.ndarray, logits: bool = False) -> np.ndarray:
        """Run hidden states f32[n, n_embd] through this engine's layer range; return the new hidden
        states (or the logits f32[n, n_vocab] when logits=True and the range ends the model)."""
        h = np.asarray(hidden, dtype=np.float32).reshape(-1, self.hp.n_embd)
        if logits and self.layers[1] != self.hp.n_layer:
            raise InvalidArgument(f"layers {self.layers} do not end the model; it has no logits")
        with self._kv_room(h.shape[0]):
            return self._eval_hidden(h, logits)

    def _eval_hidden(self, h: np.ndarray, logits: bool) -> np.ndarray:
        out = []
        for c0 in range(0, h.shape[0], self.plan.batch):
            part = h[c0:c0 + self.plan.batch]
            n = part.shape[0]

            def put(x, part=part):
                x[:] = part
            res = self._pass(n, put, slice(0, n) if logits else None)
            out.append(res if logits else self.state.x[:n].copy())
        return np.concatenate(out)

    def _pass(self, n: int, fill, rows: slice | None, view: Batch | None = None,
              only: slice | None = None, kind: str | None = None, embd: bool = False) -> np.ndarray | None:
        """One forward pass over n tokens: fill s.x, run the layers (their matmuls and attention as rows
        of batch `view`, kernels.batch; None: a batch of their own; the last layer past attention `only`
        for those rows), logits for `rows` if asked (with only=None: as rows of the whole batch); embd: the
        hidden states of `rows` instead (Engine.hidden)."""
        bind(self.n_threads)                        # numba's thread settings, in this thread
        rec = PassRecord(n, kind or ("prefill" if n > 1 else "decode")) if PROFILE.enabled else None
        self.weights.record = rec
        spill = self.kv if isinstance(self.kv, SpilledKVCache) else None
        k0 = (KERNELS.seconds, KERNELS.calls)
        sw = Stopwatch().start()
        try:
            self.weights.begin_pass(logits=rows is not None and not embd)
            if spill:                                # its older positions' reads start beside the weights'
                spill.record = rec
                spill.begin_pass(self.kv.n_past, n)
            fill(self.state.x[:n])
            self.arch.forward(self, self.state, n, self.kv.n_past, out=only, batch=view)
            if spill:
                spill.end_pass()
            if self.kv.ub is None:                  # a cells pass (parallel.eval_batch) keeps its own books
                self.kv.n_past += n
            if rows is not None:             # the output matmul: rows of the whole batch, or one row alone
                v = (view or Batch(n, 0)) if only is None else None
                res = self._embd(rows) if embd else self._logits(rows, v.at(rows.start) if v else None)
            else:
                res = None
        except BaseException:
            if spill:
                spill.abort()
            self.weights.abort()
            raise
        if rec:
            rec.seconds = sw.stop().seconds            # compiling kernels left out
            rec.kernel_s, rec.kernel_calls = KERNELS.seconds - k0[0], KERNELS.calls - k0[1]
            PROFILE.passes.append(rec)
        return res

    def _logits(self, rows: slice, batch: Batch | None) -> np.ndarray:
        """A new f32[n, n_vocab] array, the caller's (not charged: one row, unless all logits were asked for);
        its matmul in the arithmetic of `batch` (kernels.batch)."""
        if not self.arch.has_output:              # an encoder (bert, nomic-bert, jina-bert-v2): no logits
            raise Unsupported(f"{self.hp.arch} is an embedding model (no output layer): it cannot generate; "
                              f"use its embeddings (Model.embed, /api/embed, /v1/embeddings)")
        s = self.state
        n = rows.stop - rows.start
        rms_norm(s.hn[:n], s.x[rows], self.weights.output_norm.data, self.hp.rms_eps)
        logits = self.weights.output_rows(np.empty((n, self.hp.n_vocab), np.float32), s.hn[:n], batch)
        return softcap(logits, self.hp.final_softcap) if self.hp.final_softcap else logits

    def _embd(self, rows: slice) -> np.ndarray:
        """llama.cpp's t_embd of the rows, a new f32[n, n_embd]: the output norm of the final hidden
        states, or the architecture's own (`hidden_out`: an encoder's last layer ends in its norm)."""
        x = self.state.x[rows]
        own = self.arch.hidden_out
        if own is not None:
            return own(self, x)
        return rms_norm(np.empty_like(x), x, self.weights.output_norm.data, self.hp.rms_eps)

    @property
    def causal(self) -> bool:
        return self.arch.causal

    def hidden(self, tokens) -> np.ndarray:
        """One sequence's final hidden states f32[n, n_embd] (t_embd): see engine/embedding.py."""
        return embedding.hidden(self, tokens)

    def hidden_batch(self, seqs) -> tuple[np.ndarray, np.ndarray]:
        """Several sequences' hidden states in one llama_decode, and their rows: see engine/embedding.py."""
        return embedding.hidden_batch(self, seqs)

    @property
    def packs_causal(self) -> bool:
        """Whether hidden_batch can pack a causal model's sequences (embedding.packs_causal)."""
        return embedding.packs_causal(self)

    # llama.cpp's memory API over KV cells (parallel.py): several sequences, positions moved and removed
    def eval_batch(self, batch) -> dict:
        """One llama_decode of [(seq_id, tokens), ...]: {seq_id: its last logits f32[n_vocab]}."""
        return parallel.eval_batch(self, batch)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        parallel.seq_rm(self, seq_id, p0, p1)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        parallel.seq_add(self, seq_id, p0, p1, delta)

    def seq_cp(self, src: int, dst: int) -> None:
        parallel.seq_cp(self, src, dst)

    def seq_pos_max(self, seq_id: int) -> int:
        return parallel.seq_pos_max(self, seq_id)

    def generate(self, prompt: list[int], max_tokens: int, sampler=None, stop_on_eog: bool = True,
                 reuse_prefix: bool = False, draft=None, outputs_all: bool = False,
                 context_shift: bool = False, n_keep: int = 0) -> Iterator[int]:
        """Yield up to max_tokens sampled tokens after the prompt (greedy when sampler is None).

        reuse_prefix keeps the cached keys/values of the longest common prefix of the prompt and the
        tokens already in the cache; timings.prompt_tokens counts only the tokens evaluated anew. The
        last prompt's logits are kept, so the same prompt again (a new sample, another seed) starts
        from the very same logits instead of re-evaluating its last token alone, which rounds
        differently than the batch did (in llama.cpp as here).

        draft: speculative decoding (ramforge.engine.speculative) with this drafter: a PromptLookup, a
        DraftModel, or any callable input_ids -> draft ids (llama-cpp-python's LlamaDraftModel shape).
        The prompt is then evaluated as llama-cpp-python does with a draft model (every token an output).
        outputs_all: so too without one (llama-cpp-python's `logits_all=True`, which its logprobs need).
        context_shift: when the context is full, keep n_keep tokens (+ BOS) and drop half of the rest, as
        llama-server's --context-shift (parallel.context_shift), and go on.
        """
        if not prompt:
            raise EmptyPrompt("the prompt is empty: at least one token (e.g. BOS) is needed")
        if context_shift:
            n_keep = len(prompt) if n_keep == -1 else n_keep        # llama-server's -1: the whole prompt
            if not (isinstance(n_keep, int) and 0 <= n_keep < self.n_ctx):
                raise InvalidArgument(f"n_keep = {n_keep!r} is beyond the context of {self.n_ctx} tokens")
            if draft is not None or outputs_all:
                raise InvalidArgument("context_shift with a drafter or all logits is not supported")
            if isinstance(self.kv, SpilledKVCache):
                self.kv.cells_on()                                  # refused: the shift needs the cache in RAM
            if len(prompt) >= self.n_ctx:
                raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx}")
        elif len(prompt) + max_tokens > self.n_ctx:
            raise ContextLengthExceeded(f"prompt of {len(prompt)} tokens + {max_tokens} to generate exceed the "
                                        f"context of {self.n_ctx}; raise --ctx or lower --max-tokens")
        logits = self._prompt_logits(prompt, reuse_prefix, outputs_all=outputs_all or draft is not None)
        history = list(prompt)
        sw = Stopwatch().start()
        try:
            if draft is not None:
                from .speculative import speculate
                yield from speculate(self, history, logits, max_tokens, sampler, draft, stop_on_eog)
                return
            for _ in range(max_tokens):
                tok = int(np.argmax(logits)) if sampler is None else sampler.sample(logits, history)
                if stop_on_eog and self.tokenizer.is_eog(tok):
                    break
                history.append(tok)
                self.timings.gen_tokens += 1
                yield tok
                if self.timings.gen_tokens == max_tokens:
                    break
                if context_shift and self.kv.pos_max(0) + 2 >= self.n_ctx:    # llama-server's pre_decode
                    parallel.context_shift(self, n_keep)
                logits = self.eval([tok])[-1]
        finally:
            sw.stop()
            self.timings.gen_s = sw.seconds
            self.timings.compile_s += sw.compile_s

    def _prompt_logits(self, prompt: list[int], reuse_prefix: bool, outputs_all: bool) -> np.ndarray:
        """The prompt evaluated (past a reused prefix, see generate): its last logits f32[n_vocab]; new timings."""
        key = (list(prompt), outputs_all)
        again = reuse_prefix and self._prompt == key and self.tokens[:len(prompt)] == key[0]
        keep = len(prompt) if again else 0
        if reuse_prefix and not again:
            limit = min(len(prompt) - 1, len(self.tokens))
            while keep < limit and self.tokens[keep] == prompt[keep]:
                keep += 1
        self.reset(keep)
        with Stopwatch() as sw:
            if again:
                logits = self.state.prompt_logits.copy()
            else:
                logits = self.eval(prompt[keep:], aligned=True, outputs_all=outputs_all)[-1]
                self.state.prompt_logits[:] = logits
                self._prompt = key
        # compile_s: this call's, plus the load's on the first call
        self.timings = Timings(self.timings.load_s, len(prompt) - keep, sw.seconds,
                               compile_s=self._load_compile_s + sw.compile_s)
        self._load_compile_s = 0.0
        return logits

    def close(self) -> None:
        for c in self._charges:       # a spilled cache first: it reads with the weights' reader thread
            (c.close if isinstance(c, SpilledKVCache) else c.release)()
        self._charges.clear()
        self.weights.close()
        while self.closing:
            self.closing.pop()()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

