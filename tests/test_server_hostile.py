"""`ramforge serve` against a hostile client: web pages (Origin, DNS rebinding, a browser's body
type), clients that stall (a stream nobody reads, a disconnect mid-prefill), connection floods, and
one failing slot of the continuous batcher.

Real uvicorn servers on 127.0.0.1 (the Host check applies to loopback connections) built as
`ramforge serve` builds them (server.transport.uvicorn_config). The browser tests never load the
model: a refused request must not reach it. robustness/hostile.py runs the same classes for longer,
measuring /health meanwhile (docs/RELIABILITY.md).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from ramforge import cancel  # noqa: E402
from ramforge.errors import ClientDisconnected, GrammarError  # noqa: E402
from ramforge.server import ServerConfig, create_app  # noqa: E402
from ramforge.server.browser import DEFAULT_ORIGINS, local_host, origin_regex, parse_origins  # noqa: E402
from ramforge.server.transport import uvicorn_config  # noqa: E402
from tests.serving import serving  # noqa: E402

KEY = "sk-hostile"
AUTH = {"Authorization": f"Bearer {KEY}"}
EVIL = "https://evil.example"


@contextlib.contextmanager
def served(app, **limits):
    """A uvicorn server of `app` in a thread on 127.0.0.1 at a free port, as `ramforge serve` configures
    it (server.transport.uvicorn_config's `limits`); yields (url, server)."""
    server = uvicorn.Server(uvicorn_config(app, log_level="warning", **limits))
    with serving(server) as (url, _):
        yield url, server


def wait_until(pred, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"{what} did not happen within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - t0


# ------------------------------------------------------------------------------- pure helpers

def test_origin_patterns_as_ollama():
    rx = __import__("re").compile(origin_regex(DEFAULT_ORIGINS))
    for ok in ("http://localhost", "https://localhost", "http://localhost:3000", "https://127.0.0.1:8443",
               "http://0.0.0.0:1", "app://anything", "file://", "tauri://localhost", "vscode-webview://4f2a",
               "vscode-file://vscode-app", "HTTP://LOCALHOST:80"):
        assert rx.fullmatch(ok), ok
    for bad in (EVIL, "null", "http://localhost.evil.example", "http://127.0.0.1.nip.io", "http://evil/localhost",
                "chrome-extension://abc", "http://localhost:1/x", "https://127.0.0.2"):
        assert not rx.fullmatch(bad), bad
    assert parse_origins(" 'https://a.example', chrome-extension://* ,,") == ("https://a.example", "chrome-extension://*")
    assert parse_origins(None) == ()
    extra = __import__("re").compile(origin_regex(("https://*.corp.example",)))
    assert extra.fullmatch("https://app.corp.example") and not extra.fullmatch("https://corp.example.evil/x")
    assert origin_regex(("*",)) == ".*"


def test_local_hosts_as_ollama():
    for ok in ("localhost", "localhost:11434", "127.0.0.1:80", "[::1]:11434", "::1", "0.0.0.0", "192.168.1.9:1",
               "10.0.0.2", "app.localhost", "box.local:11434", "db.internal", "LOCALHOST.", "",
               socket.gethostname()):
        assert local_host(ok), ok
    for bad in ("evil.example", "evil.example:11434", "localhost.evil.example", "8.8.8.8", "127.0.0.1.nip.io",
                "[2001:4860::1]:80"):
        assert not local_host(bad), bad


# ---------------------------------------------------------------------------------- browsers

@pytest.fixture(scope="module")
def lazy():
    """A server whose model loads on first use: a refused request must leave it unloaded."""
    app = create_app(ServerConfig(ram="400M", n_ctx=512, api_key=KEY, origins=("https://app.example",)))
    with served(app) as (url, _):
        yield url, app.state.manager


@pytest.mark.parametrize("path,ctype", [("/api/generate", "text/plain"), ("/api/chat", "application/x-www-form-urlencoded"),
                                        ("/v1/chat/completions", "multipart/form-data; boundary=x"),
                                        ("/v1/completions", "application/json")])
def test_cross_site_post_is_403_and_runs_nothing(lazy, path, ctype):
    url, manager = lazy
    body = json.dumps({"model": "default", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]})
    for auth in ({}, AUTH):                       # with or without the key: refused before it is looked at
        r = httpx.post(url + path, content=body, headers={"Content-Type": ctype, "Origin": EVIL, **auth})
        assert r.status_code == 403, r.text
        msg = r.json()["error"]["message"] if path.startswith("/v1") else r.json()["error"]
        assert "evil.example" in msg and "--origins" in msg
        assert "access-control-allow-origin" not in r.headers
    assert manager.current is None and not manager.lock.locked()     # nothing loaded, nothing queued


def test_bad_origins_are_403_even_preflight(lazy):
    url, _ = lazy
    for origin in (EVIL, "null", "http://localhost.evil.example", "chrome-extension://abcdef", "http://127.0.0.1.nip.io"):
        assert httpx.get(f"{url}/health", headers={"Origin": origin}).status_code == 403, origin
        r = httpx.options(f"{url}/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, origin


def test_allowed_origins_get_cors(lazy):
    url, _ = lazy
    for origin in ("http://localhost:3000", "https://127.0.0.1", "app://ramforge", "vscode-webview://1a2b",
                   "https://app.example"):                               # the last from --origins
        r = httpx.options(f"{url}/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "content-type,authorization"})
        assert r.status_code == 200, (origin, r.text)                   # no API key asked of a preflight
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = httpx.get(f"{url}/api/version", headers={"Origin": origin, **AUTH})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        r = httpx.get(f"{url}/api/version", headers={"Origin": origin})    # the key is still required
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin
    port = url.rsplit(":", 1)[1]
    r = httpx.get(f"{url}/api/version", headers={"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}",
                                                 **AUTH})
    assert r.status_code == 200                                          # same origin


def test_browser_bodies_must_be_json(lazy):
    url, manager = lazy
    body = json.dumps({"model": "default", "prompt": "hi"})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Origin": "http://localhost:5173", **AUTH} | ({"Content-Type": ctype} if ctype else {})
        r = httpx.post(f"{url}/api/generate", content=body, headers=headers)
        assert r.status_code == 415 and "application/json" in r.json()["error"], (ctype, r.text)
        assert r.headers["access-control-allow-origin"] == "http://localhost:5173"   # the page can read why
    assert manager.current is None
    r = httpx.post(f"{url}/api/show", content=b'{"model": "default"}', headers={"Origin": "http://localhost:5173",
                   "Content-Type": "application/json; charset=utf-8", **AUTH})
    assert r.status_code == 200 and r.json()["details"]["family"] == "gemma3"
    r = httpx.post(f"{url}/api/show", content=b'{"model": "default"}',                   # curl -d, no Origin
                   headers={"Content-Type": "application/x-www-form-urlencoded", **AUTH})
    assert r.status_code == 200


def test_dns_rebinding_host_is_403(lazy):
    url, manager = lazy
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}", "127.0.0.1.nip.io",
                 "8.8.8.8"):
        r = httpx.post(f"{url}/api/generate", json={"model": "default", "prompt": "hi"}, headers={"Host": host, **AUTH})
        assert r.status_code == 403 and "not a name of this machine" in r.json()["error"], host
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"ui.localhost:{port}"):
        assert httpx.get(f"{url}/api/version", headers={"Host": host, **AUTH}).status_code == 200, host
    assert manager.current is None


def test_cli_flags(monkeypatch):
    from click.testing import CliRunner

    from ramforge.cli.serve import serve

    seen = {}
    monkeypatch.setattr("ramforge.cli.serve._serve", lambda cfg, *a, **limits: seen.update(cfg=cfg, **limits))
    monkeypatch.setenv("OLLAMA_ORIGINS", "https://a.example, chrome-extension://*")
    r = CliRunner().invoke(serve, ["--write-timeout", "7", "--max-connections", "9"])
    assert r.exit_code == 0, r.output
    assert seen["cfg"].origins == ("https://a.example", "chrome-extension://*")
    assert seen["write_timeout"] == 7 and seen["max_connections"] == 9 and seen["request_timeout"] == 10
    r = CliRunner().invoke(serve, ["--origins", "https://b.example"])
    assert r.exit_code == 0 and seen["cfg"].origins == ("https://b.example",)
    assert CliRunner().invoke(serve, ["--max-connections", "0"]).exit_code != 0


def test_serve_ctx_beyond_max_ctx_is_refused_and_beyond_the_model_clamped(monkeypatch, caplog):
    """--ctx over --max-ctx: refused when the server is made (the CLI's one-line error); over the model's
    trained context: that context, with Ollama's warning, as a request's num_ctx is."""
    import logging

    from ramforge.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="--ctx 2,048 is larger than --max-ctx 1,024"):
        create_app(ServerConfig(n_ctx=2048, max_ctx=1024))
    monkeypatch.setattr("ramforge.server.common.trained_context", lambda path: 256)
    app = create_app(ServerConfig(model="default", n_ctx=4096, ram="400M", n_threads=1))
    manager = app.state.manager
    with caplog.at_level(logging.WARNING, logger="ramforge.server"):
        manager.preload()
    try:
        assert manager.current.model.n_ctx == 256
        assert "requested context size too large for model: num_ctx=4096, n_ctx_train=256" in caplog.text
    finally:
        manager.run_sync(manager.current.model.close)
        manager.executor.shutdown()


# ---------------------------------------------------------------------------- connection cap

def test_connection_flood_evicts_the_longest_waiting():
    """A flood of idle connections beyond the cap: the oldest idle ones are closed, /health still answers."""
    app = create_app(ServerConfig(ram="400M", n_ctx=512))
    with served(app, max_connections=8, request_timeout=30) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            wait_until(lambda: len(server.server_state.connections) <= 8, 5, "evictions")
            with httpx.Client(base_url=url, timeout=5) as c:
                for _ in range(5):
                    r = c.get("/health")
                    assert r.status_code == 200
            for s in idle[:10]:                                  # the oldest were closed by the server
                s.settimeout(5)
                try:
                    assert s.recv(1) == b""
                except ConnectionResetError:
                    pass
        finally:
            for s in idle:
                s.close()
        wait_until(lambda: len(server.server_state.connections) == 0, 5, "the connections to close")


def test_a_request_over_the_connection_cap_gets_a_json_503():
    """Every connection in the middle of a request: a new request is 503 in the server's error shape (Ollama's,
    OpenAI's under /v1) with a reason and Retry-After, not uvicorn's plain text; once one ends, served again."""
    release = threading.Event()

    async def app(scope, receive, send):                     # /slow holds its request until released
        if scope["type"] != "http":
            return
        await receive()
        if scope["path"] == "/slow":
            while not release.is_set():
                await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with served(app, max_connections=2, request_timeout=30) as (url, server):
        held = []
        for _ in range(2):
            held.append(threading.Thread(target=httpx.get, args=(url + "/slow",), kwargs={"timeout": 30}))
            held[-1].start()
        wait_until(lambda: len(server.server_state.tasks) == 2, 10, "two requests in flight")
        try:
            for path, reason in (("/api/generate", lambda b: b["error"]),
                                 ("/v1/chat/completions", lambda b: b["error"]["message"])):
                r = httpx.post(url + path, json={}, timeout=10)
                assert r.status_code == 503 and r.headers["content-type"] == "application/json"
                assert r.headers["retry-after"] == "1" and "--max-connections" in reason(r.json())
            assert httpx.post(url + "/v1/x", json={}, timeout=10).json()["error"]["type"] == "server_busy"
        finally:
            release.set()
            for t in held:
                t.join(30)
        assert httpx.get(url + "/fast", timeout=10).text == "ok"


# ------------------------------------------------------------------- clients that stall (model)

def _raw_request(port: int, path: str, body: dict, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


@pytest.fixture(scope="module")
def loaded():
    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=1024, keep_alive=600, n_threads=1))
    app.state.manager.preload()
    warming = app.state.manager.current.warming
    if warming is not None:                         # these tests time the requests, not the kernels' warm-up
        warming.done.wait(900)
    with served(app, send_buffer=4096, write_timeout=1.5, request_timeout=5) as (url, _):  # full in a few tokens
        yield url, app.state.manager


def test_a_client_that_stops_reading_is_dropped_and_frees_the_model(loaded, caplog):
    url, manager = loaded
    port = int(url.rsplit(":", 1)[1])
    body = {"model": "default", "prompt": "Tell me a very long story about the sea.", "stream": True,
            "logprobs": True, "top_logprobs": 20, "options": {"temperature": 0, "num_predict": 600}}
    stalled = _raw_request(port, "/api/generate", body, rcvbuf=2048)        # and never reads
    try:
        wait_until(manager.lock.locked, 30, "the stream to start")
        t = wait_until(lambda: not manager.lock.locked(), 60, "the model lock to be freed")
        eng = manager.current.model.engine
        assert eng.timings.gen_tokens < 400                                  # cut long before its 600 tokens
        assert "took nothing of its response for 1.5 s: dropped" in caplog.text
        got = b""
        stalled.settimeout(5)
        with contextlib.suppress(OSError):
            while chunk := stalled.recv(65536):
                got += chunk
        assert b'"done":true' not in got.replace(b" ", b"")                  # it never got the end
        with httpx.Client(base_url=url, timeout=60) as c:                    # another client is served
            assert c.get("/health").json()["busy"] is False
            r = c.post("/api/generate", json={"model": "default", "prompt": "Hi", "stream": False,
                                              "options": {"num_predict": 3}})
            assert r.status_code == 200 and r.json()["eval_count"] >= 1
        print(f"dropped {t:.1f} s after the lock was taken, after {eng.timings.gen_tokens} tokens")
    finally:
        stalled.close()


def test_disconnect_mid_prefill_stops_between_chunks(loaded, monkeypatch):
    from ramforge.engine.engine import Engine

    url, manager = loaded
    port = int(url.rsplit(":", 1)[1])
    chunks, entered, proceed = [], threading.Event(), threading.Event()
    run_chunk = Engine.run_chunk

    def gated(self, inp, c, *more):
        chunks.append(c.size)
        if len(chunks) == 1:
            entered.set()
            proceed.wait(20)                                        # the client goes meanwhile
        return run_chunk(self, inp, c, *more)

    prompt = " ".join(f"w{i}" for i in range(150))                  # some 550 tokens: five chunks of 128
    body = {"model": "default", "prompt": prompt, "raw": True, "stream": False, "options": {"num_predict": 4}}
    monkeypatch.setattr(Engine, "run_chunk", gated)
    s = _raw_request(port, "/api/generate", body)
    assert entered.wait(30), "the prefill did not start"
    s.close()
    time.sleep(0.5)                                                 # the server sees the disconnect
    proceed.set()
    wait_until(lambda: not manager.lock.locked(), 10, "the model lock to be freed")
    monkeypatch.setattr(Engine, "run_chunk", run_chunk)
    assert len(chunks) == 1, chunks                                 # the other chunks never ran
    with httpx.Client(base_url=url, timeout=60) as c:               # the cached chunk is reused correctly
        again = c.post("/api/generate", json={**body, "options": {"num_predict": 4, "temperature": 0}}).json()
        c.post("/api/generate", json={"model": "default", "prompt": "x", "raw": True, "stream": False,
                                      "options": {"num_predict": 1}})
        fresh = c.post("/api/generate", json={**body, "options": {"num_predict": 4, "temperature": 0}}).json()
    assert again["response"] == fresh["response"] and again["eval_count"] == 4
    assert fresh["prompt_eval_count"] - again["prompt_eval_count"] == 128 - 1       # its one chunk kept, BOS aside


def test_cancel_check_is_a_no_op_outside_a_request():
    cancel.check()
    token = cancel.INTERRUPT.set(lambda: True)
    try:
        with pytest.raises(ClientDisconnected):
            cancel.check()
    finally:
        cancel.INTERRUPT.reset(token)
    assert not cancel.gone()


def test_closing_a_job_while_its_step_runs_on_another_thread(caplog):
    """--parallel steps a generation on anyio's threads; a request cancelled mid-step (its await abandoned, as
    a native cancel does) closes its job from another thread while next() still runs. Closing then must
    not fail with "generator already executing" (the generator left open, its step running on): it stops
    the step through the cancel test, the stepping thread closes the generator, and close waits for it."""
    import logging

    import anyio.to_thread

    from ramforge.server.jobs import Job
    from ramforge.server.manager import ModelManager

    started, closed_by = threading.Event(), []

    def generation():
        try:
            yield 1
            started.set()
            t = time.monotonic()
            while not cancel.gone() and time.monotonic() - t < 10:     # a long step, checking as the engine does
                time.sleep(0.005)
            cancel.check()
            yield 2
        finally:
            closed_by.append(threading.current_thread().name)

    async def main():
        from ramforge.server.jobs import Steps

        manager = ModelManager(ServerConfig())
        job = Job(manager, keep_alive=None)
        job.shared, manager.busy = True, 1
        job.it = generation()
        job.steps = Steps(job.it)
        assert await anyio.to_thread.run_sync(job.steps.step) == 1
        step = asyncio.ensure_future(anyio.to_thread.run_sync(job.steps.step))
        await anyio.to_thread.run_sync(started.wait, 10)
        step.cancel()                                          # the request's task is cancelled mid-step
        t = time.monotonic()
        await job.close()
        took = time.monotonic() - t
        with pytest.raises((asyncio.CancelledError, ClientDisconnected)):
            await step
        manager.executor.shutdown()
        return took, manager.busy

    with caplog.at_level(logging.ERROR, logger="ramforge.server"):
        took, busy = asyncio.run(main())
    assert "closing a generation failed" not in caplog.text
    assert len(closed_by) == 1 and closed_by[0] != threading.current_thread().name   # by the stepping thread
    assert took < 2 and busy == 0


# ----------------------------------------------------------------- one failing batched slot

@pytest.fixture(scope="module")
def parallel():
    app = create_app(ServerConfig(model="default", ram="600M", n_ctx=1024, keep_alive=600, parallel=2, n_threads=1))
    app.state.manager.preload()
    with served(app) as (url, _):
        yield url, app.state.manager


def test_a_failing_slot_ends_its_request_in_band_and_the_other_goes_on(parallel, monkeypatch):
    from ramforge.sampling import Sampler

    url, manager = parallel
    sample = Sampler.sample

    def faulty(self, logits, history):                              # the request of seed 666 fails at its 3rd token
        self._calls = getattr(self, "_calls", 0) + 1
        if self.params.seed == 666 and self._calls >= 3:
            raise GrammarError("injected: no token fits the grammar")
        return sample(self, logits, history)

    monkeypatch.setattr(Sampler, "sample", faulty)
    out = {}

    def other():
        with httpx.Client(base_url=url, timeout=120) as c:
            out["other"] = c.post("/api/generate", json={"model": "default", "prompt": "Count to twenty:", "stream": False,
                                                         "options": {"num_predict": 24, "seed": 1, "temperature": 0}})

    t = threading.Thread(target=other)
    t.start()
    with httpx.Client(base_url=url, timeout=120) as c:
        with c.stream("POST", "/api/generate", json={"model": "default", "prompt": "Hello", "stream": True,
                                                     "options": {"num_predict": 24, "seed": 666}}) as r:
            assert r.status_code == 200
            lines = [json.loads(x) for x in r.iter_lines() if x]
        t.join(120)
        assert "injected" in lines[-1]["error"] and not any(x.get("done") for x in lines)
        assert out["other"].status_code == 200 and out["other"].json()["eval_count"] > 2
        wait_until(lambda: manager.busy == 0, 10, "the busy count to return to 0")
        batcher = manager.current.model.batcher
        wait_until(lambda: batcher.free == [0, 1] and not batcher.active, 10, "the slots to be freed")
        assert batcher.thread.is_alive()
        r = c.post("/api/generate", json={"model": "default", "prompt": "Hello", "stream": False,
                                          "options": {"num_predict": 24, "seed": 666}})
        assert r.status_code == 400 and "injected" in r.json()["error"]        # not streamed: its 4xx
        monkeypatch.setattr(Sampler, "sample", sample)
        r = c.post("/api/generate", json={"model": "default", "prompt": "Hello", "stream": False,
                                          "options": {"num_predict": 4}})
        assert r.status_code == 200 and c.get("/health").json()["generating"] == 0


@pytest.mark.slow
def test_hostile_harness_short(loaded):
    """robustness/hostile.py's classes, a few seconds each, against the in-process server."""
    from robustness import hostile

    url, _ = loaded
    results = hostile.run(url, seconds=4, request_timeout=5, write_timeout=1.5, loris=5, flood_n=100, readers=1,
                          health_p99_ms=250)          # the target is 100 ms; this machine is shared
    print(hostile.table(results))
    assert [f for r in results for f in r.failures] == []
    assert all(r.as_expected == r.tried > 0 for r in results)


def test_a_gone_client_frees_its_batched_slot(parallel):
    url, manager = parallel
    batcher = manager.current.model.batcher
    body = {"model": "default", "prompt": "Tell me a long story.", "stream": True,
            "options": {"num_predict": 400, "temperature": 0}}
    with httpx.Client(base_url=url, timeout=60) as c:
        with c.stream("POST", "/api/generate", json=body) as r:
            lines = r.iter_lines()
            first = [json.loads(next(lines)) for _ in range(2)]
        assert not any(x["done"] for x in first)
        wait_until(lambda: manager.busy == 0 and batcher.free == [0, 1] and not batcher.active, 10,
                   "the slot to be freed")
        assert batcher.thread.is_alive() and c.get("/health").json()["generating"] == 0
