"""Tool calls (ramforge.generation.tools_call) and `<think>` blocks (ramforge.generation.reasoning.Think): the parsers on
constructed model outputs of each format, whole and in any pieces; the template detection on the
recorded chat templates; tool results rendered back through them; and the servers end to end with
the official `openai` and `ollama` clients on a scripted model output (the tiny default model does
not call tools), arguments validated against the tool's parameters with jsonschema."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ramforge.generation.chat import ChatTemplate, render_chat
from ramforge.errors import InvalidArgument
from ramforge.generation.reasoning import Think, parser_for, split
from ramforge.generation.tools_call import (GENERIC, HERMES, LLAMA3, MISTRAL, CallStream, ToolSession,
                                            call_constraint, check_choice, detect, parse, tool_names)

CHAT = Path(__file__).parent / "fixtures" / "chat"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"]}}}
ARGS = '{"city": "Paris, \\"FR\\" {x}", "days": 3}'
OUTPUTS = {   # (format, output, content, [(name, arguments)])
    "hermes": (HERMES, f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>', "",
               [("get_weather", ARGS)]),
    "hermes-content-two": (HERMES, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                                   '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
                                   '\n</tool_call>', "Let me check.",
                           [("get_weather", '{"city": "Oslo"}'), ("get_weather", '{"city": "Rome"}')]),
    "hermes-text": (HERMES, "The weather is <b>fine</b> today.", "The weather is <b>fine</b> today.", []),
    "llama3": (LLAMA3, f'{{"name": "get_weather", "parameters": {ARGS}}}', "", [("get_weather", ARGS)]),
    "llama3-typed": (LLAMA3, '{"type": "function", "name": "get_weather", "parameters": {"city": "Oslo"}}', "",
                     [("get_weather", '{"city": "Oslo"}')]),
    "llama3-text": (LLAMA3, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", []),
    "mistral": (MISTRAL, f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}, "id": "a1B2c3D4e"}}]', "",
                [("get_weather", ARGS)]),
    "mistral-no-marker": (MISTRAL, '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "",
                          [("get_weather", '{"city": "Oslo"}')]),
    "generic": (GENERIC, f'{{"tool_calls": [{{"name": "get_weather", "arguments": {ARGS}}}]}}', "",
                [("get_weather", json.dumps(json.loads(ARGS), ensure_ascii=False))]),
    "generic-response": (GENERIC, '{"response": "It is sunny."}', "It is sunny.", []),
    "generic-text": (GENERIC, "Plain words.", "Plain words.", []),
}


def template(name: str) -> str:
    return json.loads((CHAT / f"{name}.json").read_text())["template"]


@pytest.mark.parametrize("case", OUTPUTS)
def test_each_format_parses_its_calls(case):
    fmt, text, content, calls = OUTPUTS[case]
    got_content, got = parse(text, fmt)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls
    for c in got:
        assert jsonschema.validate(json.loads(c.arguments), WEATHER["function"]["parameters"]) is None
    if case == "mistral":
        assert got[0].id == "a1B2c3D4e"


def stream(fmt: str, pieces: list[str]):
    cs, content, deltas = CallStream(fmt), "", []
    for p in pieces:
        c, d = cs.feed(p)
        content += c
        deltas += d
    c, d = cs.finish()
    return cs, content + c, deltas + d


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(sorted(OUTPUTS)), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_streamed_deltas_add_up_to_the_whole_parse(case, cuts):
    fmt, text, content, calls = OUTPUTS[case]
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    cs, got_content, deltas = stream(fmt, [text[a:b] for a, b in zip(bounds, bounds[1:])])
    assert got_content == content
    heads = [d for d in deltas if "id" in d]
    assert [(d["index"], d["type"], d["function"]["name"]) for d in heads] == \
        [(i, "function", n) for i, (n, _) in enumerate(calls)]
    args = {}
    for d in deltas:
        args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    assert [args[i] for i in range(len(calls))] == [a for _, a in calls]
    assert all(h["id"] for h in heads) and len({h["id"] for h in heads}) == len(heads)


@pytest.mark.parametrize("name, fmt", [("qwen2.5-7b-instruct", HERMES), ("qwen3-0.6b", HERMES),
                                       ("llama-3.1-8b-instruct", LLAMA3), ("llama-3.2-3b-instruct", LLAMA3),
                                       ("mistral-nemo-instruct-2407", MISTRAL), ("gemma3", GENERIC),
                                       ("phi-3.5-mini-instruct", GENERIC)])
def test_the_format_follows_the_recorded_template(name, fmt):
    assert detect(template(name)) == fmt


@pytest.mark.parametrize("name, needle", [("qwen2.5-7b-instruct", '"city": "Oslo"'),
                                          ("llama-3.1-8b-instruct", '"city": "Oslo"'),
                                          ("mistral-nemo-instruct-2407", '"city": "Oslo"')])
def test_tool_results_render_back_through_the_template(name, needle):
    """An assistant call (arguments as OpenAI's JSON string) and its `role: tool` result, rendered."""
    msgs = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a1B2c3D4e", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "a1B2c3D4e", "name": "get_weather", "content": "12 C, rain"}]
    s = ToolSession([WEATHER])
    msgs2, tools = s.prepare(template(name), msgs)
    out = render_chat(template(name), msgs2, tools=tools, bos_token="<s>", eos_token="</s>")
    assert "12 C, rain" in out and needle in out and '\\"city\\"' not in out    # an object, not a string
    assert "get_weather" in out.split("Weather in Oslo?")[0] or name.startswith("mistral")   # tools described


def test_generic_format_describes_the_tools_in_a_system_message():
    s = ToolSession([WEATHER])
    msgs, tools = s.prepare(template("gemma3"), [{"role": "user", "content": "Weather in Oslo?"}])
    assert s.fmt == GENERIC and msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    assert '"response"' in msgs[0]["content"] and '"tool_calls"' in msgs[0]["content"]


def test_validation_is_a_clear_400():
    with pytest.raises(InvalidArgument, match="needs a name"):
        tool_names([{"type": "function", "function": {"description": "no name"}}])
    with pytest.raises(InvalidArgument, match="not among the tools"):
        check_choice({"type": "function", "function": {"name": "nope"}}, [WEATHER])
    with pytest.raises(InvalidArgument, match="needs tools"):
        check_choice("required", [])
    assert check_choice({"type": "function", "function": {"name": "get_weather"}}, [WEATHER]) == "get_weather"
    assert not ToolSession([WEATHER], "none").active


def test_forced_choices_describe_the_grammar_to_switch_on():
    c = call_constraint(HERMES, [WEATHER], "get_weather")
    assert c["start"] == "<tool_call>" and c["schema"]["properties"]["name"] == {"const": "get_weather"}
    assert call_constraint(HERMES, [WEATHER], "auto") is None


# ---- <think> ---------------------------------------------------------------------------------

THINKS = [("<think>\nI'm\nthinking\n</think>\n\nHello, world!", False, ("I'm\nthinking", "Hello, world!")),
          ("I'm\nthinking</think>Hello, world!", True, ("I'm\nthinking", "Hello, world!")),
          ("<think>\n\n</think>\n\nJust the answer.", False, ("", "Just the answer.")),
          ("No thinking here. </think>", False, ("", "No thinking here. </think>")),
          ("<think>cut off", False, ("cut off", ""))]


@settings(max_examples=60, deadline=None)
@given(i=st.integers(0, len(THINKS) - 1), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_think_blocks_split_the_same_in_any_pieces(i, cuts):
    text, opened, want = THINKS[i]
    assert split(text, Think(opened)) == want
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    p, a, b = Think(opened), "", ""
    for x, y in zip(bounds, bounds[1:]):
        t, c = p.feed(text[x:y])
        a, b = a + t, b + c
    t, c = p.flush()
    assert (a + t, b + c) == want


def test_think_templates_get_a_think_parser_opened_by_the_prompt():
    assert isinstance(parser_for(template("qwen3-0.6b")), Think)
    r1 = template("deepseek-r1-distill-qwen-32b")
    prompt = render_chat(r1, [{"role": "user", "content": "hi"}], bos_token="<s>", enable_thinking=True)
    assert prompt.rstrip().endswith("<think>") and parser_for(r1, prompt).state == "think"
    closed = render_chat(r1, [{"role": "user", "content": "hi"}], bos_token="<s>", enable_thinking=False)
    assert parser_for(r1, closed).state == "start"      # think: false closes the block in the prompt
    assert parser_for(template("gemma3")) is None


# ------------------------------------------------------------- the stream parser is incremental (issue 39)

def _naive_stream(fmt: str, pieces: list[str]):
    """The stream as it was before it became incremental: the whole text parsed again per chunk."""
    from ramforge.generation.tools_call import new_id

    text, sent, calls, args_sent, out = "", 0, [], [], []
    for final, piece in [(False, p) for p in pieces] + [(True, "")]:
        text += piece
        content, got = parse(text, fmt, partial=not final)
        if not final:
            content = content.rstrip()
            if got and sent == 0:
                content = content.lstrip()
        delta = content[sent:] if len(content) > sent else ""
        sent += len(delta)
        deltas = []
        for k, c in enumerate(got):
            if k == len(calls):
                c.id = c.id or new_id(fmt)
                calls.append(c)
                args_sent.append(0)
                deltas.append({"index": k, "type": "function", "function": {"name": c.name, "arguments": ""}})
            known = calls[k]
            if c.arguments.startswith(known.arguments[:args_sent[k]]) and len(c.arguments) > args_sent[k]:
                deltas.append({"index": k, "function": {"arguments": c.arguments[args_sent[k]:]}})
                args_sent[k] = len(c.arguments)
            known.arguments, known.complete = c.arguments, c.complete
        out.append((delta, deltas))
    return out, [(c.name, c.arguments, c.complete) for c in calls]


_PIECES = {
    HERMES: ["<tool_call>", "</tool_call>", '{"name": "f", "arguments": {"a": "x<y\\" }"}}', "hello ", " ", "\n",
             "<b>", "<", "{", "}", '"', "\\"],
    LLAMA3: ["<|python_tag|>", '{"name": "f", "parameters": {"a": 1}}', ";", " ", "\n", "hi", "<", "{", '"'],
    MISTRAL: ["[TOOL_CALLS]", '[{"name": "f", "arguments": {"a": 1}, "id": "abc123def"}]', "[", "]", ",", " ", "hi"],
    GENERIC: ['{"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}', '{"response": "ok"}', "```json\n", "```",
              " ", "\n", "plain", "{", "}", '"'],
}


@pytest.mark.parametrize("seed", range(400))
def test_incremental_stream_equals_parsing_the_whole_text_each_time(seed):
    import random

    rng = random.Random(seed)
    fmt = rng.choice(sorted(_PIECES))
    text = "".join(rng.choice(_PIECES[fmt]) for _ in range(rng.randint(0, 10)))
    cuts = sorted({0, len(text)} | {rng.randint(0, len(text)) for _ in range(rng.randint(0, 8))})
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    cs = CallStream(fmt)
    got = [cs.feed(p) for p in pieces] + [cs.finish()]
    got = [(d, [{k: v for k, v in x.items() if k != "id"} for x in xs]) for d, xs in got]
    want, calls = _naive_stream(fmt, pieces)
    want = [(d, [{k: v for k, v in x.items() if k != "id"} for x in xs]) for d, xs in want]
    assert got == want and [(c.name, c.arguments, c.complete) for c in cs.calls] == calls


@pytest.mark.parametrize("fmt, text", [
    (HERMES, "Plain words, and more of them. " * 7000),
    (LLAMA3, "Plain words, and more of them. " * 7000),
    (HERMES, '<tool_call>\n{"name": "f", "arguments": {"t": "' + "x" * 100_000 + '"}}\n</tool_call>'),
    (LLAMA3, '{"name": "f", "parameters": {"t": "' + "y" * 100_000 + '"}}'),
    (MISTRAL, '[TOOL_CALLS][{"name": "f", "arguments": {"t": "' + "z" * 100_000 + '"}}]'),
    (GENERIC, '{"tool_calls": [{"name": "f", "arguments": {"t": "' + "w" * 100_000 + '"}}]}'),
    (HERMES, ("<p>Some <b>bold</b> text, <i>it</i> & <a href='x'>a link</a>.</p>\n" * 3000)[:200_000]),
    (HERMES, "".join(f'<b>{i}</b> <tool_call>\n{{"name": "f", "arguments": {{"i": {i}, "t": "<b>x</b>"}}}}\n'
                     f'</tool_call>\n' for i in range(2000))),
], ids=["hermes-content", "llama3-content", "hermes-call", "llama3-call", "mistral-call", "generic-call",
        "hermes-html", "hermes-2000-calls"])
def test_long_streams_cost_linear_time(fmt, text):
    """~200 KB of content, or a call with 100 KB of arguments, 4 characters a chunk: re-parsing the
    whole text per chunk took minutes for the calls (a Python scan of every argument each time)."""
    import time

    t = time.perf_counter()
    cs, content, deltas = stream(fmt, [text[i:i + 4] for i in range(0, len(text), 4)])
    assert time.perf_counter() - t < 10.0          # ~0.3 s alone; quadratic re-parsing took minutes
    want_content, want_calls = parse(text, fmt)
    assert content == want_content
    assert "".join(d["function"]["arguments"] for d in deltas) == "".join(c.arguments for c in want_calls)


_HERMES_MORE = _PIECES[HERMES] + ["<tool", "_call>", "</tool", "</tool_call", "x", "\u2003",
                                  '{"name": "g", "arguments": 1}', "<tool_call>\n"]


@pytest.mark.parametrize("seed", range(300))
def test_hermes_stream_parses_only_after_its_last_final_point(seed):
    """Hermes re-parses only the text after its last final point (tools_call._hermes's `done`): the deltas
    equal the re-parse-everything stream's on longer random streams of calls, HTML, split markers and
    whitespace (Unicode's too), in random chunks."""
    import random

    rng = random.Random(seed)
    text = "".join(rng.choice(_HERMES_MORE) for _ in range(rng.randint(0, 30)))
    cuts = sorted({0, len(text)} | {rng.randint(0, len(text)) for _ in range(rng.randint(0, 25))})
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    cs = CallStream(HERMES)
    got = [cs.feed(p) for p in pieces] + [cs.finish()]
    got = [(d, [{k: v for k, v in x.items() if k != "id"} for x in xs]) for d, xs in got]
    want, calls = _naive_stream(HERMES, pieces)
    want = [(d, [{k: v for k, v in x.items() if k != "id"} for x in xs]) for d, xs in want]
    assert got == want and [(c.name, c.arguments, c.complete) for c in cs.calls] == calls


def test_hermes_html_streams_in_linear_time():
    """HTML under the Hermes format (a `<` in most chunks, each the start of a marker) costs about its
    length: 4x the text takes well under 16x (quadratic) the time; 200 KB in 4-character chunks took
    about 1 s when every such chunk re-parsed the whole text."""
    import time

    unit = "<p>Some <b>bold</b> text, <i>it</i> & <a href='x'>a link</a>.</p>\n" + \
        '<tool_call>{"name": "f", "arguments": {"t": "<b>x</b>"}}</tool_call>\n'

    def took(text):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            stream(HERMES, [text[i:i + 4] for i in range(0, len(text), 4)])
            best = min(best, time.perf_counter() - t)
        return best

    small, large = unit * 350, unit * 1400
    assert took(large) < 8 * took(small)
