"""Hostile request values (issue 39): every malformed value is a 4xx with a reason within 2 s, never a
500; legal but extreme ones (an exponential-looking grammar, a huge num_ctx) are served or clamped.

The table is robustness/hostile_values.py's (`cases`), swept here over the Ollama and OpenAI routes
of an in-process app (Starlette's TestClient): first with a model name that is not there, so that no
model loads and a case whose values pass answers 404; then the served cases on the default model.
Beside it, the pieces on their own: Ollama's num_ctx clamp, chat truncation by binary search against
the linear scan it replaces, and the message cap.
"""
from __future__ import annotations

import logging
import random
import time

import pytest

fastapi = pytest.importorskip("fastapi")

from ramforge.errors import RequestTooLarge  # noqa: E402
from ramforge.server import ServerConfig, create_app  # noqa: E402
from ramforge.server.common import MAX_MESSAGES, clamp_num_ctx, fit_messages, trained_context  # noqa: E402
from robustness.hostile_values import REFUSED, SERVED, cases, judge  # noqa: E402

DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    app = create_app(ServerConfig(ram="400M", n_ctx=256, max_ctx=1024, lenient_names=False))   # unknown: 404
    with TestClient(app, raise_server_exceptions=False) as c:
        c.manager = app.state.manager
        yield c


def _post(c, case):
    t = time.perf_counter()
    r = c.post(case.path, content=case.body, headers={"content-type": "application/json"})
    return r, time.perf_counter() - t


@pytest.mark.parametrize("case", cases(model="no-such-model"), ids=lambda case: case.name)
def test_hostile_values_are_4xx_within_2_s(client, case):
    r, took = _post(client, case)
    assert judge(case, r.status_code, r.content, missing_model=True) is None, (r.status_code, r.text[:300])
    assert took < DEADLINE_S, f"{case.name}: {took:.2f} s"
    assert client.manager.current is None                       # nothing loaded a model


def test_the_table_covers_each_class_and_both_apis():
    table = cases()
    names = " ".join(c.name for c in table)
    for what in ("doubling", "nested 5,000", "rule chain", "500 deep", "1e999", "NaN", "Infinity", "400-digit",
                 "chat_template_kwargs.messages", "5,000 messages", "num_ctx 1,048,576", "body: JSON nested 600 deep",
                 "inside strings"):
        assert what in names, what
    assert {c.path for c in table} >= {"/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions"}
    assert {c.expect for c in table} == {SERVED, REFUSED}


def test_served_cases_on_the_model(client):
    """The legal extremes on the default model: the 27-doubling grammar constrains an answer, a
    400-digit bound is clamped, and num_ctx 1,048,576 loads the model at --max-ctx (1024)."""
    served = [c for c in cases() if c.expect == SERVED]
    for case in served:
        r, took = _post(client, case)
        assert judge(case, r.status_code, r.content) is None, (case.name, r.status_code, r.text[:300])
        if "doubling" in case.name:
            body = r.json()
            text = body["choices"][0]["message"]["content"] if "messages" in case.body else body["choices"][0]["text"]
            assert set(text) <= {"a"} and text, text                 # the grammar held
    ps = client.get("/api/ps").json()["models"][0]
    assert ps["context_length"] == 1024


def test_request_bodies_nest_and_count_digits_with_a_reason(client):
    """A body nesting past MAX_JSON_DEPTH is a 400 saying so (checked in C before Python's recursive parser
    runs, within milliseconds even at the body limit); one nesting to the limit is read; an integer past
    Python's digit limit is a 400 saying the number is too large, not FastAPI's "error parsing the body"."""
    import json

    from ramforge.server.common import MAX_JSON_DEPTH, json_depth

    assert json_depth(b'[' * MAX_JSON_DEPTH + b']' * MAX_JSON_DEPTH) == 0            # no more brackets than the limit
    assert json_depth(b'{"a": "' + b'[{' * 5000 + b'\\"]", "b": [[1]]}') == 3      # strings do not nest
    ok = {"model": "no-such-model", "prompt": "x", "stream": False, "context": []}
    for depth, status in ((MAX_JSON_DEPTH - 1, 400), (MAX_JSON_DEPTH + 1, 400)):
        body = json.dumps(ok).replace('"context": []', '"context": ' + "[" * depth + "]" * depth)
        r = client.post("/api/generate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        assert ("nests arrays and objects" in r.json()["error"]) == (depth + 1 > MAX_JSON_DEPTH)
    t = time.perf_counter()
    r = client.post("/api/generate", content=b"[" * (1 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 400 and "1,048,576 deep" in r.json()["error"] and time.perf_counter() - t < 1.0
    r = client.post("/v1/completions", content='{"model": "m", "prompt": "x", "seed": ' + "7" * 4301 + "}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "more than 4,300 digits" in r.json()["error"]["message"]


def test_the_library_refuses_template_variable_collisions_too(default_model):
    """Model.create_chat_completion applies chat.check_template_kwargs as the server does."""
    from ramforge import Model
    from ramforge.generation.chat import ChatTemplateError

    with Model(default_model, n_ctx=256) as m:
        for name in ("messages", "bos_token", "add_generation_prompt"):
            with pytest.raises(ChatTemplateError, match=f"cannot set {name}"):
                m.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=1,
                                         chat_template_kwargs={name: 1})
        with pytest.raises(ChatTemplateError, match="must be an object"):
            m.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=1, chat_template_kwargs=["x"])
        r = m.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=1,
                                     chat_template_kwargs={"enable_thinking": False})
        assert r["choices"][0]["message"]["role"] == "assistant"


def test_num_ctx_is_clamped_as_ollama_clamps_it(default_model, caplog):
    path = str(default_model)
    trained = trained_context(path)
    assert trained == 32768                                        # gemma-3-270m's context_length
    assert clamp_num_ctx(None, path, None) is None                 # the server's --ctx decides
    assert clamp_num_ctx(2048, path, None) == 2048
    with caplog.at_level(logging.WARNING, logger="ramforge.server"):
        assert clamp_num_ctx(1 << 20, path, None) == trained
    assert "requested context size too large for model" in caplog.text and "n_ctx_train=32768" in caplog.text
    assert clamp_num_ctx(1 << 20, path, 4096) == 4096              # --max-ctx
    assert clamp_num_ctx(3000, path, 4096) == 3000
    assert clamp_num_ctx(40000, path, 65536) == trained            # --max-ctx above the trained context


# ------------------------------------------------------------------------------- chat truncation

def _linear_fit(msgs, n_ctx, count):
    """The linear scan fit_messages replaced (Ollama's chatPrompt, oldest first), as the reference."""
    from ramforge.generation.chat import ChatTemplateError
    from ramforge.server.common import _tool_block_start

    last = len(msgs) - 1
    for i in range(last + 1):
        start = _tool_block_start(msgs, i)
        kept = [m for m in msgs[:start] if m.get("role") == "system"] + msgs[start:]
        try:
            if i == last or count(kept) <= n_ctx:
                return kept
        except ChatTemplateError:
            if start == 0:
                raise
    return msgs


def _conversation(rng: random.Random, n: int) -> list[dict]:
    msgs = [{"role": "system", "content": "s" * rng.randint(1, 5)}] if rng.random() < 0.5 else []
    while len(msgs) < n:
        r = rng.random()
        if r < 0.15 and msgs and msgs[-1]["role"] != "tool":
            msgs.append({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]})
            msgs += [{"role": "tool", "content": "t" * rng.randint(1, 9)} for _ in range(rng.randint(1, 3))]
        elif r < 0.2:
            msgs.append({"role": "system", "content": "s" * rng.randint(1, 5)})
        else:
            msgs.append({"role": rng.choice(["user", "assistant"]), "content": "x" * rng.randint(0, 30)})
    return msgs


@pytest.mark.parametrize("seed", range(40))
def test_truncation_by_binary_search_keeps_ollamas_choice(seed):
    from ramforge.generation.chat import ChatTemplateError

    rng = random.Random(seed)
    msgs = _conversation(rng, rng.randint(1, 60))
    refuse = rng.random() < 0.5            # a template that wants a user turn first, as alternating ones do
    calls = []

    def count(ms):
        calls.append(len(ms))
        first = next((m for m in ms if m["role"] != "system"), None)
        if refuse and first is not None and first["role"] != "user" and len(ms) < len(msgs):
            raise ChatTemplateError("conversation roles must alternate", "raised")
        return sum(len(m["content"]) + 4 for m in ms)

    total = sum(len(m["content"]) + 4 for m in msgs)
    for n_ctx in (1, total // 4, total // 2, total - 1, total + 1):
        calls.clear()
        try:
            want = _linear_fit(msgs, n_ctx, count)
        except ChatTemplateError:
            want = "refused"
        calls.clear()
        try:
            got = fit_messages(msgs, n_ctx, count)
        except ChatTemplateError:
            got = "refused"
        assert got == want, (seed, n_ctx)


def test_truncation_renders_log_n_times():
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "w " * 20} for i in range(MAX_MESSAGES - 1)]
    msgs.append({"role": "user", "content": "last"})
    calls = []

    def count(ms):
        calls.append(len(ms))
        return sum(len(m["content"]) for m in ms)

    kept = fit_messages(msgs, 4000, count)
    assert kept == msgs[-100:]                                   # 40 characters each: the last 100 fit
    assert len(calls) <= 2 * MAX_MESSAGES.bit_length(), len(calls)   # the linear scan made ~4,000
    assert sum(calls) < 5 * len(msgs)


def test_more_messages_than_the_cap_is_a_400():
    msgs = [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)
    with pytest.raises(RequestTooLarge, match=f"{MAX_MESSAGES:,}"):
        fit_messages(msgs, 100, lambda ms: 0)
