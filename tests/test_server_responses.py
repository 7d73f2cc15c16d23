"""POST /v1/responses (OpenAI's Responses API) through the official `openai` client: on the default
model, against /v1/chat/completions' answer for the same conversation (the one chat path), streamed
and not; with tools on a scripted model (as tests/test_server_tools.py: Qwen 2.5's Hermes template)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from ramforge.generation.api import Model  # noqa: E402
from ramforge.server import ServerConfig, create_app  # noqa: E402
from tests.serving import serving  # noqa: E402


def _clients(url: str) -> SimpleNamespace:
    return SimpleNamespace(openai=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0),
                           http=httpx.Client(base_url=url, timeout=300))


@pytest.fixture(scope="module")
def srv():
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        yield _clients(url)


def _chat(srv, messages, **kw):
    return srv.http.post("/v1/chat/completions", json={"model": "default", "messages": messages,
                                                       "temperature": 0, **kw}).json()


def test_text_response_is_the_chat_answer(srv):
    r = srv.openai.responses.create(model="default", input="Name a colour.", instructions="Answer in one word.",
                                    max_output_tokens=6, temperature=0)
    chat = _chat(srv, [{"role": "system", "content": "Answer in one word."},
                       {"role": "user", "content": "Name a colour."}], max_tokens=6)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "default"
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.output_text == chat["choices"][0]["message"]["content"] and r.output_text
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    finish = chat["choices"][0]["finish_reason"]
    assert r.status == ("incomplete" if finish == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_streamed_events(srv):
    events = list(srv.openai.responses.create(model="default", input="Name a colour.", max_output_tokens=6,
                                              temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert deltas == done.text == final.output_text and deltas
    plain = srv.openai.responses.create(model="default", input="Name a colour.", max_output_tokens=6, temperature=0)
    assert plain.output_text == deltas and final.usage.output_tokens == plain.usage.output_tokens


def test_input_items_are_the_conversation(srv):
    items = [{"role": "developer", "content": "Answer in one word."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a fruit."}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Apple.", "annotations": []}]},
             {"role": "user", "content": "Another?"}]
    r = srv.openai.responses.create(model="default", input=items, max_output_tokens=5, temperature=0)
    chat = _chat(srv, [{"role": "system", "content": "Answer in one word."},
                       {"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
                       {"role": "user", "content": "Another?"}], max_tokens=5)
    assert r.output_text == chat["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]


@pytest.mark.parametrize("body, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input_image"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "web_search"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
    ({"input": [{"role": "tool", "content": "x"}]}, "role"),
    ({"input": []}, "no messages"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": 3}, "temperature"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "name"),
    ({}, "input"),
    ({"input": "hi", "text": {"format": "json"}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "yaml"),
    ({"input": [{"role": "user", "content": None}]}, "content"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "content"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "nope"),
])
def test_bad_requests_are_400_by_name(srv, body, words):
    r = srv.http.post("/v1/responses", json={"model": "default", **body})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_text_format_json_schema_constrains_the_answer(srv):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = srv.openai.responses.create(model="default", input="Is water wet? Answer in JSON.", temperature=0,
                                    max_output_tokens=40, text={"format": {"type": "json_schema", "name": "answer",
                                                                           "schema": schema, "strict": True}})
    assert r.status == "completed", r.output_text
    assert isinstance(json.loads(r.output_text)["ok"], bool)


# ------------------------------------------------------------------------- tools, on a scripted model
# (after every test of the real model: `tooled` patches Model for the rest of the module)

from tests import test_server_tools as scripted  # noqa: E402

FLAT = {"type": "function", **scripted.WEATHER["function"]}


@pytest.fixture(scope="module")
def tooled():
    mp = pytest.MonkeyPatch()
    mp.setattr(Model, "chat_template", lambda self, tools=False: scripted._template(scripted.state.template))
    mp.setattr(Model, "stream", scripted._scripted)
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600))
    try:
        with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
            yield _clients(url)
    finally:
        mp.undo()


@pytest.fixture
def script():
    st = scripted.state
    st.template, st.output, st.prompts[:] = "qwen2.5-7b-instruct", scripted.CALLS, []
    return st


def test_function_calls_come_back_as_items(tooled, script):
    r = tooled.openai.responses.create(model="default", input="Weather in Oslo and Zürich?", tools=[FLAT])
    assert [o.type for o in r.output] == ["message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "I will look." and r.status == "completed"
    calls = r.output[1:]
    assert [c.name for c in calls] == ["get_weather"] * 2 and len({c.call_id for c in calls}) == 2
    assert [scripted._valid(c.arguments) for c in calls] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]
    assert "<tools>" in script.prompts[-1] and "get_weather" in script.prompts[-1]
    one = tooled.openai.responses.create(model="default", input="Weather?", tools=[FLAT], parallel_tool_calls=False)
    assert [o.type for o in one.output] == ["message", "function_call"]
    assert scripted._valid(one.output[1].arguments) == {"city": "Oslo", "days": 2}


def test_function_calls_streamed(tooled, script):
    events = list(tooled.openai.responses.create(model="default", input="Weather?", tools=[FLAT], stream=True,
                                                 tool_choice="auto"))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["message", "function_call", "function_call"]
    args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [scripted._valid(a) for a in args] == [{"city": "Oslo", "days": 2}, {"city": 'Zürich "ZH"'}]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "I will look."
    final = events[-1]
    assert final.type == "response.completed" and [o.type for o in final.response.output] == [i.type for i in done]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_function_call_output_goes_back_through_the_template(tooled, script):
    script.output = "Oslo: 12 C and rain."
    items = [{"role": "user", "content": "Weather in Oslo?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "12 C, rain"}]
    r = tooled.openai.responses.create(model="default", input=items, tools=[FLAT], tool_choice="auto")
    assert r.output_text == "Oslo: 12 C and rain." and [o.type for o in r.output] == ["message"]
    p = script.prompts[-1]
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in p and "12 C, rain" in p


def test_chat_parallel_tool_calls_false_keeps_the_first(tooled, script):
    ask = [{"role": "user", "content": "Weather?"}]
    r = tooled.openai.chat.completions.create(model="default", messages=ask, tools=[scripted.WEATHER],
                                              parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and scripted._valid(calls[0].function.arguments) == {"city": "Oslo", "days": 2}
    got = {}
    for chunk in tooled.openai.chat.completions.create(model="default", messages=ask, tools=[scripted.WEATHER],
                                                       parallel_tool_calls=False, stream=True):
        for t in chunk.choices[0].delta.tool_calls or []:
            got[t.index] = got.get(t.index, "") + ((t.function.arguments or "") if t.function else "")
    assert list(got) == [0] and scripted._valid(got[0]) == {"city": "Oslo", "days": 2}
    both = tooled.openai.chat.completions.create(model="default", messages=ask, tools=[scripted.WEATHER])
    assert len(both.choices[0].message.tool_calls) == 2
