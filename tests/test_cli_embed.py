"""`ramforge embed` (cli/embed.py) on the synthetic bert fixture: its outputs equal the Embedder's
(generation/embed.py, itself checked against llama-cpp-python in test_embeddings.py); on a streamed causal
model, --profile's passes."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ramforge.cli import cli
from ramforge.cli.embed import read_documents

RECORDS = Path(__file__).parent / "fixtures" / "embeddings"
DOCS = ["Hello world", "", "The quick brown fox jumps over the lazy dog.", "Äpfel und Birnen, 42 Stück!"]


@pytest.fixture(scope="module")
def model():
    from tools.record_embeddings import model_file
    return str(model_file("bert-tiny-f16"))


@pytest.fixture(scope="module")
def reference(model):
    """The Embedder's vectors of DOCS' non-blank lines: mean (the file's) and cls, Euclidean-normalized."""
    from ramforge.engine.engine import Engine
    from ramforge.generation.embed import Embedder, Pooling
    with Engine.load(model, n_ctx=512, n_threads=1) as eng:
        out = {}
        for p in (Pooling.MEAN, Pooling.CLS):
            emb = Embedder(eng, p)
            out[p.name.lower()] = emb.embed_many([emb.tokens(d) for d in DOCS if d], 2)
        return out


def _run(args, stdin=None):
    r = CliRunner().invoke(cli, ["embed", *args, "-t", "1"], input=stdin, catch_exceptions=False)
    return r


def test_read_documents_skips_blank_lines():
    assert read_documents(["a\n", "\n", "  \n", "b\r\n"]) == ([1, 4], ["a", "b"])


def test_json_lines_from_stdin(model, reference):
    r = _run([model, "--profile"], "\n".join(DOCS) + "\n")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["line"] for x in rows] == [1, 3, 4]
    for x, ref in zip(rows, reference["mean"]):
        assert np.array_equal(np.asarray(x["embedding"], np.float32), ref)
    assert "3 documents" in r.stderr and "1 weight passes" in r.stderr and "3.00 documents per pass" in r.stderr
    assert "512 tokens a pass" in r.stderr                   # an encoder: a whole ubatch a pass


def test_json_array_and_pooling_override(model, reference, tmp_path):
    f = tmp_path / "docs.txt"
    f.write_text("\n".join(DOCS), encoding="utf-8")
    r = _run([model, str(f), "--json", "--pooling", "cls"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert len(got) == 3 and all(np.array_equal(np.asarray(g, np.float32), ref)
                                 for g, ref in zip(got, reference["cls"]))
    r = _run([model, str(f), "--json", "--normalize", "-1"])           # not normalized: not unit length
    assert abs(np.linalg.norm(json.loads(r.stdout)[0]) - 1.0) > 1e-3


def test_npy_matrix(model, reference, tmp_path):
    out = tmp_path / "e.npy"
    r = _run([model, "-", "--npy", str(out)], "\n".join(DOCS))
    assert r.exit_code == 0, r.output
    m = np.load(out)
    assert m.dtype == np.float32 and m.shape == (3, 128)
    assert np.array_equal(m, np.stack(reference["mean"]))


def test_pooling_none_gives_token_vectors_and_refuses_npy(model, tmp_path):
    r = _run([model, "--pooling", "none"], "Hello world\n")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert np.asarray(row["embedding"]).shape == (4, 128)                 # [CLS] hello world [SEP]
    r = CliRunner().invoke(cli, ["embed", model, "--pooling", "none", "--npy", str(tmp_path / "x.npy"), "-t", "1"],
                           input="Hello\n")
    assert r.exit_code == 2 and "pooling is none" in r.output


@pytest.mark.parametrize("args,stdin,words", [
    (["--json", "--npy", "x.npy"], "a\n", "exclusive"),
    ([], "\n \n", "no documents"),
    (["--pooling", "max"], "a\n", "max"),
])
def test_usage_errors(model, args, stdin, words):
    r = CliRunner().invoke(cli, ["embed", model, *args], input=stdin)
    assert r.exit_code == 2 and words in r.output


def test_too_long_without_truncate(model):
    from ramforge.errors import ContextLengthExceeded
    with pytest.raises(ContextLengthExceeded, match="truncate"):
        _run([model, "--no-truncate"], "word " * 600 + "\n")


def test_profile_counts_a_causal_models_passes():
    """A causal model streamed under --ram: --profile's documents per weight pass and tokens a pass are the
    embedding plan's (`plan --embed`'s batch), the 4 documents' vectors llama.cpp's packed ones."""
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.embed_plan import embed_plan
    from tools.record_embeddings import model_file
    path = str(model_file("llama-tiny-f16"))
    run = next(r for r in json.loads((RECORDS / "llama-tiny-f16.json").read_text())["runs"] if r["pooling_type"] == 1)
    with GGUFFile(path) as f:
        p = embed_plan(f, 6 * 2 ** 20, 512)[0]
    assert p.verdict == "streaming" and 1 < p.batch < 512
    r = _run([path, "--ram", "6M", "--pooling", "mean", "--normalize", "-1", "--profile"],
             "\n".join(it["text"] for it in run["items"]) + "\n")
    assert r.exit_code == 0, r.output
    n = sum(len(it["tokens"]) for it in run["items"])
    passes = -(-n // p.batch)
    assert f"4 documents, {n} tokens, {passes} weight passes ({4 / passes:.2f} documents per pass, " \
           f"{p.batch} tokens a pass)" in r.stderr
    for line, ref in zip(r.stdout.splitlines(), run["batch"]):
        assert np.array_equal(np.asarray(json.loads(line)["embedding"], np.float32), np.asarray(ref, np.float32))
