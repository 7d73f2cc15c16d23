"""llama-server's own endpoints (tools/server): /tokenize, /detokenize, /apply-template, /props,
GET /slots, /metrics, /completion (its native shape, streamed as SSE objects without [DONE]),
/infill, /v1/health (/v1/responses: server.responses).

Requests take llama-server's field names; the sampler fields are ramforge.sampling.params' table
(llama-server's names), with the GGUF's own sampling defaults (`general.sampling.*`) beneath them as
llama-server applies them at load, then llama-server's defaults. Unknown fields are ignored, as
llama-server ignores them, with a logged warning. Tokenize and detokenize read the vocabulary from the
GGUF's header (cached per file), not through the model lock, and are bounded (MAX_TOKENIZE_CHARS,
MAX_DETOKENIZE_TOKENS). /metrics is Prometheus text (prometheus_client) under llama-server's metric
names, always on (llama-server needs --metrics).
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from .._version import __version__
from ..errors import InvalidArgument, RequestTooLarge, Unsupported, UnsupportedField, check_token_ids
from ..generation.logprobs import MAX_TOP, SERVER, chat_logprobs
from ..structured import for_request
from .common import (MAX_CTX, MAX_PREDICT, MAX_TOP_K, loading_response, log, request_sampling, sampler_fields,
                     stop_list)
from ..generation.fim import infill_ids
from .jobs import Job, stream_job
from .manager import Target, manager_of

router = APIRouter()
MAX_TOKENIZE_CHARS = 1 << 18           # characters a /tokenize or /apply-template may send
MAX_DETOKENIZE_TOKENS = 1 << 18        # tokens a /detokenize may send
MAX_EXTRA_CHUNKS = 64                  # /infill input_extra chunks


class Lenient(BaseModel):
    """llama-server ignores fields it does not know: here they are ignored with a warning."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unknown(cls, data):
        if isinstance(data, dict):
            for k in data:
                if k not in cls.model_fields:
                    log.warning("%s: unknown field %r ignored (as llama-server ignores it)", cls.__name__, str(k)[:100])
        return data


# ------------------------------------------------------------------------------ the vocabulary

@lru_cache(maxsize=4)
def _vocab(path: str, size: int, mtime_ns: int, override: str | None):
    """(tokenizer, chat template, metadata) of a GGUF, from its header: once per file version."""
    from ..generation.chat import ChatTemplate
    from ..gguf.reader import GGUFFile
    from ..tokenizer import load_tokenizer
    from .common import read_info

    with GGUFFile(path) as f:
        md = f.metadata
    text = override if override is not None else read_info(path)["template"]
    return load_tokenizer(md), ChatTemplate.from_metadata(md, text), md


def vocab_of(m, target: Target | None = None):
    """The tokenizer, chat template and metadata of a request's resolved model (None: the one llama-server
    serves, ModelManager.resolve_lenient)."""
    target = target or m.resolve_lenient(None)
    st = Path(target.path).stat()
    return _vocab(target.path, st.st_size, st.st_mtime_ns, m.cfg.chat_template if target.startup else None)


class TokenizeRequest(Lenient):
    content: str = Field("", max_length=MAX_TOKENIZE_CHARS)
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Lenient):
    tokens: list[Annotated[int, Field(ge=0, lt=2 ** 31)]] = Field(default_factory=list, max_length=MAX_DETOKENIZE_TOKENS)


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request):
    m = manager_of(request)

    def run():
        tok = vocab_of(m)[0]
        ids = tok.encode(req.content, add_special=req.add_special, parse_special=req.parse_special)
        if not req.with_pieces:
            return ids
        out = []
        for t in ids:                   # a piece that is not valid UTF-8 is its bytes, as llama-server sends it
            b = tok.token_to_piece(t, special=True)
            try:
                out.append({"id": t, "piece": b.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": t, "piece": list(b)})
        return out
    return {"tokens": await anyio.to_thread.run_sync(run)}


@router.post("/detokenize")
async def detokenize(req: DetokenizeRequest, request: Request):
    m = manager_of(request)

    def run():
        tok = vocab_of(m)[0]
        check_token_ids(req.tokens, tok.n_vocab)
        return tok.decode_bytes(req.tokens, special=True).decode("utf-8", "replace")
    return {"content": await anyio.to_thread.run_sync(run)}


@router.post("/apply-template")
async def apply_template(request: Request):
    from .openai import ChatRequest, _effort_kwargs
    from ..generation.tools_call import ToolSession

    body = await request.json()
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object with messages")
    req = ChatRequest.model_validate(body)
    if sum(len(json.dumps(x.content)) for x in req.messages) > MAX_TOKENIZE_CHARS:
        raise RequestTooLarge(f"the messages are over {MAX_TOKENIZE_CHARS:,} characters")
    await anyio.to_thread.run_sync(req.check)
    m = manager_of(request)

    def run():
        template = vocab_of(m, m.resolve_lenient(req.model))[1]
        tools = ToolSession(req.tools, req.tool_choice)
        msgs, tool_list = tools.prepare(template.text, [x.for_template() for x in req.messages])
        kwargs = {**_effort_kwargs(req.reasoning_effort), **(req.chat_template_kwargs or {})}
        return template.strip_special(template.render(msgs, tools=tool_list, **kwargs))
    return {"prompt": await anyio.to_thread.run_sync(run)}


# ------------------------------------------------------------------------------ properties

def _defaults(md: dict) -> dict:
    from ..sampling.gguf_defaults import gguf_sampling_defaults
    from ..sampling.params import PARAMS

    table = {p.name: p.default for p in PARAMS if p.kind in (int, float) and p.name != "seed"}
    return {**table, **gguf_sampling_defaults(md)}


@router.get("/props")
async def props(request: Request):
    m = manager_of(request)
    target = await anyio.to_thread.run_sync(m.resolve, None)
    tok, template, md = await anyio.to_thread.run_sync(vocab_of, m, target)
    cur = m.current
    n_ctx = cur.model.n_ctx if cur is not None else (m.cfg.n_ctx or 4096)
    path = target.path
    return {"default_generation_settings": {"id": 0, "n_ctx": n_ctx, "is_processing": m.lock.locked(),
                                            "params": {**_defaults(md), "n_predict": -1, "seed": 4294967295}},
            "total_slots": m.cfg.parallel, "model_path": path, "model_alias": m.startup_name,
            "chat_template": template.text, "chat_template_caps": {"supports_tools": "tools" in template.text},
            "bos_token": tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
            "eos_token": tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
            "modalities": {"vision": False, "audio": False}, "build_info": f"ramforge {__version__}"}


@router.post("/props")
async def set_props():
    raise Unsupported("This server does not support changing global properties (llama-server's --props)")


@router.get("/slots")
async def slots(request: Request):
    m = manager_of(request)
    cur = m.current
    n_ctx = cur.model.n_ctx if cur is not None else 0
    return [{"id": i, "id_task": -1, "n_ctx": n_ctx // max(1, m.cfg.parallel), "speculative": bool(m.cfg.speculative),
             "is_processing": (m.lock.locked() if i == 0 else False) or m.busy > i} for i in range(m.cfg.parallel)]


@router.get("/metrics")
async def metrics(request: Request):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    m = manager_of(request)
    st = m.stats

    class _Collector:
        def collect(self):
            yield CounterMetricFamily("llamacpp:prompt_tokens", "Number of prompt tokens processed.", st.prompt_tokens)
            yield CounterMetricFamily("llamacpp:prompt_seconds", "Prompt process time", st.prompt_s)
            yield CounterMetricFamily("llamacpp:tokens_predicted", "Number of generation tokens processed.",
                                      st.predicted_tokens)
            yield CounterMetricFamily("llamacpp:tokens_predicted_seconds", "Predict process time", st.predicted_s)
            yield CounterMetricFamily("llamacpp:requests", "Generations finished.", st.requests)
            yield GaugeMetricFamily("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                                    st.prompt_tokens / st.prompt_s if st.prompt_s else 0.0)
            yield GaugeMetricFamily("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                                    st.predicted_tokens / st.predicted_s if st.predicted_s else 0.0)
            yield GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing.",
                                    int(m.lock.locked()) + m.busy)
            yield GaugeMetricFamily("llamacpp:requests_deferred", "Number of requests deferred.", m.waiting)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/health")
async def v1_health(request: Request):
    if manager_of(request).warming:             # as /health: llama-server's answer while it loads
        return loading_response()
    return {"status": "ok"}


# ------------------------------------------------------------------------------ /completion, /infill

_Sampler = create_model("_Sampler", __base__=Lenient, **sampler_fields({
    "top_k": (0, MAX_TOP_K), "repeat_last_n": (-1, MAX_CTX), "seed": (-(2 ** 63), 2 ** 64 - 1)}))


class CompletionRequest(_Sampler):
    prompt: str | list[Annotated[int, Field(ge=0, lt=2 ** 31)]] = Field("", max_length=MAX_CTX)
    n_predict: int | None = Field(None, ge=-1, le=MAX_PREDICT)
    stream: bool = False
    stop: list[str] | None = None
    n_keep: int | None = Field(None, ge=-1, le=MAX_CTX)
    n_probs: int = Field(0, ge=0, le=MAX_TOP)
    grammar: str | None = None
    json_schema: dict | None = None
    ignore_eos: bool = False
    cache_prompt: bool = True          # ramforge always resumes from the KV cache's shared prefix
    id_slot: int = Field(-1, ge=-1, le=0)
    return_tokens: bool = False
    samplers: list[str] | str | None = None
    model: str | None = None

    def check(self) -> str | None:
        stop_list(self.stop)
        if self.samplers is not None:
            raise UnsupportedField("samplers (a custom sampler order) is not supported: the order is llama.cpp's "
                                   "default")
        gbnf = for_request(self.grammar, self.json_schema, None)
        self.sampling({})
        return gbnf

    def sampling(self, model_defaults: dict) -> dict:
        seed = None if self.seed is None or self.seed < 0 else self.seed % 0xFFFFFFFF
        kw = request_sampling(self, model_defaults, seed)
        return {**kw, **({"logprobs": self.n_probs, "logprobs_style": SERVER} if self.n_probs else {})}


class InfillRequest(CompletionRequest):
    input_prefix: str = Field(max_length=MAX_TOKENIZE_CHARS)
    input_suffix: str = Field(max_length=MAX_TOKENIZE_CHARS)
    input_extra: list[dict[str, str]] = Field(default_factory=list, max_length=MAX_EXTRA_CHUNKS)
    prompt: str = Field("", max_length=MAX_TOKENIZE_CHARS)

    def check(self) -> str | None:
        for c in self.input_extra:
            if "text" not in c:
                raise InvalidArgument('extra_context chunk must contain a "text" field with a string value')
        return super().check()


async def _native(req: CompletionRequest, request: Request, build):
    m = manager_of(request)
    gbnf = await anyio.to_thread.run_sync(req.check)
    target = await anyio.to_thread.run_sync(m.resolve_lenient, req.model)     # once per request
    tok, _, md = await anyio.to_thread.run_sync(vocab_of, m, target)
    from ..sampling.gguf_defaults import gguf_sampling_defaults

    sampling = {**req.sampling(gguf_sampling_defaults(md)), "grammar": gbnf}
    if req.n_keep is not None:
        sampling["n_keep"] = req.n_keep
    if req.ignore_eos:                   # llama-server: the end-of-generation tokens get -inf
        sampling["logit_bias"] = {**dict(sampling.get("logit_bias") or {}), **{t: float("-inf") for t in tok.eog_ids}}
    stops = stop_list(req.stop)
    job = await Job.start(m, model=target, num_ctx=None, keep_alive=None, build=build,
                          max_tokens=req.n_predict, clamp=True, sampling=sampling, stop=stops)
    t0, alias = time.perf_counter(), req.model or job.loaded.name

    def final(r, content: str, tokens: list[int]) -> dict:
        ended_eog = bool(r.tokens) and job.model.tokenizer.is_eog(r.tokens[-1])
        stop_type = "limit" if r.finish_reason == "length" else "eos" if ended_eog or not stops else "word"
        return {"content": content, "tokens": tokens if req.return_tokens else [], "id_slot": 0, "stop": True,
             "model": alias, "tokens_predicted": r.completion_tokens, "tokens_evaluated": r.prompt_tokens,
             "prompt": job.model.detokenize(job.ids, special=True).decode("utf-8", "replace"),
             "has_new_line": "\n" in content, "truncated": False, "stop_type": stop_type, "stopping_word": "",
             "tokens_cached": r.prompt_tokens - r.prompt_eval_tokens,
             "timings": {"prompt_n": r.prompt_eval_tokens, "prompt_ms": r.prompt_s * 1e3,
                         "predicted_n": r.completion_tokens, "predicted_ms": r.gen_s * 1e3,
                         "total_ms": (time.perf_counter() - t0) * 1e3}}

    def probs(steps):
        return {"completion_probabilities": chat_logprobs(steps, job.model.tokenizer)["content"]} \
            if steps and req.n_probs else {}

    if not req.stream:
        r = await job.collect(request)
        return {**final(r, r.text, list(r.tokens or [])), **probs(r.logprobs)}

    def lines(r):
        if r.done:
            return [f"data: {json.dumps({**final(r, '', []), **probs(r.logprobs)}, ensure_ascii=False)}\n\n"]
        d = {"content": r.text, "tokens": [r.token] if req.return_tokens and r.token is not None else [],
             "stop": False, "id_slot": 0, **probs(r.logprobs)}
        return [f"data: {json.dumps(d, ensure_ascii=False)}\n\n"]

    return stream_job(job, lines, lambda e: f"data: {json.dumps({'error': {'message': str(e)}})}\n\n",
                      "text/event-stream")


@router.post("/completion")
@router.post("/completions")
async def completion(req: CompletionRequest, request: Request):
    def build(model):
        p = req.prompt
        return model.tokenize(p, add_bos=True, special=True) if isinstance(p, str) else list(p)
    return await _native(req, request, build)


@router.post("/infill")
async def infill(req: InfillRequest, request: Request):
    def build(model):
        prompt = model.tokenize(req.prompt, add_bos=False, special=True) if req.prompt else []
        return infill_ids(model.tokenizer, req.input_prefix, req.input_suffix, req.input_extra, prompt,
                          n_ctx=model.n_ctx, spm=spm)
    spm = manager_of(request).cfg.spm_infill
    return await _native(req, request, build)
