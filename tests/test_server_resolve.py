"""Each server request resolves its model once (ModelManager.resolve: one store `locate` and one
`modelfile_of`), however many steps (checks, sampling defaults, the queue, the load) use it."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from ramforge.server import ServerConfig, create_app  # noqa: E402
from ramforge.server import manager as manager_mod  # noqa: E402


@pytest.fixture(scope="module")
def served():
    from tools.make_models import ensure_model

    tiny = Path(ensure_model("llama", "F16"))
    app = create_app(ServerConfig(model=str(tiny), n_ctx=256, alias="tiny", preload=True, keep_alive=600))
    with TestClient(app) as client:
        yield client, app.state.manager


REQUESTS = [
    ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}),
    ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 1,
                                                                                     "num_ctx": 128}}),
    ("/api/generate", {"model": "tiny", "keep_alive": "10m"}),                     # load only
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                   "options": {"num_predict": 1}}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}),
    ("/v1/completions", {"model": "not-in-the-store", "prompt": "hi", "max_tokens": 1}),   # lenient: the loaded
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/completion", {"prompt": "hi", "n_predict": 1, "ignore_eos": True}),
]


@pytest.mark.parametrize("path,body", REQUESTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(REQUESTS)])
def test_a_request_resolves_its_model_once(served, monkeypatch, path, body):
    client, m = served
    calls = {"locate": [], "modelfile_of": []}
    locate, modelfile_of = m.locate, manager_mod.modelfile_of
    monkeypatch.setattr(m, "locate", lambda name: calls["locate"].append(name) or locate(name))
    monkeypatch.setattr(manager_mod, "modelfile_of", lambda name: calls["modelfile_of"].append(name) or
                        modelfile_of(name))
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    # an unknown /v1 name: located (not found), then the loaded model as it is loaded (no Modelfile read)
    unknown = body.get("model") == "not-in-the-store"
    assert len(calls["locate"]) == 1 and len(calls["modelfile_of"]) == (0 if unknown else 1), calls
