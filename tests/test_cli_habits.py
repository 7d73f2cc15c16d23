"""The CLI habits of Ollama and llama.cpp users: run's positional prompt and stdin, the GGUF's sampling
defaults, show / cp / rm of several names / ps / stop, serve's variables and llama-server's units, exit codes."""
import hashlib
import json

import numpy as np

import click
import pytest
from click.testing import CliRunner

from ramforge.cli import EXIT_INTERNAL, _main, cli
from ramforge.cli.console import parse_ollama_host, server_address, with_gguf_defaults
from ramforge.cli.serve import cache_ram_bytes
from ramforge.sampling.gguf_defaults import gguf_sampling_defaults


@pytest.mark.parametrize("value, want", [
    ("0.0.0.0", ("http", "0.0.0.0", 11434)), ("127.0.0.1:8080", ("http", "127.0.0.1", 8080)),
    (":9000", ("http", "", 9000)), ("http://example.com", ("http", "example.com", 80)),
    ("https://h:1234/path", ("https", "h", 1234)), ("[::1]:5000", ("http", "::1", 5000)), ("", ("http", "127.0.0.1", 11434)),
])
def test_ollama_host_is_read_as_ollama_reads_it(value, want):
    assert parse_ollama_host(value) == want


def test_address_precedence(monkeypatch):
    for v in ("RAMFORGE_HOST", "RAMFORGE_PORT", "OLLAMA_HOST"):
        monkeypatch.delenv(v, raising=False)
    assert server_address() == ("127.0.0.1", 11434)
    monkeypatch.setenv("OLLAMA_HOST", ":8000")
    assert server_address() == ("0.0.0.0", 8000)                  # Ollama's ":PORT" binds every address
    monkeypatch.setenv("RAMFORGE_PORT", "9001")
    monkeypatch.setenv("RAMFORGE_HOST", "127.0.0.2")
    assert server_address() == ("127.0.0.2", 9001)
    assert server_address("localhost", 7000) == ("localhost", 7000)   # flags win
    monkeypatch.setenv("RAMFORGE_PORT", "x")
    with pytest.raises(click.UsageError, match="RAMFORGE_PORT"):
        server_address()


def test_cache_ram_is_mib_as_llama_server():
    assert cache_ram_bytes("8192") == 8192 << 20 and cache_ram_bytes("2G") == 2 << 30
    assert cache_ram_bytes("0") is None and cache_ram_bytes(None) is None
    with pytest.raises(click.BadParameter):
        cache_ram_bytes("-1")


def test_gguf_sampling_defaults_and_flags_win():
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.penalty_last_n": -1,
          "general.sampling.sequence": "kt", "general.sampling.top_p": "bad"}
    assert gguf_sampling_defaults(md) == {"temperature": float(np.float32(0.6)), "top_k": 20, "repeat_last_n": -1}   # strtof: a float32, as llama.cpp reads it
    seen = {}

    @click.command()
    @click.option("--temp", "temperature", type=float, default=0.8)
    @click.option("--top-k", "top_k", type=int, default=40)
    @click.option("--repeat-last-n", "repeat_last_n", type=int, default=64)
    def cmd(**sampling):
        seen.update(with_gguf_defaults(sampling, md))
    assert CliRunner().invoke(cmd, ["--temp", "0.1"]).exit_code == 0
    assert seen == {"temperature": 0.1, "top_k": 20, "repeat_last_n": -1}


def test_exit_codes(monkeypatch):
    @cli.command(name="boom-test")
    def boom():
        raise KeyError("a bug")
    try:
        with pytest.raises(SystemExit) as e:
            _main(["boom-test"])
        assert e.value.code == EXIT_INTERNAL == 3
        with pytest.raises(SystemExit) as e:
            _main(["run", "--no-such-flag"])
        assert e.value.code == 2
        with pytest.raises(SystemExit) as e:
            _main(["show", "/no/such/model.gguf"])
        assert e.value.code == 1
    finally:
        cli.commands.pop("boom-test")


def test_run_prompt_sources(monkeypatch):
    r = CliRunner().invoke(cli, ["run", "default", "a", "-p", "b"])
    assert r.exit_code == 2 and "once" in r.output
    from ramforge.cli.console import prompt_text

    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("from stdin"))
    assert prompt_text("-", None) == "from stdin"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("piped"))
    assert prompt_text(None, None) == "piped"                  # not a terminal: read
    assert prompt_text("given", None) == "given"


def test_run_positional_prompt_matches_dash_p():
    a = CliRunner().invoke(cli, ["run", "default", "The capital of France is", "-n", "6", "--temp", "0", "--json"])
    b = CliRunner().invoke(cli, ["run", "default", "-p", "The capital of France is", "-n", "6", "--temp", "0",
                                 "--json", "--raw"])
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert json.loads(a.output)["completion_tokens"] == json.loads(b.output)["completion_tokens"]


def test_show_default():
    r = CliRunner().invoke(cli, ["show", "default", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"] == {"architecture": "gemma3", "parameters": "268.10M", "context length": 32768,
                          "embedding length": 640, "quantization": "Q4_K_M"}
    assert d["capabilities"] == ["completion"] and d["parameters"]["stop"] == ["<eos>"]
    assert "<start_of_turn>" in d["template"] and d["license"] == "gemma"
    r = CliRunner().invoke(cli, ["show", "default", "--license"])
    assert r.output.strip() == "gemma"


def test_cp_and_rm_several(tmp_path, monkeypatch, default_model):
    from ramforge.store import Store
    from ramforge.store.blobs import Manifest

    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path))
    store = Store()
    store._ensure()
    data = b"GGUF" + b"\0" * 60
    digest = "sha256:" + hashlib.sha256(data).hexdigest()          # checked on load (Store.checked)
    store.blob_path(digest).write_bytes(data)
    store._write_manifest(Manifest("one", digest, 64, "test", "2025-01-01T00:00:00", True))
    r = CliRunner().invoke(cli, ["cp", "one", "two"])
    assert r.exit_code == 0, r.output
    assert store.get("two").digest == digest
    r = CliRunner().invoke(cli, ["rm", "one", "two", "three"])
    assert r.exit_code == 1 and "three" in r.output
    assert not store.manifest_path("one").exists() and not store.manifest_path("two").exists()
    assert not store.blob_path(digest).exists()


def test_ps_and_stop_without_a_server_say_so(monkeypatch):
    monkeypatch.setenv("RAMFORGE_HOST", "127.0.0.1")
    monkeypatch.setenv("RAMFORGE_PORT", "9")                     # discard: nothing listens
    for args in (["ps"], ["stop", "default"]):
        with pytest.raises(SystemExit) as e:
            _main(args)
        assert e.value.code == 1


def test_ps_and_stop_against_a_running_server(monkeypatch):
    """`ps` lists the loaded model and `stop` unloads it, over HTTP as ollama ps / stop do."""
    import uvicorn

    from ramforge.server import ServerConfig, create_app
    from tests.serving import serving

    app = create_app(ServerConfig(model="default", ram="400M", n_ctx=256, keep_alive=600))
    app.state.manager.preload()
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        monkeypatch.setenv("RAMFORGE_HOST", host)
        monkeypatch.setenv("RAMFORGE_PORT", port)
        r = CliRunner().invoke(cli, ["ps", "--json"])
        assert r.exit_code == 0, r.output
        assert [m["name"] for m in json.loads(r.output)["models"]] == ["default"]
        r = CliRunner().invoke(cli, ["stop", "nothing-loaded"])
        assert "couldn't find model 'nothing-loaded'" in str(r.exception)        # ModelNotFound: main prints one line
        r = CliRunner().invoke(cli, ["stop", "default"])
        assert r.exit_code == 0, r.output
        assert app.state.manager.current is None


def test_serve_spm_infill_reaches_the_server_config(monkeypatch):
    """`serve --spm-infill` (llama-server's flag) sets ServerConfig.spm_infill, off by default."""
    import ramforge.cli.serve as serve_mod

    seen = []
    monkeypatch.setattr(serve_mod, "_serve", lambda cfg, *a, **k: seen.append(cfg.spm_infill))
    for args, want in ((["serve", "--spm-infill"], True), (["serve"], False)):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        assert seen.pop() is want


def test_rm_of_a_model_a_server_holds_unloads_it_first(tmp_path, monkeypatch):
    """`ramforge rm NAME` while a `ramforge serve` holds NAME: the server unloads it first (as `ollama rm`
    stops it), its budget charges released; the next request for NAME is a 404."""
    import datetime
    import shutil

    import httpx
    import uvicorn

    from ramforge.server import ServerConfig, create_app
    from ramforge.store import Store
    from ramforge.store.blobs import Manifest
    from tests.serving import serving
    from tools.make_models import ensure_model

    tiny = ensure_model("llama", "F16")
    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path))
    store = Store()
    store._ensure()
    digest = "sha256:" + hashlib.sha256(open(tiny, "rb").read()).hexdigest()
    shutil.copyfile(tiny, store.blob_path(digest))
    store._write_manifest(Manifest("tiny-rm", digest, store.blob_path(digest).stat().st_size, "test",
                                   datetime.datetime.now(datetime.timezone.utc).isoformat(), True))
    app = create_app(ServerConfig(ram="400M", n_ctx=256, keep_alive=600))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
        monkeypatch.setenv("RAMFORGE_HOST", host)
        monkeypatch.setenv("RAMFORGE_PORT", port)
        gen = {"model": "tiny-rm", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
        assert httpx.post(f"{url}/api/generate", json=gen, timeout=120).status_code == 200
        budget = app.state.manager.current.model.budget
        assert budget.current > 0
        r = CliRunner().invoke(cli, ["rm", "tiny-rm"])
        assert r.exit_code == 0, r.output
        assert app.state.manager.current is None and budget.current == 0 and budget.charges() == []
        assert not store.manifest_path("tiny-rm").exists() and not store.blob_path(digest).exists()
        assert httpx.post(f"{url}/api/generate", json=gen, timeout=120).status_code == 404
