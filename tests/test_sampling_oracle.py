"""ramforge's sampler against llama.cpp's, token for token on real models.

tests/fixtures/sampling/*.json (tools/record_sampling.py) hold the tokens llama.cpp's own sampler
chains picked on gemma-3-270m and a synthetic llama, for each prompt and configuration (greedy and
seeded: every stage, both surfaces' chain orders, mirostat, DRY with its tokenized sequence breakers,
XTC's and dist's std::mt19937 draws). ramforge's logits are llama.cpp's to the bit, so its engine feeds
the same logits to ramforge's Sampler and every generated token must be the recorded one. Marked
oracle, the live test re-derives a few configurations from llama_cpp directly.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ramforge.engine import Engine
from ramforge.params import sampler_params
from ramforge.sampling import Sampler

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


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
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
