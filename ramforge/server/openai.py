"""OpenAI's API: /v1/chat/completions, /v1/completions (SSE streams ending in `data: [DONE]`), /v1/models.

Request models forbid unknown fields but declare every field the official `openai` client can
send: those that change nothing here (user, metadata, store, service_tier, prompt_cache_key,
...) are accepted and ignored; reasoning_effort goes to the chat template (gpt-oss's harmony reads it), and
a reasoning model's thinking comes back as `reasoning_content`, as llama-server reports it; those asking for something ramforge cannot do
(n > 1, audio) are a 400. response_format (json_object, json_schema) and llama-server's `grammar` /
`json_schema` constrain the answer (ramforge.structured). With `tools`, the model's calls come back
as `tool_calls` (finish_reason "tool_calls"; streamed as deltas: id, type, name, then argument
chunks) in the template's format (ramforge.generation.tools_call); tool_choice "required" or a named function
is forced by a grammar; a tool without a name or a tool_choice naming no tool is a 400. Messages
also accept the fields a client echoes back from an earlier response (refusal,
annotations, audio: null). Extensions, as llama.cpp's server takes them (the client's
`extra_body`): top_k, min_p, typical_p, repeat_penalty, repeat_last_n, min_keep, top_n_sigma,
xtc_*, dynatemp_*, mirostat*, dry_* (the rest of ramforge.sampling.params' table), chat_template_kwargs;
logit_bias takes OpenAI's {"token id": bias} or llama-server's [[id, bias], ...], false banning a
token. Out of range, xtc_* and mirostat are clamped and a dry_base below 1 is its default, as
llama-server does; the rest is a 400.

logprobs (ramforge.generation.logprobs): chat's `logprobs`/`top_logprobs` in llama-server's shape (`logprobs.content[]`
with id, token, bytes, logprob and top_logprobs; top_logprobs defaults to 20 as there, and without
logprobs is a 400), streamed with each chunk's tokens; /v1/completions' `logprobs: N` in OpenAI's
legacy shape as llama-cpp-python returns it. Above 20 is a 400.

Defaults are the GGUF's `general.sampling.*` where it has them (as llama-server applies them beneath a
request's values), else OpenAI's (temperature 1, top_p 1, no penalties) with Ollama's top_k 40; max_tokens
defaults to 16 for /v1/completions (as OpenAI) and to the room left in the context for chat; a
max_tokens beyond the room left is cut to it (the answer then ends with finish_reason "length"), as
llama-server does. A model name that reaches no model means the loaded one (else the startup one), as
llama-server serves any name (ModelManager.resolve_lenient). reasoning_effort "none" turns thinking off,
"xhigh" is harmony's "high"; parallel_tool_calls false keeps the first call only. /v1/completions'
`suffix` is fill-in-the-middle (generation.fim).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model

from ..generation.chat import check_template_kwargs
from ..errors import EmptyPrompt, InvalidArgument, ModelNotFound, UnsupportedField
from ..generation.logprobs import LCPP, MAX_TOP, SERVER, chat_logprobs, legacy
from ..structured import for_request
from ..generation.tools_call import ToolSession, openai_calls
from .common import (MAX_CTX, MAX_NAME, MAX_PREDICT, MAX_TOP_K, check_messages, error_body, error_status,
                     model_sampling_defaults, request_sampling, sampler_fields, stop_list)
from ..generation.fim import fim_prompt
from .jobs import Job, stream_job
from .manager import list_models, manager_of

router = APIRouter()
SSE = "text/event-stream"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


# The sampler fields: ramforge.sampling.params' names; OpenAI's defaults (temperature 1, top_p 1, no min_p)
# and OpenAI's documented ranges, llama.cpp's for the extensions, a cap on top_k; any 64-bit seed.
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0}
BOUNDS = {"temperature": (0, 2), "frequency_penalty": (-2, 2), "presence_penalty": (-2, 2), "top_k": (0, MAX_TOP_K),
          "repeat_penalty": (0, 100), "repeat_last_n": (-1, MAX_CTX), "seed": (-(2 ** 63), 2 ** 64 - 1)}
_SamplerFields = create_model("_SamplerFields", __base__=Strict, **sampler_fields(BOUNDS))


class _Common(_SamplerFields):
    model: str = Field("", max_length=MAX_NAME)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1)
    stop: str | list[str] | None = None
    user: str | None = None
    n_keep: int | None = Field(None, ge=-1, le=MAX_CTX)   # llama-server's: a context shift's kept tokens
    grammar: str | None = None           # llama-server's extensions: GBNF, or a JSON schema
    json_schema: dict | None = None
    _gbnf: str | None = PrivateAttr(None)

    def check(self) -> None:
        stop_list(self.stop)
        # a bad grammar or schema is a 400 here, before the request queues (ramforge.structured)
        self._gbnf = for_request(self.grammar, self.json_schema, getattr(self, "response_format", None))
        self.sampling()                  # a bad combination fails here, before the request queues

    def sampling(self, model_defaults: dict | None = None) -> dict:
        """The sampler parameters: the request's, else the GGUF's `general.sampling.*` (model_defaults, as
        llama-server applies them), else OpenAI's."""
        seed = None if self.seed is None or self.seed < 0 else self.seed % 0xFFFFFFFF  # 0xFFFFFFFF = random
        return {**request_sampling(self, {**DEFAULTS, **(model_defaults or {})}, seed), **self.logprob_args()}

    def logprob_args(self) -> dict:
        """Model.stream's logprobs keywords (ramforge.generation.logprobs); none when not asked."""
        return {}

    def generation(self, model_defaults: dict | None = None) -> dict:
        """Model.stream's keywords: the sampler parameters and the grammar (None: unconstrained)."""
        return {**self.sampling(model_defaults), "grammar": self._gbnf, **({} if self.n_keep is None else {"n_keep": self.n_keep})}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    function_call: dict | None = None
    refusal: str | None = None
    audio: dict | None = None
    annotations: list | None = None
    reasoning_content: str | None = None

    def for_template(self) -> dict:
        if self.audio or self.function_call:
            raise UnsupportedField("audio and function_call messages are not supported")
        m = {"role": "system" if self.role == "developer" else self.role,
             "content": "" if self.content is None and not self.tool_calls else self.content}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, key):
                m[key] = getattr(self, key)
        return m


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0, le=MAX_PREDICT)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_PREDICT)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    response_format: dict | None = None
    chat_template_kwargs: dict | None = None
    # accepted, no effect here
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict | None = None
    safety_identifier: str | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    # asking for what ramforge cannot do: only null
    audio: dict | None = None
    prediction: dict | None = None
    web_search_options: dict | None = None
    moderation: dict | None = None

    def logprob_args(self) -> dict:
        # llama-server: top_logprobs defaults to 20 when logprobs is true
        if not self.logprobs:
            return {}
        return {"logprobs": 20 if self.top_logprobs is None else self.top_logprobs, "logprobs_style": SERVER}

    def check(self) -> None:
        check_messages(len(self.messages))              # over MAX_MESSAGES: 400
        check_template_kwargs(self.chat_template_kwargs)  # not messages, tools, bos_token, ...: 400
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidArgument("top_logprobs requires logprobs to be set to true")
        session = ToolSession(self.tools, self.tool_choice)                # bad tools: 400
        forced = session.choice not in ("auto", "none")
        if forced:
            session.grammar()            # the forced call's schemas convert (or 400) before the request queues
        if forced and self._gbnf is not None:
            raise InvalidArgument(f"tool_choice {json.dumps(self.tool_choice)} forces a call by a grammar; "
                                  "it cannot be used with response_format, grammar or json_schema")
        if self.functions or self.function_call:
            raise UnsupportedField("functions / function_call are not supported; use tools")
        if self.modalities not in (None, ["text"]):
            raise UnsupportedField("only the text modality is supported")
        for name in ("audio", "prediction", "web_search_options", "moderation"):
            if getattr(self, name) is not None:
                raise UnsupportedField(f"{name} is not supported")


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0, le=MAX_PREDICT)
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: str | None = None

    def logprob_args(self) -> dict:
        return {} if self.logprobs is None else {"logprobs": self.logprobs, "logprobs_style": LCPP}

    def check(self) -> None:
        super().check()
        if self.logprobs is not None and self.echo:
            raise UnsupportedField("logprobs with echo (the prompt's logprobs) are not supported")

    def one_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if not p:
            raise EmptyPrompt("the prompt is empty")
        if isinstance(p[0], int):
            return list(p)
        if len(p) > 1:
            raise UnsupportedField(f"{len(p)} prompts in one request: batched prompts are not supported (n = 1)")
        return p[0] if isinstance(p[0], str) else list(p[0])


def _effort_kwargs(effort: str | None) -> dict:
    """reasoning_effort as chat template keywords: the level as gpt-oss's harmony reads it (low, medium,
    high; "xhigh" is its "high"), and thinking on, or off for "none" (qwen3's enable_thinking)."""
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False, "reasoning_effort": "low"}
    return {"enable_thinking": True, "reasoning_effort": "high" if effort == "xhigh" else effort}


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _sse_error(path: str):
    return lambda e: _sse(error_body(path, error_status(e), str(e)))


def _stream_end(req, head: dict, r) -> list[str]:
    """A stream's last lines: the usage chunk (`head` + no choices) when stream_options asks, then [DONE]."""
    usage = [_sse({**head, "choices": [], "usage": _usage(r), **_timings(r)})] if req.include_usage else []
    return usage + ["data: [DONE]\n\n"]


def _timings(r) -> dict:
    """llama-server's `timings` extension, for speculative decoding's counters (draft_n, draft_n_accepted)."""
    spec = r.speculative
    return {"timings": {"draft_n": spec["drafted"], "draft_n_accepted": spec["accepted"]}} if spec else {}


def _usage(r) -> dict:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": r.prompt_tokens - r.prompt_eval_tokens}}


@dataclass
class ChatRun:
    """A started chat request: its job, its tool session, and the names its answer carries."""

    job: Job
    tools: ToolSession
    one_call: bool          # parallel_tool_calls false: at most one call, as llama-server
    name: str

    def calls(self, calls: list) -> list:
        return calls[:1] if self.one_call else calls


async def start_chat(req: ChatRequest, request: Request) -> ChatRun:
    """Check a chat request, render it (with tools, the GGUF's tool_use template where it has one) and
    start its generation: the one chat path, of /v1/chat/completions and /v1/responses."""
    await anyio.to_thread.run_sync(req.check)       # a grammar or schema is CPU work: off the event loop
    messages = [m.for_template() for m in req.messages]
    kwargs = {**_effort_kwargs(req.reasoning_effort), **(req.chat_template_kwargs or {})}
    tools = ToolSession(req.tools, req.tool_choice)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    m = manager_of(request)
    target = await anyio.to_thread.run_sync(m.resolve_lenient, req.model)      # once per request
    generation = req.generation(await anyio.to_thread.run_sync(model_sampling_defaults, target.path))

    def build(model):
        msgs, kwargs["tools"] = tools.prepare(model.chat_template(tools.active).text, messages)
        forced = tools.grammar()                  # tool_choice "required" / a named function
        if forced is not None:
            generation["grammar"] = forced
        return model.tokenize(model.render_chat(msgs, **kwargs), add_bos=True, special=True)

    job = await Job.start(m, model=target, num_ctx=None, keep_alive=None, build=build,
                          max_tokens=max_tokens, clamp=False, sampling=generation, stop=stop_list(req.stop),
                          chat=True, length_finish=True)
    return ChatRun(job, tools, req.parallel_tool_calls is False, req.model or job.loaded.name)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatRequest, request: Request):
    run = await start_chat(req, request)
    job, tools, one_call, name = run.job, run.tools, run.one_call, run.name
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def lp(steps):
        return chat_logprobs(steps, job.model.tokenizer) if steps is not None and req.logprobs else None

    if not req.stream:
        r = await job.collect(request)
        content, calls = tools.parse(r.text)
        calls = run.calls(calls)
        message = {"role": "assistant", "content": content if content or not calls else None}
        if r.thinking:
            message["reasoning_content"] = r.thinking          # as llama-server reports it
        if calls:
            message["tool_calls"] = openai_calls(calls, tools.fmt)
        return {"id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": message, "logprobs": lp(r.logprobs),
                             "finish_reason": "tool_calls" if calls else r.finish_reason}],
                "usage": _usage(r), **_timings(r)}

    def chunk(delta: dict, finish=None, steps=None) -> str:
        return _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                     "choices": [{"index": 0, "delta": delta, "logprobs": lp(steps), "finish_reason": finish}]})

    started = False

    def lines(r):
        nonlocal started
        out = []
        if not started:
            started = True
            out.append(chunk({"role": "assistant", "content": ""}))
        if r.thinking:
            out.append(chunk({"reasoning_content": r.thinking}))
        text, calls = r.text, []
        if tools.stream is not None:                # the answer through the tool-call parser
            text, calls = tools.stream.feed(r.text)
            if r.done:
                more, rest = tools.stream.finish()
                text, calls = text + more, calls + rest
            if one_call:
                calls = [c for c in calls if c.get("index", 0) == 0]
        if text or r.logprobs:
            out.append(chunk({"content": text}, None, r.logprobs or None))
        if calls:
            out.append(chunk({"tool_calls": calls}))
        if r.done:
            called = tools.stream is not None and tools.stream.calls
            out.append(chunk({}, "tool_calls" if called else r.finish_reason))
            head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name}
            out += _stream_end(req, head, r)
        return out

    return stream_job(job, lines, _sse_error(request.url.path), SSE)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    req.check()
    prompt = req.one_prompt()
    m = manager_of(request)
    target = await anyio.to_thread.run_sync(m.resolve_lenient, req.model)      # once per request
    sampling = req.generation(await anyio.to_thread.run_sync(model_sampling_defaults, target.path))

    def build(model):
        if req.suffix:                          # fill-in-the-middle with the model's FIM tokens (generation.fim)
            prefix = prompt if isinstance(prompt, str) else model.detokenize(prompt).decode("utf-8", "replace")
            return fim_prompt(model.tokenizer, prefix, req.suffix, error=UnsupportedField, spm=m.cfg.spm_infill)
        return model.tokenize(prompt, add_bos=True, special=True) if isinstance(prompt, str) else prompt

    job = await Job.start(m, model=target, num_ctx=None, keep_alive=None, build=build,
                          max_tokens=req.max_tokens, clamp=False, sampling=sampling, stop=stop_list(req.stop),
                          length_finish=True)
    cid, created, name = f"cmpl-{uuid.uuid4().hex}", int(time.time()), req.model or job.loaded.name
    echo = ""
    if req.echo:
        echo = prompt if isinstance(prompt, str) else \
            job.model.detokenize(prompt, special=True).decode("utf-8", "replace")

    done = b""

    def shape(text: str, finish, usage=None, steps=None) -> dict:
        nonlocal done
        lp = None
        if steps is not None and req.logprobs is not None:     # llama-cpp-python's legacy shape
            tok = job.model.tokenizer
            lp = legacy(steps, tok, len(prompt), done)
            done += tok.decode_bytes([s.token for s in steps])
        d = {"id": cid, "object": "text_completion", "created": created, "model": name,
             "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}
        if usage is not None:
            d["usage"] = usage
        return d

    if not req.stream:
        r = await job.collect(request)
        return shape(echo + r.text, r.finish_reason, _usage(r), r.logprobs) | _timings(r)

    started = False

    def lines(r):
        nonlocal started
        out = []
        if not started and echo:
            out.append(_sse(shape(echo, None)))
        started = True
        if (r.text or r.logprobs) and not r.done:
            out.append(_sse(shape(r.text, None, None, r.logprobs)))
        if r.done:
            out.append(_sse(shape(r.text, r.finish_reason, None, r.logprobs)))
            out += _stream_end(req, {"id": cid, "object": "text_completion", "created": created, "model": name}, r)
        return out

    return stream_job(job, lines, _sse_error(request.url.path), SSE)


def _model_entry(x: dict) -> dict:
    return {"id": x["name"], "object": "model", "created": int(x.get("mtime") or 0), "owned_by": "ramforge"}


@router.get("/v1/models")
async def models(request: Request):
    found = await anyio.to_thread.run_sync(list_models, manager_of(request))
    return {"object": "list", "data": [_model_entry(x) for x in found]}


@router.get("/v1/models/{model_id}")
async def model(model_id: str, request: Request):
    found = await anyio.to_thread.run_sync(list_models, manager_of(request))
    for x in found:
        if x["name"] == model_id:
            return _model_entry(x)
    raise ModelNotFound(f"model {model_id!r} not found; GET /v1/models lists the names")

