"""The model store: resumable, verified pull over a loopback HTTP server; list, rm, verify; names; resolve."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import socket
import threading
import time

import pytest
from click.testing import CliRunner

from ramforge.cli import cli, main
from ramforge.errors import ModelNotFound, RamforgeError
from ramforge.store.resolve import resolve_model
from ramforge.store import (DigestMismatch, DownloadIncomplete, InvalidModelName, InvalidSource, NotGGUF,
                            NotInStore, Store, StoreBusy, default_name, expand_source, normalize_name,
                            parse_name)
from ramforge.store import blobs as blobs_mod
from ramforge.store import BlobChanged
from ramforge.store.transfer import _PartLock

SIZE = 3 * (1 << 20) + 12345
DATA = b"GGUF" + os.urandom(SIZE - 4)
DIGEST = hashlib.sha256(DATA).hexdigest()
DATA2 = b"GGUF" + os.urandom(SIZE - 4)         # the same file after an upstream change
DIGEST2 = hashlib.sha256(DATA2).hexdigest()
CUT = 1_500_000                      # where an interrupted response stops
MODIFIED = ("Mon, 01 Jan 2024 00:00:00 GMT", "Tue, 02 Jan 2024 00:00:00 GMT")   # Last-Modified per version


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "ramforge-test"

    def log_message(self, *args):    # quiet
        pass

    def do_GET(self):
        st = self.server.state
        rng = self.headers.get("Range")
        st["requests"].append({"path": self.path, "range": rng})
        if self.headers.get("If-Range"):
            st["if_range"].append(self.headers["If-Range"])
        v = st["version"]
        if self.path.startswith("/to/"):          # a redirect to the plain-http server
            self.send_response(302)
            self.send_header("Location", st["to"] + "/" + self.path.split("/", 2)[2])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", "/" + self.path.split("/", 2)[2])
            self.send_header("X-Linked-Etag", f'"{st["linked_etag"]}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = (DATA, DATA2)[v]
        body = {"/model.gguf": data, "/Other-Model.Q4_K_M.gguf": data, "/page.html": b"<html>nope</html>" * 10}
        data = body.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        etag = f'"{st["etag"]}"' if st["etag"] else None
        if_range = self.headers.get("If-Range")
        if if_range and st["honour_if_range"] and if_range not in (etag, MODIFIED[v]):
            m = None                              # RFC 9110: the validator does not match, send it all
        if m and st["range"]:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                st["requests"][-1]["status"] = 416
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        st["requests"][-1]["status"] = 206 if start else 200
        self.send_header("Content-Length", str(len(data) - start))
        if st["etag"]:
            self.send_header("ETag", f'"{st["etag"]}"')
        self.send_header("Last-Modified", MODIFIED[v])
        self.end_headers()
        if st.get("stall"):                       # once: send part of the body, then go quiet
            st["stall"] = False
            self.wfile.write(data[start:CUT])
            self.wfile.flush()
            time.sleep(1.0)
            return
        if st["cut"] is not None:                 # once: send part of the body, then drop the connection
            cut, st["cut"] = st["cut"], None
            self.wfile.write(data[start:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def srv(server):
    """The server with fresh state: range support on, no interruption, no ETag."""
    server.state = {"requests": [], "range": True, "cut": None, "etag": None, "linked_etag": None, "version": 0,
                    "if_range": [], "honour_if_range": True, "to": None}
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


def _pull(*args, **kwargs):
    """Store().pull of the loopback server's plain-http URLs (insecure=True)."""
    return Store().pull(*args, insecure=True, **kwargs)


@pytest.fixture
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("RAMFORGE_HOME", str(root))
    return root


def run(capsys, *args):
    """`ramforge ARGS` in-process: (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _check_pulled(home, name="model"):
    m = json.loads((home / "manifests" / f"{name}.json").read_text())
    assert m["digest"] == f"sha256:{DIGEST}" and m["size"] == SIZE and m["name"] == name
    assert m["source"].startswith("http://127.0.0.1:") and m["pulled_at"]
    blob = home / "blobs" / f"sha256-{DIGEST}"
    assert blob.read_bytes() == DATA
    assert not list((home / "blobs").glob("*.part"))
    return blob


# -------------------------------------------------------------------------------- names and sources

def test_shorthand_maps_to_resolve_url():
    assert expand_source("hf.co/unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf") == \
        "https://huggingface.co/unsloth/Qwen3-0.6B-GGUF/resolve/main/Qwen3-0.6B-Q4_K_M.gguf"
    assert expand_source("huggingface.co/o/r/sub/f.gguf") == "https://huggingface.co/o/r/resolve/main/sub/f.gguf"
    assert expand_source("https://example.com/x.gguf") == "https://example.com/x.gguf"
    for bad in ("hf.co/org/file.gguf", "hf.co/o/r/../f.gguf", "file:///etc/passwd", "ftp://h/x.gguf", "x.gguf", ""):
        with pytest.raises(InvalidSource):
            expand_source(bad)
    assert default_name("hf.co/unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf") == "qwen3-0.6b-q4_k_m"
    assert default_name("https://h/a%20b+c.gguf?download=1") == "a-b-c"


@pytest.mark.parametrize("bad", ["../x", "/abs", "..", "", ".hidden", "a\\b", "a\x00b", "a..b",
                                 "x:", ":tag", "a:b:c", "a b", "-x", "x" * 129, "C:\\x", "a:../b",
                                 "a/../b", "a/./b", "a//b", "a/", "/", "a/b/c/d", "h:1/ns/m", "a.b/model",
                                 "hf.co/../x", "user/x" + "y" * 128, "u/" + "m" * 128 + ":" + "t" * 128,
                                 "ns/m\x00", "ns\\m", "x" * 1000, "./x", "a/.b"])
def test_name_validation_refuses(bad, home):
    with pytest.raises(InvalidModelName):
        normalize_name(bad)
    with pytest.raises(InvalidModelName):
        Store().manifest_path(bad)
    assert not home.exists()


def test_name_normalisation():
    assert normalize_name("Qwen3-0.6B") == "qwen3-0.6b"
    # Ollama's names: [host/][namespace/]model[:tag]; its default host and namespace are dropped
    assert normalize_name("library/llama3") == "llama3"
    assert normalize_name("registry.ollama.ai/library/llama3:latest") == "llama3"
    assert normalize_name("User/Model:Tag") == "user/model:tag"
    assert normalize_name("hf.co/Org/Repo-GGUF:Q4_K_M") == "hf.co/org/repo-gguf:q4_k_m"
    n = parse_name("hf.co/org/repo:Q4_K_M")
    assert (n.host, n.namespace, n.model, n.tag) == ("hf.co", "org", "repo", "q4_k_m")
    base, tag = parse_name("user/model")                                 # unpacks as (base, tag)
    assert (base, tag) == ("user/model", "latest")
    assert normalize_name("qwen3:latest") == "qwen3"
    assert normalize_name("qwen3:Q8_0") == "qwen3:q8_0"
    assert issubclass(InvalidModelName, RamforgeError)


def test_bad_name_touches_nothing(srv, home, capsys):
    code, _, e = run(capsys, "pull", "--insecure", f"{srv.url}/model.gguf", "--name", "../x", "-q")
    assert code == 1 and "invalid model name '../x'" in e and "--name" in e
    assert not home.exists() and srv.state["requests"] == []


# ----------------------------------------------------------------------------------------- pull

def test_pull_without_range_support(srv, home, capsys):
    srv.state["range"] = False
    code, _, e = run(capsys, "pull", "--insecure", f"{srv.url}/model.gguf")          # with the progress bar
    assert code == 0, e
    assert "pulled model" in e
    _check_pulled(home)
    # the header read for the plan (a bounded range, answered 200 here: refused unread), then the pull
    assert [r["range"] for r in srv.state["requests"]] == [f"bytes=0-{(1 << 20) - 1}", None]
    assert "no plan before the download" in e


def test_a_part_of_unknown_origin_is_resumed_only_against_a_digest(srv, home):
    """A .part with no recorded validator (an older ramforge's) may be of another file: resumed with
    Range only where --sha256 will catch a splice, else downloaded again from 0."""
    (home / "blobs").mkdir(parents=True)
    (home / "blobs" / "model.part").write_bytes(DATA[:1 << 20])
    m = _pull(f"{srv.url}/model.gguf", sha256=DIGEST)
    assert m.digest == f"sha256:{DIGEST}" and m.name == "model" and m.verified
    assert srv.state["requests"] == [{"path": "/model.gguf", "range": f"bytes={1 << 20}-", "status": 206}]
    _check_pulled(home)
    (home / "blobs" / "model.part").write_bytes(DATA2[:1 << 20])     # another file's beginning
    srv.state["requests"].clear()
    assert _pull(f"{srv.url}/model.gguf", "again").hex == DIGEST
    assert srv.state["requests"] == [{"path": "/model.gguf", "range": None, "status": 200}]


def test_interrupted_pull_resumes_with_range(srv, home, capsys):
    srv.state["cut"] = CUT
    code, _, e = run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "--retries", "0", "-q")
    assert code == 1 and "partial file is kept" in e and f"{CUT:,} of {SIZE:,} B" in e
    part = home / "blobs" / "model.part"
    assert part.stat().st_size == CUT and not (home / "manifests" / "model.json").exists()
    code, _, e = run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "-q")
    assert code == 0, e
    assert [(r["range"], r["status"]) for r in srv.state["requests"]] == [(None, 200), (f"bytes={CUT}-", 206)]
    assert srv.state["if_range"] == [MODIFIED[0]]                   # the resume names the version it began
    _check_pulled(home)
    assert not (home / "blobs" / "model.part.json").exists()


def test_interruption_without_range_support_restarts_cleanly(srv, home, capsys):
    srv.state["range"], srv.state["cut"] = False, CUT
    code, _, _ = run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "--retries", "0", "-q")
    assert code == 1 and (home / "blobs" / "model.part").stat().st_size == CUT
    code, _, e = run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "-q")
    assert code == 0, e
    assert [(r["range"], r["status"]) for r in srv.state["requests"]] == [(None, 200), (f"bytes={CUT}-", 200)]
    _check_pulled(home)


def test_retries_resume_within_one_pull(srv, home):
    srv.state["cut"] = CUT
    events = []
    m = _pull(f"{srv.url}/model.gguf", "m2", retries=1, retry_delay=0,
                     progress=lambda phase, done, total: events.append(phase))
    assert m.hex == DIGEST and any(p.startswith("retry 1/1") for p in events)
    assert [r["status"] for r in srv.state["requests"]] == [200, 206]
    _check_pulled(home, "m2")
    with pytest.raises(DownloadIncomplete):          # and without retries the error surfaces
        srv.state["cut"] = CUT
        _pull(f"{srv.url}/model.gguf", "m3", retries=0)


def test_complete_part_is_finished_after_416(srv, home):
    (home / "blobs").mkdir(parents=True)
    (home / "blobs" / "model.part").write_bytes(DATA)
    _pull(f"{srv.url}/model.gguf", sha256=DIGEST)
    assert [r["status"] for r in srv.state["requests"]] == [416]
    _check_pulled(home)


def test_expected_digests(srv, home):
    with pytest.raises(DigestMismatch, match=f"expected {'0' * 64}, got {DIGEST}"):
        _pull(f"{srv.url}/model.gguf", sha256="0" * 64)
    assert not (home / "blobs" / "model.part").exists() and not (home / "manifests" / "model.json").exists()
    srv.state["etag"] = "f" * 64                       # a 64-hex ETag is checked
    with pytest.raises(DigestMismatch, match="ETag"):
        _pull(f"{srv.url}/model.gguf")
    srv.state["etag"] = "abc-123"                     # anything else is ignored
    assert _pull(f"{srv.url}/model.gguf").hex == DIGEST
    srv.state["etag"], srv.state["linked_etag"] = None, "e" * 64    # huggingface: on the redirect
    with pytest.raises(DigestMismatch, match="e" * 64):
        _pull(f"{srv.url}/redirect/model.gguf", "viaredirect")
    srv.state["linked_etag"] = DIGEST
    assert _pull(f"{srv.url}/redirect/model.gguf", "viaredirect").hex == DIGEST


def test_not_gguf_is_refused(srv, home):
    with pytest.raises(NotGGUF, match="not a GGUF file"):
        _pull(f"{srv.url}/page.html")
    assert list((home / "blobs").iterdir()) == [] and list((home / "manifests").iterdir()) == []


def test_http_404(srv, home, capsys):
    code, _, e = run(capsys, "pull", "--insecure", f"{srv.url}/missing.gguf", "-q")
    assert code == 1 and "HTTP 404" in e and len(e.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- list, rm, verify, resolve

def test_list_rm_keeps_shared_blob(srv, home, capsys):
    assert run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "-q")[0] == 0
    assert run(capsys, "pull", "--insecure", f"{srv.url}/Other-Model.Q4_K_M.gguf", "-q")[0] == 0   # default name
    assert run(capsys, "pull", "--insecure", f"{srv.url}/model.gguf", "--name", "Tagged:V1", "-q")[0] == 0
    code, o, _ = run(capsys, "list", "--json")
    listed = json.loads(o)
    assert code == 0 and [m["name"] for m in listed] == ["model", "other-model.q4_k_m", "tagged:v1"]
    assert {m["digest"] for m in listed} == {f"sha256:{DIGEST}"}
    r = CliRunner().invoke(cli, ["list"])
    assert r.exit_code == 0 and "other-model.q4_k_m" in r.output and DIGEST[:12] in r.output
    blob = home / "blobs" / f"sha256-{DIGEST}"
    assert run(capsys, "rm", "model")[0] == 0 and blob.exists()
    assert run(capsys, "rm", "other-model.q4_k_m:latest")[0] == 0 and blob.exists()
    code, _, e = run(capsys, "rm", "tagged:v1")
    assert code == 0 and "deleted its blob" in e and not blob.exists()
    code, _, e = run(capsys, "rm", "model")
    assert code == 1 and "no model named 'model'" in e and "ramforge list" in e


def test_verify_catches_corruption(srv, home, capsys):
    assert run(capsys, "pull", "--insecure", "--force", f"{srv.url}/model.gguf", "-q")[0] == 0
    code, o, e = run(capsys, "verify", "model")
    assert code == 0 and "ok" in o, e
    blob = home / "blobs" / f"sha256-{DIGEST}"
    raw = bytearray(blob.read_bytes())
    raw[SIZE // 2] ^= 0xFF
    blob.write_bytes(bytes(raw))
    actual = hashlib.sha256(raw).hexdigest()
    code, _, e = run(capsys, "verify", "model", "-q")
    assert code == 1 and f"expected {DIGEST}" in e and f"got {actual}" in e
    with pytest.raises(DigestMismatch):
        Store().verify("model")


def test_resolve_model_finds_pulled_name(srv, home, tmp_path, monkeypatch):
    _pull(f"{srv.url}/model.gguf", "mymodel")
    blob = home / "blobs" / f"sha256-{DIGEST}"
    assert resolve_model("mymodel") == blob
    assert resolve_model("MyModel:latest") == blob
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodel").write_bytes(b"GGUF local")                 # an existing file wins
    assert resolve_model("mymodel").resolve() == tmp_path / "mymodel"
    with pytest.raises(ModelNotFound, match="ramforge list"):
        resolve_model("nosuchmodel")
    with pytest.raises(ModelNotFound):
        resolve_model("../nosuch/model.gguf")
    with pytest.raises(NotInStore):
        Store().verify("nosuchmodel")
    blob.unlink()
    with pytest.raises(ModelNotFound, match="missing"):
        resolve_model("mymodel:latest")


def test_ctrl_c_keeps_a_resumable_part(srv, home):
    seen = []

    def interrupt(phase, done, total):
        if phase == "download" and done >= 2 << 20:
            seen.append(done)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _pull(f"{srv.url}/model.gguf", progress=interrupt, chunk_size=1 << 18)
    kept = (home / "blobs" / "model.part").stat().st_size
    assert kept == seen[0] and 2 << 20 <= kept <= (2 << 20) + (1 << 18)
    assert _pull(f"{srv.url}/model.gguf").hex == DIGEST
    assert srv.state["requests"][-1] == {"path": "/model.gguf", "range": f"bytes={kept}-", "status": 206}
    _check_pulled(home)


def test_failed_connect_leaves_no_part(home):
    with socket.socket() as s:             # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadIncomplete, match="cannot reach"):
        _pull(f"http://127.0.0.1:{port}/x.gguf", timeout=2)
    assert list((home / "blobs").iterdir()) == []


def test_stalled_server_times_out_and_resumes(srv, home):
    srv.state["stall"] = True
    with pytest.raises(DownloadIncomplete, match="stalled"):
        _pull(f"{srv.url}/model.gguf", timeout=0.3)
    assert (home / "blobs" / "model.part").stat().st_size == CUT
    assert _pull(f"{srv.url}/model.gguf").hex == DIGEST


def test_concurrent_pull_of_one_name_is_refused(srv, home):
    (home / "blobs").mkdir(parents=True)
    with _PartLock(home / "blobs" / "model.part"):
        with pytest.raises(StoreBusy, match="another `ramforge pull`"):
            _pull(f"{srv.url}/model.gguf")
    assert srv.state["requests"] == []


# ------------------------------------------------------------------- a changed upstream, plain http, digests

def _interrupted(srv, name="model"):
    srv.state["cut"] = CUT
    with pytest.raises(DownloadIncomplete):
        _pull(f"{srv.url}/model.gguf", name, retries=0)
    part = srv.home / "blobs" / f"{name}.part"
    assert part.stat().st_size == CUT and json.loads((srv.home / "blobs" / f"{name}.part.json").read_text())["url"]
    return part


@pytest.fixture
def srvh(srv, home):
    srv.home = home
    return srv


@pytest.mark.parametrize("validator", ["last-modified", "etag"])
def test_a_file_changed_upstream_is_downloaded_again_from_0(srvh, validator):
    srv = srvh
    if validator == "etag":
        srv.state["etag"] = "v1-abc"                                  # an opaque strong ETag
    _interrupted(srv)
    srv.state["version"] = 1                                          # the file changes upstream
    if validator == "etag":
        srv.state["etag"] = "v2-def"
    m = _pull(f"{srv.url}/model.gguf")
    assert m.hex == DIGEST2 and not m.verified                        # the new file whole, not a splice
    assert srv.state["if_range"] == ['"v1-abc"' if validator == "etag" else MODIFIED[0]]
    assert [(r["range"], r["status"]) for r in srv.state["requests"]] == [(None, 200), (f"bytes={CUT}-", 200)]
    assert (srv.home / "blobs" / f"sha256-{DIGEST2}").read_bytes() == DATA2


def test_a_server_ignoring_if_range_is_caught_by_its_validator(srvh):
    srv = srvh
    _interrupted(srv)
    srv.state["version"], srv.state["honour_if_range"] = 1, False    # answers 206 of the new version
    assert _pull(f"{srv.url}/model.gguf").hex == DIGEST2
    assert [(r["range"], r["status"]) for r in srv.state["requests"]] == \
        [(None, 200), (f"bytes={CUT}-", 206), (None, 200)]          # the 206's Last-Modified differs: over


def test_a_part_of_another_url_is_not_resumed(srvh):
    srv = srvh
    _interrupted(srv)
    srv.state["requests"].clear()
    assert _pull(f"{srv.url}/Other-Model.Q4_K_M.gguf", "model").hex == DIGEST
    assert srv.state["requests"] == [{"path": "/Other-Model.Q4_K_M.gguf", "range": None, "status": 200}]


def test_plain_http_needs_insecure(srv, home, capsys):
    from ramforge.store import InsecureSource
    with pytest.raises(InsecureSource, match="--insecure"):
        Store().pull(f"{srv.url}/model.gguf")
    code, _, e = run(capsys, "pull", f"{srv.url}/model.gguf", "-q")
    assert code == 1 and "plain http" in e and "--insecure" in e
    assert srv.state["requests"] == [] and not (home / "manifests").exists() and not list(home.rglob("*.part"))


def test_a_redirect_from_https_to_http_is_refused():
    import urllib.request

    from ramforge.store.transfer import _RecordRedirects
    h = _RecordRedirects()
    req = urllib.request.Request("https://example.com/model.gguf")
    with pytest.raises(InvalidSource, match="from https to plain http"):
        h.redirect_request(req, None, 302, "Found", {}, "http://example.com/model.gguf")
    for ok in ("https://cdn.example.com/model.gguf",):
        assert h.redirect_request(req, None, 302, "Found", {}, ok).full_url == ok
    plain = urllib.request.Request("http://127.0.0.1/model.gguf")      # with --insecure, http to http is as asked
    assert h.redirect_request(plain, None, 302, "Found", {}, "http://127.0.0.1/b.gguf").full_url.startswith("http:")


def _tls_server(tmp_path, monkeypatch):
    """An https server on 127.0.0.1 with a self-signed certificate the client is made to trust."""
    import ssl
    import subprocess
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command (to make a test certificate) is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, timeout=60)
    if r.returncode:
        pytest.skip(f"openssl could not make a test certificate: {r.stderr[-200:]!r}")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_an_https_pull_redirected_to_http_is_refused_end_to_end(srv, home, tmp_path, monkeypatch):
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    tls = _tls_server(tmp_path, monkeypatch)
    try:
        tls.state = dict(srv.state, requests=[], to=srv.url)
        url = f"https://127.0.0.1:{tls.server_address[1]}"
        assert Store().pull(f"{url}/model.gguf", "direct").verified is False    # https itself works
        with pytest.raises(InvalidSource, match="from https to plain http"):
            Store().pull(f"{url}/to/model.gguf", "downgraded", insecure=True)   # refused even with insecure
        assert srv.state["requests"] == [] and Store().find("downgraded") is None
    finally:
        tls.shutdown()
        tls.server_close()


def test_unverified_downloads_are_marked(srv, home, capsys):
    code, _, e = run(capsys, "pull", "--insecure", f"{srv.url}/model.gguf", "--name", "plain", "-q")
    assert code == 0 and "plain is unverified" in e
    code, _, e = run(capsys, "pull", "--insecure", f"{srv.url}/model.gguf", "--name", "checked", "--sha256", DIGEST,
                     "-q")
    assert code == 0 and "unverified" not in e
    srv.state["etag"] = DIGEST                                        # a sha256 ETag verifies too
    assert _pull(f"{srv.url}/model.gguf", "tagged").verified
    code, o, _ = run(capsys, "list", "--json")
    assert {m["name"]: m["verified"] for m in json.loads(o)} == {"checked": True, "plain": False, "tagged": True}
    r = CliRunner().invoke(cli, ["list"])
    row = next(line for line in r.output.splitlines() if line.lstrip("│ ").startswith("plain"))
    assert "unverified" in row
    # an older manifest without the field reads as unverified
    path = home / "manifests" / "checked.json"
    data = json.loads(path.read_text())
    del data["verified"]
    path.write_text(json.dumps(data))
    assert Store().get("checked").verified is False


def test_ollama_tags_say_which_pulls_are_unverified(srv, home):
    uvicorn = pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from ramforge.server import ServerConfig, create_app
    from tests.serving import serving
    _pull(f"{srv.url}/model.gguf", "plain")
    _pull(f"{srv.url}/model.gguf", "checked", sha256=DIGEST)
    app = create_app(ServerConfig(ram="400M", n_ctx=512))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        tags = httpx.get(f"{url}/api/tags", timeout=60).json()["models"]
    by = {m["name"]: m for m in tags}
    assert by["plain"]["verified"] is False and by["checked"]["verified"] is True
    assert by["plain"]["digest"] == DIGEST
    assert all("verified" not in m for n, m in by.items() if n not in ("plain", "checked"))   # not pulls


# ------------------------------------------------------------------------- verify on load, names

def test_a_changed_file_is_hashed_again_before_it_is_served(srv, home, monkeypatch):
    _pull(f"{srv.url}/model.gguf", "model")
    blob = home / "blobs" / f"sha256-{DIGEST}"
    m = Store().get("model")
    assert m.mtime_ns == blob.stat().st_mtime_ns
    hashed = []
    real = blobs_mod.hash_file
    monkeypatch.setattr(blobs_mod, "hash_file", lambda p, *a, **k: hashed.append(p) or real(p, *a, **k))
    assert resolve_model("model") == blob and hashed == []                 # unchanged: no read at all
    os.utime(blob, ns=(blob.stat().st_atime_ns, m.mtime_ns + 10**9))      # touched, same bytes
    assert resolve_model("model") == blob and hashed == [blob]
    assert Store().get("model").mtime_ns == m.mtime_ns + 10**9            # recorded: not hashed next time
    assert resolve_model("model") == blob and hashed == [blob]
    raw = bytearray(DATA)
    raw[-1] ^= 1
    blob.write_bytes(bytes(raw))                                            # same size, other bytes
    with pytest.raises(DigestMismatch, match="modified on disk"):
        resolve_model("model")
    with open(blob, "r+b") as f:
        f.truncate(SIZE - 1)
    with pytest.raises(BlobChanged, match="changed on disk"):
        Store().path_of("model")


def test_an_old_manifest_is_hashed_once(srv, home):
    _pull(f"{srv.url}/model.gguf", "model")
    path = Store().manifest_path("model")
    data = json.loads(path.read_text())
    del data["mtime_ns"]                                                    # written before mtimes were kept
    path.write_text(json.dumps(data))
    assert Store().get("model").mtime_ns is None
    Store().path_of("model")
    assert Store().get("model").mtime_ns == (home / "blobs" / f"sha256-{DIGEST}").stat().st_mtime_ns


def test_names_with_slashes_live_in_folders(srv, home, capsys):
    for name in ("user/model:tag", "library/plain", "hf.co/org/repo:Q4_K_M"):
        _pull(f"{srv.url}/model.gguf", name)
    assert (home / "manifests" / "user" / "model:tag.json").is_file()
    assert (home / "manifests" / "plain.json").is_file()                  # Ollama's library/x is x
    assert (home / "manifests" / "hf.co" / "org" / "repo:q4_k_m.json").is_file()
    code, out, _ = run(capsys, "list", "--json")
    assert {r["name"] for r in json.loads(out)} == {"user/model:tag", "plain", "hf.co/org/repo:q4_k_m"}
    assert resolve_model("User/Model:tag") == home / "blobs" / f"sha256-{DIGEST}"
    r = Store().remove("hf.co/org/repo:Q4_K_M")
    assert r["manifest"] and not r["blob_deleted"]                         # two names still use the blob
    assert not (home / "manifests" / "hf.co").exists()                     # its empty folders are gone
    assert Store().part_path("user/model:tag").parent == home / "blobs"    # a part stays in blobs/
