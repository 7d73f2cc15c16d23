"""docs/COMPATIBILITY.md is kept true, walked in both directions against the live app:

- the endpoint table and the app's routes are the same set of (method, path) pairs (a path parameter is
  written as the route writes it, `{digest}`), so a route added without a row, or a row whose route went,
  fails;
- each endpoint row answers as its status says (a request with an example for each path parameter and a
  body no handler takes: a route that exists answers 400/422/501, never 404/405; GET and HEAD of a
  supported route 2xx; a refused row 4xx; a 501 row 501; a 404 row 404), with no model loaded;
- each field row marked supported or accepted names fields that the endpoint's request model has (its
  `options` or `messages[]` sub-model where the row says so);
- every test the doc names (`test_file::test_name`, or `test_file`) exists.
"""
from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ramforge.server import ServerConfig, create_app  # noqa: E402

DOC = Path(__file__).parents[1] / "docs" / "COMPATIBILITY.md"
TESTS = Path(__file__).parent
ROW = re.compile(r"^\| (GET|HEAD|POST|DELETE) \| (/[^ |]*) \| ([^|]+?) \|")
EXAMPLES = {"digest": "sha256:" + "0" * 64, "id_slot": "0", "model_id": "default", "verb": "no-such-verb"}
SHORT = {"generate": "/api/generate", "chat": "/api/chat"}          # the Ollama table's shorthand
IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def _section(title: str, end: str | None) -> str:
    text = DOC.read_text()
    start = text.index(title)
    return text[start:text.index(end, start) if end else len(text)]


def _rows():
    section = _section("## Endpoints", "## Ollama fields")
    rows = [m.groups() for m in map(ROW.match, section.splitlines()) if m]
    assert len(rows) >= 25, "the endpoint table lost its rows"
    return rows


def _field_rows():
    rows = []
    for title, end in (("## Ollama fields", "## OpenAI and llama-server fields"),
                       ("## OpenAI and llama-server fields", None)):
        for line in _section(title, end).splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and len(cells) >= 3 and cells[0] not in ("endpoint",) and \
                    not set(cells[0]) <= set("-"):
                rows.append(tuple(cells[:3]))
    assert len(rows) >= 40, "the field tables lost their rows"
    return rows


def _routes(routes):
    for r in routes:
        sub = getattr(r, "original_router", None)           # an included router (FastAPI wraps them)
        if sub is not None:
            yield from _routes(sub.routes)
        elif getattr(r, "methods", None):
            yield r


@pytest.fixture(scope="module")
def app():
    return create_app(ServerConfig(n_ctx=512))


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_the_table_and_the_app_serve_the_same_routes(app):
    served = {(m, r.path) for r in _routes(app.routes) for m in r.methods}
    named = {(m, p) for m, p, _ in _rows()}
    assert not served - named, f"routes the app serves that docs/COMPATIBILITY.md has no row for: {served - named}"
    assert not named - served, f"rows of docs/COMPATIBILITY.md the app has no route for: {named - served}"
    for need in [("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/apply-template"), ("GET", "/props"),
                 ("GET", "/slots"), ("GET", "/metrics"), ("POST", "/completion"), ("POST", "/infill"),
                 ("GET", "/v1/health"), ("HEAD", "/api/tags"), ("POST", "/v1/responses")]:   # issue 41's list
        assert need in named, need


@pytest.mark.parametrize("method,path,status", _rows(), ids=lambda x: str(x))
def test_every_endpoint_row_answers_as_its_status(client, method, path, status):
    url = re.sub(r"\{(\w+)\}", lambda m: EXAMPLES[m.group(1)], path)
    # a POST gets a body no handler takes (a list where an object belongs): a route answers 400/422/501,
    # never 404/405; a GET or HEAD of the routes that load nothing answers 2xx
    body = None if method in ("GET", "HEAD") else b"[1]"
    r = client.request(method, url, content=body, headers={"Content-Type": "application/json"} if body else {})
    if status == "404":
        assert r.status_code == 404, (method, url, r.status_code, r.text)
        return
    assert r.status_code not in (404, 405) or (method, path) == ("HEAD", "/api/blobs/{digest}"), \
        (method, url, r.status_code, r.text)                # HEAD of an absent blob is Ollama's 404
    assert r.status_code < 500 or r.status_code == 501, (method, url, r.status_code, r.text)
    if status == "501":
        assert r.status_code in (400, 501), (method, url, r.status_code)
        r = client.request(method, url, json={"model": "x", "input": "x", "name": "x", "path": "x"})
        assert r.status_code == 501, (method, url, r.status_code, r.text)
    elif status == "refused":
        assert 400 <= r.status_code < 500
    elif method in ("GET", "HEAD") and path != "/api/blobs/{digest}":
        assert 200 <= r.status_code < 300, (method, url, r.status_code, r.text)


def _model_of(annotation) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (X | None, list[X])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, (types.UnionType, typing._GenericAlias)) or typing.get_args(annotation):
        for a in typing.get_args(annotation):
            found = _model_of(a)
            if found is not None:
                return found
    return None


def _names(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}


@pytest.mark.parametrize("endpoints,fields,status", _field_rows(), ids=lambda x: str(x)[:60])
def test_every_field_row_names_fields_the_endpoint_takes(app, endpoints, fields, status):
    """A supported or accepted row's plain field names are fields of the endpoint's request model (`options:
    a, b` those of its options model, `messages[].a, b` those of a message); `think: true, false` checks
    `think`, `reasoning_effort none, ...` checks `reasoning_effort`, "the sampler table" every parameter of
    ramforge.sampling.params. Descriptions ("a ...", in parentheses), `/v1/*`, serve flags and answer fields
    (`(answer) ...`) are not request fields."""
    if status not in ("supported", "accepted") or fields.startswith("(answer)") or fields.startswith("`serve"):
        return
    bodies = {}
    for r in _routes(app.routes):
        params = r.dependant.body_params
        if params and "POST" in r.methods:
            bodies[r.path] = _model_of(getattr(params[0], "type_", None) or params[0].field_info.annotation)
    for ep in (SHORT.get(e.strip(), e.strip()) for e in endpoints.split(",")):
        if ep.endswith("*"):
            continue
        model = bodies.get(ep)
        assert model is not None, f"{ep}: no route with a request model"
        text = re.sub(r"\([^)]*\)", "", fields)
        m = re.match(r"^(\w+)(\[\])?[:.]\s*(.*)$", text)
        if m:                                                  # options: a, b / messages[].a, b / think: values
            assert m.group(1) in _names(model), (ep, m.group(1))
            sub = _model_of(model.model_fields[m.group(1)].annotation)
            if sub is None:
                continue                                       # the rest are values
            model, text = sub, m.group(3)
        tokens = [t.strip().strip("`") for t in text.split(",")]
        if any(t.startswith("the sampler table") for t in tokens):      # every sampling parameter ramforge has
            from ramforge.sampling.params import PARAMS

            missing = [p.name for p in PARAMS if p.name not in _names(model)]
            assert not missing, f"{ep}: {model.__name__} lacks the sampler parameters {missing}"
        tokens = [t for t in tokens if not re.match(r"(the|a|an|any) ", t)]   # descriptions
        if tokens and " " in tokens[0]:                        # "reasoning_effort none, minimal, ...": values
            assert tokens[0].split()[0] in _names(model), (ep, tokens[0])
            continue
        missing = [t for t in tokens if IDENT.match(t) and t not in _names(model)]
        assert not missing, f"{ep}: {model.__name__} has no field {missing} (docs/COMPATIBILITY.md: {fields!r})"


def test_every_test_the_doc_names_exists():
    text = DOC.read_text()
    refs = set(re.findall(r"\b(test_\w+)(?:::(test_\w+))?", text))
    assert len(refs) >= 20
    bad = []
    for module, func in refs:
        path = TESTS / f"{module}.py"
        if not path.is_file():
            bad.append(module)
        elif func and not re.search(rf"^(async )?def {func}\b", path.read_text(), re.M):
            bad.append(f"{module}::{func}")
    assert not bad, f"docs/COMPATIBILITY.md names tests that do not exist: {sorted(bad)}"
