"""Logprobs through `ramforge serve` with the official `openai` and `ollama` clients, against the
llama.cpp records of tests/fixtures/logprobs/ (gemma-3-270m: tools/record_logprobs.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

from ramforge.server import ServerConfig, create_app  # noqa: E402
from tests.serving import serving  # noqa: E402

REC = json.loads((Path(__file__).parent / "fixtures" / "logprobs" / "gemma3-270m-q4_k_m.json").read_text())
TOL = 1e-5
CHAT_Q = "What is the capital of France?"


def prompt(name: str) -> dict:
    return next(p for p in REC["prompts"] if p["name"] == name)


@pytest.fixture(scope="module")
def server():
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        yield SimpleNamespace(url=url, ollama=ollama.Client(host=url),
                              openai=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0),
                              http=httpx.Client(base_url=url, timeout=300))


def check_top(entries, pr, key=lambda e: e["token"]):
    """entries (one per generated token, with top_logprobs) against the record's server_top."""
    assert len(entries) >= 5
    for i, e in enumerate(entries):
        want = pr["server_top"][i]
        assert math.isclose(e["logprob"], want[0][1], abs_tol=TOL), i
        assert len(e["top_logprobs"]) == len(want)
        for alt, (tid, lp) in zip(e["top_logprobs"], want):
            assert math.isclose(alt["logprob"], lp, abs_tol=TOL), (i, alt, tid)
            if "id" in alt:
                assert alt["id"] == tid


def test_chat_logprobs_are_llama_cpps(server):
    pr = prompt("chat")
    r = server.openai.chat.completions.create(model="default", messages=[{"role": "user", "content": CHAT_Q}],
                                              max_tokens=6, temperature=0, logprobs=True, top_logprobs=20)
    content = [c.model_dump() for c in r.choices[0].logprobs.content]
    assert [c["id"] for c in content] == pr["tokens"][:len(content)]
    check_top(content, pr)
    assert "".join(c["token"] for c in content) == r.choices[0].message.content
    for c in content:                                        # bytes are the token's UTF-8 bytes
        assert bytes(c["bytes"]).decode() == c["token"]
    # streamed: the same entries, spread over the chunks
    got = []
    for ch in server.openai.chat.completions.create(model="default", messages=[{"role": "user", "content": CHAT_Q}],
                                                    max_tokens=6, temperature=0, logprobs=True, top_logprobs=20,
                                                    stream=True):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            got += [c.model_dump() for c in ch.choices[0].logprobs.content]
    assert [c["id"] for c in got] == [c["id"] for c in content]
    assert all(math.isclose(a["logprob"], b["logprob"], abs_tol=1e-9) for a, b in zip(got, content))


def test_completions_legacy_logprobs_are_llama_cpp_pythons(server):
    for name in ("prose", "emoji"):
        pr = prompt(name)
        want = pr["completion"]["logprobs"]
        r = server.openai.completions.create(model="default", prompt=pr["text"], max_tokens=REC["oracle"]["n_gen"],
                                             temperature=0, logprobs=5)
        got = r.choices[0].logprobs.model_dump()
        n = len(got["tokens"])
        assert n == REC["oracle"]["n_gen"]
        assert got["tokens"] == want["tokens"][:n] and got["text_offset"] == want["text_offset"][:n]
        assert all(math.isclose(a, b, abs_tol=TOL) for a, b in zip(got["token_logprobs"], want["token_logprobs"]))
        for a, b in zip(got["top_logprobs"], want["top_logprobs"]):
            assert a.keys() == b.keys() and all(math.isclose(a[k], b[k], abs_tol=TOL) for k in b)


def test_ollama_logprobs_are_llama_cpps(server):
    pr = prompt("prose")
    r = server.ollama.generate(model="default", prompt=pr["text"], raw=True, logprobs=True, top_logprobs=20,
                               options={"temperature": 0, "num_predict": 8})
    entries = [e.model_dump() for e in r.logprobs]
    assert len(entries) == 8
    check_top(entries, pr)
    pr = prompt("chat")
    parts = list(server.ollama.chat(model="default", messages=[{"role": "user", "content": CHAT_Q}], stream=True,
                                    logprobs=True, top_logprobs=3, options={"temperature": 0, "num_predict": 6}))
    entries = [e.model_dump() for p in parts for e in (p.logprobs or [])]
    assert len(entries) == 6 and all(len(e["top_logprobs"]) == 3 for e in entries)
    assert "".join(e["token"] for e in entries) == "".join(p.message.content for p in parts)
    for e, want in zip(entries, pr["server_top"]):
        assert math.isclose(e["logprob"], want[0][1], abs_tol=TOL)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}),
    ("/v1/chat/completions", {"top_logprobs": 2}),
    ("/v1/completions", {"logprobs": 21}),
    ("/api/chat", {"logprobs": True, "top_logprobs": 21}),
])
def test_bad_logprobs_are_a_400(server, path, body):
    base = {"model": "default", "messages": [{"role": "user", "content": "hi"}]} if "chat" in path else \
        {"model": "default", "prompt": "hi"}
    r = server.http.post(path, json={**base, **body})
    assert r.status_code == 400, r.text
    assert "logprobs" in r.text
