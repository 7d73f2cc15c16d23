"""Hugging Face sources: llama.cpp's quant choice, and pull / plan / list against a local server that
answers as the Hub does (HF_ENDPOINT): the model API, /resolve with a redirect, range requests, a
gated repository, a connection cut mid-file."""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from pathlib import Path

import pytest

from tools.ggufbuild import GGUFBuilder
from tests.test_store import run  # noqa: F401  (`ramforge ARGS` in-process: code, stdout, stderr)
from ramforge.gguf.constants import GGMLType, GGUFValueType as VT
from ramforge.gguf.reader import GGUFFile
from ramforge.store import DigestMismatch, InvalidSource, Store
from ramforge.store.resolve import resolve_model
from ramforge.stream.plan import plan_for_budget

hub = pytest.importorskip("huggingface_hub", reason="the hf extra: pip install 'ramforge[hf]'")
import huggingface_hub.constants  # noqa: E402,F401  (HF_TOKEN_PATH, patched per test)
from ramforge.store import hf  # noqa: E402
from ramforge.store.ranged import READ_AHEAD  # noqa: E402

TOKEN = "hf_testtoken"


def plannable(n_layer=6, n_embd=256, n_ff=2048, n_vocab=512, seed=0, shard=None) -> bytes:
    """A small llama GGUF that plans (about 11 MB, a header of about 9 KB); shard=(k, n): its k-th of n
    shards as gguf-split cuts it (split keys in each, the metadata in the first, the tensors in n runs)."""
    tensors = [("token_embd.weight", [n_embd, n_vocab], GGMLType.Q8_0)]
    for i in range(n_layer):
        tensors.append((f"blk.{i}.attn_norm.weight", [n_embd], GGMLType.F32))
        tensors += [(f"blk.{i}.attn_{t}.weight", [n_embd, n_embd], GGMLType.Q8_0) for t in ("q", "k", "v", "output")]
        tensors += [(f"blk.{i}.ffn_norm.weight", [n_embd], GGMLType.F32),
                    (f"blk.{i}.ffn_gate.weight", [n_embd, n_ff], GGMLType.Q8_0),
                    (f"blk.{i}.ffn_up.weight", [n_embd, n_ff], GGMLType.Q8_0),
                    (f"blk.{i}.ffn_down.weight", [n_ff, n_embd], GGMLType.Q8_0)]
    tensors += [("output_norm.weight", [n_embd], GGMLType.F32), ("output.weight", [n_embd, n_vocab], GGMLType.Q8_0)]
    b = GGUFBuilder()
    k, n = shard or (1, 1)
    if k == 1:
        b.add("general.architecture", VT.STRING, "llama")
        for key, v in (("block_count", n_layer), ("embedding_length", n_embd), ("feed_forward_length", n_ff),
                       ("attention.head_count", 4), ("attention.head_count_kv", 4), ("context_length", 2048)):
            b.add(f"llama.{key}", VT.UINT32, v)
        b.add("llama.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-5)
        b.add("general.seed", VT.UINT32, seed)
        b.add("tokenizer.ggml.model", VT.STRING, "llama")
        b.add("tokenizer.ggml.tokens", VT.ARRAY, [f"t{i}" for i in range(n_vocab)], VT.STRING)
    if shard:
        b.add("split.no", VT.UINT16, k - 1).add("split.count", VT.UINT16, n).add("split.tensors.count", VT.INT32,
                                                                                 len(tensors))
        per = -(-len(tensors) // n)
        tensors = tensors[(k - 1) * per:k * per]
    for name, dims, t in tensors:
        b.tensor(name, dims, t)
    return b.build()


SMALL = plannable(n_layer=1, n_ff=256, seed=1)
BIG = plannable()
SHARDS = [b"GGUF" + bytes([i]) * 40_000 for i in range(1, 4)]      # a split set's files, as bytes
REPOS = {
    "org/model-GGUF": {"README.md": b"# card", "model-Q2_K.gguf": SMALL, "model-Q4_K_M.gguf": BIG,
                       "model-Q8_0.gguf": plannable(n_layer=2, seed=2), "mmproj-model-f16.gguf": SMALL},
    "org/split-GGUF": {f"Q4_K_M/split-Q4_K_M-0000{i}-of-00003.gguf": SHARDS[i - 1] for i in (1, 2, 3)}
                      | {"split-Q8_0.gguf": SMALL},
    "org/gated-GGUF": {"gated-Q4_K_M.gguf": SMALL},
    "org/real-split-GGUF": {f"real-Q4_K_M-0000{k}-of-00003.gguf": plannable(shard=(k, 3)) for k in (1, 2, 3)}
                           | {"real-Q8_0-00001-of-00002.gguf": plannable(shard=(1, 3)),     # a shard of 3 named 1 of 2
                              "real-Q8_0-00002-of-00002.gguf": plannable(shard=(2, 3))},
}
GATED = {"org/gated-GGUF"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorised(self, repo):
        return repo not in GATED or self.headers.get("Authorization") == f"Bearer {TOKEN}"

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        st = self.server.state
        path = self.path.split("?")[0]
        st["requests"].append((self.command, path, self.headers.get("Range")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            repo = m.group(1)
            if repo not in REPOS:
                return self._send(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])
            if not self._authorised(repo):
                return self._send(401, b'{"error": "gated"}', [("X-Error-Code", "GatedRepo")])
            sha = st["listed_sha"]
            sib = [{"rfilename": p, "size": len(d), **({"lfs": {"sha256": sha(p, d), "size": len(d), "pointerSize": 134}}
                                                      if p.endswith(".gguf") else {})}
                   for p, d in REPOS[repo].items()]
            return self._send(200, json.dumps({"id": repo, "sha": COMMIT, "siblings": sib}).encode(),
                              [("Content-Type", "application/json")])
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        if m:                                   # as the Hub: a redirect to where the bytes are
            repo, file = m.group(1), m.group(2)
            if repo not in REPOS or file not in REPOS[repo]:
                return self._send(404, b"", [("X-Error-Code", "EntryNotFound")])
            if not self._authorised(repo):
                return self._send(401, b"", [("X-Error-Code", "GatedRepo")])
            d = REPOS[repo][file]
            return self._send(302, b"", [("Location", f"/cdn/{repo}/{file}"), ("X-Repo-Commit", COMMIT),
                                         ("X-Linked-Etag", f'"{hashlib.sha256(d).hexdigest()}"'),
                                         ("X-Linked-Size", str(len(d)))])
        m = re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", path)
        if not m or m.group(2) not in REPOS.get(m.group(1), {}):
            return self._send(404)
        data, file = REPOS[m.group(1)][m.group(2)], m.group(2)
        start, end = 0, len(data) - 1
        r = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        head = [("X-Repo-Commit", COMMIT), ("ETag", f'"{hashlib.sha256(data).hexdigest()}"'),
                ("Accept-Ranges", "bytes")]
        if r:
            start, end = int(r.group(1)), min(int(r.group(2) or len(data) - 1), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            self.send_response(200)
        for k, v in head:
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        body = data[start:end + 1]
        cut = st["cut"].pop(file, None)
        if cut is not None:                     # the connection drops mid-file, once
            body = body[:cut]
            self.close_connection = True
        self.wfile.write(body)
        st["served"][file] = st["served"].get(file, 0) + len(body)
        if cut is not None:
            self.wfile.flush()
            self.connection.shutdown(2)


@pytest.fixture(scope="module")
def hub_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()


@pytest.fixture
def env(hub_server, tmp_path, monkeypatch):
    """HF_ENDPOINT at the local hub, HF_HOME and the store in tmp_path, no token anywhere."""
    hub_server.state = {"requests": [], "served": {}, "cut": {},
                        "listed_sha": lambda p, d: hashlib.sha256(d).hexdigest()}
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path / "store"))
    hub_server.cache = tmp_path / "hf" / "hub"
    return hub_server




# ------------------------------------------------------------------------ llama.cpp's choice

Q4 = "m-Q4_K_M.gguf"
SPLIT = [f"Q4_K_M/m-Q4_K_M-0000{i}-of-00003.gguf" for i in (2, 1, 3)]


@pytest.mark.parametrize("files, quant, expected", [
    (["README.md", "m-Q2_K.gguf", Q4, "m-Q8_0.gguf"], None, [Q4]),              # the default: Q4_K_M
    (["m-Q2_K.gguf", "m-Q8_0.gguf", "m-Q6_K.gguf"], None, ["m-Q8_0.gguf"]),      # then Q8_0
    (["m-F16.gguf", "m-Q5_K_S.gguf"], None, ["m-F16.gguf"]),                      # then the first model
    (["mmproj-m-Q4_K_M.gguf", "m-Q6_K.gguf"], None, ["m-Q6_K.gguf"]),            # a projector is never the model
    (["mmproj-F16.gguf", "imatrix.gguf", "m-IQ2_M.gguf"], None, ["m-IQ2_M.gguf"]),
    (["m-q4_k_m.gguf"], "Q4_K_M", ["m-q4_k_m.gguf"]),                             # case-insensitive
    (["m.Q5_K_M.gguf", "m-Q5_K_S.gguf"], "q5_k_m", ["m.Q5_K_M.gguf"]),            # '.' or '-' after the tag
    (["m-Q4_K_L.gguf", Q4], "Q4_K", []),                                          # "Q4_K[.-]": neither
    (["m-Q4_K_L.gguf", Q4, "m-Q4_K.gguf"], "Q4_K", ["m-Q4_K.gguf"]),
    (["m-UD-Q4_K_XL.gguf", Q4], "UD-Q4_K_XL", ["m-UD-Q4_K_XL.gguf"]),
    (["m-IQ4_XS.gguf"], "Q4_XS", ["m-IQ4_XS.gguf"]),                              # a search, as llama.cpp's regex
    (SPLIT + ["m-Q8_0.gguf"], "Q4_K_M", sorted(SPLIT)),                           # shard 1 picked, its set joins
    (SPLIT, None, sorted(SPLIT)),
    (["x/m-Q8_0.gguf", "m-Q8_0.gguf"], "Q8_0", ["x/m-Q8_0.gguf"]),               # the listing's first
])
def test_quant_picks_the_file_llama_cpp_picks(files, quant, expected):
    ref = hf.HfRef("o/r", quant)
    if not expected:
        with pytest.raises(hf.NoMatchingFile, match="the repository has m-Q4_K_L.gguf"):
            hf.choose(files, ref)
    else:
        assert hf.choose(files, ref) == expected


def test_include_globs_and_exact_files():
    files = ["m-Q2_K.gguf", Q4, "m-Q8_0.gguf", *SPLIT]
    assert hf.choose(files, hf.HfRef("o/r", include="*Q8_0*")) == ["m-Q8_0.gguf"]
    assert hf.choose(files, hf.HfRef("o/r", include="Q4_K_M/*")) == sorted(SPLIT)    # one split set is one model
    with pytest.raises(hf.NoMatchingFile, match="matches 4 models"):
        hf.choose(files, hf.HfRef("o/r", include="*.gguf"))
    assert hf.choose(files, hf.HfRef("o/r", filename=SPLIT[2])) == sorted(SPLIT)
    with pytest.raises(hf.NoMatchingFile, match="case-sensitive"):
        hf.choose(files, hf.HfRef("o/r", filename="m-q8_0.gguf"))


def test_sources_as_the_ecosystem_names_them():
    assert hf.parse_source("hf.co/Qwen/Qwen3-30B-A3B-GGUF:Q4_K_M") == hf.HfRef("Qwen/Qwen3-30B-A3B-GGUF", "Q4_K_M")
    assert hf.parse_source("huggingface.co/o/r") == hf.HfRef("o/r")
    assert hf.parse_source("o/r:Q8_0", hf=True) == hf.HfRef("o/r", "Q8_0")
    assert hf.parse_source("hf.co/o/r/sub/f.gguf") == hf.HfRef("o/r", filename="sub/f.gguf")
    assert hf.parse_source("hf.co/o/r", include="*Q4*") == hf.HfRef("o/r", include="*Q4*")
    assert hf.parse_source("https://example.com/x.gguf") is None and hf.parse_source("o/r") is None
    for bad in ("hf.co/o", "hf.co/o/r:", "hf.co/o/r:Q4;rm", "hf.co/../r", "hf.co/o/r/../f.gguf", "hf.co/o/r/a\\b",
                "hf.co/o--x/r"):
        with pytest.raises(InvalidSource):
            hf.parse_source(bad)
    with pytest.raises(InvalidSource, match="not two"):
        hf.parse_source("hf.co/o/r:Q8_0", include="*")


# ------------------------------------------------------------------------------- over HTTP

def test_pull_of_a_quant_into_the_hf_cache(env, capsys):
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/model-GGUF:Q8_0", "-q")
    assert code == 0, e
    m = Store().get("hf.co/org/model-GGUF:Q8_0")
    assert m.name == "hf.co/org/model-gguf:q8_0" and m.verified and not m.shards
    path = Path(m.path)
    assert path == env.cache / "models--org--model-GGUF" / "snapshots" / COMMIT / "model-Q8_0.gguf"
    assert m.hex == hashlib.sha256(REPOS["org/model-GGUF"]["model-Q8_0.gguf"]).hexdigest()
    assert resolve_model("hf.co/org/model-GGUF:Q8_0") == path
    assert m.source == "hf.co/org/model-GGUF/model-Q8_0.gguf"
    assert any(r[1].startswith("/cdn/") for r in env.state["requests"])          # the redirect was followed


def test_default_quant_and_a_plain_http_endpoint_needs_insecure(env, capsys):
    code, _, e = run(capsys, "pull", "hf.co/org/model-GGUF", "-q")
    assert code == 1 and "HF_ENDPOINT" in e and "--insecure" in e and env.state["requests"] == []
    code, _, e = run(capsys, "pull", "--insecure", "--hf", "org/model-GGUF", "--force", "-q")
    assert code == 0, e
    m = Store().get("hf.co/org/model-GGUF")                                      # :latest, as Ollama names it
    assert Path(m.path).name == "model-Q4_K_M.gguf"


def test_split_set_pulls_every_shard(env, capsys):
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/split-GGUF:Q4_K_M", "--force", "-q")
    assert code == 0, e
    m = Store().get("hf.co/org/split-GGUF:Q4_K_M")
    assert Path(m.path).name == "split-Q4_K_M-00001-of-00003.gguf"
    assert [Path(s.path).name for s in m.shards] == [f"split-Q4_K_M-0000{i}-of-00003.gguf" for i in (2, 3)]
    assert all(Path(s.path).parent == Path(m.path).parent for s in m.shards)      # beside shard 1
    assert [s.sha256 for s in m.shards] == [hashlib.sha256(d).hexdigest() for d in SHARDS[1:]]
    assert m.total_size == sum(map(len, SHARDS)) and "3 files" in e


def test_gated_repo_needs_a_token(env, capsys, monkeypatch):
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/gated-GGUF:Q4_K_M", "--force", "-q")
    assert code == 1 and "gated or private" in e and "HF_TOKEN" in e
    assert not (env.cache / "models--org--gated-GGUF" / "snapshots").exists()
    Path(hub.constants.HF_TOKEN_PATH).parent.mkdir(parents=True, exist_ok=True)
    Path(hub.constants.HF_TOKEN_PATH).write_text(TOKEN)                          # `hf auth login`'s file
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/gated-GGUF:Q4_K_M", "--force", "-q")
    assert code == 0, e
    Path(hub.constants.HF_TOKEN_PATH).unlink()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    code, out, e = run(capsys, "plan", "--insecure", "hf.co/org/gated-GGUF:Q4_K_M", "--ram", "1G", "--json")
    assert code == 0, e                                                           # cached: read locally
    Store().remove("hf.co/org/gated-GGUF:Q4_K_M")
    import shutil
    shutil.rmtree(env.cache / "models--org--gated-GGUF")
    code, out, e = run(capsys, "plan", "--insecure", "hf.co/org/gated-GGUF:Q4_K_M", "--ram", "1G", "--json")
    assert code == 0, e
    assert json.loads(out)["remote"]["source"] == "hf.co/org/gated-GGUF:Q4_K_M"


def _served_for(env, file):
    """Bytes the hub was asked for by range GETs of `file`, from the request log (written before the
    body, so no race with the server thread still sending it)."""
    size = len(next(r[file] for r in REPOS.values() if file in r))
    total = 0
    for cmd, path, rng in env.state["requests"]:
        if cmd == "GET" and path.startswith("/cdn/") and path.endswith("/" + file) and rng:
            a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", rng).groups()
            total += min(int(b) if b else size - 1, size - 1) - int(a) + 1
    return total


def test_plan_over_http_reads_the_header_only(env, capsys, tmp_path):
    code, out, e = run(capsys, "plan", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "--ram", "8G", "--json")
    assert code == 0, e
    info = json.loads(out)
    local = tmp_path / "model-Q4_K_M.gguf"
    local.write_bytes(BIG)
    with GGUFFile(local) as f:
        want = json.loads(json.dumps(plan_for_budget(f, 8 << 30, None).to_json()))
        header = f.data_offset
    served = _served_for(env, "model-Q4_K_M.gguf")
    assert header < served <= header + READ_AHEAD < len(BIG) / 4                 # the header and one read-ahead
    assert info["remote"]["bytes_fetched"] == served and info["remote"]["size"] == len(BIG)
    assert {k: v for k, v in info.items() if k not in ("remote", "storage", "path")} == \
        {k: v for k, v in want.items() if k != "path"}                            # the same plan as the file's
    assert info["storage"]["assumed"] and info["storage"]["read_gb_s"] == 2.0
    code, out, e = run(capsys, "plan", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "--ram", "1M")
    assert code == 0 and "insufficient" in out and "needs at least" in out and "range requests" in out
    assert not (env.cache / "models--org--model-GGUF" / "snapshots").exists()   # nothing downloaded


def test_pull_refuses_what_this_machine_cannot_run(env, capsys, monkeypatch):
    import psutil

    class Small:
        total = 1 << 20
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Small())
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "-q")
    assert code == 1 and "needs at least" in e and "1,048,576 B in all" in e and "--force" in e
    assert _served_for(env, "model-Q4_K_M.gguf") <= READ_AHEAD and Store().find("hf.co/org/model-GGUF:Q4_K_M") is None
    code, out, e = run(capsys, "pull", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "--dry-run", "--ram", "1G")
    assert code == 0 and "verdict" in out and Store().find("hf.co/org/model-GGUF:Q4_K_M") is None
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "--force", "-q")
    assert code == 0, e
    assert Store().find("hf.co/org/model-GGUF:Q4_K_M") is not None


def test_a_cut_download_resumes_to_the_right_sha256(env, capsys):
    chunk = hub.constants.DOWNLOAD_CHUNK_SIZE           # what huggingface_hub writes at once
    assert chunk + 12345 < len(BIG)
    cut = chunk + 12345                                 # past a written chunk: the retry resumes there
    env.state["cut"]["model-Q4_K_M.gguf"] = cut
    code, _, e = run(capsys, "pull", "--insecure", "hf.co/org/model-GGUF:Q4_K_M", "--force", "-q")
    assert code == 0, e
    m = Store().get("hf.co/org/model-GGUF:Q4_K_M")
    assert m.hex == hashlib.sha256(BIG).hexdigest() and Path(m.path).read_bytes() == BIG
    resumed = [r[2] for r in env.state["requests"] if r[:2] == ("GET", "/cdn/org/model-GGUF/model-Q4_K_M.gguf")]
    assert resumed[0] is None and re.fullmatch(r"bytes=(\d+)-", resumed[1])            # resumed with a Range
    assert 0 < int(resumed[1][6:-1]) <= cut


def test_a_file_that_is_not_the_listed_one_is_refused_and_deleted(env):
    env.state["listed_sha"] = lambda p, d: "0" * 64
    with pytest.raises(DigestMismatch, match="deleted it"):
        hf.pull(hf.HfRef("org/model-GGUF", "Q2_K"), Store(), insecure=True)
    snap = env.cache / "models--org--model-GGUF" / "snapshots" / COMMIT
    assert not (snap / "model-Q2_K.gguf").exists() and not list((env.cache / "models--org--model-GGUF" / "blobs").iterdir())


def test_download_for_from_pretrained_and_list_of_the_cache(env, capsys):
    path = hf.download("org/model-GGUF", "*Q2_K*", insecure=True)
    assert path.read_bytes() == SMALL and path.name == "model-Q2_K.gguf"
    assert hf.download("org/split-GGUF", "Q4_K_M/split-Q4_K_M-00002-of-00003.gguf", insecure=True).name == \
        "split-Q4_K_M-00001-of-00003.gguf"                                        # a shard brings its set
    with pytest.raises(hf.NoMatchingFile):
        hf.download("org/model-GGUF", "*.gguf", insecure=True)
    code, out, _ = run(capsys, "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["hf.co/org/model-gguf:q2_k"]["source"] == "huggingface-cache"
    assert rows["hf.co/org/split-gguf:q4_k_m"]["size"] == sum(map(len, SHARDS))
    assert resolve_model("hf.co/org/model-GGUF:Q2_K") == path                   # runs from the cache, no pull


# ------------------------------------------------------------------------- remote split sets

REAL = REPOS["org/real-split-GGUF"]


def test_plan_of_a_remote_split_set_joins_its_headers(env, capsys, tmp_path):
    """Each shard's header by range requests, joined by the reader (its split checks): the plan of the
    shards on disk, for a hf.co quant and for a plain URL of any shard."""
    for name in REAL:
        (tmp_path / name).write_bytes(REAL[name])
    with GGUFFile(tmp_path / "real-Q4_K_M-00001-of-00003.gguf") as f:
        want = json.loads(json.dumps(plan_for_budget(f, 1 << 30, None).to_json()))
        headers = [s.data_offset for s in f.shards]
    code, out, e = run(capsys, "plan", "--insecure", "hf.co/org/real-split-GGUF:Q4_K_M", "--ram", "1G", "--json")
    assert code == 0, e
    info = json.loads(out)
    assert {k: v for k, v in info.items() if k not in ("remote", "storage", "path")} == \
        {k: v for k, v in want.items() if k != "path"}
    assert len(info["remote"]["urls"]) == 3 and info["remote"]["size"] == sum(len(REAL[n]) for n in REAL if "Q4" in n)
    asked = 0
    for k, h in enumerate(headers, 1):                   # each shard: its header and at most one read-ahead
        name = f"real-Q4_K_M-0000{k}-of-00003.gguf"
        spans = [re.fullmatch(r"bytes=(\d+)-(\d+)", r[2]).groups() for r in env.state["requests"]
                 if r[1] == f"/cdn/org/real-split-GGUF/{name}"]      # logged before the answer: no race
        got = sum(min(int(b), len(REAL[name]) - 1) - int(a) + 1 for a, b in spans)
        assert h < got <= h + READ_AHEAD < len(REAL[name])
        asked += got
    assert info["remote"]["bytes_fetched"] == asked
    url = f"{env.url}/cdn/org/real-split-GGUF/real-Q4_K_M-00002-of-00003.gguf"        # shard 2's URL: the set
    code, out, e = run(capsys, "plan", "--insecure", url, "--ram", "1G", "--json")
    assert code == 0, e
    assert json.loads(out)["min_budget"] == want["min_budget"] and len(json.loads(out)["remote"]["urls"]) == 3
    assert not (env.cache / "models--org--real-split-GGUF" / "snapshots").exists()


def test_a_remote_set_that_does_not_belong_together_is_named(env, capsys):
    code, _, e = run(capsys, "plan", "--insecure", "hf.co/org/real-split-GGUF:Q8_0", "--ram", "1G")
    assert code == 1 and "split.count = 3, but 2 files were given" in e and "real-Q8_0-00001-of-00002.gguf" in e


def test_pull_of_a_split_url_into_the_store_loads(env, capsys):
    url = f"{env.url}/cdn/org/real-split-GGUF/real-Q4_K_M-00001-of-00003.gguf"
    code, _, e = run(capsys, "pull", "--insecure", url, "--name", "real", "-q")
    assert code == 0, e
    assert "3 files" in e
    m = Store().get("real")
    assert [m.hex, *(s.sha256 for s in m.shards)] == \
        [hashlib.sha256(REAL[f"real-Q4_K_M-0000{k}-of-00003.gguf"]).hexdigest() for k in (1, 2, 3)]
    with GGUFFile(resolve_model("real")) as f:
        assert len(f.shards) == 3 and f.split.tensors == len(f.tensors)
    code, out, e = run(capsys, "verify", "real", "-q")
    assert code == 0, e
    code, _, e = run(capsys, "rm", "real")
    assert code == 0 and not list((Store().blobs).glob("sha256-*"))


def test_api_pull_of_a_hugging_face_quant(env):
    from fastapi.testclient import TestClient

    from ramforge.server import ServerConfig, create_app

    with TestClient(create_app(ServerConfig(ram="400M", n_ctx=256))) as c:
        r = c.post("/api/pull", json={"model": "hf.co/org/real-split-GGUF:Q4_K_M", "insecure": True})
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert r.status_code == 200 and lines[0] == {"status": "pulling manifest"} and lines[-1]["status"] == "success"
        assert not any("error" in x for x in lines)
        m = Store().get("hf.co/org/real-split-GGUF:Q4_K_M")
        assert len(m.shards) == 2 and Path(m.path).parent.parent.parent.name == "models--org--real-split-GGUF"
        assert lines[-3]["total"] == m.total_size
        r = c.post("/api/pull", json={"model": "hf.co/org/model-GGUF:Q2_K", "stream": False})
        assert r.status_code == 400 and "HF_ENDPOINT" in r.json()["error"]           # http endpoint: insecure only
        assert c.post("/api/pull", json={"model": "hf.co/org/../x:Q2_K"}).status_code == 400


def test_api_show_of_a_remote_name_not_pulled_is_a_404_naming_pull(env):
    from fastapi.testclient import TestClient

    from ramforge.server import ServerConfig, create_app

    with TestClient(create_app(ServerConfig(ram="400M", n_ctx=256))) as c:
        r = c.post("/api/show", json={"model": "hf.co/org/model-GGUF:Q2_K"})
        assert r.status_code == 404 and "ramforge pull hf.co/org/model-GGUF:Q2_K" in r.json()["error"]
        assert env.state["requests"] == []                       # nothing fetched
