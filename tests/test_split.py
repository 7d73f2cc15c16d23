"""Split GGUFs (llama.cpp's gguf-split format): shards found from any one of them, checked to belong
together, and read in every I/O mode with logits bit-identical to the unsplit file's."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.errors import SplitMismatch, SplitShardMissing
from ramforge.gguf.reader import SHARD_GAP, GGUFFile, split_path, split_prefix
from ramforge.memory import MemoryBudget
from ramforge.stream.plan import plan_for_budget
from tests.ggufpy import gguf_reader

PROMPT = [1, 415, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889]
gguf = pytest.importorskip("gguf")


def split_gguf(src, out_dir, stem: str, max_tensors: int, drop=(), kv=None) -> list:
    """src rewritten as gguf-py's GGUFWriter splits a model (split_max_tensors: llama.cpp's layout,
    names NAME-0000k-of-0000N.gguf, the metadata in the first shard); the shard paths, in order."""
    r = gguf_reader(src)
    out = out_dir / f"{stem}.gguf"
    w = gguf.GGUFWriter(out, r.fields["general.architecture"].contents(), split_max_tensors=max_tensors)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for k, (v, vt) in (kv or {}).items():
        w.add_key_value(k, v, vt)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=[int(x) for x in reversed(t.shape)] if t.tensor_type > 1
                         else None, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))


@pytest.fixture(scope="module")
def tiny():
    from tools.make_models import ensure_model

    return ensure_model("llama", "F16")


@pytest.fixture(scope="module")
def shards(tiny, tmp_path_factory):
    return split_gguf(tiny, tmp_path_factory.mktemp("split"), "tiny", 9)


def test_names_are_llama_cpps():
    assert split_path("/m/model", 2, 4) == "/m/model-00002-of-00004.gguf"
    assert split_prefix("/m/model-00002-of-00004.gguf") == ("/m/model", 2, 4)
    assert split_prefix("/m/model.gguf") is None


def test_shards_read_as_the_whole_file(tiny, shards):
    assert len(shards) >= 3
    with GGUFFile(tiny) as whole:
        want = {n: (t.ggml_type, t.dims, whole.read_tensor(t).tobytes()) for n, t in whole.tensors.items()}
        md = whole.metadata
    for given in (shards[0], shards[-1], shards[1]):           # from any shard: the set, read from its first
        with GGUFFile(given) as f:
            assert f.paths == [str(s) for s in shards] and f.path == str(shards[0])
            assert list(f.tensors) == list(want)                # llama.cpp's order: shard by shard
            assert {n: (t.ggml_type, t.dims, f.read_tensor(t).tobytes()) for n, t in f.tensors.items()} == want
            assert {k: v for k, v in f.metadata.items() if not k.startswith("split.")}.keys() == md.keys()
            assert f.split.count == len(shards) and f.split.tensors == len(want)
            files = sorted({t.file for t in f.tensors.values()})
            assert files == list(range(len(shards)))
            for t in f.tensors.values():                        # a tensor knows its file and its offset there
                path, off = f.file_offset(t)
                assert path == str(shards[t.file]) and 0 < off < f.shards[t.file].size
            assert all(b % SHARD_GAP == 0 for b in f.bases) and f.total_size == sum(s.stat().st_size for s in shards)
            assert "shards" in f.describe()


@pytest.mark.parametrize("io", ["direct", "buffered", "mmap"])
@pytest.mark.parametrize("where", ["resident", "streaming"])
def test_logits_are_bit_identical_to_the_unsplit_file(tiny, shards, io, where):
    with Engine.load(tiny, n_ctx=64) as e:
        want, gen = e.eval(PROMPT, all_logits=True, aligned=True), list(e.generate(PROMPT, 8))
    with GGUFFile(shards[0]) as f:
        full = plan_for_budget(f, None, 64)
    budget = MemoryBudget(None if where == "resident" else full.min_budget)
    with Engine.load(shards[0], n_ctx=64, budget=budget, io=io) as e:
        assert e.plan.verdict == where
        got = e.eval(PROMPT, all_logits=True, aligned=True)
        assert list(e.generate(PROMPT, 8)) == gen
        assert e.weights.file.paths == [str(s) for s in shards]
    assert np.array_equal(got, want)
    assert budget.current == 0


def test_experts_stream_from_their_shards(tmp_path):
    """A mixture whose expert cache reads each expert from the shard that holds it."""
    from tools.make_models import ensure_model

    moe = ensure_model("qwen3moe", "F16")
    parts = split_gguf(moe, tmp_path, "moe", 7)
    toks = list(range(3, 30))
    with Engine.load(moe, n_ctx=128, batch=64) as eng:
        want = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (7, 8, 9)]
    with GGUFFile(parts[0]) as f:
        b = MemoryBudget(plan_for_budget(f, None, 128, batch=64).min_budget + (10 << 20))
    with Engine.load(parts[0], n_ctx=128, budget=b, batch=64) as eng:
        assert eng.weights.expert_cache is not None
        got = [eng.eval(toks, all_logits=True)] + [eng.eval([t]) for t in (7, 8, 9)]
        assert eng.weights.expert_cache.totals.misses > 0
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    assert b.current == 0


def test_a_missing_shard_is_named(shards, tmp_path):
    for s in shards:
        shutil.copy(s, tmp_path / s.name)
    gone = tmp_path / shards[1].name
    gone.unlink()
    with pytest.raises(SplitShardMissing) as e:
        GGUFFile(tmp_path / shards[0].name)
    assert e.value.path == str(gone) and e.value.no == 2 and str(gone) in str(e.value)
    (tmp_path / shards[0].name).unlink()                       # the first one gone, another given
    with pytest.raises(SplitShardMissing, match="shard 1 of"):
        GGUFFile(tmp_path / shards[-1].name)


def test_a_foreign_shard_is_named(tiny, shards, tmp_path):
    # a shard of another split of the same size (another tensor count), in place of shard 2
    other = split_gguf(tiny, tmp_path, "other", 9, drop=("output_norm.weight",))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for s in shards:
        shutil.copy(s, mixed / s.name)
    shutil.copy(other[-1], mixed / shards[-1].name)
    with pytest.raises(SplitMismatch) as e:
        GGUFFile(mixed / shards[0].name)
    assert e.value.path == str(mixed / shards[-1].name) and "split.tensors.count" in str(e.value)
    # a shard numbered as another: shard 2's bytes under shard 3's name
    shutil.copy(shards[-1], mixed / shards[-1].name)
    shutil.copy(shards[1], mixed / shards[-1].name)
    with pytest.raises(SplitMismatch, match="belongs to another model") as e:
        GGUFFile(mixed / shards[0].name)
    assert e.value.path == str(mixed / shards[-1].name)
    # a shard that lost its split keys (an unsplit file under a shard's name)
    shutil.copy(tiny, mixed / shards[-1].name)
    with pytest.raises(SplitMismatch, match="no split keys"):
        GGUFFile(mixed / shards[0].name)


def test_a_renamed_shard_cannot_find_the_others(shards, tmp_path):
    shutil.copy(shards[0], tmp_path / "renamed.gguf")
    with pytest.raises(SplitMismatch, match="cannot be found"):
        GGUFFile(tmp_path / "renamed.gguf")


def test_cli_inspect_and_plan_take_a_split_model(tiny, shards):
    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "ramforge", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    whole, split = cli("inspect", str(tiny), "--json"), cli("inspect", str(shards[-1]), "--json")
    assert split["tensor_count"] == whole["tensor_count"] and split["types"] == whole["types"]
    pw, ps = cli("plan", str(tiny), "--ram", "64M", "--json"), cli("plan", str(shards[0]), "--ram", "64M", "--json")
    assert ps["verdict"] == pw["verdict"] and len(ps["layer_bytes"]) == len(pw["layer_bytes"])
    slack = 2 * 4096 * (len(shards) - 1)        # a layer cut by a shard's end: two aligned read segments
    for k in ("min_budget", "planned_peak"):
        assert 0 <= ps[k] - pw[k] <= slack, k
    assert 0 <= sum(ps["layer_bytes"]) - sum(pw["layer_bytes"]) <= slack


@pytest.mark.oracle
def test_llama_cpp_loads_the_shards_and_agrees(tiny, shards):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(shards[0]), n_ctx=64, n_batch=64, logits_all=True, verbose=False)
    llm.eval(PROMPT)
    theirs = np.array(llm.scores[:len(PROMPT)], dtype=np.float32)
    with Engine.load(shards[0], n_ctx=64) as e:
        ours = e.eval(PROMPT, all_logits=True, aligned=True)
    assert np.array_equal(ours, theirs)


# ----------------------------------------------------------------------------- in the store

@pytest.fixture
def served(shards, tmp_path, monkeypatch):
    """The shards over plain HTTP (a static file server), the store in tmp_path."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(shards[0].parent))
    handler.func.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path / "store"))
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _same_tensors(path, shards):
    with GGUFFile(shards[0]) as want, GGUFFile(path) as got:
        assert len(got.shards) == len(shards) and list(got.tensors) == list(want.tensors)
        assert all(np.array_equal(got.read_tensor(n), want.read_tensor(n)) for n in want.tensors)


def test_pull_of_a_shard_url_brings_the_set(shards, served):
    import hashlib

    from ramforge.store import DigestMismatch, Store
    from ramforge.store.resolve import resolve_model

    store, phases = Store(), set()
    m = store.pull(f"{served}/{shards[1].name}", "tiny-split", insecure=True,
                   progress=lambda ph, d, t: phases.add(ph))              # any shard's URL: its set
    n = len(shards)
    assert phases == {f"download {k}/{n}" for k in range(1, n + 1)}
    assert [m.hex, *(s.sha256 for s in m.shards)] == [hashlib.sha256(s.read_bytes()).hexdigest() for s in shards]
    assert m.total_size == sum(s.stat().st_size for s in shards) and m.source.endswith(shards[1].name)
    path = resolve_model("tiny-split")                                   # shard 1's link, its set beside it
    assert path.name == f"model-00001-of-{n:05d}.gguf" and path.parent == store.root / "splits" / m.hex
    _same_tensors(path, shards)
    assert store.verify("tiny-split") == m
    # a changed shard is noticed on load and by verify
    blob = store.blob_path(m.shards[-1].sha256)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch):
        store.path_of("tiny-split")
    with pytest.raises(DigestMismatch):
        store.verify("tiny-split")
    # rm: every shard's blob and the links go, a second name keeps them until it goes too
    from ramforge.store.modelfile import copy

    copy(store, "tiny-split", "again")
    assert not store.remove("tiny-split")["blob_deleted"] and all(store.blob_path(h).exists() for h in m.blob_hexes)
    assert store.remove("again")["blob_deleted"]
    assert not any(store.blob_path(h).exists() for h in m.blob_hexes) and not (store.root / "splits" / m.hex).exists()


def test_a_foreign_set_is_refused_and_leaves_nothing(tiny, shards, served, tmp_path):
    from ramforge.store import Store, split_urls

    (tmp_path / "other").mkdir()
    other = split_gguf(tiny, tmp_path / "other", "x", 9, drop=("output_norm.weight",))
    n = len(shards)
    for s in shards[:-1]:                              # shard N from another split of the same model
        shutil.copy(s, shards[0].parent / s.name.replace("tiny", "mixed"))
    shutil.copy(other[-1], shards[0].parent / f"mixed-{n:05d}-of-{n:05d}.gguf")
    url = f"{served}/mixed-00001-of-{n:05d}.gguf"
    assert split_urls(url)[-1] == f"{served}/mixed-{n:05d}-of-{n:05d}.gguf"
    store = Store()
    with pytest.raises(SplitMismatch, match="split.tensors.count"):
        store.pull(url, "mixed", insecure=True)
    assert store.find("mixed") is None and not list(store.blobs.glob("sha256-*"))
    with pytest.raises(Exception, match="one file"):
        store.pull(url, "mixed", "0" * 64, insecure=True)


def test_create_from_a_shard_stores_the_set(shards, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ramforge.cli import cli
    from ramforge.store import Store
    from ramforge.store.resolve import resolve_model

    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path / "store"))
    (tmp_path / "Modelfile").write_text(f"FROM {shards[0]}\nPARAMETER temperature 0.5\n")
    r = CliRunner().invoke(cli, ["create", "made", "-f", str(tmp_path / "Modelfile"), "-q"])
    assert r.exit_code == 0, r.output
    m = Store().get("made")
    assert len(m.shards) == len(shards) - 1 and not m.path and m.config["parameters"] == {"temperature": 0.5}
    _same_tensors(resolve_model("made"), shards)
