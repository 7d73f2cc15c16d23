"""Ollama's model management over HTTP (server/models_api.py) through the official `ollama` clients (Python;
npm's in a slow test): pull from a local http source, blobs, create (JSON and Modelfile forms), copy, delete,
list, show, and that a created model's TEMPLATE / SYSTEM / PARAMETERs take effect; `ramforge create`."""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

import httpx
import ollama
import pytest
import uvicorn
from click.testing import CliRunner

from ramforge.errors import ModelfileError
from ramforge.server import ServerConfig, create_app
from ramforge.store import Store, blobs as store_blobs
from ramforge.store.modelfile import parse_modelfile
from tests.serving import serving

TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}[assistant]"


@pytest.fixture(scope="module")
def tiny():
    from tools.make_models import ensure_model

    return Path(ensure_model("llama", "F16"))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    mp = pytest.MonkeyPatch()
    mp.setattr(store_blobs, "cache_dir", lambda: root)          # Store()'s root; the default model stays put
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def source(tiny):
    """A plain http server of the tiny model's file (under two names: one per client)."""
    data = tiny.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path not in ("/tiny-llama.gguf", "/tiny-npm.gguf"):
                return self.send_error(404)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(home):
    app = create_app(ServerConfig(ram="400M", n_ctx=256, keep_alive=600))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        yield ollama.Client(host=url), httpx.Client(base_url=url, timeout=120)


def _names(client) -> list[str]:
    return [m.model for m in client.list().models]


def test_pull_streams_ollamas_progress_and_lists_the_model(server, source, home, tiny):
    client, _ = server
    lines = list(client.pull(f"{source}/tiny-llama.gguf", insecure=True, stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    size = tiny.stat().st_size
    progress = [p for p in lines if p.status.startswith("pulling http")]
    assert progress and progress[-1].completed == progress[-1].total == size
    assert lines[-3].digest == "sha256:" + hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert "tiny-llama" in _names(client)
    assert client.show("tiny-llama").details.family == "llama"
    # not streamed: one answer; plain http without insecure: 400 before anything moves
    assert client.pull(f"{source}/tiny-llama.gguf", insecure=True).status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull(f"{source}/tiny-llama.gguf")
    assert e.value.status_code == 400 and "insecure" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        client.pull(f"{source}/missing.gguf", insecure=True)
    assert e.value.status_code >= 400 and "404" in str(e.value)


_NODE = r"""
import { Ollama } from 'ollama';
const c = new Ollama({ host: process.argv[2] });
const source = process.argv[3];
const names = async () => (await c.list()).models.map((m) => m.name);
const refusal = async (call) => { try { await call(); return null; }
                                  catch (e) { return { status: e.status_code, error: e.error }; } };
const out = { progress: [] };
for await (const p of await c.pull({ model: source, insecure: true, stream: true })) {
  out.progress.push({ status: p.status, total: p.total ?? null, completed: p.completed ?? null,
                      digest: p.digest ?? null });
}
out.created = await c.create({ model: 'npm-sys', from: 'tiny-npm', system: 'Be brief.',
                               parameters: { num_predict: 3, temperature: 0, stop: ['\n\n'] } });
out.copied = await c.copy({ source: 'npm-sys', destination: 'npm-sys-copy' });
out.listed = await names();
out.shown = await c.show({ model: 'npm-sys-copy' });
out.deleted = await c.delete({ model: 'npm-sys-copy' });
out.after = await names();
out.delete_again = await refusal(() => c.delete({ model: 'npm-sys-copy' }));
out.copy_missing = await refusal(() => c.copy({ source: 'no-such-model', destination: 'x' }));
out.create_missing = await refusal(() => c.create({ model: 'y', from: 'no-such-model' }));
console.log(JSON.stringify(out));
"""


@pytest.mark.slow
def test_npm_ollama_client_manages_models(server, source, home, tiny):
    """The npm `ollama` client (tests/npm.py: installed once into the fixture cache) pulls with streamed
    progress, creates from a pulled model with SYSTEM and PARAMETERs, copies, lists, shows and deletes."""
    from tests.npm import run_node

    _, http = server
    out = run_node(_NODE, str(http.base_url).rstrip("/"), f"{source}/tiny-npm.gguf")
    size, digest = tiny.stat().st_size, "sha256:" + hashlib.sha256(tiny.read_bytes()).hexdigest()
    statuses = [p["status"] for p in out["progress"]]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    moving = [p for p in out["progress"] if p["status"] == f"pulling {source}/tiny-npm.gguf"]
    assert moving and {p["total"] for p in moving} == {size}
    done = [p["completed"] for p in moving]
    assert done == sorted(done) and done[-1] == size                    # monotone, to the whole file
    assert out["progress"][-3]["digest"] == digest and out["progress"][-3]["completed"] == size
    assert out["created"]["status"] == out["copied"]["status"] == out["deleted"]["status"] == "success"
    assert {"tiny-npm", "npm-sys", "npm-sys-copy"} <= set(out["listed"])
    assert "npm-sys-copy" not in out["after"] and {"tiny-npm", "npm-sys"} <= set(out["after"])
    shown = out["shown"]
    params = [line.split(None, 1) for line in shown["parameters"].splitlines()]
    assert shown["system"] == "Be brief." and ["num_predict", "3"] in params and ["temperature", "0"] in params
    assert ["stop", '"\\n\\n"'] in params and 'SYSTEM """Be brief."""' in shown["modelfile"]
    assert shown["details"]["family"] == "llama"
    assert out["delete_again"]["status"] == out["copy_missing"]["status"] == out["create_missing"]["status"] == 404
    assert "no-such-model" in out["copy_missing"]["error"]
    assert Store().get("npm-sys").config["system"] == "Be brief."       # what the store kept, not just what show says


def test_blobs_are_checked_and_bounded(server, home, tiny, monkeypatch):
    _, http = server
    data = tiny.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert http.head(f"/api/blobs/{'sha256:' + '0' * 64}").status_code == 404
    assert http.head("/api/blobs/sha256:../../etc").status_code in (400, 404)
    r = http.post(f"/api/blobs/{'sha256:' + '1' * 64}", content=data)
    assert r.status_code == 400 and "digest mismatch" in r.json()["error"]
    not_gguf = b"NOPE" * 100
    r = http.post(f"/api/blobs/sha256:{hashlib.sha256(not_gguf).hexdigest()}", content=not_gguf)
    assert r.status_code == 400 and "not a GGUF" in r.json()["error"]
    monkeypatch.setenv("RAMFORGE_MAX_BLOB", "1K")
    assert http.post(f"/api/blobs/{digest}", content=data).status_code == 413
    monkeypatch.delenv("RAMFORGE_MAX_BLOB")
    assert not [p for p in (home / "blobs").glob(".upload*")]            # nothing of a refused upload kept
    r = http.post(f"/api/blobs/{digest}", content=data)                   # over the JSON body limit: streamed
    assert r.status_code == 201 and http.head(f"/api/blobs/{digest}").status_code == 200
    assert http.post("/api/blobs/sha256:xyz", content=b"GGUF").status_code == 400


def test_create_copy_delete_through_the_client(server, home, tiny):
    client, http = server
    digest = client.create_blob(tiny)
    assert client.create(model="tiny-sys", files={"tiny.gguf": digest}, template=TEMPLATE, system="Be brief.",
                         parameters={"num_predict": 3, "temperature": 0, "stop": ["\n\n"]}).status == "success"
    assert client.create(model="tiny-plain", files={"tiny.gguf": digest}, template=TEMPLATE).status == "success"
    assert {"tiny-sys", "tiny-plain"} <= set(_names(client))
    shown = client.show("tiny-sys")
    params = [line.split(None, 1) for line in shown.parameters.splitlines()]      # Ollama's padded columns
    assert shown.template == TEMPLATE and ["num_predict", "3"] in params and ["stop", '"\\n\\n"'] in params
    assert 'SYSTEM """Be brief."""' in shown.modelfile
    assert http.post("/api/show", json={"model": "tiny-sys"}).json()["system"] == "Be brief."
    # SYSTEM: used where the request has none, the request's own wins; PARAMETER num_predict: the default
    sys_model = client.generate(model="tiny-sys", prompt="hi")
    plain = client.generate(model="tiny-plain", prompt="hi", options={"num_predict": 3})
    given = client.generate(model="tiny-plain", prompt="hi", system="Be brief.", options={"num_predict": 3})
    def prompt(r):                  # the prompt's ids (prompt_eval_count leaves out a reused cached prefix)
        return r.context[:len(r.context) - r.eval_count]

    assert sys_model.eval_count <= 3 and prompt(sys_model) == prompt(given) != prompt(plain)
    assert len(prompt(given)) > len(prompt(plain))
    assert client.generate(model="tiny-sys", prompt="hi", options={"num_predict": 1}).eval_count == 1
    chat = client.chat(model="tiny-sys", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 1})
    assert chat.eval_count == 1 and chat.done_reason == "length"
    # copy and delete
    client.copy("tiny-sys", "tiny-sys-2")
    assert client.show("tiny-sys-2").template == TEMPLATE
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("no-such-model", "x")
    assert e.value.status_code == 404
    client.delete("tiny-sys-2")
    assert "tiny-sys-2" not in _names(client) and "tiny-sys" in _names(client)
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("tiny-sys-2")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("tiny-sys", "../evil")
    assert e.value.status_code == 400


def test_create_refusals_are_400_by_name(server, home, tiny, monkeypatch):
    client, http = server
    digest = client.create_blob(tiny)

    def refused(body, needle, status=400):
        r = http.post("/api/create", json={"model": "x", **body})
        assert r.status_code == status and needle in r.json()["error"], r.text

    refused({"modelfile": f"FROM {digest}\nADAPTER ./lora.gguf\n"}, "ADAPTER")
    refused({"modelfile": f"FROM {digest}\nLICENSE mit\n"}, "LICENSE")
    refused({"modelfile": f"FROM {digest}\nPARAMETER not_a_param 1\n"}, "not_a_param")
    refused({"modelfile": f"FROM {digest}\nTEMPLATE {{{{ .Prompt }}}}\n"}, "Go template")
    refused({"files": {"m.gguf": digest}, "quantize": "q4_K_M"}, "quantize")
    refused({"files": {"m.gguf": digest}, "adapters": {"a.gguf": digest}}, "adapters")
    refused({"files": {"m.gguf": digest}, "parameters": {"temperature": "hot"}}, "temperature")
    refused({"files": {"m.gguf": "sha256:" + "2" * 64}}, "sha256:" + "2" * 64, 404)
    refused({"from": str(tiny)}, "RAMFORGE_CREATE_DIRS")                              # a path outside the dirs
    refused({"from": "/etc/passwd"}, "")
    assert not (home / "manifests" / "x.json").exists()
    monkeypatch.setenv("RAMFORGE_CREATE_DIRS", str(tiny.parent))
    r = http.post("/api/create", json={"model": "from-path", "modelfile": f"FROM {tiny}\nPARAMETER temperature 0\n",
                                       "stream": False})
    assert r.status_code == 200 and r.json()["status"] == "success"
    assert Store().get("from-path").hex == digest.split(":")[1]
    assert http.post("/api/push", json={"model": "from-path"}).status_code == 501


def test_modelfile_subset_parses_as_ollama():
    mf = parse_modelfile('# a comment\nfrom ./m.gguf\nPARAMETER stop "<|end|>"\nPARAMETER stop <eot>\n'
                         'PARAMETER temperature 0.5\nPARAMETER num_ctx 2048\nSYSTEM """Line one.\nLine two."""\n'
                         'TEMPLATE "{{ messages[0].content }}"\n')
    assert mf.source == "./m.gguf" and mf.config.system == "Line one.\nLine two."
    assert mf.config.parameters == {"stop": ["<|end|>", "<eot>"], "temperature": 0.5, "num_ctx": 2048}
    assert mf.config.template == "{{ messages[0].content }}"
    for bad, needle in (("PARAMETER num_ctx 1.5\nFROM x", "integer"), ("SYSTEM hi", "no FROM"),
                        ('FROM x\nSYSTEM """open', "unterminated"), ("FROM x\nMESSAGE user hi", "MESSAGE"),
                        ("FROM x\nTEMPLATE {% for %}", "Jinja")):
        with pytest.raises(ModelfileError, match=needle):
            parse_modelfile(bad)


def test_cli_create(home, tiny, tmp_path):
    from ramforge.cli import cli

    (tmp_path / "tiny.gguf").symlink_to(tiny)
    (tmp_path / "Modelfile").write_text('FROM ./tiny.gguf\nSYSTEM "You are terse."\nPARAMETER top_k 5\n')
    r = CliRunner().invoke(cli, ["create", "cli-made", "-f", str(tmp_path / "Modelfile"), "-q"])
    assert r.exit_code == 0, r.output
    m = Store().get("cli-made")
    assert m.config == {"template": None, "system": "You are terse.", "parameters": {"top_k": 5}}
    assert Path(Store().path_of("cli-made")).read_bytes()[:4] == b"GGUF"
    (tmp_path / "Bad").write_text("FROM ./tiny.gguf\nADAPTER x\n")
    r = CliRunner().invoke(cli, ["create", "cli-bad", "-f", str(tmp_path / "Bad")])
    assert r.exit_code != 0 and "ADAPTER" in str(r.exception or r.output)
    assert json.loads((home / "manifests" / "cli-made.json").read_text())["name"] == "cli-made"


def test_delete_unloads_the_loaded_model_and_frees_its_budget(home, tiny):
    """DELETE /api/delete of the loaded model unloads it first (its budget charges released), as `ollama rm`
    stops it; the next request for the name is a 404. Deleting another name of the same blob leaves it."""
    app = create_app(ServerConfig(ram="400M", n_ctx=256, keep_alive=600))
    m = app.state.manager
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        client, http = ollama.Client(host=url), httpx.Client(base_url=url, timeout=120)
        digest = client.create_blob(tiny)
        assert client.create(model="tiny-del", files={"tiny.gguf": digest}).status == "success"
        client.copy("tiny-del", "tiny-del-copy")
        assert client.generate(model="tiny-del", prompt="hi", options={"num_predict": 1}).eval_count == 1
        loaded = m.current
        budget = loaded.model.budget
        assert loaded.name == "tiny-del" and budget.current > 0
        client.delete("tiny-del-copy")                   # another name: the blob stays, and the model with it
        assert m.current is loaded and [x.model for x in client.ps().models] == ["tiny-del"]
        client.delete("tiny-del")
        assert m.current is None and client.ps().models == []
        assert budget.current == 0 and budget.charges() == []
        r = http.post("/api/generate", json={"model": "tiny-del", "prompt": "hi", "stream": False})
        assert r.status_code == 404, r.text
        with pytest.raises(ollama.ResponseError) as e:
            client.delete("tiny-del")
        assert e.value.status_code == 404


def test_forget_with_parallel_jobs_unloads_when_they_end():
    """--parallel jobs still generating on a deleted model: marked removed (never reused by a request) and
    expired, so the reaper unloads it once they end."""
    import asyncio
    import time

    from ramforge.server.manager import Loaded, ModelManager

    class Fake:
        closed = False
        cache = None

        def close(self):
            self.closed = True

    m = ModelManager(ServerConfig())
    model = Fake()
    m.current = Loaded(model, "gone", "/nonexistent/model.gguf", None)
    m.current.keep(600)
    m.busy = 1
    assert asyncio.run(m.forget("gone"))
    assert m.current.removed and m.current.expires <= time.monotonic() and not model.closed
    m.busy = 0
    assert asyncio.run(m.forget("gone")) and m.current is None and model.closed
    m.current = Loaded(Fake(), "kept", __file__, None)            # another name, its file still there
    assert not asyncio.run(m.forget("gone")) and m.current is not None
