"""Speculative decoding against llama-cpp-python's own (tools/record_speculative.py records), the
drafters' rules, and the refusals.

Replaying a record, ramforge's loop must submit llama-cpp-python's very batches (so the arithmetic
is the same) and give its tokens; its speculative output must equal its plain greedy output wherever
llama.cpp's does. Quantized synthetic models need llama_cpp to be built, so they are marked `oracle`.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ramforge.engine.engine import Engine
from ramforge.errors import InvalidArgument, OutOfBudget
from ramforge.memory import MemoryBudget
from ramforge.sampling import LCPP, Sampler, SamplerParams
from ramforge.engine.speculative import DraftModel, PromptLookup, check_same_vocab
from tools.oracle_report import model_path
from tools.record_speculative import SPEC_DIR

FLOAT_TYPES = {"F32", "F16", "BF16"}
RECORDS = [json.loads(p.read_text()) for p in sorted(SPEC_DIR.glob("*.json"))]


# CI replays two of the default model's prompts and four float models (dense llama, gemma2's caps,
# gpt-oss's sinks and experts, qwen3moe); the rest (minutes of 150k-vocabulary output matmuls) is
# marked slow, the quantized synthetic ones oracle (their files need llama.cpp's quantizer)
CI_FLOAT = {"llama-tiny-f16", "gemma2-tiny-f16", "gpt-oss-tiny-f16", "qwen3moe-tiny-f16"}
CI_GEMMA = {"copy"}


def _params():
    for rec in RECORDS:
        m = rec["model"]
        for i, p in enumerate(rec["prompts"]):
            if m["source"] == "synthetic" and m["type"] not in FLOAT_TYPES:
                marks = [pytest.mark.oracle]
            elif m["id"] in CI_FLOAT or (m["source"] != "synthetic" and p["name"] in CI_GEMMA):
                marks = []
            else:
                marks = [pytest.mark.slow]
            yield pytest.param(rec, i, id=f"{m['id']}/{p['name']}", marks=marks)


def _logged(eng):
    """Wrap eng.eval to log [n_past, n_tokens] per call, as the recorder logs Llama.eval."""
    batches, inner = [], eng.eval

    def ev(tokens, *a, **kw):
        batches.append([eng.n_past, len(tokens)])
        return inner(tokens, *a, **kw)
    eng.eval = ev
    return batches


@pytest.mark.parametrize("rec,i", list(_params()))
def test_replays_llama_cpp_prompt_lookup(rec, i):
    o, p = rec["oracle"], rec["prompts"][i]
    with Engine.load(model_path(rec), n_ctx=o["n_ctx"]) as eng:
        eng.ubatch = o["n_ubatch"]
        plain = list(eng.generate(p["tokens"], rec["n_gen"]))
        assert plain == p["plain"], f"{p['name']}: plain greedy tokens differ from llama.cpp's"
        for r in p["runs"]:
            where = f"ngram {r['max_ngram_size']}, k {r['num_pred_tokens']}"
            eng.reset()
            batches = _logged(eng)
            sampler = None
            if "sampling" in r:           # llama-cpp-python's chain and seed (ramforge.Model's)
                where += ", seeded"
                sampler = Sampler(SamplerParams(**r["sampling"]), eng.hp.n_vocab, chain=LCPP)
            try:
                got = list(eng.generate(p["tokens"], rec["n_gen"], sampler,
                                        draft=PromptLookup(r["max_ngram_size"], r["num_pred_tokens"])))
            finally:
                del eng.eval
            assert batches == r["batches"], f"{where}: batches differ from llama-cpp-python's"
            assert got == r["tokens"], f"{where}: tokens differ from llama-cpp-python's"
            if "sampling" not in r and r["tokens"] == p["plain"]:
                assert got == plain, f"{where}: speculative output differs from the plain one"
            s = eng.timings.spec
            assert s.passes == len(batches) - 1 and s.accepted <= s.drafted
            assert s.tokens == len(got)


def test_records_cover_the_oracle_models():
    from tools.oracle_report import records
    from tools.record_speculative import REPRODUCED_BUILD

    want = {r["model"]["id"] for r in records() if REPRODUCED_BUILD in r["oracle"].get("system_info", "")}
    assert want == {r["model"]["id"] for r in RECORDS}
    assert any(run["batches"][1][1] > 1 for r in RECORDS for p in r["prompts"] for run in p["runs"])


# ---- prompt lookup: llama-cpp-python's rules --------------------------------------------------

def ref_lookup(ids, g, k):
    """LlamaPromptLookupDecoding.find_candidate_pred_tokens as plain loops."""
    n = len(ids)
    for size in range(min(g, n - 1), 0, -1):
        tail = ids[n - size:]
        for i in range(n - size + 1):
            if ids[i:i + size] == tail and i + size < min(i + size + k, n):
                return ids[i + size:i + size + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.integers(1, 4), st.integers(1, 12))
def test_lookup_follows_llama_cpp_python(ids, g, k):
    got = PromptLookup(g, k)(np.array(ids)).tolist()
    assert got == ref_lookup(ids, g, k)
    try:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        return
    assert got == LlamaPromptLookupDecoding(g, k)(np.array(ids, np.intc)).tolist()


def test_adaptive_backs_off_and_recovers():
    d = PromptLookup(2, 8, adaptive=True)
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], np.int32)
    assert d(ids).size == 8
    d.feedback(8, 0)
    assert d(ids).size == 4                       # halved
    d.feedback(4, 0)                              # two rejections in a row: pause 2 calls
    assert d(ids).size == 0 and d(ids).size == 0
    assert d(ids).size == 2
    d.feedback(2, 2)                              # fully accepted: doubled, pause forgotten
    assert d(ids).size == 4
    d.feedback(4, 1)
    assert d(ids).size == 2
    for _ in range(20):                           # rejections forever: pauses grow to MAX_PAUSE
        d.feedback(1, 0)
    assert d._pause == PromptLookup.MAX_PAUSE


@pytest.mark.parametrize("kw", [dict(max_ngram_size=0), dict(num_pred_tokens=0), dict(num_pred_tokens=1.5)])
def test_lookup_bad_values(kw):
    with pytest.raises(InvalidArgument):
        PromptLookup(**kw)


# ---- on the default model: grounded text speeds up, answers stay ------------------------------

def test_greedy_equals_plain_and_passes_are_fewer(default_model):
    with Engine.load(default_model, n_ctx=256) as eng:
        ids = eng.tokenizer.encode("Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, "
                                   "grape.\nRepeat the list exactly:\napple, banana,")
        plain = list(eng.generate(ids, 24))
        for d in (PromptLookup(2, 10), PromptLookup(2, 10, adaptive=True)):
            got = list(eng.generate(ids, 24, draft=d))
            assert got == plain
            s = eng.timings.spec
            assert s.tokens == 24 and s.passes < 12 and s.accepted > 12
            assert eng.timings.as_dict()["speculative"]["tokens_per_pass"] > 2
            assert eng.n_past == len(eng.tokens) <= len(ids) + 24 + 10


def test_sampled_tokens_are_the_targets_own_draws(default_model):
    """Every token is the sampler's draw on the target's logits for its position, one draw per token
    as without drafts: replaying the logits it saw through a fresh sampler with the same seed gives
    the same tokens. (Equal tokens to a plain run are not expected: the verification batch rounds
    differently from one token per pass, by up to 5 logits on gemma in llama.cpp's own record.)"""
    from ramforge.sampling import Sampler, SamplerParams

    class Seen(Sampler):
        def sample(self, logits, history=()):
            self.rows.append(logits.copy())
            return super().sample(logits, history)

    with Engine.load(default_model, n_ctx=256) as eng:
        ids = eng.tokenizer.encode("Count: one, two, three, four, five, six, seven, eight, nine, ten. "
                                   "Again: one, two, three,")
        params = SamplerParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=7)
        seen = Seen(params, eng.hp.n_vocab)
        seen.rows = []
        got = list(eng.generate(ids, 20, seen, draft=PromptLookup(2, 6)))
        assert eng.timings.spec.accepted > 0
        assert len(seen.rows) == len(got)
        again = Sampler(params, eng.hp.n_vocab)
        history = list(ids)
        for row, tok in zip(seen.rows, got):
            assert again.sample(row, history) == tok
            history.append(tok)


def test_draft_model_drafts_and_is_charged(default_model):
    budget = MemoryBudget("2G")
    draft = DraftModel(default_model, n_max=6).attach(Engine.load, budget, 256)
    try:
        with Engine.load(default_model, n_ctx=256, budget=budget) as eng:
            draft.check_vocab(eng.tokenizer)
            used = budget.current
            assert used >= draft.engine.plan.planned_peak
            ids = eng.tokenizer.encode("The capital of France is")
            plain = list(eng.generate(ids, 16))
            got = list(eng.generate(ids, 16, draft=draft))
            # the draft is the target itself, so its drafts are the target's one-token greedy choices:
            # every one is accepted until the batch's rounding first disagrees with one token per pass
            s = eng.timings.spec
            assert s.accepted > 0 and s.drafted <= 6 * s.passes
            assert got[:s.accepted // s.passes] == plain[:s.accepted // s.passes]
    finally:
        draft.close()
    assert budget.current == 0


def test_draft_model_too_large_for_the_budget(default_model):
    budget = MemoryBudget("64M")
    with pytest.raises(OutOfBudget, match="draft model"):
        DraftModel(default_model).attach(Engine.load, budget, 256)
    assert budget.current == 0


def test_draft_vocabulary_must_match(default_model):
    class Tok:
        def __init__(self, texts):
            self.texts = texts
            self.n_vocab = len(texts)

        def token_text(self, i):
            return self.texts[i]
    check_same_vocab(Tok(["a", "b", "c"]), Tok(["a", "b", "c"]))
    with pytest.raises(InvalidArgument, match="at token 1: 'x' vs 'b'"):
        check_same_vocab(Tok(["a", "b", "c"]), Tok(["a", "x", "c"]))
    with pytest.raises(InvalidArgument, match="has 2 tokens, the target 3"):
        check_same_vocab(Tok(["a", "b", "c"]), Tok(["a", "b"]))


@pytest.mark.parametrize("kw,needle", [(dict(n_max=0), "n_max"), (dict(n_min=-1), "n_min"),
                                       (dict(n_max=2, n_min=3), "above"), (dict(p_min=1.5), "p_min")])
def test_draft_model_bad_values(kw, needle):
    with pytest.raises(InvalidArgument, match=needle):
        DraftModel("unused.gguf", **kw)


# ---- surfaces: Model(draft_model=), the CLI, the servers --------------------------------------

COPY = ("Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape.\n"
        "Repeat the list exactly:\napple, banana,")


def test_model_draft_model_like_llama_cpp_python(default_model):
    import ramforge

    with ramforge.Model(default_model, n_ctx=256, draft_model=ramforge.PromptLookup(num_pred_tokens=10)) as m:
        r = m.generate(COPY, max_tokens=16, temperature=0)
        assert r.speculative["accepted"] > 8 and r.speculative["tokens_per_pass"] > 2
        assert r.completion_tokens == 16
    with pytest.raises(InvalidArgument, match="draft_model"):
        ramforge.Model(default_model, n_ctx=256, draft_model="lookup")


def test_cli_run_lookup_reports_acceptance(default_model, capsys):
    from ramforge.cli import main

    main(["run", str(default_model), "-p", COPY, "-n", "12", "--temp", "0", "--ctx", "256", "--lookup", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    spec = out["timings"]["speculative"]
    assert spec["accepted"] > 0 and spec["drafted"] >= spec["accepted"] and out["n_completion"] == 12
    for args, needle in ((["--lookup", "4", "--draft", "x.gguf"], "choose one"), (["--draft-max", "0"], "--draft-max"),
                         (["--lookup", "300", "--ctx", "256"], "cannot fit a context of 256")):
        with pytest.raises(SystemExit) as e:
            main(["run", str(default_model), "-p", "hi", *args])
        assert e.value.code != 0 and needle in capsys.readouterr().err


def test_server_with_lookup_reports_draft_counts(default_model):
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from ramforge.server import ServerConfig, create_app
    from tests.serving import serving

    cfg = ServerConfig(model=str(default_model), n_ctx=256, speculative=dict(lookup=10))
    app = create_app(cfg)
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as http:
            r = http.post("/v1/completions", json={"prompt": COPY, "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["timings"]["draft_n_accepted"] > 0
            assert body["usage"]["completion_tokens"] == 12
