"""Tool calls and thinking through `ramforge serve`, with the official `openai` and `ollama` clients.

The tiny default model does not call tools, so the model's output is scripted: `Model.stream` yields a
given text in small pieces and `Model.chat_template` is a recorded template (Qwen 2.5's Hermes format,
Qwen 3's `<think>`); the prompt the server renders is kept to check what reaches the template. Every
call's arguments must validate against the tool's parameters (jsonschema)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from ramforge.generation.api import Model, Response  # noqa: E402
from ramforge.generation.chat import ChatTemplate  # noqa: E402
from ramforge.server import ServerConfig, create_app  # noqa: E402
from tests.serving import serving  # noqa: E402

CHAT = Path(__file__).parent / "fixtures" / "chat"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"], "additionalProperties": False}}}
SCHEMA = WEATHER["function"]["parameters"]
CALLS = ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich \\"ZH\\""}}\n</tool_call>')
ASK = [{"role": "user", "content": "Weather in Oslo and Zürich?"}]
state = SimpleNamespace(template="qwen2.5-7b-instruct", output="", prompts=[])


def _template(name: str) -> ChatTemplate:
    d = json.loads((CHAT / f"{name}.json").read_text())
    return ChatTemplate(d["template"], "override", d["bos_token"], d["eos_token"])


def _scripted(self, prompt, max_tokens=256, **kwargs):
    state.prompts.append(self.detokenize(prompt, special=True).decode())
    text = state.output
    for i in range(0, len(text), 3):
        yield Response(text[i:i + 3], 1)
    n = (len(text) + 2) // 3
    yield Response("", None, True, "stop", len(prompt), len(prompt), n, 0.01, 0.01, 0.0, [1] * n)


@pytest.fixture(scope="module")
def server():
    mp = pytest.MonkeyPatch()
    mp.setattr(Model, "chat_template", lambda self, tools=False: _template(state.template))
    mp.setattr(Model, "stream", _scripted)
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600))
    try:
        with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
            yield SimpleNamespace(ollama=ollama.Client(host=url),
                                  openai=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0),
                                  http=httpx.Client(base_url=url, timeout=120))
    finally:
        mp.undo()


@pytest.fixture(autouse=True)
def script():
    state.template, state.output, state.prompts[:] = "qwen2.5-7b-instruct", CALLS, []


def _valid(args) -> dict:
    args = json.loads(args) if isinstance(args, str) else dict(args)
    jsonschema.validate(args, SCHEMA)
    return args


def test_openai_tool_calls(server):
    r = server.openai.chat.completions.create(model="default", messages=ASK, tools=[WEATHER])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "I will look."
    calls = ch.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"] * 2 and len({c.id for c in calls}) == 2
    assert [_valid(c.function.arguments) for c in calls] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]
    assert "get_weather" in state.prompts[-1] and "<tools>" in state.prompts[-1]   # described by the template


def test_openai_tool_calls_streamed_as_deltas(server):
    calls, content, finish = {}, "", None
    for chunk in server.openai.chat.completions.create(model="default", messages=ASK, tools=[WEATHER], stream=True,
                                                       tool_choice="auto"):
        d = chunk.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            c = calls.setdefault(t.index, {"id": None, "name": "", "args": ""})
            c["id"] = t.id or c["id"]
            c["name"] += (t.function.name or "") if t.function else ""
            c["args"] += (t.function.arguments or "") if t.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "I will look."
    assert [c["name"] for c in calls.values()] == ["get_weather"] * 2 and all(c["id"] for c in calls.values())
    assert [_valid(c["args"]) for c in calls.values()] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]


def test_tool_choice_none_leaves_the_text_alone(server):
    r = server.openai.chat.completions.create(model="default", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.content == CALLS and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop" and "<tools>" not in state.prompts[-1]


def test_tool_results_go_back_through_the_template(server):
    state.output = "Oslo: 12 C and rain."
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"}]
    r = server.openai.chat.completions.create(model="default", messages=msgs, tools=[WEATHER])
    assert r.choices[0].message.content == "Oslo: 12 C and rain." and r.choices[0].finish_reason == "stop"
    p = state.prompts[-1]
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in p
    assert "<tool_response>\n12 C, rain\n</tool_response>" in p


def test_ollama_tool_calls(server):
    r = server.ollama.chat(model="default", messages=ASK, tools=[WEATHER], stream=False)
    calls = r.message.tool_calls
    assert r.message.content == "I will look." and [c.function.name for c in calls] == ["get_weather"] * 2
    assert [_valid(c.function.arguments) for c in calls] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]
    parts = list(server.ollama.chat(model="default", messages=ASK, tools=[WEATHER], stream=True))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [_valid(c.function.arguments) for c in streamed] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]
    assert "".join(p.message.content or "" for p in parts) == "I will look."
    # a tool result (Ollama's tool_name) goes back through the template
    state.output = "Rain."
    msgs = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "12 C, rain"}]
    assert server.ollama.chat(model="default", messages=msgs, tools=[WEATHER]).message.content == "Rain."
    assert "12 C, rain" in state.prompts[-1] and '"arguments": {"city": "Oslo"}' in state.prompts[-1]


def test_thinking_is_split_on_both_apis(server):
    state.template, state.output = "qwen3-0.6b", "<think>\nCold up north.\n</think>\n\nTake a coat."
    r = server.openai.chat.completions.create(model="default", messages=ASK)
    m = r.choices[0].message
    assert m.content == "Take a coat." and m.model_extra["reasoning_content"] == "Cold up north."
    o = server.ollama.chat(model="default", messages=ASK, think=True)
    assert o.message.content == "Take a coat." and o.message.thinking == "Cold up north."
    parts = list(server.ollama.chat(model="default", messages=ASK, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Cold up north."
    o = server.ollama.chat(model="default", messages=ASK, think=False)
    assert o.message.thinking is None and o.message.content == "Take a coat."
    assert state.prompts[-1].rstrip().endswith("</think>")        # think: false reaches the template


def test_thinking_then_a_tool_call(server):
    state.template = "qwen3-0.6b"
    state.output = '<think>\nNeed data.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    r = server.openai.chat.completions.create(model="default", messages=ASK, tools=[WEATHER])
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "Need data." and not m.content
    assert _valid(m.tool_calls[0].function.arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("path, body, why", [
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"description": "x"}}]}, "name"),
    ("/v1/chat/completions", {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "nope"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "needs tools"),
    ("/api/chat", {"tools": [{"type": "function", "function": {"parameters": {}}}]}, "name"),
])
def test_bad_tools_are_a_400(server, path, body, why):
    r = server.http.post(path, json={"model": "default", "messages": ASK, "stream": False, **body})
    assert r.status_code == 400 and why in r.text, r.text
