"""`ramforge serve` under a short load: robustness/load_server.py's checks, 10 clients for 5 s.

An in-process uvicorn server (127.0.0.1, a free port, the same config `ramforge serve` builds: the
per-request read deadline and timeout_keep_alive), the default model at ram=400M and a 512-token
context. Valid requests must get a 2xx (or a 503 when the queue is full), malformed ones a 4xx with
a JSON reason, stalled connections must be closed within the request timeout while /health still
answers, and once idle the budget's managed bytes and live charges must equal their value after the
warm-up request. The full run: `python robustness/load_server.py` (docs/RELIABILITY.md).
"""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from ramforge.server import ServerConfig, create_app  # noqa: E402
from ramforge.server.transport import uvicorn_config  # noqa: E402
from tests.serving import serving  # noqa: E402

from robustness import load_server  # noqa: E402

REQUEST_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server():
    app = create_app(ServerConfig(ram="400M", n_ctx=512, keep_alive=600, lenient_names=False))   # as the harness serves
    srv = uvicorn.Server(uvicorn_config(app, request_timeout=REQUEST_TIMEOUT, timeout_keep_alive=1,
                                        log_level="warning"))
    with serving(srv) as (url, thread):
        yield url, thread


def test_load_with_malformed_and_stalled_clients(server):
    url, thread = server
    report = load_server.run_load(url, clients=10, seconds=5, stalled=2, request_timeout=REQUEST_TIMEOUT,
                                  request_deadline=60)
    print(load_server.table(report))
    assert report["failures"] == []
    assert thread.is_alive() and httpx.get(f"{url}/health", timeout=10).status_code == 200
    res = report["stats"].results
    assert sum(1 for c in ("generate", "generate_stream", "chat_v1", "chat_v1_stream")
               for s, _, _ in res[c] if s == 200) > 0                          # generations did complete
    assert sum(len(res[c]) for c in load_server.MALFORMED) > 0
    assert report["waves"] and all(wv["closes"] and all(c is not None and c <= REQUEST_TIMEOUT + 1
                                                         for c in wv["closes"]) for wv in report["waves"])
    b0, b1 = report["budget_before"], report["budget_after"]
    assert (b1["current"], b1["charges"]) == (b0["current"], b0["charges"]) and b1["current"] <= b1["limit"]


@pytest.mark.parametrize("kind", load_server.STALLS)
def test_stalled_connection_is_closed_within_the_timeout(server, kind):
    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    closed = asyncio.run(load_server.stalled_conn("127.0.0.1", port, kind, cap=REQUEST_TIMEOUT + 5))
    assert closed is not None and REQUEST_TIMEOUT - 0.2 <= closed <= REQUEST_TIMEOUT + 1


def test_keep_alive_connection_serves_several_requests(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=10) as c:                  # the read deadline is per request
        for _ in range(3):
            assert c.get("/health").status_code == 200
            time.sleep(0.5)
        assert c.get("/api/tags").status_code == 200
