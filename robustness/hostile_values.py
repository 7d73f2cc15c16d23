"""Hostile request values against `ramforge serve`: each must be answered 4xx with a reason (or be
served, where the value is legal, or clamped), within 2 s, never a 500, and the server must stay well.

    python robustness/hostile_values.py                  # starts a server on the default model
    python robustness/hostile_values.py --url http://127.0.0.1:11434

The classes (`CASES`, one request each, over the Ollama and OpenAI routes):
  - grammars: 27 doubling rules (`r1 ::= r0 r0`, ...; exponential if rules were inlined: served),
    groups or repetitions nested 5,000 deep, a 5,000-rule chain, 300 KB of grammar (400);
  - JSON schemas nested 500 deep (as `format`, response_format, json_schema and a forced tool's
    parameters), `1e999` as a bound or a const, NaN, an integer bound of 400 digits (clamped: served),
    JSON nested 100,000 deep;
  - request bodies nested 100,000 and 600 deep (400 saying so, before Python's recursive parser runs),
    1,600 brackets inside strings (not nesting: served);
  - numbers: `1e999`, `NaN`, `Infinity` and 5,000-digit integers as sampling options, num_ctx,
    keep_alive, max_tokens, seed, logit_bias (a 5,000-digit integer: 400 saying it is too large);
  - chat_template_kwargs naming the template's own variables (messages, add_generation_prompt,
    bos_token, tools, limits);
  - 5,000 messages in one chat (400); num_ctx 1,048,576 (clamped to the model's trained context and
    --max-ctx: served).
Checks (exit status 1 if one fails): each case's status class and a JSON error reason for a 4xx; each
answered within `--deadline` (2 s) except the served ones, which also generate (`--served-deadline`);
/health answers within 100 ms between cases; the server process is alive at the end and a normal
request completes; the model's budget (/api/ps) once idle is as after the warm-up; no traceback in
the server's log. Bounded: one request at a time, each with a client timeout; loopback only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

if __package__ in (None, ""):                       # run as a script: python robustness/hostile_values.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from robustness.load_server import budget_of, free_port, start_server, stop_server, wait_idle, wait_up  # noqa: E402

SERVED, REFUSED = "served", "refused"      # 2xx (or 404 for a model that is not there), or 400 / 422
MSG = [{"role": "user", "content": "Say yes."}]
WARM_UP = {"model": "default", "prompt": "hi", "stream": False, "options": {"num_predict": 1, "num_ctx": 1 << 20}}


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: str                 # the JSON text sent (numbers such as 1e999 written as they are)
    expect: str               # SERVED or REFUSED
    why: str = ""             # for REFUSED: what the reason must say (any reason where empty)


def _j(obj) -> str:
    return json.dumps(obj)


def doubling(n: int = 27) -> str:
    """root ::= r27, r27 ::= r26 r26, ... r0 ::= "a": 2^27 characters long, ~300 bytes of text."""
    return f"root ::= r{n}\nr0 ::= \"a\"\n" + "".join(f"r{i} ::= r{i - 1} r{i - 1}\n" for i in range(1, n + 1))


def deep_schema(n: int = 500) -> dict:
    s: dict = {"type": "string"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return s


def _ollama_chat(**kw) -> dict:
    return {"model": "default", "messages": MSG, "stream": False, "options": {"num_predict": 2, "temperature": 0},
            **kw}


def _v1_chat(**kw) -> dict:
    return {"model": "default", "messages": MSG, "max_tokens": 2, "temperature": 0, **kw}


def _with(body: dict, raw: str, where: str) -> str:
    """body as JSON with the text `raw` in place of the placeholder at key path `where` (a.b.c)."""
    keys, d = where.split("."), body
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = "@RAW@"
    return _j(body).replace('"@RAW@"', raw)


def cases(model: str = "default") -> list[Case]:
    """The table of hostile values (see the module doc); `model` names the model every request asks for."""
    out: list[Case] = []

    def add(name, path, body, expect, why=""):
        if isinstance(body, dict):
            body = _j(body)
        out.append(Case(name, path, body.replace('"model": "default"', f'"model": {_j(model)}'), expect, why))

    # ---- grammars (GBNF)
    for path, mk in (("/v1/chat/completions", _v1_chat), ("/v1/completions", None)):
        base = mk if mk else (lambda **kw: {"model": "default", "prompt": "Say", "max_tokens": 2, **kw})
        add(f"grammar: 27 doubling rules {path}", path, base(grammar=doubling()), SERVED)
    add("grammar: groups nested 5,000 deep", "/v1/chat/completions",
        _v1_chat(grammar="root ::= " + "(" * 5000 + '"a"' + ")" * 5000), REFUSED)
    add("grammar: repetitions nested 5,000 deep", "/v1/chat/completions", _v1_chat(grammar='root ::= "a"' + "*" * 5000),
        REFUSED)
    add("grammar: a 5,000-rule chain", "/v1/chat/completions",
        _v1_chat(grammar="root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(5000)) + 'r5000 ::= "a"\n'),
        REFUSED)
    add("grammar: 300 KB", "/v1/chat/completions", _v1_chat(grammar="root ::= " + '"a" ' * 75_000), REFUSED)
    # ---- JSON schemas
    deep = deep_schema()
    add("schema: 500 deep as Ollama format", "/api/chat", _ollama_chat(format=deep), REFUSED)
    add("schema: 500 deep as /api/generate format", "/api/generate",
        {"model": "default", "prompt": "x", "stream": False, "format": deep}, REFUSED)
    add("schema: 500 deep as response_format", "/v1/chat/completions",
        _v1_chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}), REFUSED)
    add("schema: 500 deep as json_schema", "/v1/chat/completions", _v1_chat(json_schema=deep), REFUSED)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": deep}}}}
    add("schema: 500 deep as a forced tool's parameters", "/v1/chat/completions",
        _v1_chat(tools=[tool], tool_choice="required"), REFUSED)
    for raw, what in (("1e999", "1e999"), ("-1e999", "-1e999"), ("NaN", "NaN"), ("Infinity", "Infinity")):
        add(f"schema: {what} as an integer minimum", "/api/chat",
            _with(_ollama_chat(format={"type": "integer"}), raw, "format.minimum"), REFUSED)
        add(f"schema: {what} as a const", "/v1/chat/completions",
            _with(_v1_chat(json_schema={}), raw, "json_schema.const"), REFUSED)
    add("schema: a 400-digit integer bound (clamped to int64)", "/api/chat",
        _with(_ollama_chat(format={"type": "integer"}), "1" + "0" * 400, "format.maximum"), SERVED)
    nests = "nests arrays and objects"
    add("schema: JSON nested 100,000 deep", "/api/chat",
        _with(_ollama_chat(), "[" * 100_000 + "]" * 100_000, "format"), REFUSED, nests)
    # ---- request bodies: nesting past what the server reads (Python's parser recurses per level)
    add("body: JSON nested 100,000 deep", "/api/generate", "[" * 100_000 + "]" * 100_000, REFUSED, nests)
    add("body: JSON nested 600 deep", "/v1/chat/completions", _with(_v1_chat(), "[" * 600 + "]" * 600, "stop"),
        REFUSED, nests)
    add("body: 1,600 brackets inside strings (not nesting: read)", "/v1/chat/completions",
        _v1_chat(stop=["[{" * 400, "[" * 800]), SERVED)
    # ---- numbers anywhere
    for raw in ("1e999", "NaN", "-Infinity", "9" * 5000):
        why = "more than 4,300 digits" if raw[0] == "9" else ""     # the body's JSON cannot be read
        for opt in ("temperature", "top_p", "num_ctx", "seed", "num_predict", "repeat_penalty"):
            add(f"options.{opt} = {raw[:8]}", "/api/generate",
                _with({"model": "default", "prompt": "x", "stream": False}, raw, f"options.{opt}"), REFUSED, why)
        for field in ("temperature", "max_tokens", "seed", "top_p", "frequency_penalty"):
            add(f"{field} = {raw[:8]}", "/v1/chat/completions", _with(_v1_chat(), raw, field), REFUSED, why)
        add(f"keep_alive = {raw[:8]}", "/api/chat", _with(_ollama_chat(), raw, "keep_alive"), REFUSED, why)
        add(f"logit_bias value = {raw[:8]}", "/v1/chat/completions", _with(_v1_chat(), raw, "logit_bias.1"), REFUSED,
            why)
    add('keep_alive = "1e999"', "/api/chat", _ollama_chat(keep_alive="1e999"), REFUSED)
    # ---- template variables
    for name in ("messages", "add_generation_prompt", "bos_token", "tools", "limits"):
        add(f"chat_template_kwargs.{name}", "/v1/chat/completions", _v1_chat(chat_template_kwargs={name: 1}), REFUSED)
    # ---- sizes
    many = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 2500
    add("5,000 messages (Ollama)", "/api/chat", _ollama_chat(messages=many), REFUSED)
    add("5,000 messages (OpenAI)", "/v1/chat/completions", _v1_chat(messages=many), REFUSED)
    add("num_ctx 1,048,576 (clamped)", "/api/generate",
        {"model": "default", "prompt": "x", "stream": False, "options": {"num_ctx": 1 << 20, "num_predict": 1}}, SERVED)
    add("num_ctx 1,048,577", "/api/generate",
        {"model": "default", "prompt": "x", "stream": False, "options": {"num_ctx": (1 << 20) + 1}}, REFUSED)
    return out


def reason(status: int, body: bytes) -> str | None:
    """The error reason of a 4xx JSON body (Ollama's or OpenAI's shape), or None."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(err, dict):
        err = err.get("message")
    return err if isinstance(err, str) and err else None


def judge(case: Case, status: int, body: bytes, missing_model: bool = False) -> str | None:
    """What is wrong with an answer (None: right). missing_model: the requests name no model there
    is, so a served case answers 404 once its values passed."""
    if status >= 500:
        return f"{status}: {body[:200]!r}"
    if case.expect == REFUSED:
        if status not in (400, 422) or reason(status, body) is None:
            return f"expected a 400 with a reason, got {status}: {body[:200]!r}"
        if case.why not in reason(status, body):
            return f"expected a reason saying {case.why!r}, got {reason(status, body)!r}"
    elif missing_model:
        if status != 404:
            return f"expected the values to pass (then 404 for the model), got {status}: {body[:200]!r}"
    elif not 200 <= status < 300:
        return f"expected it served, got {status}: {body[:200]!r}"
    return None


def run(url: str, deadline: float = 2.0, served_deadline: float = 60.0) -> list[str]:
    """Send every case to a running server (loopback); the failures, as lines."""
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"only a loopback server may be targeted, not {host}")
    fails: list[str] = []
    with httpx.Client(base_url=url, timeout=served_deadline + 10) as c:
        # the warm-up asks for the largest context, as the clamped case does, so that no case reloads the
        # model (a reload would change the budget the end is compared with)
        c.post("/api/generate", json=WARM_UP).raise_for_status()
        wait_idle(url)
        budget = budget_of(url)
        for case in cases():
            t = time.perf_counter()
            try:
                r = c.post(case.path, content=case.body, headers={"content-type": "application/json"})
            except httpx.HTTPError as e:
                fails.append(f"{case.name}: {type(e).__name__}: {e}")
                continue
            took = time.perf_counter() - t
            bad = judge(case, r.status_code, r.content)
            limit = deadline if case.expect == REFUSED else served_deadline
            if bad is None and took > limit:
                bad = f"took {took:.2f} s, over {limit:g} s"
            if bad:
                fails.append(f"{case.name}: {bad}")
            t = time.perf_counter()
            h = c.get("/health", timeout=10)
            if h.status_code != 200 or time.perf_counter() - t > 0.1:
                fails.append(f"after {case.name}: /health {h.status_code} in {time.perf_counter() - t:.3f} s")
        wait_idle(url)
        r = c.post("/api/generate", json=WARM_UP)
        if r.status_code != 200:
            fails.append(f"a normal request after the cases: {r.status_code} {r.text[:200]}")
        wait_idle(url)
        if budget_of(url) != budget:
            fails.append(f"budget once idle {budget_of(url)} != after the warm-up {budget}")
    return fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="an already running server (loopback) instead of starting one")
    ap.add_argument("--deadline", type=float, default=2.0, help="seconds a refused value may take")
    ap.add_argument("--served-deadline", type=float, default=60.0, help="seconds a served one may take")
    a = ap.parse_args(argv)
    proc, log_path, url = None, None, a.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = tempfile.mktemp(prefix="ramforge-hostile-", suffix=".log")
        proc = start_server(port, log_path, "--max-ctx", "1024")
    try:
        wait_up(url, proc)
        fails = run(url, a.deadline, a.served_deadline)
        if proc is not None:
            if proc.poll() is not None:
                fails.append(f"the server process exited with {proc.returncode}")
            log = open(log_path, "rb").read().decode("utf-8", "replace")
            if "Traceback" in log:
                fails.append("a traceback in the server log: " + log[log.index("Traceback"):][:1500])
        n = len(cases())
        print(f"{n} hostile cases against {url}: {len(fails)} failed")
        for f in fails:
            print("  " + f)
        return 1 if fails else 0
    finally:
        stop_server(proc, log_path)


if __name__ == "__main__":
    sys.exit(main())
