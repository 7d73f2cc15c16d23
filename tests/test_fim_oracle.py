"""Fill-in-the-middle against llama.cpp's infill (tests/fixtures/fim/, tools/record_fim.py).

The records hold, on two synthetic models with FIM tokens (qwen2 with Qwen2.5-Coder's tokens and
`fim_*_token_id` keys; llama SPM with CodeLlama's ▁<PRE> ▁<SUF> ▁<MID>, found by their text), the
prompt llama-server's format_prompt_infill builds (over llama.cpp's tokenizer and FIM ids) and llama.cpp's
greedy tokens and text after it. ramforge's prompt builder, `Llama(suffix=)`, `/api/generate` and
`/v1/completions` with `suffix`, and `/infill` must give the same tokens and text. The default suite
compares with the records (no llama.cpp needed); `-m oracle` re-records live and compares the records.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ramforge.generation.fim import fim_ids, fim_prompt, infill_ids

RECORDS = sorted((Path(__file__).parent / "fixtures" / "fim").glob("*.json"))
IDS = [p.stem for p in RECORDS]


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _model(rec: dict) -> Path:
    from tools.record_fim import ensure_fim_model

    return ensure_fim_model(rec["model"]["id"].rsplit("-", 1)[0])


@pytest.fixture(scope="module", params=RECORDS, ids=IDS)
def llm(request):
    from ramforge import Llama

    rec = _load(request.param)
    with Llama(str(_model(rec)), n_ctx=4096, n_batch=512, verbose=False) as m:
        yield SimpleNamespace(llm=m, rec=rec, path=_model(rec))


def test_records_cover_both_layouts():
    assert IDS == ["llama-fim-f16", "qwen2-fim-f16"]
    for p in RECORDS:
        rec = _load(p)
        kinds = {c["kind"] for c in rec["cases"]}
        assert kinds == {"library", "infill"} and any(c["spm"] for c in rec["cases"])
        # llama-cpp-python 0.3.36's own create_completion(suffix=) is no reference: token 0 for each FIM token
        lc = [c for c in rec["cases"] if "lcpp_suffix_prompt" in c]
        assert lc and all(c["lcpp_suffix_prompt"].count(0) == 3 for c in lc)


def test_fim_tokens_and_prompts_match_llama_server(llm):
    tok, rec, bad = llm.llm.tokenizer_, llm.rec, []
    want_ids = {k: (None if v < 0 else v) for k, v in rec["oracle"]["fim_tokens"].items()}
    assert fim_ids(tok) == {k: want_ids[k] for k in ("pre", "suf", "mid", "rep", "sep")}
    assert want_ids["pad"] is None or want_ids["pad"] in tok.eog_ids       # llama.cpp: fim pad/rep/sep end generation
    for c in rec["cases"]:
        if c["kind"] == "library":
            got = fim_prompt(tok, c["prefix"], c["suffix"])
        else:
            prompt = tok.encode(c["prompt"], add_special=False, parse_special=True) if c["prompt"] else []
            got = infill_ids(tok, c["prefix"], c["suffix"], c["input_extra"], prompt, n_ctx=c["n_ctx"], spm=c["spm"])
        if got != c["prompt_tokens"]:
            bad.append(f"{c['name']}: {got[:40]} != {c['prompt_tokens'][:40]}")
    assert not bad, "\n".join(bad)


def test_llama_suffix_matches_llama_cpp_infill(llm):
    m, bad = llm.llm, []
    n_gen = llm.rec["oracle"]["n_gen"]
    for c in llm.rec["cases"]:
        if c["kind"] != "library":
            continue
        out = m(c["prefix"], suffix=c["suffix"], max_tokens=n_gen, temperature=0)
        n_prompt = out["usage"]["prompt_tokens"]
        tokens = [int(t) for t in m.input_ids[n_prompt:m.n_tokens]]
        want_tokens = c["tokens"][:out["usage"]["completion_tokens"]]
        # the last pick is never evaluated, as in llama-cpp-python
        if n_prompt != len(c["prompt_tokens"]) or tokens != want_tokens[:len(tokens)] \
                or out["usage"]["completion_tokens"] != len(c["tokens"]) or out["choices"][0]["text"] != c["text"]:
            bad.append(f"{c['name']}: {n_prompt} prompt tokens, {tokens} {out['choices'][0]['text']!r} != "
                       f"{len(c['prompt_tokens'])}, {c['tokens']} {c['text']!r}")
    assert not bad, "\n".join(bad)


@pytest.fixture(scope="module", params=RECORDS, ids=IDS)
def srv(request):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ramforge.server import ServerConfig, create_app

    rec = _load(request.param)
    app = create_app(ServerConfig(model=str(_model(rec)), n_ctx=4096, alias="coder", preload=True))
    with TestClient(app) as client:
        yield SimpleNamespace(http=client, rec=rec)


def test_server_suffix_and_infill_match_llama_cpp(srv):
    rec, http, bad = srv.rec, srv.http, []
    n_gen = rec["oracle"]["n_gen"]
    for c in rec["cases"]:
        if c["kind"] == "library":
            r = http.post("/api/generate", json={"model": "coder", "prompt": c["prefix"], "suffix": c["suffix"],
                                                 "stream": False, "options": {"temperature": 0, "num_predict": n_gen}})
            assert r.status_code == 200, r.text
            d = r.json()
            if d["context"] != c["prompt_tokens"] + c["tokens"] or d["response"] != c["text"]:
                bad.append(f"/api/generate {c['name']}: {d['context'][-n_gen:]} {d['response']!r} != "
                           f"{c['tokens']} {c['text']!r}")
            r = http.post("/v1/completions", json={"model": "coder", "prompt": c["prefix"], "suffix": c["suffix"],
                                                   "max_tokens": n_gen, "temperature": 0})
            assert r.status_code == 200, r.text
            d = r.json()
            if d["choices"][0]["text"] != c["text"] or d["usage"]["prompt_tokens"] != len(c["prompt_tokens"]):
                bad.append(f"/v1/completions {c['name']}: {d['choices'][0]['text']!r} != {c['text']!r}")
        elif c["n_ctx"] == 4096 and not c["spm"]:            # the server's context; --spm-infill: below
            r = http.post("/infill", json={"input_prefix": c["prefix"], "input_suffix": c["suffix"],
                                           "input_extra": c["input_extra"], "prompt": c["prompt"],
                                           "n_predict": n_gen, "temperature": 0, "return_tokens": True})
            assert r.status_code == 200, r.text
            d = r.json()
            if d["tokens"] != c["tokens"] or d["content"] != c["text"] or \
                    d["tokens_evaluated"] != len(c["prompt_tokens"]):
                bad.append(f"/infill {c['name']}: {d['tokens']} {d['content']!r} != {c['tokens']} {c['text']!r}")
    assert not bad, "\n".join(bad)


def _spm_library_prompt(rec: dict) -> tuple[dict, list[int]]:
    """The `code` case and its prompt in SPM order with no extra context: the tail of llama-server's
    --spm-infill record (the same prefix and suffix, an empty prompt), after its repo-level extra."""
    code = next(c for c in rec["cases"] if c["name"] == "code")
    spm = next(c for c in rec["cases"] if c["spm"])
    assert (spm["prefix"], spm["suffix"], spm["prompt"]) == (code["prefix"], code["suffix"], "")
    want = spm["prompt_tokens"][-len(code["prompt_tokens"]):]
    assert want != code["prompt_tokens"] and sorted(want) == sorted(code["prompt_tokens"])   # reordered only
    return code, want


@pytest.fixture(scope="module", params=RECORDS, ids=IDS)
def srv_spm(request):
    """`ramforge serve --spm-infill` on each record's model."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from ramforge.server import ServerConfig, create_app

    rec = _load(request.param)
    app = create_app(ServerConfig(model=str(_model(rec)), n_ctx=4096, alias="coder", preload=True, spm_infill=True))
    with TestClient(app) as client:
        yield SimpleNamespace(http=client, rec=rec)


def test_serve_spm_infill_matches_llama_server(srv_spm):
    """--spm-infill: /infill answers llama-server --spm-infill's record token for token; a `suffix` on
    /api/generate and /v1/completions takes the same suffix-first prompt (without the extra context)."""
    rec, http = srv_spm.rec, srv_spm.http
    n_gen = rec["oracle"]["n_gen"]
    c = next(c for c in rec["cases"] if c["spm"])
    r = http.post("/infill", json={"input_prefix": c["prefix"], "input_suffix": c["suffix"],
                                   "input_extra": c["input_extra"], "prompt": c["prompt"],
                                   "n_predict": n_gen, "temperature": 0, "return_tokens": True})
    assert r.status_code == 200, r.text
    d = r.json()
    assert (d["tokens"], d["tokens_evaluated"]) == (c["tokens"], len(c["prompt_tokens"]))
    # the record's text is llama-cpp-python's (the bytes of a broken character dropped: errors="ignore"); the
    # served content replaces them with U+FFFD, as llama-server's JSON (error_handler_t::replace) does
    assert d["content"].replace("\ufffd", "") == c["text"]

    code, want = _spm_library_prompt(rec)
    r = http.post("/api/generate", json={"model": "coder", "prompt": code["prefix"], "suffix": code["suffix"],
                                         "stream": False, "options": {"temperature": 0, "num_predict": n_gen}})
    assert r.status_code == 200, r.text
    g = r.json()
    assert g["context"][:len(want)] == want and g["prompt_eval_count"] == len(want)
    r = http.post("/v1/completions", json={"model": "coder", "prompt": code["prefix"], "suffix": code["suffix"],
                                           "max_tokens": n_gen, "temperature": 0})
    assert r.status_code == 200, r.text
    o = r.json()
    assert o["usage"]["prompt_tokens"] == len(want) and o["choices"][0]["text"] == g["response"]


def test_llama_spm_infill_puts_the_suffix_first(llm):
    """Llama(spm_infill=True): llama-cpp-python's suffix-first order (BOS SUF suffix PRE prefix MID) with the
    model's FIM ids (llama-cpp-python 0.3.36 writes 0 for each: test_records_cover_both_layouts), i.e.
    llama-server's --spm-infill prompt."""
    from ramforge import Llama

    code, want = _spm_library_prompt(llm.rec)
    n_gen = llm.rec["oracle"]["n_gen"]
    with Llama(str(llm.path), n_ctx=4096, n_batch=512, verbose=False, spm_infill=True) as m:
        assert m.spm_infill is True
        out = m(code["prefix"], suffix=code["suffix"], max_tokens=n_gen, temperature=0)
        assert out["usage"]["prompt_tokens"] == len(want)
        assert [int(t) for t in m.input_ids[:len(want)]] == want
    # the default order is unchanged: the record's PSM prompt
    out = llm.llm(code["prefix"], suffix=code["suffix"], max_tokens=1, temperature=0)
    assert [int(t) for t in llm.llm.input_ids[:out["usage"]["prompt_tokens"]]] == code["prompt_tokens"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", RECORDS, ids=IDS)
def test_records_are_llama_cpp_now(path):
    """llama.cpp (llama-cpp-python) built and answers these prompts as recorded."""
    pytest.importorskip("llama_cpp")
    from tools.record_fim import record_model

    rec = _load(path)
    assert record_model(rec["model"]["id"].rsplit("-", 1)[0]) == rec


@pytest.mark.oracle
@pytest.mark.parametrize("path", RECORDS, ids=IDS)
def test_llama_cpp_python_spm_infill_order_is_ours(path):
    """llama-cpp-python 0.3.36's Llama(spm_infill=True): its prompt is BOS, FIM-suffix, suffix, FIM-prefix,
    prefix, FIM-middle with id 0 for each FIM token; ramforge's Llama(spm_infill=True) has the same layout
    and the same prefix tokens, with the model's FIM ids in place of the zeros; its suffix is llama-server's
    tokens (llama-cpp-python's "☺" space hack drops the suffix's first token), hence no token-for-token
    parity with llama-cpp-python: ramforge's reference is llama-server's --spm-infill prompt."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tools.record_fim import lcpp_suffix_prompt

    rec = _load(path)
    code, ours = _spm_library_prompt(rec)
    fim = {k: v for k, v in rec["oracle"]["fim_tokens"].items()}
    lcpp = llama_cpp.Llama(str(_model(rec)), n_ctx=4096, n_batch=512, verbose=False, spm_infill=True)
    try:
        theirs = lcpp_suffix_prompt(lcpp, code["prefix"], code["suffix"])
    finally:
        lcpp.close()

    def segments(ids, marks):           # the runs between the FIM tokens, and what came before the first
        cut = [i for i, t in enumerate(ids) if t in marks]
        assert len(cut) == 3, (ids, marks)
        return ids[:cut[0]], ids[cut[0] + 1:cut[1]], ids[cut[1] + 1:cut[2]], ids[cut[2] + 1:]

    lead, suf, pre, tail = segments(theirs, {0})
    o_lead, o_suf, o_pre, o_tail = segments(ours, {fim["suf"], fim["pre"], fim["mid"]})
    assert [ours[len(o_lead)], ours[len(o_lead) + 1 + len(o_suf)]] == [fim["suf"], fim["pre"]]   # suffix first
    assert pre == o_pre and tail == o_tail == [] and lead == o_lead
    # its "☺" hack (tokenize "☺" + suffix, drop 2 tokens) loses the suffix's first token: "▁" on llama's SPM
    # vocabulary, the leading "\n\n" itself on qwen2's (text of the suffix gone); ours keeps llama-server's
    assert len(suf) < len(o_suf) and o_suf[len(o_suf) - len(suf):] == suf
