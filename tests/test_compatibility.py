"""docs/COMPATIBILITY.md is kept true: every endpoint row's route exists on the app (not 404 / 405),
and every row marked refused or 501 answers so. Requests are made with bodies that fail validation
or name nothing to load, so no model loads."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ramforge.server import ServerConfig, create_app  # noqa: E402

DOC = Path(__file__).parents[1] / "docs" / "COMPATIBILITY.md"
ROW = re.compile(r"^\| (GET|HEAD|POST|DELETE) \| (/[^ |]*) \| ([^|]+?) \|")


def _rows():
    text = DOC.read_text()
    section = text[text.index("## Endpoints"):text.index("## Ollama fields")]
    rows = [m.groups() for m in map(ROW.match, section.splitlines()) if m]
    assert len(rows) >= 25, "the endpoint table lost its rows"
    return rows


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(ServerConfig(n_ctx=512)), raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("method,path,status", _rows(), ids=lambda x: str(x))
def test_every_endpoint_row_exists(client, method, path, status):
    # a POST gets a body no handler takes (a list where an object belongs): a route answers 400/422/501,
    # never 404/405; a GET or HEAD of the routes that load nothing answers 2xx
    body = None if method in ("GET", "HEAD") else b"[1]"
    r = client.request(method, path, content=body, headers={"Content-Type": "application/json"} if body else {})
    assert r.status_code not in (404, 405), (method, path, r.status_code, r.text)
    assert r.status_code < 500 or r.status_code == 501, (method, path, r.status_code, r.text)
    if status == "501":
        assert r.status_code in (400, 501), (method, path, r.status_code)
        r = client.request(method, path, json={"model": "x", "input": "x", "name": "x", "path": "x"})
        assert r.status_code == 501, (method, path, r.status_code, r.text)
    elif status == "refused":
        assert 400 <= r.status_code < 500


def test_the_table_names_every_route_the_app_serves(client):
    """Each documented route answers; and the routes the issue names all appear in the table."""
    named = {(m, p) for m, p, _ in _rows()}
    for need in [("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/apply-template"), ("GET", "/props"),
                 ("GET", "/slots"), ("GET", "/metrics"), ("POST", "/completion"), ("POST", "/infill"),
                 ("GET", "/v1/health"), ("HEAD", "/api/tags"), ("POST", "/v1/responses")]:
        assert need in named, need
