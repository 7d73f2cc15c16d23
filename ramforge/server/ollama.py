"""Ollama's API: /api/generate, /api/chat (NDJSON streams), /api/tags, /api/show, /api/ps, /api/version.

Request models accept every field Ollama's Go types define (api.GenerateRequest, ChatRequest,
ShowRequest, Message, Options, Runner: the Go client sends several of them empty or null always)
and refuse an unknown top-level field. In `options`, the sampler table's names (ramforge.sampling.params)
are honoured; num_ctx, num_predict, stop, num_keep too; num_thread, num_batch and use_mmap are load-time
knobs (a model loaded with others is reloaded, as Ollama reloads its runner); num_gpu, main_gpu and
draft_num_predict are accepted and change nothing; any other key is logged and ignored, as Ollama's
Options.FromMap does. think takes true, false, "low", "medium", "high" and "max". `suffix` is
fill-in-the-middle with the model's FIM tokens (generation.fim; a 400 naming them where the model has
none); images and Go templates are a 400; `format` ("json" or a JSON schema) constrains the answer
(ramforge.structured). num_ctx above the model's trained context (or `serve --max-ctx`) is clamped
to it, as Ollama does. A chat longer than num_ctx loses its oldest messages first, as Ollama's
chatPrompt drops them (system messages and the last message kept, a tool result with the call it
answers; `truncate: false` keeps them all, and an overflow is a 400); a generate prompt is cut as
Ollama's runner cuts it where the server shifts the context (`shift: false`: no shift). logprobs /
top_logprobs (0..20): Ollama's `logprobs` list beside each chunk's text. `_debug_render_only`
answers the rendered prompt. /api/show (its answer, capabilities, parameters): server.showinfo.

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, min_p 0, num_predict -1 = until an
end-of-generation token or the context is full), except repeat_penalty 1.0 (Ollama's is 1.1): no
penalty, so that temperature 0 is plain greedy decoding here as on /v1 and in `ramforge.Model`.
"""
from __future__ import annotations

import json
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, field_validator, model_validator

from .._version import __version__
from ..errors import InvalidArgument, Unsupported, UnsupportedField
from ..generation.logprobs import MAX_TOP, SERVER, ollama_entry
from ..structured import for_ollama_format
from ..generation.tools_call import ToolSession, ollama_calls
from .common import (MAX_CTX, MAX_NAME, MAX_PREDICT, MAX_TOP_K, Runner, check_messages, clamp_num_ctx, details_of,
                     fit_messages, iso, log, now_iso, parse_keep_alive, request_sampling, sampler_fields,
                     stop_list)
from ..generation.fim import fim_prompt
from .showinfo import locate_for_show, model_digest, show_response
from .jobs import Job, stream_job
from .manager import ModelManager, Target, list_models, manager_of
from .models_api import apply_modelfile

router = APIRouter()
NDJSON = "application/x-ndjson"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


# The sampler options: ramforge.sampling.params' names; Ollama's defaults where they differ from the table's,
# and the bounds a request may ask where they are narrower (or, for the seed, wider: any negative
# seed means random, as in Ollama).
DEFAULTS = {"top_p": 0.9, "min_p": 0.0}
BOUNDS = {"temperature": (0, 100), "top_k": (0, MAX_TOP_K), "repeat_penalty": (0, 100), "repeat_last_n": (-1, MAX_CTX),
          "presence_penalty": (-100, 100), "frequency_penalty": (-100, 100), "seed": (-(2 ** 63), 0xFFFFFFFF)}
_SamplerOptions = create_model("_SamplerOptions", __base__=Strict, **sampler_fields(BOUNDS))


# Options Ollama's Go types define (api.Options, api.Runner) beside the sampler table's; any other key is
# logged and ignored, as Ollama's Options.FromMap does ("invalid option provided").
MAX_UBATCH = 8192


class Options(_SamplerOptions):
    # honoured, besides the sampler options
    num_ctx: int | None = Field(None, ge=1, le=MAX_CTX)
    num_predict: int | None = Field(None, ge=-2, le=MAX_PREDICT)
    stop: str | list[str] | None = None
    num_keep: int | None = Field(None, ge=-1, le=MAX_CTX)   # a context shift's kept tokens (serve --context-shift)
    # load-time knobs (a model loaded with others is reloaded, as Ollama reloads its runner); 0: the server's
    num_batch: int | None = Field(None, ge=0, le=MAX_UBATCH)  # the prompt's batch (Model's n_ubatch)
    num_thread: int | None = Field(None, ge=0)                # kernel threads, at most NUMBA_NUM_THREADS
    use_mmap: bool | None = None                              # true: mmap I/O; false: the server's (else direct)
    # accepted, no effect here: no GPU, and speculative decoding is the server's --draft
    num_gpu: int | None = None
    main_gpu: int | None = None
    draft_num_predict: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _unknown(cls, data):
        if isinstance(data, dict):
            unknown = [k for k in data if k not in cls.model_fields]
            for k in unknown:
                log.warning("invalid option provided: %s (ignored, as Ollama ignores it)", str(k)[:100])
            if unknown:
                data = {k: v for k, v in data.items() if k in cls.model_fields}
        return data

    def check(self) -> "Options":
        stop_list(self.stop)
        top = _max_threads()
        if self.num_thread and self.num_thread > top:
            raise InvalidArgument(f"options.num_thread = {self.num_thread} is more than the {top} kernel threads this "
                                  f"server can run (NUMBA_NUM_THREADS); use 0 for the server's")
        self.sampling()                  # a bad combination fails here, before the request queues
        return self

    def runner(self, cfg) -> Runner:
        """The load-time knobs asked for (None: the server's)."""
        io = None
        if self.use_mmap is True:
            io = "mmap"
        elif self.use_mmap is False and cfg.io == "mmap":
            io = "direct"
        return Runner(n_threads=self.num_thread or None, io=io, n_ubatch=self.num_batch or None)

    def sampling(self) -> dict:
        seed = None if self.seed is None or self.seed < 0 else self.seed
        return request_sampling(self, DEFAULTS, seed)


def _max_threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


THINK_LEVELS = ("low", "medium", "high", "max")     # Ollama's think levels (gpt-oss's reasoning effort)


class _Generating(Strict):
    model: str = Field("", max_length=MAX_NAME)
    stream: bool | None = True
    format: Any = None
    options: Options | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP)
    truncate: bool | None = None     # Ollama's: fit the prompt to num_ctx (default true)
    shift: bool | None = None        # Ollama's: shift the context when it fills (default true; serve --context-shift)
    debug_render_only: bool | None = Field(None, alias="_debug_render_only")   # the prompt, not generated
    _gbnf: str | None = PrivateAttr(None)

    def check(self) -> Options:
        self._gbnf = for_ollama_format(self.format)      # "json" or a JSON schema: ramforge.structured
        if isinstance(self.think, str) and self.think not in THINK_LEVELS:
            raise UnsupportedField(f"invalid think value: {self.think!r} (must be true, false or one of "
                                   f"{', '.join(THINK_LEVELS)})")
        return (self.options or Options()).check()

    def logprob_args(self) -> dict:
        """Model.stream's logprobs keywords: logprobs true, with top_logprobs (0..20) alternatives."""
        return {"logprobs": self.top_logprobs or 0, "logprobs_style": SERVER} if self.logprobs else {}

    def template_kwargs(self) -> dict:
        """think: true/false as enable_thinking (qwen3's templates); a level as reasoning_effort (gpt-oss's;
        "max" is "high" there, as Ollama maps it for harmony) with thinking on."""
        if self.think is None:
            return {}
        if isinstance(self.think, str):
            return {"reasoning_effort": "high" if self.think == "max" else self.think, "enable_thinking": True}
        return {"enable_thinking": bool(self.think)}

    def sampling(self, opts: Options) -> dict:
        """Model.stream's keywords: the options' sampler parameters, logprobs and the grammar."""
        keep = {} if opts.num_keep is None else {"n_keep": opts.num_keep}
        return {**opts.sampling(), **self.logprob_args(), "grammar": self._gbnf, **keep}


class GenerateRequest(_Generating):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[Annotated[int, Field(ge=0, lt=2 ** 31)]] | None = Field(None, max_length=MAX_CTX)
    raw: bool | None = None
    images: list[str] | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    def check(self) -> Options:
        if self.template:
            raise UnsupportedField("template (a Go template) is not supported: the model's chat template is used, "
                                "or pass raw: true with the prompt already formatted")
        if self.images:
            raise UnsupportedField("images are not supported")
        if self.width is not None or self.height is not None or self.steps is not None:
            raise UnsupportedField("image generation is not supported")
        return super().check()


class Message(Strict):
    role: str = Field(min_length=1, max_length=64)
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[dict] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _lower(cls, v: str) -> str:
        return v.lower()                 # as Ollama's Message.UnmarshalJSON

    def for_template(self) -> dict:
        if self.images:
            raise UnsupportedField("images are not supported")
        m = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            m["tool_calls"] = self.tool_calls
        if self.tool_name:
            m["name"] = self.tool_name
        if self.tool_call_id:
            m["tool_call_id"] = self.tool_call_id
        return m


class ChatRequest(_Generating):
    messages: list[Message] | None = None
    tools: list[dict] | None = None

    def check(self) -> Options:
        check_messages(len(self.messages or ()))        # over MAX_MESSAGES: 400
        ToolSession(self.tools)                          # a tool without a name: 400
        return super().check()


class ShowRequest(Strict):
    """Ollama's api.ShowRequest: the Go client always sends every field (no omitempty)."""
    model: str | None = Field(None, max_length=MAX_NAME)
    name: str | None = Field(None, max_length=MAX_NAME)      # the older spelling
    verbose: bool | None = None
    system: str | None = None        # shown as the model's system message, as Ollama does
    template: str | None = None      # shown as its template
    options: dict | None = None      # shown among its parameters


def _logprobs(req: _Generating, job: Job):
    """d -> d with Ollama's `logprobs` (the entries of r's tokens) when the request asked for them."""
    def add(d: dict, r) -> dict:
        if req.logprobs and r.logprobs:
            d["logprobs"] = [ollama_entry(s, job.model.tokenizer) for s in r.logprobs]
        return d
    return add


async def _checked(req: _Generating, m: ModelManager) -> tuple[Options, int | None, Target]:
    """The request's checks (a grammar or schema is converted and parsed: CPU work, so off the event
    loop), its num_ctx as Ollama clamps it to the model's trained context (and --max-ctx), and its model
    resolved (once per request: the Target the rest of the request uses). A created model's PARAMETERs
    and SYSTEM go under the request's own (models_api.apply_modelfile)."""
    opts = await anyio.to_thread.run_sync(req.check)
    target = await anyio.to_thread.run_sync(m.resolve, req.model)
    if target.config:
        apply_modelfile(req, target.config, Options, Message)
        opts = await anyio.to_thread.run_sync(req.check)
    if opts.num_ctx is None:
        return opts, None, target
    return opts, await anyio.to_thread.run_sync(clamp_num_ctx, opts.num_ctx, target.path, m.cfg.max_ctx), target


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def _load_or_unload(m: ModelManager, target: Target, num_ctx, keep_alive, runner=None) -> tuple[str, str]:
    """An empty prompt: load the model (keep_alive as given), or with keep_alive 0 unload it."""
    await m.acquire()
    try:
        if keep_alive == 0:
            if m.current is not None and m.current.path == target.path:
                await m.unload()
            return target.name, "unload"
        loaded, _ = await m.ensure(target, num_ctx, runner)
        loaded.keep(m.cfg.keep_alive if keep_alive is None else keep_alive)
        return loaded.name, "load"
    finally:
        m.lock.release()


def _ollama_truncate(ids: list[int], n_ctx: int, num_keep: int | None, add_bos: bool) -> list[int]:
    """A prompt longer than the context, cut as Ollama's runner does with context shift on
    (llm/llama_server.go completionPromptForRequest): keep num_keep (default 4, -1: all; + BOS) tokens,
    drop the oldest after them down to n_ctx - max((n_ctx - keep) / 2, 1)."""
    if n_ctx <= 1 or len(ids) <= n_ctx - 1:
        return ids
    keep = 4 if num_keep is None else num_keep
    keep = len(ids) if keep < 0 else keep
    keep = min(keep + (1 if add_bos else 0), n_ctx - 1)
    limit = n_ctx - max((n_ctx - keep) // 2, 1)
    discard = len(ids) - limit
    log.warning("truncating input prompt: limit=%d prompt=%d keep=%d new=%d", limit, len(ids), keep, limit)
    return ids[:keep] + ids[keep + discard:]


async def _render_only(m: ModelManager, req: _Generating, opts: Options, num_ctx, target: Target, render) -> dict:
    """Ollama's _debug_render_only: the prompt the request would evaluate, nothing generated."""
    await m.acquire()
    try:
        loaded, _ = await m.ensure(target, num_ctx, opts.runner(m.cfg))
        text = await m.call(render, loaded.model)
        return {"model": req.model, "created_at": now_iso(),
                "debug_info": {"rendered_template": text, "image_count": 0}}
    finally:
        await m.release(None)


@router.post("/api/generate")
async def generate(req: GenerateRequest, request: Request):
    m = manager_of(request)
    keep_alive = parse_keep_alive(req.keep_alive)      # every value checked before the model is looked up
    opts, num_ctx, target = await _checked(req, m)
    if not req.prompt and not req.system and not req.context and not req.suffix:
        served, reason = await _load_or_unload(m, target, num_ctx, keep_alive, opts.runner(m.cfg))
        return {"model": req.model or served, "created_at": now_iso(), "response": "", "done": True,
                "done_reason": reason}
    kwargs, context = req.template_kwargs(), list(req.context or [])
    messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
        [{"role": "user", "content": req.prompt or ""}]

    def text_of(model) -> str:
        if req.suffix:                                  # fill-in-the-middle: the model's FIM tokens (generation.fim)
            return model.detokenize(build(model), special=True).decode("utf-8", "replace")
        return (req.prompt or "") if req.raw else model.render_chat(messages, **kwargs)

    def build(model):
        if req.suffix:
            ids = context + fim_prompt(model.tokenizer, req.prompt or "", req.suffix, error=UnsupportedField,
                                       spm=m.cfg.spm_infill)
        elif context:
            ids = context + model.tokenize(text_of(model), add_bos=False, special=True)
        else:
            ids = model.tokenize(text_of(model), add_bos=True, special=True)
        if req.truncate is not False and model.context_shift and req.shift is not False:
            ids = _ollama_truncate(ids, model.n_ctx, opts.num_keep, model.tokenizer.add_bos)
        return ids

    if req.debug_render_only:
        return await _render_only(m, req, opts, num_ctx, target, text_of)
    job = await Job.start(m, model=target, num_ctx=num_ctx, keep_alive=keep_alive, build=build,
                          max_tokens=opts.num_predict, clamp=True, sampling=req.sampling(opts),
                          stop=stop_list(opts.stop), chat=not req.raw and not req.suffix,
                          runner=opts.runner(m.cfg), shift=req.shift is not False)
    name = req.model or job.loaded.name
    show_thinking = req.think is not False
    lp = _logprobs(req, job)

    def final(r) -> dict:
        d = {"model": name, "created_at": now_iso(), "response": r.text if not req.stream else "",
             "done": True, "done_reason": r.finish_reason, "context": job.ids + list(r.tokens),
             **job.durations(r)}
        if r.thinking and show_thinking and not req.stream:
            d["thinking"] = r.thinking
        return lp(d, r)

    if req.stream is False:
        return final(await job.collect(request))

    def lines(r):
        out = []
        if r.text or (r.thinking and show_thinking) or (r.logprobs and not r.done):
            d = {"model": name, "created_at": now_iso(), "response": r.text, "done": False}
            if r.thinking and show_thinking:
                d["thinking"] = r.thinking
            out.append(_line(lp(d, r)))
            r.logprobs = None                           # sent with this chunk
        if r.done:
            out.append(_line(final(r)))
        return out

    return stream_job(job, lines, lambda e: _line({"error": str(e)}), NDJSON)


@router.post("/api/chat")
async def chat(req: ChatRequest, request: Request):
    m = manager_of(request)
    keep_alive = parse_keep_alive(req.keep_alive)      # every value checked before the model is looked up
    opts, num_ctx, target = await _checked(req, m)
    messages = [msg.for_template() for msg in req.messages or []]
    if not messages:
        served, reason = await _load_or_unload(m, target, num_ctx, keep_alive, opts.runner(m.cfg))
        return {"model": req.model or served, "created_at": now_iso(),
                "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": reason}
    kwargs, tools = req.template_kwargs(), ToolSession(req.tools)

    def text(model, msgs):
        msgs, kwargs["tools"] = tools.prepare(model.chat_template(tools.active).text, msgs)   # the tool_use one
        return model.render_chat(msgs, **kwargs)

    def build(model):
        def ids(msgs):
            return model.tokenize(text(model, msgs), add_bos=True, special=True)
        if req.truncate is False:
            return ids(messages)
        return ids(fit_messages(messages, model.n_ctx, lambda msgs: len(ids(msgs))))  # oldest first, as Ollama

    if req.debug_render_only:
        d = await _render_only(m, req, opts, num_ctx, target, lambda model: text(model, messages))
        return {**d, "message": {"role": "", "content": ""}, "done": False}

    job = await Job.start(m, model=target, num_ctx=num_ctx, keep_alive=keep_alive, build=build,
                          max_tokens=opts.num_predict, clamp=True, sampling=req.sampling(opts),
                          stop=stop_list(opts.stop), chat=True, runner=opts.runner(m.cfg),
                          shift=req.shift is not False)
    name = req.model or job.loaded.name
    lp = _logprobs(req, job)

    def message(content: str, thinking: str, calls=(), start: int = 0) -> dict:
        m = {"role": "assistant", "content": content}
        if thinking and req.think is not False:       # the reasoning, as Ollama reports it
            m["thinking"] = thinking
        if calls:
            m["tool_calls"] = ollama_calls(calls, start)
        return m

    def final(r, content: str, thinking: str) -> dict:
        return lp({"model": name, "created_at": now_iso(), "message": message(content, thinking),
                   "done": True, "done_reason": r.finish_reason, **job.durations(r)}, r)

    if req.stream is False:
        r = await job.collect(request)
        content, calls = tools.parse(r.text)
        d = final(r, content, r.thinking)
        if calls:
            d["message"]["tool_calls"] = ollama_calls(calls)
        return d

    sent = 0                                            # tool calls streamed so far

    def lines(r):
        nonlocal sent
        out, text, calls, first = [], r.text, [], sent
        if tools.stream is not None:                    # Ollama sends each call whole, once complete
            text = tools.stream.feed(r.text)[0] + (tools.stream.finish()[0] if r.done else "")
            done = [c for c in tools.stream.calls if c.complete or r.done]
            calls, sent = done[sent:], len(done)
        if text or calls or (r.thinking and req.think is not False) or (r.logprobs and not r.done):
            out.append(_line(lp({"model": name, "created_at": now_iso(),
                                 "message": message(text, r.thinking, calls, first), "done": False}, r)))
            r.logprobs = None                           # sent with this chunk
        if r.done:
            out.append(_line(final(r, "", "")))
        return out

    return stream_job(job, lines, lambda e: _line({"error": str(e)}), NDJSON)


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request):
    from ..store import Store

    models = await anyio.to_thread.run_sync(list_models, manager_of(request))
    pulled = await anyio.to_thread.run_sync(lambda: {(m.name, m.hex): m.verified for m in Store().models()})
    return {"models": [{"name": x["name"], "model": x["name"], "modified_at": x["modified_at"], "size": x["size"],
                        "digest": x["digest"], "details": x["details"],     # a pull's check: `verified` (store only)
                        **({"verified": pulled[k]} if (k := (x["name"], x["digest"])) in pulled else {})}
                       for x in models]}


@router.post("/api/show")
async def show(req: ShowRequest, request: Request):
    m = manager_of(request)
    name = req.model if req.model else req.name       # the Go client sends both, one of them empty
    if not name:
        raise InvalidArgument("model is required")
    served, path = await anyio.to_thread.run_sync(locate_for_show, m, name)
    return await anyio.to_thread.run_sync(show_response, served, path, req)


@router.get("/api/ps")
async def ps(request: Request):
    m = manager_of(request)
    cur = m.current
    if cur is None:
        return {"models": []}
    details = await anyio.to_thread.run_sync(details_of, cur.path)
    digest = await anyio.to_thread.run_sync(model_digest, cur.name)
    b = cur.model.budget
    return {"models": [{"name": cur.name, "model": cur.name, "size": int(cur.model.budget.current),
                        "digest": digest, "details": details, "expires_at": iso(cur.expires_wall),
                        "size_vram": 0, "context_length": cur.model.n_ctx,
                        # ramforge's own, read-only: the managed bytes of the model's budget (a leaked
                        # charge shows as current above its idle value once no request runs)
                        "budget": {"current": int(b.current), "peak": int(b.peak), "limit": b.limit,
                                   "charges": len(b.charges())}}]}


OLLAMA_VERSION = "0.12.11"    # the Ollama release whose API this one matches (logprobs, tool_call_id, truncate, shift)


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version():
    return {"version": OLLAMA_VERSION, "ramforge_version": __version__}


@router.api_route("/api/{verb}", methods=["POST", "DELETE", "HEAD"])
async def unsupported(verb: str):
    if verb in ("pull", "push", "create", "copy", "delete", "blobs"):
        hint = "; use `ramforge pull SOURCE --name NAME` and `ramforge rm NAME`" if verb in ("pull", "delete") else ""
        raise Unsupported(f"/api/{verb} is not supported by ramforge serve{hint}")
    raise HTTPException(404, f"no route /api/{verb}")
