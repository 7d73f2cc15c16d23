"""`ramforge.Llama`: llama-cpp-python 0.3's `Llama`, keyword for keyword and contract for contract, on the
budgeted streaming engine, so code written for llama-cpp-python runs with only its import changed:

    >>> from ramforge import Llama
    >>> llm = Llama(model_path="default", n_gpu_layers=-1, n_ctx=0, seed=1337)       # doctest: +SKIP
    >>> llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\\n"], echo=True)

The token loop (`eval`, `sample`, `generate`) is llama-cpp-python's: each `eval` chunk of n_batch tokens is
one llama_decode (engine.eval(as_batch=True)), the sampler chain is llama-cpp-python's
(ramforge.sampling LCPP), seeds are derived per completion as it derives them, and text is detokenized
piece by piece as it does, so greedy and seeded outputs are its tokens and its text. The completion
functions live in generation/llama_completion.py. What ramforge adds: `ram=` (a memory budget) and the
other keywords of ramforge.Model (io, kv_spill, expert_policy, expert_prefetch, chat_template).
GPU and other keywords with no effect here are accepted with one warning; keywords whose values would
change the output in ways ramforge does not reproduce (LoRA, rope overrides, kv_overrides, vocab_only,
a custom tokenizer) are refused with a clear error unless left at their defaults. spm_infill puts a
`suffix` first, as llama-cpp-python does (BOS SUF suffix PRE prefix MID), with the model's real FIM token
ids where llama-cpp-python 0.3.36 writes id 0 for each (its TODO), and the suffix tokenized as llama-server
does (llama-cpp-python's "☺" space hack drops its first token): the prompt is llama-server's --spm-infill
prompt (generation/fim.py), held to llama.cpp's record and to llama-cpp-python's layout in tests/test_fim_oracle.py.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidArgument, Unsupported
from ..sampling import LCPP, Sampler
from ..sampling.params import LLAMA_DEFAULT_SEED, sampler_params
from ..store.resolve import resolve_model
from . import llama_completion
from .llama_compat import NO_OP_KEYWORDS, REFUSED_KEYWORDS, _metadata_strings, _Processed  # noqa: F401 (re-exported)

class EmbeddingsUnsupported(Unsupported, NotImplementedError):
    """Llama.embed / create_embedding on a model or build that does not compute embeddings."""


@dataclass
class LlamaState:
    """A saved sequence, shaped as llama-cpp-python's LlamaState (its caches read input_ids and
    llama_state_size); `llama_state` is the ramforge session.State holding the KV cache rows."""

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    llama_state: object
    llama_state_size: int
    seed: int


class Llama:
    """llama_cpp.Llama's interface (see the module doc). model_path: a .gguf path, a store name or "default".
    n_ctx: 0 takes the model's trained context (llama-cpp-python's default, 512, otherwise). use_mmap:
    weights read through mmap (else direct reads). ram: ramforge's memory budget (None: unlimited);
    io, kv_spill, expert_policy, expert_prefetch, chat_template: as ramforge.Model takes them."""

    def __init__(self, model_path: str, *, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512, n_batch: int = 512,
                 n_ubatch: int = 512, n_threads: int | None = None, n_threads_batch: int | None = None,
                 use_mmap: bool = True, logits_all: bool = False, embedding: bool = False, flash_attn: bool = False,
                 last_n_tokens_size: int = 64, chat_format: str | None = None, chat_handler=None, draft_model=None,
                 type_k: int | None = None, type_v: int | None = None, verbose: bool = True,
                 ram: str | int | None = None, io: str | None = None, kv_spill=None, expert_policy: str | None = None,
                 expert_prefetch: bool = True, chat_template: str | None = None, pooling_type: int = -1,
                 spm_infill: bool = False, **kwargs):
        from ..gguf.reader import GGUFFile
        from .api import Model

        ignored = sorted(k for k in kwargs if k in NO_OP_KEYWORDS and kwargs[k] != NO_OP_KEYWORDS[k])
        unknown = sorted(k for k in kwargs if k not in NO_OP_KEYWORDS and k not in REFUSED_KEYWORDS)
        refused = sorted(k for k in kwargs if k in REFUSED_KEYWORDS and kwargs[k] != REFUSED_KEYWORDS[k])
        if refused:
            raise Unsupported(f"Llama({', '.join(f'{k}={kwargs[k]!r}' for k in refused)}): ramforge does not "
                              f"reproduce {'this option' if len(refused) == 1 else 'these options'}; leave "
                              f"{'it' if len(refused) == 1 else 'them'} at the default")
        if n_threads_batch is not None and n_threads is not None and n_threads_batch != n_threads:
            ignored.append("n_threads_batch")         # one thread count serves both (results do not depend on it)
        if ignored or unknown:
            warnings.warn(f"ramforge.Llama ignores {', '.join(ignored + unknown)}: "
                          f"{'no effect on a CPU engine' if ignored else ''}"
                          f"{'; ' if ignored and unknown else ''}{'unknown keywords' if unknown else ''}",
                          stacklevel=2)
        for name, value in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                            ("last_n_tokens_size", last_n_tokens_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "n_ctx" else 1):
                raise InvalidArgument(f"{name} must be a {'non-negative' if name == 'n_ctx' else 'positive'} "
                                      f"integer, got {value!r}")
        if n_batch > n_ubatch and n_batch % n_ubatch:
            raise Unsupported(f"n_batch = {n_batch} is not a multiple of n_ubatch = {n_ubatch}: llama.cpp's ubatches "
                              f"of such a batch are not reproduced; make n_batch a multiple of n_ubatch")
        if chat_handler is not None and not callable(chat_handler):
            raise InvalidArgument(f"chat_handler must be a callable (llama-cpp-python's LlamaChatCompletionHandler), "
                                  f"not {type(chat_handler).__name__}")
        self.model_path = str(model_path)
        path = str(resolve_model(model_path))
        with GGUFFile(path) as f:
            md = f.metadata
        arch = md.get("general.architecture", "")
        self._n_ctx_train = int(md.get(f"{arch}.context_length", 0) or 0)
        self.metadata = _metadata_strings(md)
        self._gguf_metadata = md
        self.verbose = bool(verbose)
        self._model = Model(model_path, ram=ram, n_ctx=n_ctx or self._n_ctx_train or None, n_threads=n_threads,
                            seed=None, verbose=verbose, io=io or ("mmap" if use_mmap else "direct"),
                            chat_template=chat_template, n_ubatch=min(n_batch, n_ubatch), draft_model=draft_model,
                            type_k=type_k, type_v=type_v, flash_attn=True if flash_attn else None, kv_spill=kv_spill,
                            expert_policy=expert_policy, expert_prefetch=expert_prefetch)
        self.n_batch, self.n_ubatch = n_batch, min(n_batch, n_ubatch)
        self._pooling_type = pooling_type          # llama.cpp's id (-1: the file's {arch}.pooling_type)
        self.n_threads = self._model.engine.n_threads
        self.n_threads_batch = n_threads_batch or self.n_threads
        self._seed = seed or LLAMA_DEFAULT_SEED            # llama-cpp-python: `seed or LLAMA_DEFAULT_SEED`
        self.last_n_tokens_size = last_n_tokens_size
        self._logits_all = bool(logits_all) or draft_model is not None
        self.draft_model = draft_model
        self.embedding = bool(embedding)
        self.spm_infill = bool(spm_infill)              # a suffix's prompt: suffix first (generation/fim.py)
        self.chat_handler, self.chat_format = chat_handler, chat_format
        self.cache = None
        self._sampler = None                              # generate()'s chain, used by sample() meanwhile
        self._requires_eval = True
        self._rows, self._rows_start = None, 0            # logits of the last eval, from position _rows_start
        self._all_scores = np.zeros((0, self.n_vocab()), np.float32)   # every position's logits (logits_all)
        if chat_format is not None and chat_handler is None:
            llama_completion.chat_template_for(self, chat_format)     # an unknown format fails here
        if self.verbose:
            print(f"ramforge.Llama: {path} n_ctx={self.n_ctx()} n_batch={self.n_batch} n_ubatch={self.n_ubatch} "
                  f"threads={self.n_threads} io={io or ('mmap' if use_mmap else 'direct')} "
                  f"budget={ram if ram is not None else 'unlimited'}", file=sys.stderr)

    # ---- the model ------------------------------------------------------------------------------------
    @property
    def _engine(self):
        return self._model.engine

    @property
    def tokenizer_(self):
        return self._model.tokenizer

    def n_ctx(self) -> int:
        return self._engine.n_ctx

    def n_embd(self) -> int:
        return self._engine.hp.n_embd

    def n_vocab(self) -> int:
        return self._engine.hp.n_vocab

    def token_bos(self) -> int:
        b = self.tokenizer_.bos_id
        return -1 if b is None else b

    def token_eos(self) -> int:
        e = self.tokenizer_.eos_id
        return -1 if e is None else e

    def token_nl(self) -> int:
        return self.tokenizer_.vocab.byte_to_token(10)

    def pooling_type(self) -> str:
        return str(self._gguf_metadata.get(f"{self.metadata.get('general.architecture', '')}.pooling_type", -1))

    @property
    def n_tokens(self) -> int:
        return self._engine.n_past

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        self._engine.reset(n)

    @property
    def input_ids(self) -> np.ndarray:
        return np.asarray(self._engine.tokens, dtype=np.intc)

    _input_ids = input_ids

    @property
    def scores(self) -> np.ndarray:
        """The logits of every evaluated position (logits_all=True), else of the last evaluation's last one."""
        if self._logits_all:
            return self._all_scores[:self.n_tokens]
        return self._rows[-1:] if self._rows is not None else np.zeros((0, self.n_vocab()), np.float32)

    _scores = scores

    # ---- tokens ---------------------------------------------------------------------------------------
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special=add_bos, parse_special=special); text is UTF-8 bytes (a str is taken)."""
        if isinstance(text, str):
            text = text.encode("utf-8")
        if not isinstance(text, (bytes, bytearray)):
            raise InvalidArgument(f"tokenize takes bytes, not {type(text).__name__}")
        return self.tokenizer_.encode(bytes(text), add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The tokens' pieces concatenated, a leading space dropped after a leading BOS (llama-cpp-python's
        rule; prev_tokens, as there, changes nothing for a GGUF vocabulary)."""
        tokens = [int(t) for t in tokens]
        n = self.n_vocab()
        bad = next((t for t in tokens if not 0 <= t < n), None)
        if bad is not None:
            raise InvalidArgument(f"token id {bad} is outside the vocabulary of {n}")
        out = self.tokenizer_.decode_bytes(tokens, special=special)
        if tokens and tokens[0] == self.token_bos() and out[:1] == b" ":
            return out[1:]
        return out

    # ---- evaluation and sampling ----------------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def reset(self) -> None:
        """Forget the evaluated tokens (the next generate evaluates its prompt anew, past no prefix)."""
        self.n_tokens = 0
        self._requires_eval = True

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens after the n_tokens already evaluated, n_batch at a time (each one llama_decode)."""
        eng, tokens = self._engine, [int(t) for t in tokens]
        eng.reset(self.n_tokens)
        eng._prompt = []                        # Model.stream's prompt-logits memo no longer matches the cache
        for i in range(0, len(tokens), self.n_batch):
            batch, n_past = tokens[i:i + self.n_batch], self.n_tokens
            rows = eng.eval(batch, all_logits=self._logits_all, as_batch=True, outputs_all=self._logits_all)
            if self._logits_all:
                self._keep_scores(n_past, rows)
                self._rows, self._rows_start = rows, n_past
            else:
                self._rows, self._rows_start = rows, n_past + len(batch) - 1
            self._requires_eval = False

    def _keep_scores(self, n_past: int, rows: np.ndarray) -> None:
        need = n_past + len(rows)
        if self._all_scores.shape[0] < need:
            grown = np.zeros((max(need, min(self.n_ctx(), 2 * self._all_scores.shape[0] + 64)), self.n_vocab()),
                             np.float32)
            grown[:self._all_scores.shape[0]] = self._all_scores
            self._all_scores = grown
        self._all_scores[n_past:need] = rows

    def _logits_at(self, idx: int) -> np.ndarray:
        """The logits computed at position idx (the last one evaluated unless logits_all)."""
        if self._logits_all and 0 <= idx < self.n_tokens:
            return self._all_scores[idx]
        if self._rows is None or not (self._rows_start <= idx < self._rows_start + len(self._rows)):
            raise InvalidArgument(f"no logits at position {idx}: evaluate the tokens first (logits_all=True keeps "
                                  f"every position's)")
        return self._rows[idx - self._rows_start]

    def _init_sampler(self, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, temp=0.80, repeat_penalty=1.0,
                      frequency_penalty=0.0, presence_penalty=0.0, tfs_z=1.0, mirostat_mode=0, mirostat_eta=0.1,
                      mirostat_tau=5.0, penalize_nl=True, logits_processor=None, grammar=None):
        """llama-cpp-python's chain (tfs_z and penalize_nl are accepted and unused, as there)."""
        values = dict(top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temperature=temp,
                      repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                      presence_penalty=presence_penalty, mirostat=mirostat_mode, mirostat_eta=mirostat_eta,
                      mirostat_tau=mirostat_tau, repeat_last_n=self.last_n_tokens_size,
                      seed=int(self._seed) & 0xFFFFFFFF)
        if temp is not None and temp < 0:              # llama-cpp-python: a bare dist, no filters
            values.update(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, mirostat=0)
        sampler = Sampler(sampler_params(values), self.n_vocab(), chain=LCPP, tokenizer=self.tokenizer_,
                          grammar=self._model.compile_grammar(grammar))
        return _Processed(sampler, logits_processor) if logits_processor else sampler

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor=None, grammar=None,
               idx: int | None = None) -> int:
        """A token from the logits at position idx (default: the last evaluated), with generate()'s chain
        while it runs, else a fresh one of these parameters."""
        if self.n_tokens <= 0:
            raise InvalidArgument("sample needs evaluated tokens: call eval first")
        sampler = self._sampler or self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty,
                                                      frequency_penalty, presence_penalty, tfs_z, mirostat_mode,
                                                      mirostat_eta, mirostat_tau, penalize_nl, logits_processor,
                                                      grammar)
        pos = self.n_tokens - 1 if idx is None else idx
        return sampler.sample(self._logits_at(pos), self._engine.tokens)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None,
                 grammar=None) -> Iterator[int]:
        """Tokens sampled after `tokens`, without end: the caller stops (llama-cpp-python's generator; send()
        more tokens to evaluate them after the yielded one). The longest prefix shared with the tokens
        already evaluated is kept (reset=True); stopping_criteria(input_ids, logits) -> True ends it."""
        self._sampler = self._init_sampler(top_k, top_p, min_p, typical_p, temp, repeat_penalty, frequency_penalty,
                                           presence_penalty, tfs_z, mirostat_mode, mirostat_eta, mirostat_tau,
                                           penalize_nl, logits_processor, grammar)
        tokens = [int(t) for t in tokens]
        if reset and self.n_tokens > 0:
            have = self._engine.tokens
            longest = 0
            for a, b in zip(have, tokens):
                if a != b:
                    break
                longest += 1
            consumed = longest == len(tokens)
            if self.n_tokens == len(tokens) and consumed and not self._requires_eval:
                reset, tokens, reuse = False, [], 0       # the prompt's logits are at hand
            else:
                reuse = longest - 1 if consumed else longest
            if reuse > 0:
                reset, tokens = False, tokens[reuse:]
                self.n_tokens = reuse
                self._requires_eval = True
        if reset:
            self.reset()
        sample_idx = self.n_tokens + len(tokens) - 1
        while True:
            if tokens:
                self.eval(tokens)
            while sample_idx < self.n_tokens:
                scores = self._logits_at(sample_idx)
                token = self._sampler.sample(scores, self._engine.tokens[:sample_idx + 1])
                sample_idx += 1
                if stopping_criteria is not None and stopping_criteria(self.input_ids[:sample_idx], scores):
                    return
                more = yield token
                tokens = [token] + ([int(t) for t in more] if more is not None else [])
                if sample_idx < self.n_tokens and token != self._engine.tokens[sample_idx]:
                    self.n_tokens = sample_idx
                    self._requires_eval = True
                    break
            if self.draft_model is not None:
                draft = np.asarray(self.draft_model(np.asarray(self._engine.tokens + tokens, dtype=np.intc)))
                tokens += [int(t) for t in draft.astype(int)[:max(0, self.n_ctx() - self.n_tokens - len(tokens))]]

    # ---- completions (llama_completion) -----------------------------------------------------------------
    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria=None, logits_processor=None, grammar=None, logit_bias=None):
        """A text_completion dict, or with stream=True an iterator of its chunks (llama-cpp-python's)."""
        chunks = llama_completion.completion(
            self, prompt, suffix=suffix, max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
            typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            model=model, stopping_criteria=stopping_criteria, logits_processor=logits_processor, grammar=grammar,
            logit_bias=logit_bias)
        if stream:
            return chunks
        return next(chunks)

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict], functions=None, function_call=None, tools=None,
                               tool_choice=None, temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: str | list[str] | None = None, seed: int | None = None, response_format=None,
                               max_tokens: int | None = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               model: str | None = None, logits_processor=None, grammar=None, logit_bias=None,
                               logprobs: bool | None = None, top_logprobs: int | None = None):
        """A chat.completion dict, or a stream of chat.completion.chunk dicts, with llama-cpp-python's defaults
        (temperature 0.2); chat_handler, when given, makes it, as in llama-cpp-python."""
        kwargs = dict(messages=messages, functions=functions, function_call=function_call, tools=tools,
                      tool_choice=tool_choice, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                      typical_p=typical_p, logprobs=logprobs, top_logprobs=top_logprobs, stream=stream, stop=stop,
                      seed=seed, response_format=response_format, max_tokens=max_tokens,
                      presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                      repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                      mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
                      logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias)
        if self.chat_handler is not None:
            return self.chat_handler(llama=self, **kwargs)
        return llama_completion.chat_completion(self, **kwargs)

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """create_chat_completion's answer as openai's ChatCompletion objects (needs the openai package)."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError:
            raise Unsupported("create_chat_completion_openai_v1 needs the openai package: pip install openai") from None
        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream"):
            return (ChatCompletionChunk(**c) for c in out)
        return ChatCompletion(**out)

    # ---- embeddings ----------------------------------------------------------------------------------
    def create_embedding(self, input: str | list[str], model: str | None = None):
        return self._embeddings("create_embedding", input, model=model)

    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        return self._embeddings("embed", input, normalize=normalize, truncate=truncate, return_count=return_count)

    def _embeddings(self, method: str, input, **kwargs):
        """Model.embed / create_embedding (generation/embed.py), once Llama(embedding=True) asked for them."""
        if not self.embedding:
            raise InvalidArgument(f"Llama.{method} needs Llama(..., embedding=True), as llama-cpp-python does")
        fn = self._model.embed if method == "embed" else self._model.create_embedding
        return fn(input, pooling_type=self._pooling_type, **kwargs)

    # ---- states and caches ---------------------------------------------------------------------------
    def save_state(self) -> LlamaState:
        st = self._model.save_state()
        scores = self._logits_at(self.n_tokens - 1)[None].copy() if self.n_tokens else np.zeros((0, self.n_vocab()))
        return LlamaState(self.input_ids.copy(), scores, self.n_tokens, st, int(st.nbytes), int(self._seed))

    def load_state(self, state: LlamaState) -> None:
        """Continue from a save_state() (or a ramforge session.State); the next generate re-evaluates the
        last token for its logits, as llama-cpp-python does."""
        self._model.load_state(state.llama_state if isinstance(state, LlamaState) else state)
        if isinstance(state, LlamaState):
            self._seed = state.seed
        self._rows, self._requires_eval = None, True
        self._engine._prompt = []

    def set_cache(self, cache) -> None:
        """A prompt cache: llama-cpp-python's (LlamaRAMCache, LlamaDiskCache: indexed by tokens) or a
        ramforge session.PromptCache. None: none."""
        if cache is not None:
            from .session import check_local

            check_local(self._engine)
        self.cache = cache

    # ---- loading -------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files=None, local_dir=None,
                        local_dir_use_symlinks="auto", cache_dir=None, **kwargs) -> "Llama":
        """Download filename (a name or glob) of the Hugging Face repo repo_id into the shared Hugging Face cache
        (store.hf.download: HF_ENDPOINT, HF_TOKEN) and load it; a split set's shards come with its first."""
        from ..store.hf import download

        if additional_files:
            raise Unsupported("from_pretrained(additional_files=...) (split GGUFs) is not supported")
        return cls(model_path=str(download(repo_id, filename)), **kwargs)

    def close(self) -> None:
        m = getattr(self, "_model", None)
        if m is not None:
            m.close()
            self._model = None

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:       # noqa: BLE001 - interpreter teardown
            pass

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        """log-softmax, as llama-cpp-python computes it."""
        logits_maxs = np.amax(logits, axis=axis, keepdims=True)
        if logits_maxs.ndim > 0:
            logits_maxs[~np.isfinite(logits_maxs)] = 0
        elif not np.isfinite(logits_maxs):
            logits_maxs = 0
        subtract_maxs = np.subtract(logits, logits_maxs, dtype=np.single)
        exp = np.exp(subtract_maxs)
        with np.errstate(divide="ignore"):
            summed = np.sum(exp, axis=axis, keepdims=True)
            out = np.log(summed)
        return subtract_maxs - out

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n
