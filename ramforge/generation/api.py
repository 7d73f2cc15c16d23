"""The library API, shaped like llama-cpp-python's `Llama`, on the budgeted streaming engine.

    >>> from ramforge import Model
    >>> with Model("default", ram="512M", n_ctx=2048) as m:                     # doctest: +SKIP
    ...     print(m("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"])
    ...     for chunk in m.create_chat_completion([{"role": "user", "content": "Hi"}], stream=True):
    ...         print(chunk["choices"][0]["delta"].get("content", ""), end="")
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import InvalidArgument
from ..flags import DEFAULT_CTX, N_UBATCH
from ..memory import MemoryBudget, parse_memory_size
from .logprobs import LCPP as LCPP_LOGPROBS, Recorder, check_top
from .logprobs import chat_from_legacy as chat_logprobs_lcpp
from .logprobs import legacy as legacy_logprobs
from ..sampling.params import sampler_params, stop_strings
from .model_chat import _DEFAULT_MODEL_TEMPLATE, is_default_model, model_chat_template  # noqa: F401 (re-exported)
from .reasoning import parser_for
from ..store.resolve import resolve_model
from .tools_call import ToolSession, openai_calls
from ..sampling import LCPP, Sampler

@dataclass
class Response:
    """One step of `Model.stream()`: the new text, and on the last step the totals."""

    text: str                             # the answer (in a chat, without the reasoning)
    token: int | None
    done: bool = False
    finish_reason: str | None = None      # "stop" (EOG or a stop string) or "length"
    prompt_tokens: int = 0                # tokens in the prompt
    prompt_eval_tokens: int = 0           # of which evaluated anew (the rest came from the KV cache)
    completion_tokens: int = 0
    prompt_s: float = 0.0
    gen_s: float = 0.0
    load_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    compile_s: float = 0.0                # compiling kernels (a first run), not in prompt_s or gen_s
    thinking: str = ""                    # a chat's reasoning, split out (Model.split_reasoning)
    speculative: dict | None = None       # with a draft_model: drafted, accepted, acceptance, passes, tokens_per_pass
    logprobs: list | None = None          # with stream(logprobs=N): a logprobs.Step per token since the last Response

    @property
    def prompt_tps(self) -> float:
        return self.prompt_eval_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        return self.completion_tokens / self.gen_s if self.gen_s > 0 else 0.0


class Model:
    """A GGUF model under a memory budget. `path_or_name`: a file, a store name, or "default".

    ram: a budget such as "512M" (None: unlimited). n_threads: kernel threads (None: physical cores).
    n_ubatch: llama.cpp's physical batch, whose arithmetic a prompt's evaluation reproduces (512, as
    llama.cpp's default; memory use does not depend on it). expert_policy ("lfu" or "lru") and
    expert_prefetch: the expert cache of a mixture of experts whose experts stream (see `ramforge plan`).
    draft_model: speculative decoding (ramforge.engine.speculative), as llama-cpp-python's `Llama(draft_model=)`:
    a `PromptLookup(max_ngram_size, num_pred_tokens)` (llama-cpp-python's LlamaPromptLookupDecoding
    rules), a `DraftModel(path, n_max=16)` (loaded resident under this Model's budget first), or any
    callable input_ids -> draft ids.
    type_k, type_v: the KV cache types, as llama-cpp-python's (ggml type ids: 1 f16, 8 q8_0, 2 q4_0) or
    their names (default: $RAMFORGE_KV_TYPE, else f16); a quantized cache is read as llama.cpp's flash
    attention reads it (llama-cpp-python's `flash_attn=True`, which a quantized V needs), an f16 one as
    its default graph does; flash_attn, if given, must say the same.
    kv_spill: the KV cache spilled to storage (a file per layer, read back each token, bit-exact): None
    (default) when the budget cannot hold it for the whole context, True always, a directory always (its
    files there), False never (ramforge.stream.kv_spill).
    ray: run the model as a pipeline of `stages` layer ranges on Ray (ramforge.cluster): True (a new
    local cluster, or $RAY_ADDRESS), an address (HOST:PORT, ray://HOST:PORT, "auto"), or a dict of
    cluster.Pipeline's keywords with "address" (connect_timeout, stage_timeout, placement, ...); each
    stage under stage_ram (one size, or one per stage; default: ram), its own KV cache. Greedy and
    seeded output equal the single process's.
    """

    sampler_chain = LCPP    # llama-cpp-python's chain order and penalty window (ramforge.sampling)

    def __init__(self, path_or_name: str = "default", *, ram: str | int | None = None, n_ctx: int | None = DEFAULT_CTX,
                 n_threads: int | None = None, seed: int | None = None, verbose: bool = False, io: str = "direct",
                 chat_template: str | None = None, n_ubatch: int = N_UBATCH, expert_policy: str | None = None,
                 expert_prefetch: bool = True, draft_model=None, type_k: int | str | None = None,
                 type_v: int | str | None = None, kv_spill: bool | str | None = None, flash_attn: bool | None = None,
                 ray=None, stages: int = 2, stage_ram=None, context_shift: bool = False, n_seq: int = 1):
        from ..engine.engine import Engine
        from ..engine.speculative import DraftModel, check_draft_length

        self.path = str(resolve_model(path_or_name))
        self.name = str(path_or_name)
        self.budget = MemoryBudget(parse_memory_size(ram) if ram is not None else None)
        if not isinstance(n_ubatch, int) or n_ubatch < 1:
            raise InvalidArgument(f"n_ubatch must be a positive integer, got {n_ubatch!r}")
        if draft_model is not None and not callable(draft_model):
            raise InvalidArgument(f"draft_model must be a PromptLookup, a DraftModel or a callable input_ids -> "
                                  f"ids, got {type(draft_model).__name__}")
        if ray is not None and ray is not False:
            if draft_model is not None:
                raise InvalidArgument("a draft model is not supported with ray= (a pipeline of stages)")
            if type_k is not None or type_v is not None:
                raise InvalidArgument("type_k / type_v are not supported with ray= (the stages keep f16 caches)")
            if kv_spill:
                raise InvalidArgument("kv_spill is not supported with ray= (the stages keep their caches in RAM)")
            self.engine = _pipeline(path_or_name, ray, stages, stage_ram if stage_ram is not None else ram,
                                    n_ctx, io, n_threads)
            draft_model = None
        elif isinstance(draft_model, DraftModel):
            draft_model.path = str(resolve_model(draft_model.path))
            draft_model.attach(Engine.load, self.budget, n_ctx, n_threads)
        try:
            if ray is None or ray is False:
                self.engine = Engine.load(self.path, n_ctx=n_ctx, budget=self.budget, io=io, n_threads=n_threads,
                                          expert_policy=expert_policy, expert_prefetch=expert_prefetch,
                                          type_k=type_k, type_v=type_v, kv_spill=kv_spill, n_seq=n_seq)
        except BaseException:
            if isinstance(draft_model, DraftModel):
                draft_model.close()
            raise
        self.draft_model = draft_model
        if context_shift and (ray is not None and ray is not False):
            self.engine.close()
            raise InvalidArgument("context_shift is not supported with ray= (the KV caches live in the stages)")
        self.context_shift = bool(context_shift)     # llama-server's --context-shift (Engine.generate)
        self.batcher = None                          # n_seq > 1: requests share passes (ramforge.generation.batcher)
        if n_seq > 1:
            from .batcher import Batcher
            if draft_model is not None or self.context_shift:
                self.engine.close()
                raise InvalidArgument("n_seq > 1 (parallel requests) with a draft model or context_shift is "
                                      "not supported")
            self.batcher = Batcher(self.engine)
        if isinstance(draft_model, DraftModel):
            self.engine.closing.append(draft_model.close)
        if draft_model is not None:
            try:
                check_draft_length(draft_model, self.engine.n_ctx)
                if isinstance(draft_model, DraftModel):
                    draft_model.check_vocab(self.engine.tokenizer)
            except BaseException:
                self.engine.close()
                raise
        self.engine.ubatch = n_ubatch
        kv = getattr(self.engine, "kv", None)         # none in this process for a pipeline on Ray (f16 stages)
        self.flash_attn = kv is not None and (kv.type_k != "f16" or kv.type_v != "f16")
        if flash_attn is not None and bool(flash_attn) != self.flash_attn:
            self.engine.close()
            raise InvalidArgument(
                f"flash_attn={flash_attn!r} with a {kv.type_k if kv else 'f16'}/{kv.type_v if kv else 'f16'} KV cache: ramforge "
                f"reads an f16 cache as llama.cpp does without flash attention and a quantized one (q8_0, q4_0) as "
                f"its flash attention does; leave flash_attn unset")
        self.tokenizer = self.engine.tokenizer
        self.seed, self.verbose, self._chat_override = seed, verbose, chat_template
        self._chat = None
        self._chat_tool = None               # the GGUF's tool_use template (False: it has none)
        self._rendered = None                # the last render_chat's prompt (split_reasoning reads it)
        self.cache = None                    # a session.PromptCache (set_cache)

    # ---- embeddings (generation/embed.py) ------------------------------------------------------
    pooling = None      # the embedding pooling when a call names none (`ramforge serve --pooling`); None: the file's

    def embedder(self, pooling_type=None):
        """An embed.Embedder of this model: pooling_type, else `pooling`, else the file's ({arch}.pooling_type)."""
        from .embed import model_embedder
        return model_embedder(self, pooling_type)

    def embed(self, input, normalize: bool = False, truncate: bool = True, return_count: bool = False,
              pooling_type=None):
        """llama-cpp-python's Llama.embed: a list of floats for a string, a list of them for a list
        (pooling none: a list per token); normalize: each vector scaled to unit length as
        llama-cpp-python does (float64); truncate: inputs cut to the batch (512 tokens)."""
        from .embed import embed_inputs
        return embed_inputs(self, input, normalize, truncate, return_count, pooling_type)

    def create_embedding(self, input, model: str | None = None, pooling_type=None) -> dict:
        """llama-cpp-python's create_embedding: OpenAI's list of embedding objects, with usage."""
        from .embed import create_embedding
        return create_embedding(self, input, model, pooling_type)

    # ---- tokens ------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text, as llama_tokenize(vocab, text, add_special=add_bos, parse_special=special)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="surrogateescape")
        return self.tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(self, ids: list[int], special: bool = False) -> bytes:
        """UTF-8 bytes of ids (bytes, as llama-cpp-python returns)."""
        return self.tokenizer.decode_bytes(ids, special=special)

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    # ---- saved states (ramforge.generation.session) -------------------------------------------------------
    def save_state(self):
        """The sequence so far (tokens and KV cache) as a session.State, as llama-cpp-python's save_state."""
        from .session import save_state

        return save_state(self.engine)

    def load_state(self, state) -> None:
        """Continue from a session.State (or a state file's path); errors.StateError, the sequence left
        empty, when it was saved for another model, shape or KV type, or is damaged."""
        from .session import State, load_state, load_state_file

        if not isinstance(state, State):
            load_state_file(self.engine, state)       # streamed from the file into the cache
            return
        load_state(self.engine, state)

    def save_state_file(self, path) -> int:
        """Write the sequence so far to a state file (session's format); the bytes written."""
        from .session import write_state_file

        return write_state_file(path, self.engine)  # streamed from the cache, no copy of it in RAM

    def set_cache(self, cache) -> None:
        """A session.PromptCache (None: none): each prompt resumes from the saved sequence sharing its
        longest prefix, as llama-cpp-python's Llama.set_cache(LlamaRAMCache(...))."""
        if cache is not None:
            from .session import check_local

            check_local(self.engine)
        self.cache = cache

    # ---- generation --------------------------------------------------------------------------
    def stream(self, prompt: str | list[int], max_tokens: int = 256, *, stop: str | list[str] | None = None,
               special: bool = True, logprobs: int | None = None, logprobs_style: str = LCPP_LOGPROBS,
               grammar=None, n_keep: int | None = None, **sampling) -> Iterator[Response]:
        """Yield a Response per piece of text; the last one has done=True and the totals.

        sampling: the sampler parameters by the names of ramforge.sampling.params' table (temperature, top_k,
        top_p, ..., mirostat, dry_multiplier, logit_bias, seed); left out or None, the table's
        default (seed: the Model's). logprobs: 0..20 alternatives per token; each Response then
        carries the `logprobs.Step`s of its tokens (every generated token, the end-of-generation one
        excluded), computed as `logprobs_style` (ramforge.generation.logprobs) does. grammar: GBNF text
        (llama.cpp's dialect), a compiled ramforge.structured.Grammar or a llama_cpp.LlamaGrammar;
        errors.GrammarError when it is invalid. With a grammar the draft model is not used.
        n_keep: the tokens a context shift keeps (Model(context_shift=True); -1: the prompt; default 0),
        as llama-server's n_keep; InvalidArgument beyond the context."""
        if n_keep is not None and not (isinstance(n_keep, int) and -1 <= n_keep < self.n_ctx):
            raise InvalidArgument(f"n_keep = {n_keep!r} is beyond the context of {self.n_ctx} tokens")
        params = sampler_params(sampling, defaults={"seed": self.seed})
        grammar = self.compile_grammar(grammar)
        stops = stop_strings(stop)
        ids = self.tokenize(prompt, add_bos=True, special=special) if isinstance(prompt, str) else list(prompt)
        if max_tokens is None or max_tokens < 0:
            max_tokens = self.n_ctx - len(ids)
        if self.batcher is not None and (logprobs is not None or self.cache is not None):
            raise InvalidArgument("logprobs and the prompt cache are not supported with parallel requests "
                                  "(n_seq > 1)")
        if self.cache is not None:
            self.cache.resume(self.engine, ids)
        sampler = Sampler(params, self.engine.hp.n_vocab, chain=self.sampler_chain, tokenizer=self.tokenizer,
                          grammar=grammar)
        rec = Recorder(sampler, logprobs, logprobs_style) if logprobs is not None else None
        taken = 0

        def steps():                                   # the Steps of the tokens yielded so far, once
            nonlocal taken
            if rec is None:
                return None
            new, taken = rec.steps[taken:len(out)], len(out)
            return new
        eng, dec, hold = self.engine, self.tokenizer.stream(), max((len(s) for s in stops), default=1) - 1
        text, sent, out, finish = "", 0, [], "length"
        shift = {"context_shift": True, "n_keep": n_keep or 0} if self.context_shift else {}
        if self.batcher is not None:                   # a slot of the shared passes
            gen = self.batcher.generate(ids, max_tokens, sampler) if max_tokens > 0 else iter(())
        else:
            gen = eng.generate(ids, max_tokens, rec or sampler, reuse_prefix=True, **shift,
                           draft=self.draft_model if grammar is None else None,
                               outputs_all=rec is not None and logprobs_style == LCPP_LOGPROBS)  # logits_all=True
        for tok in gen:
            out.append(tok)
            text += dec.feed(tok)
            cut = min((i for i in (text.find(s, max(0, sent - hold)) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
                break
            if len(text) - hold > sent:
                yield Response(text[sent:len(text) - hold], tok, logprobs=steps())
                sent = len(text) - hold
        else:
            if len(out) < max_tokens:
                finish = "stop"
            text += dec.flush()
        gen.close()
        t = eng.timings
        if self.batcher is not None:                   # the engine's timings are every slot's
            yield Response(text[sent:], None, True, finish, len(ids), len(ids), len(out), tokens=out)
            return
        yield Response(text[sent:], None, True, finish, len(ids), t.prompt_tokens, len(out), t.prompt_s, t.gen_s,
                       t.load_s, out, t.compile_s, speculative=t.spec.as_dict() if t.spec is not None else None,
                       logprobs=steps())

    def compile_grammar(self, grammar):
        """A ramforge.structured.Grammar for this model's vocabulary from GBNF text, a Grammar, or an
        object holding GBNF in `_grammar` (llama_cpp.LlamaGrammar); None stays None."""
        if grammar is None:
            return None
        from ..structured import Grammar, compile_grammar

        if isinstance(grammar, Grammar):
            return grammar
        text = grammar if isinstance(grammar, str) else getattr(grammar, "_grammar", None)
        if not isinstance(text, str):
            raise InvalidArgument(f"grammar must be GBNF text or a Grammar, not {type(grammar).__name__}")
        return compile_grammar(text, self.tokenizer)

    def generate(self, prompt: str | list[int], max_tokens: int = 256, **kwargs) -> Response:
        """The whole completion as one Response (text, token ids, counts and timings)."""
        return self._collect(self.stream(prompt, max_tokens, **kwargs))

    # ---- OpenAI-shaped -----------------------------------------------------------------------
    def create_completion(self, prompt: str | list[int], max_tokens: int | None = 16, stream: bool = False,
                          logprobs: int | None = None, **kwargs):
        """An OpenAI text_completion dict, or an iterator of chunks with stream=True. kwargs: stop and
        the sampler parameters, as `stream` takes them. logprobs: 0..20 alternatives per token, in
        llama-cpp-python's (OpenAI's legacy) shape; streamed, each chunk has those of its tokens."""
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if logprobs is not None:
            check_top(logprobs, "logprobs")
        chunks = self.stream(prompt, max_tokens if max_tokens is not None else -1, logprobs=logprobs, **kwargs)
        done = b""

        def shape(text, finish, steps, usage=None):
            nonlocal done
            lp = None
            if steps:           # llama-cpp-python: text offsets count the prompt's characters
                lp = legacy_logprobs(steps, self.tokenizer, len(prompt), done)
                done += self.tokenizer.decode_bytes([s.token for s in steps])
            d = {"id": cid, "object": "text_completion", "created": created, "model": self.name,
                 "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}
            if usage:
                d["usage"] = usage
            return d

        if stream:
            return (shape(r.text, r.finish_reason, r.logprobs) for r in chunks)
        r = self._collect(chunks)
        return shape(r.text, r.finish_reason, r.logprobs, _usage(r))

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None, stream: bool = False,
                               chat_template_kwargs: dict | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, tools: list[dict] | None = None,
                               tool_choice=None, response_format: dict | None = None, **kwargs):
        """An OpenAI chat.completion dict, or an iterator of chat.completion.chunk dicts. logprobs:
        each token's, with top_logprobs (0..20) alternatives, in llama-cpp-python's chat shape.
        tools: the model's calls come back as `tool_calls` (ramforge.generation.tools_call), finish_reason
        "tool_calls"; streamed as deltas. tool_choice "required" or a named function: a grammar
        makes the answer that call (`tools_call.call_grammar`). response_format: {"type":
        "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}} (the grammar
        llama.cpp's json_schema_to_grammar writes; ramforge.structured)."""
        calls_in = ToolSession(tools, tool_choice)
        msgs, tools_for = calls_in.prepare(self.chat_template(bool(tools)).text, messages)
        forced = [(what, g) for what, g in (("grammar", kwargs.get("grammar")),
                                            ("response_format", _response_grammar(response_format)),
                                            ("tool_choice", calls_in.grammar())) if g is not None]
        if len(forced) > 1:
            raise InvalidArgument(f"{forced[0][0]} and {forced[1][0]} cannot be used together: "
                                  "each constrains the whole answer")
        if forced:
            kwargs["grammar"] = forced[0][1]
        from .chat import check_template_kwargs

        prompt = self.render_chat(msgs, tools=tools_for, **check_template_kwargs(chat_template_kwargs))
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        n_top = check_top(top_logprobs or 0) if logprobs else None
        chunks = self.split_reasoning(self.stream(prompt, max_tokens if max_tokens is not None else -1,
                                                  logprobs=n_top, **kwargs))

        def lp(steps):
            return chat_logprobs_lcpp(legacy_logprobs(steps, self.tokenizer)) if steps else None

        def chunk(delta, finish, steps=None):
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.name,
                    "choices": [{"index": 0, "delta": delta, "logprobs": lp(steps), "finish_reason": finish}]}

        if stream:
            def gen():
                yield chunk({"role": "assistant"}, None)
                for r in chunks:
                    if r.thinking:
                        yield chunk({"reasoning_content": r.thinking}, None)
                    text, calls, cs = r.text, [], calls_in.stream
                    if cs is not None:
                        text, calls = cs.feed(r.text)
                        if r.done:
                            more, rest = cs.finish()
                            text, calls = text + more, calls + rest
                    if text or r.logprobs:
                        yield chunk({"content": text}, None, r.logprobs)
                    if calls:
                        yield chunk({"tool_calls": calls}, None)
                    if r.done:
                        yield chunk({}, "tool_calls" if cs is not None and cs.calls else r.finish_reason)
            return gen()
        r = self._collect(chunks)
        content, calls = calls_in.parse(r.text)
        message = {"role": "assistant", "content": content if content or not calls else None}
        if r.thinking:
            message["reasoning_content"] = r.thinking       # as llama-server reports it
        if calls:
            message["tool_calls"] = openai_calls(calls, calls_in.fmt)
        return {"id": cid, "object": "chat.completion", "created": created, "model": self.name,
                "choices": [{"index": 0, "message": message, "logprobs": lp(r.logprobs),
                             "finish_reason": "tool_calls" if calls else r.finish_reason}], "usage": _usage(r)}

    def split_reasoning(self, responses, prompt: str | None = None):
        """The Responses of a chat with the model's reasoning moved from `text` to `thinking` (gpt-oss's
        harmony channels, a `<think>` block: ramforge.generation.reasoning); unchanged for a model without a
        reasoning format. prompt: the rendered chat (default: the last render_chat's), which tells
        whether a `<think>` block is already open."""
        parser = parser_for(self.chat_template().text, prompt if prompt is not None else getattr(self, "_rendered", None))
        for r in responses:
            if parser is not None:
                r.thinking, r.text = parser.feed(r.text)
                if r.done:
                    a, b = parser.flush()
                    r.thinking, r.text = r.thinking + a, r.text + b
            yield r

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text the model's chat template makes of messages (with tools, the GGUF's tool_use
        template where it has one)."""
        chat = self.chat_template(bool(kwargs.get("tools")))
        text = chat.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        self._rendered = text
        return chat.strip_special(text)      # llama.cpp's rule: the tokenizer adds BOS itself

    def chat_template(self, tools: bool = False):
        """The model's chat.ChatTemplate (loaded once). tools: a request with tools gets the GGUF's
        `tokenizer.chat_template.tool_use` where it has one (and no template was given), as llama.cpp."""
        from .model_chat import model_template
        return model_template(self, tools)

    def _is_default(self) -> bool:
        return is_default_model(self.name, self.path)

    @staticmethod
    def _collect(chunks) -> Response:
        """The last Response with the whole text, thinking and logprobs Steps."""
        parts, thoughts, steps = [], [], []
        for r in chunks:
            parts.append(r.text)
            thoughts.append(r.thinking)
            steps += r.logprobs or []
        r.text, r.thinking = "".join(parts), "".join(thoughts)
        r.logprobs = steps if r.logprobs is not None else None
        return r

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "batcher", None) is not None:
            self.batcher.close()
        self.engine.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pipeline(model, ray, stages, stage_ram, n_ctx, io, n_threads):
    """cluster.Pipeline for Model(ray=...)."""
    from ..cluster import Pipeline

    opts = dict(ray) if isinstance(ray, dict) else {"address": None if ray is True else ray}
    opts["stages"] = opts.get("stages") or stages
    opts["stage_ram"] = opts.get("stage_ram") or stage_ram
    return Pipeline(model, n_ctx=n_ctx, io=io, n_threads=n_threads, **opts)


def _response_grammar(response_format) -> str | None:
    """The GBNF of an OpenAI response_format (None for text or none)."""
    if response_format is None:
        return None
    from ..structured import for_response_format

    return for_response_format(response_format)


def _usage(r: Response) -> dict:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens}
