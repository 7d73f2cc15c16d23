"""ramforge's sampler against llama.cpp's, token for token on real models.

tests/fixtures/sampling/*.json (tools/record_sampling.py) hold the tokens llama.cpp's own sampler
chains picked on gemma-3-270m and a synthetic llama, for each prompt and configuration (greedy and
seeded: every stage, both surfaces' chain orders, mirostat, DRY with its tokenized sequence breakers,
XTC's and dist's std::mt19937 draws). ramforge's logits are llama.cpp's to the bit, so its engine feeds
the same logits to ramforge's Sampler and every generated token must be the recorded one. Marked
oracle, live tests re-derive configurations from llama_cpp directly: on random logits (every stage,
ties, both chain orders) and on a real context.
"""
from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ramforge.engine.engine import Engine
from ramforge.sampling.params import sampler_params
from ramforge.sampling import LCPP, LLAMA, Sampler, SamplerParams

F32 = np.float32

RECORDS = sorted((Path(__file__).parent / "fixtures" / "sampling").glob("*.json"))


def params_of(cfg: dict):
    kw = dict(cfg)
    if kw.get("logit_bias") == "bias":                 # tools/record_sampling.py's placeholder
        kw.pop("logit_bias")
    if "logit_bias" in kw:
        kw["logit_bias"] = [[t, -math.inf if b == "-inf" else b] for t, b in kw["logit_bias"]]
    return sampler_params(kw)


def model_path(mid: str) -> Path:
    from tools.record_oracle import model_table

    return Path(model_table()[mid]["path"]())


def replay(eng: Engine, prompt: list[int], surface: str, params, n: int) -> list[int]:
    sampler = Sampler(params, eng.hp.n_vocab, chain=surface, tokenizer=eng.tokenizer)
    gen = eng.generate(prompt, n, sampler, reuse_prefix=True)
    out = list(gen)
    if len(out) < n and len(sampler.tokens) > len(out):
        out.append(sampler.tokens[len(out)])          # the end-of-generation token the engine drew
    return out


# CI replays the synthetic record (every configuration, 4 prompts); the gemma record's 108 runs
# decode ~1300 tokens of a 262k vocabulary and are marked slow
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if "gemma" in p.stem else [])
                                  for p in RECORDS])
def test_sampled_tokens_match_llama_cpp_records(path):
    rec = json.loads(path.read_text())
    configs = {c["name"]: c for c in rec["configs"]}
    n_gen = rec["oracle"]["n_gen"]
    bad = []
    with Engine.load(model_path(rec["model"]["id"]), n_ctx=rec["oracle"]["n_ctx"]) as eng:
        for pr in rec["prompts"]:
            for run in pr["runs"]:
                c = configs[run["config"]]
                got = replay(eng, pr["prompt_tokens"], c["surface"], params_of(c["params"]), n_gen)
                if got != run["tokens"]:
                    bad.append(f"{pr['name']} / {run['config']}: {got} != llama.cpp's {run['tokens']}")
    n = sum(len(p["runs"]) for p in rec["prompts"])
    assert n >= 100 and len(configs) >= 25
    assert not bad, f"{len(bad)} of {n} runs differ:\n" + "\n".join(bad)


@pytest.mark.oracle
def test_live_llama_cpp_context_picks_the_same_tokens():
    """A few configurations re-derived from llama_cpp on a real context (llama-tiny-f16)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    L = llama_cpp.llama_cpp
    from tools.record_sampling import CONFIGS, SYNTH_PROMPTS, build_chain

    path = model_path("llama-tiny-f16")
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, verbose=False)
    vocab, n_vocab = L.llama_model_get_vocab(llm._model.model), llm.n_vocab()
    chosen = {"default-s42", "mirostat2", "dry", "cli-everything", "cli-xtc"}
    try:
        with Engine.load(path, n_ctx=256) as eng:
            for name, text, special in SYNTH_PROMPTS[:2]:
                toks = llm.tokenize(text.encode(), add_bos=True, special=special)
                for cname, surface, cfg in CONFIGS:
                    if cname not in chosen:
                        continue
                    p = params_of(cfg)
                    chain = build_chain(L, vocab, n_vocab, surface, p)
                    if surface == "llama.cpp":
                        for t in toks:
                            L.llama_sampler_accept(chain, t)
                    llm.reset()
                    llm.eval(toks)
                    want = []
                    for _ in range(8):
                        want.append(L.llama_sampler_sample(chain, llm._ctx.ctx, -1))
                        if L.llama_vocab_is_eog(vocab, want[-1]):
                            break
                        llm.eval([want[-1]])
                    L.llama_sampler_free(chain)
                    assert replay(eng, toks, surface, p, 8) == want, (name, cname)
    finally:
        llm.close()


# ---- oracle: llama.cpp's own sampler chains through llama_cpp's ctypes API -------------------------

def llama_chain_picks(p, rows, surface, history):
    """llama.cpp's picks on rows of logits (a llama_token_data_array each, then accept), with the
    chain tools/record_sampling.py builds for `surface`."""
    L = pytest.importorskip("llama_cpp").llama_cpp
    from tools.record_sampling import build_chain

    n = rows[0].size
    chain = build_chain(L, None, n, surface, p)
    try:
        if surface == LLAMA:
            for t in history:
                L.llama_sampler_accept(chain, int(t))
        out = []
        for x in rows:
            arr = (L.llama_token_data * n)()
            view = np.ctypeslib.as_array(arr)
            view["id"], view["logit"], view["p"] = np.arange(n), x, 0
            cur = L.llama_token_data_array(arr, n, -1, False)
            L.llama_sampler_apply(chain, ctypes.byref(cur))
            tok = cur.data[cur.selected].id
            L.llama_sampler_accept(chain, tok)
            out.append(tok)
        return out
    finally:
        L.llama_sampler_free(chain)


@pytest.mark.oracle
@pytest.mark.parametrize("surface", [LCPP, LLAMA])
def test_oracle_chains_pick_llama_cpp_tokens(surface):
    rng = np.random.default_rng(5 if surface == LCPP else 6)
    for trial in range(40):
        n = int(rng.choice([50, 700, 3000, 40000]))
        rows = [(rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(F32) for _ in range(10)]
        if trial % 3 == 0:
            rows = [np.round(r * 2) / 2 for r in rows]        # many ties: libstdc++'s sort order matters
        kw = dict(top_k=int(rng.choice([0, 1, 40, 5000])), top_p=float(rng.choice([1.0, 0.95, 0.5])),
                  min_p=float(rng.choice([0.0, 0.05, 0.2])), typical_p=float(rng.choice([1.0, 0.9])),
                  temperature=float(rng.choice([0.0, 0.8, 1.7])), repeat_penalty=float(rng.choice([1.0, 1.3])),
                  frequency_penalty=float(rng.choice([0, 0.2])), presence_penalty=float(rng.choice([0, 0.3])),
                  repeat_last_n=int(rng.choice([0, 16, 64])), seed=int(rng.integers(0, 2 ** 32 - 1)),
                  top_n_sigma=float(rng.choice([-1, 1.5])), xtc_probability=float(rng.choice([0, 0.5])),
                  dynatemp_range=float(rng.choice([0, 0.5])), min_keep=int(rng.choice([0, 3])),
                  mirostat=int(rng.choice([0, 0, 1, 2])), dry_sequence_breakers=())
        if trial % 4 == 1:
            kw["logit_bias"] = ((int(rng.integers(0, n)), 5.0), (int(rng.integers(0, n)), -math.inf))
        if trial % 5 == 2:
            kw.update(dry_multiplier=0.8, dry_allowed_length=1)
        p = SamplerParams(**kw).validate()
        hist = rng.integers(0, min(n, 8), 40).tolist()         # a repetitive prompt, for DRY
        want = llama_chain_picks(p, rows, surface, hist)
        s, h, got = Sampler(p, n, chain=surface), list(hist), []
        for x in rows:
            got.append(s.sample(x, h))
            h.append(got[-1])
        assert got == want, (trial, kw)
