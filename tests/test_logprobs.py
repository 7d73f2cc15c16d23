"""Log-probabilities against llama.cpp's (tests/fixtures/logprobs/, tools/record_logprobs.py).

The records hold llama-cpp-python's greedy `create_completion(logprobs=5)` on gemma-3-270m and a
synthetic llama (its legacy logprobs dict and streamed chunks), and for each position the 20 best ids
with log p of llama.cpp's logits in float64 (llama-server's `probs`). ramforge's Model must return
the same dict (texts and offsets exactly, values to 1e-5) and its llama-server computation the same
ids and values.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ramforge import Model
from ramforge.errors import InvalidArgument
from ramforge.generation.logprobs import (LCPP, SERVER, Recorder, _whole_chars, check_top, log_softmax,
                                          step_lcpp, step_server)

RECORDS = sorted((Path(__file__).parent / "fixtures" / "logprobs").glob("*.json"))
TOL = 1e-5


def model_path(mid: str) -> Path:
    from tools.record_oracle import model_table

    return Path(model_table()[mid]["path"]())


def close_dict(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(math.isclose(got[k], want[k], abs_tol=TOL) for k in want)


def check_legacy(got: dict, want: dict, n: int) -> list[str]:
    bad = []
    for key in ("tokens", "text_offset"):
        if got[key] != want[key][:n]:
            bad.append(f"{key}: {got[key]} != {want[key][:n]}")
    for i, (a, b) in enumerate(zip(got["token_logprobs"], want["token_logprobs"][:n])):
        if not math.isclose(a, b, abs_tol=TOL):
            bad.append(f"token_logprobs[{i}]: {a} != {b}")
    for i, (a, b) in enumerate(zip(got["top_logprobs"], want["top_logprobs"][:n])):
        if not close_dict(a, b):
            bad.append(f"top_logprobs[{i}]: {a} != {b}")
    return bad


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_model_logprobs_match_llama_cpp_records(path):
    rec = json.loads(path.read_text())
    o = rec["oracle"]
    assert len(rec["prompts"]) >= 4
    bad = []
    with Model(str(model_path(rec["model"]["id"])), n_ctx=o["n_ctx"], n_threads=2) as m:
        for pr in rec["prompts"]:
            want = pr["completion"]
            out = m(pr["text"], max_tokens=o["n_gen"], temperature=0, logprobs=o["legacy_logprobs"])
            got = out["choices"][0]
            n = len(got["logprobs"]["tokens"])
            # llama-cpp-python runs past max_tokens while a UTF-8 character is incomplete: compare ours
            assert n == min(o["n_gen"], len(pr["tokens"])), pr["name"]
            bad += [f"{pr['name']}: {b}" for b in check_legacy(got["logprobs"], want["logprobs"], n)]
            # streamed: the chunks' entries, concatenated, are the same
            streamed = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
            text = ""
            for c in m(pr["text"], max_tokens=o["n_gen"], temperature=0, logprobs=o["legacy_logprobs"], stream=True):
                ch = c["choices"][0]
                text += ch["text"]
                for k, v in (ch["logprobs"] or {}).items():
                    streamed[k] += v
            assert text == got["text"]
            bad += [f"{pr['name']} (stream): {b}" for b in check_legacy(streamed, want["logprobs"], n)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_server_probabilities_match_llama_cpp_logits(path):
    """llama-server's order (partial sort) on ramforge's logits, as llama-server gets them (the prompt's
    last row alone), against the exact softmax of llama.cpp's rows."""
    from ramforge.engine.engine import Engine

    rec = json.loads(path.read_text())
    bad, n_checked = [], 0
    with Engine.load(model_path(rec["model"]["id"]), n_ctx=rec["oracle"]["n_ctx"]) as eng:
        for pr in rec["prompts"]:
            rows = []
            rec_sampler = Recorder(None, rec["oracle"]["top"], SERVER)
            toks = list(eng.generate(pr["prompt_tokens"], len(pr["tokens"]), rec_sampler, reuse_prefix=False))
            assert toks == pr["tokens"][:len(toks)] and toks, pr["name"]
            rows = rec_sampler.steps
            for i, (s, want) in enumerate(zip(rows, pr["server_top"])):
                n_checked += 1
                got_ids, want_ids = [t for t, _ in s.top], [t for t, _ in want]
                if got_ids != want_ids:
                    bad.append(f"{pr['name']}[{i}] ids {got_ids} != {want_ids}")
                for (_, a), (_, b) in zip(s.top, want):
                    if not math.isclose(a, b, abs_tol=TOL):
                        bad.append(f"{pr['name']}[{i}] {a} != {b}")
                if not math.isclose(s.logprob, want[0][1], abs_tol=TOL):   # greedy: the pick is the best
                    bad.append(f"{pr['name']}[{i}] pick {s.logprob} != {want[0][1]}")
    assert n_checked >= 30 and not bad, "\n".join(bad[:20])


def test_both_computations_agree_and_rank_ties_as_their_references():
    rng = np.random.default_rng(0)
    x = rng.normal(size=5000).astype(np.float32) * 4
    x[[10, 20, 30]] = x.max() + 1                     # a three-way tie at the top
    a, b = step_lcpp(x, 10, 5), step_server(x, 10, 5)
    ref = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64) - x.max()).sum()) - x.max()
    assert abs(a.logprob - ref[10]) < 1e-6 and b.logprob == a.logprob
    assert [t for t, _ in a.top[:3]] == [30, 20, 10]  # llama-cpp-python: sorted((lp, id), reverse=True)
    assert sorted(t for t, _ in b.top[:3]) == [10, 20, 30]
    assert all(abs(u - v) < 1e-6 for (_, u), (_, v) in zip(a.top, b.top))
    assert np.allclose(log_softmax(x), ref, atol=1e-5)


def test_token_text_cuts_an_incomplete_utf8_character():
    assert _whole_chars("a😀".encode()[:3]) == "a"
    assert _whole_chars("é".encode()) == "é"
    assert _whole_chars(b"\xf0\x9f") == ""


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True, "3"])
def test_more_than_20_or_a_non_integer_is_refused(bad):
    with pytest.raises(InvalidArgument):
        check_top(bad)
    with pytest.raises(InvalidArgument):
        Recorder(None, bad, LCPP)
