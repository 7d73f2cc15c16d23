"""OpenAI's Responses API, POST /v1/responses, as llama-server and Ollama serve it: over the one chat
path (openai.start_chat): the request becomes a ChatRequest, the chat's answer becomes a Response.

Request: `input` a string (one user message) or a list of items: messages (role user, system,
developer or assistant; content a string or input_text / output_text parts), `function_call` items
(an earlier answer's calls, echoed back) and `function_call_output` items (their results);
`reasoning` items echoed back are passed over. `instructions` is a system message before them;
`max_output_tokens`, `temperature`, `top_p`, the sampler extensions (top_k, min_p, ... as in
/v1/chat/completions), `tools` (function tools: flat {type, name, description, parameters}),
`tool_choice`, `parallel_tool_calls`, `text.format` (json_object, json_schema: a grammar),
`reasoning.effort`. Nothing is stored: `previous_response_id`, `conversation` and `background` are a
400 (send the whole conversation as `input`); images and files are a 400; other tool types are a 400.

Answer: `{id: "resp_...", object: "response", status, output: [reasoning?, message with output_text,
function_call items], usage: {input_tokens, output_tokens, total_tokens, ...}}`; a cut at
max_output_tokens is status "incomplete" (incomplete_details.reason "max_output_tokens"). Streamed
as typed SSE events (`event:` and `data:` lines, a `sequence_number` on each): response.created,
response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta ..., response.output_text.done, response.content_part.done,
response.output_item.done, function_call items with response.function_call_arguments.delta/.done,
then response.completed (or response.incomplete); an error after the start is an `error` event.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import Field, ValidationError

from ..errors import InvalidArgument, UnsupportedField
from ..sampling.params import PARAMS
from .common import MAX_NAME, MAX_PREDICT, error_status, validation_message
from .jobs import stream_job
from .openai import SSE, ChatRequest, Strict, _SamplerFields, start_chat

router = APIRouter()

_TEXT_PARTS = ("input_text", "output_text", "text")


class Reasoning(Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_SamplerFields):
    model: str = Field("", max_length=MAX_NAME)
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_PREDICT)
    stream: bool | None = False
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    reasoning: Reasoning | None = None
    stop: str | list[str] | None = None        # llama-server's extension
    # accepted, no effect here
    metadata: dict | None = None
    store: bool | None = None
    user: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=0)     # logprobs are not reported here
    # what needs stored responses or other services: only null
    previous_response_id: str | None = None
    conversation: str | dict | None = None
    background: bool | None = None
    prompt: dict | None = None

    def chat(self) -> ChatRequest:
        """The ChatRequest this asks for (InvalidArgument: 400 for what it cannot be)."""
        for name in ("previous_response_id", "conversation", "background", "prompt"):
            if getattr(self, name):
                raise UnsupportedField(f"{name} is not supported: ramforge stores no responses; send the whole "
                                       "conversation as `input`")
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + \
            _messages(self.input)
        body = {p.name: getattr(self, p.name) for p in PARAMS if getattr(self, p.name) is not None}
        body.update(model=self.model, messages=messages, max_tokens=self.max_output_tokens, stop=self.stop,
                    tools=_tools(self.tools), tool_choice=_tool_choice(self.tool_choice),
                    parallel_tool_calls=self.parallel_tool_calls, response_format=_format(self.text),
                    reasoning_effort=self.reasoning.effort if self.reasoning else None)
        try:
            return ChatRequest(**{k: v for k, v in body.items() if v is not None})
        except ValidationError as e:
            raise InvalidArgument(validation_message(e.errors(include_url=False))) from None


def _text(content, where: str) -> str:
    """A message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidArgument(f"{where}.content must be a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "refusal":
            out.append(str(part.get("refusal") or ""))
        else:
            raise UnsupportedField(f"{where}.content[{j}]: content of type {kind!r} is not supported "
                                   f"(only {', '.join(_TEXT_PARTS)})")
    return "".join(out)


def _messages(inp) -> list[dict]:
    """`input` as chat messages: consecutive function_call items are one assistant turn's tool_calls."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    out: list[dict] = []
    for i, item in enumerate(inp):
        where, kind = f"input[{i}]", item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidArgument(f"{where}.role must be user, system, developer or assistant, not {role!r}")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", ""), str):
                raise InvalidArgument(f"{where}: a function_call item needs a name and arguments (a JSON string)")
            call = {"id": str(item.get("call_id") or item.get("id") or f"call_{i}"), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
                last["tool_calls"] = [call]          # the answer's text, then its calls: one turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                        "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            continue                                 # an earlier answer's reasoning: not sent to the template
        else:
            raise UnsupportedField(f"{where}: input items of type {kind!r} are not supported (message, "
                                   "function_call, function_call_output)")
    if not out:
        raise InvalidArgument("input has no messages")
    return out


def _tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses' flat function tools as chat's {type, function: {...}}; other tool types: 400."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else t
            raise UnsupportedField(f"tools[{i}]: tools of type {kind!r} are not supported; only function tools")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text: dict | None) -> dict | None:
    """text.format as chat's response_format (json_schema's fields are flat here)."""
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise InvalidArgument(f"text.format must be an object such as {{\"type\": \"json_object\"}}, not {fmt!r}")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if k in fmt}}
    return fmt


# ------------------------------------------------------------------------------------ the answer

def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _message(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def _call(c, fmt: str) -> dict:
    from ..generation.tools_call import new_id

    return {"id": _new_id("fc"), "type": "function_call", "status": "completed", "call_id": c.id or new_id(fmt),
            "name": c.name, "arguments": c.arguments}


class _Shape:
    """The Response object of one request, as it grows."""

    def __init__(self, req: ResponsesRequest, name: str):
        self.req, self.id, self.created, self.name = req, _new_id("resp"), int(time.time()), name

    def response(self, status: str, output: list, r=None) -> dict:
        req = self.req
        usage = None
        if r is not None:
            usage = {"input_tokens": r.prompt_tokens,
                     "input_tokens_details": {"cached_tokens": r.prompt_tokens - r.prompt_eval_tokens},
                     "output_tokens": r.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": r.prompt_tokens + r.completion_tokens}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "background": False, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.name,
                "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                                                            "summary": None},
                "store": False, "temperature": req.temperature, "text": req.text or {"format": {"type": "text"}},
                "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "top_p": req.top_p,
                "truncation": req.truncation or "disabled", "usage": usage, "metadata": req.metadata or {},
                "user": req.user}


def _status(r, calls) -> str:
    return "incomplete" if r.finish_reason == "length" and not calls else "completed"


class _Stream:
    """The events of one streamed Response: its output items opened, grown and closed as the chunks come."""

    def __init__(self, shape: _Shape, run):
        self.shape, self.run, self.tools = shape, run, run.tools
        self.seq = 0
        self.output: list[dict] = []
        self.msg: dict | None = None           # the message item, open while text streams
        self.reasoning: dict | None = None

    def event(self, kind: str, **fields) -> str:
        self.seq += 1
        data = json.dumps({"type": kind, "sequence_number": self.seq - 1, **fields}, ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n"

    def close_reasoning(self) -> list[str]:
        if self.reasoning is None:
            return []
        i, item, self.reasoning = self.output.index(self.reasoning), self.reasoning, None
        text = item["content"][0]["text"]
        return [self.event("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0,
                           text=text),
                self.event("response.output_item.done", output_index=i, item=item)]

    def reasoning_delta(self, thinking: str) -> list[str]:
        out = []
        if self.reasoning is None:
            self.reasoning = _reasoning(_new_id("rs"), "")
            self.reasoning["status"] = "in_progress"
            self.output.append(self.reasoning)
            out.append(self.event("response.output_item.added", output_index=len(self.output) - 1,
                                  item={**self.reasoning, "content": []}))
        self.reasoning["content"][0]["text"] += thinking
        out.append(self.event("response.reasoning_text.delta", item_id=self.reasoning["id"],
                              output_index=self.output.index(self.reasoning), content_index=0, delta=thinking))
        return out

    def text_delta(self, text: str) -> list[str]:
        out = self.close_reasoning()
        if self.msg is None:
            msg = self.msg = _message(_new_id("msg"), "", "in_progress")
            self.output.append(msg)
            i = len(self.output) - 1
            out += [self.event("response.output_item.added", output_index=i, item={**msg, "content": []}),
                    self.event("response.content_part.added", item_id=msg["id"], output_index=i, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]
        if text:
            self.msg["content"][0]["text"] += text
            out.append(self.event("response.output_text.delta", item_id=self.msg["id"],
                                  output_index=self.output.index(self.msg), content_index=0, delta=text, logprobs=[]))
        return out

    def close_message(self) -> list[str]:
        msg = self.msg
        if msg is None or msg["status"] == "completed":
            return []
        msg["status"] = "completed"
        i, part = self.output.index(msg), msg["content"][0]
        return [self.event("response.output_text.done", item_id=msg["id"], output_index=i, content_index=0,
                           text=part["text"], logprobs=[]),
                self.event("response.content_part.done", item_id=msg["id"], output_index=i, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=i, item=msg)]

    def call_events(self, calls) -> list[str]:
        out = []
        for c in calls:
            item = _call(c, self.tools.fmt)
            self.output.append(item)
            i = len(self.output) - 1
            out += [self.event("response.output_item.added", output_index=i,
                               item={**item, "status": "in_progress", "arguments": ""}),
                    self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                               delta=item["arguments"]),
                    self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                               name=item["name"], arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=i, item=item)]
        return out

    def finish(self, r) -> list[str]:
        """The last chunk's events: the items closed, the tool calls, and the Response's final status."""
        tools = self.tools
        calls = self.run.calls(tools.stream.calls if tools.stream is not None else [])
        out = self.text_delta("") if self.msg is None and not calls else []   # an empty answer is still a message
        out += self.close_reasoning() + self.close_message() + self.call_events(calls)
        status = _status(r, calls)
        out.append(self.event(f"response.{status}", response=self.shape.response(status, self.output, r)))
        return out

    def lines(self, r) -> list[str]:
        out = []
        if self.seq == 0:
            out += [self.event("response.created", response=self.shape.response("in_progress", [])),
                    self.event("response.in_progress", response=self.shape.response("in_progress", []))]
        if r.thinking:
            out += self.reasoning_delta(r.thinking)
        text, stream = r.text, self.tools.stream
        if stream is not None:                        # the answer through the tool-call parser
            text, _ = stream.feed(r.text)
            if r.done:
                text += stream.finish()[0]
        if text:
            out += self.text_delta(text)
        return out + self.finish(r) if r.done else out

    def on_error(self, e: BaseException) -> str:
        return self.event("error", code=str(error_status(e)), message=str(e), param=None)


@router.post("/v1/responses")
async def responses(req: ResponsesRequest, request: Request):
    run = await start_chat(req.chat(), request)
    shape, tools = _Shape(req, run.name), run.tools
    if req.stream:
        st = _Stream(shape, run)
        return stream_job(run.job, st.lines, st.on_error, SSE)
    r = await run.job.collect(request)
    content, calls = tools.parse(r.text)
    calls = run.calls(calls)
    output = [_reasoning(_new_id("rs"), r.thinking)] if r.thinking else []
    if content or not calls:
        output.append(_message(_new_id("msg"), content))
    output += [_call(c, tools.fmt) for c in calls]
    return shape.response(_status(r, calls), output, r)
