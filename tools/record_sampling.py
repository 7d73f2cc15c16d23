"""Record llama.cpp's sampled tokens (llama-cpp-python 0.3.36's low-level sampler API on a real
context) for ramforge's sampler: tests/fixtures/sampling/<model-id>.json.

    python tools/record_sampling.py                     # gemma3-270m-q4_k_m and llama-tiny-f16
    python tools/record_sampling.py --check             # compare a fresh run with the records

Per model, prompt and configuration: the prompt's token ids and the first N_GEN tokens a chain of
llama_sampler_init_* stages picks with llama_sampler_sample (which accepts each pick), the prompt
evaluated in one decode and each pick fed back in one decode. A configuration is a surface and
sampler parameters (ramforge.sampling.params' names):
  "llama-cpp-python": the chain Llama._init_sampler builds (logit bias, penalties, then greedy,
      mirostat or top-k .. temperature, dist), with llama.cpp's other stages where its default order
      puts them; nothing is accepted before the first pick.
  "llama.cpp": common_sampler_init's chain in the default sampler order; the prompt's tokens are
      accepted first, as llama-completion does.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before llama_cpp is first imported

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import REPO_ROOT, sha256_file  # noqa: E402
from tools.record_oracle import GEMMA_ID, GEMMA_PROMPTS, SYNTH_PROMPTS, dumps, model_table  # noqa: E402

OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "sampling"
MODELS = (GEMMA_ID, "llama-tiny-f16")
PROMPTS = {GEMMA_ID: [p for p in GEMMA_PROMPTS if p[0] in ("prose", "code", "dialogue", "numbers")],
           "llama-tiny-f16": SYNTH_PROMPTS}
N_CTX = 512
N_GEN = 12
LCPP, LLAMA = "llama-cpp-python", "llama.cpp"
OFF = dict(top_k=0, top_p=1.0, min_p=0.0)
PEN = dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.2)
DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=64)
BIAS = "bias"                        # a placeholder: per model, the prompt-independent ids below

# (name, surface, parameters); the table's defaults fill the rest
CONFIGS = [
    ("greedy", LCPP, dict(temperature=0.0)),
    ("greedy-penalties", LCPP, dict(temperature=0.0, **PEN)),
    ("default-s1", LCPP, dict(seed=1)),
    ("default-s42", LCPP, dict(seed=42)),
    ("dist-full-vocab", LCPP, dict(temperature=1.0, seed=7, **OFF)),
    ("top-p-full-vocab", LCPP, dict(temperature=1.5, seed=11, top_k=0, top_p=0.9, min_p=0.0)),
    ("typical", LCPP, dict(temperature=0.7, top_k=100, typical_p=0.9, seed=3)),
    ("min-p", LCPP, dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.1, seed=5)),
    ("penalties", LCPP, dict(temperature=0.9, repeat_penalty=1.5, repeat_last_n=16, frequency_penalty=0.5,
                             presence_penalty=0.5, seed=9)),
    ("mirostat1", LCPP, dict(mirostat=1, mirostat_tau=5.0, mirostat_eta=0.1, seed=13)),
    ("mirostat2", LCPP, dict(mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2, seed=17)),
    ("logit-bias", LCPP, dict(temperature=1.0, seed=19, logit_bias=BIAS)),
    ("dry", LCPP, dict(temperature=1.0, seed=23, **DRY)),
    ("xtc", LCPP, dict(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1, seed=29)),
    ("top-n-sigma", LCPP, dict(temperature=1.0, top_n_sigma=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=31)),
    ("dynatemp", LCPP, dict(temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=1.0, seed=37)),
    ("min-keep", LCPP, dict(temperature=1.0, min_keep=5, top_p=0.5, min_p=0.3, seed=41)),
    ("cli-default", LLAMA, dict(seed=1)),
    ("cli-temp0", LLAMA, dict(temperature=0.0, seed=2)),
    ("cli-penalties", LLAMA, dict(repeat_penalty=1.2, frequency_penalty=0.1, seed=3)),
    ("cli-dry", LLAMA, dict(temperature=1.0, seed=4, dry_multiplier=1.0, dry_base=1.5, dry_allowed_length=1,
                            dry_penalty_last_n=128)),
    ("cli-mirostat1", LLAMA, dict(mirostat=1, temperature=0.9, seed=5)),
    ("cli-mirostat2", LLAMA, dict(mirostat=2, temperature=1.1, mirostat_tau=3.0, seed=6)),
    ("cli-xtc", LLAMA, dict(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.05, top_k=0, seed=7)),
    ("cli-sigma-typical-dynatemp", LLAMA, dict(top_n_sigma=2.0, typical_p=0.8, dynatemp_range=0.6,
                                               dynatemp_exponent=2.0, top_k=0, seed=8)),
    ("cli-logit-bias", LLAMA, dict(temperature=1.3, top_k=20, seed=9, logit_bias=BIAS)),
    ("cli-everything", LLAMA, dict(seed=10, top_k=50, typical_p=0.95, top_p=0.9, min_p=0.02, top_n_sigma=3.0,
                                   xtc_probability=0.3, xtc_threshold=0.15, dynatemp_range=0.3, min_keep=2,
                                   dry_sequence_breakers=["\n", "."], **PEN, **DRY)),
]


def bias_for(n_vocab: int) -> list[list]:
    """Fixed biases per vocabulary: a few tokens favoured, one banned (JSON: -inf as the string)."""
    return [[13 % n_vocab, 4.0], [(n_vocab // 3), 2.5], [(n_vocab // 2) + 1, -1e9], [n_vocab - 1, "-inf"]]


def params_of(cfg: dict, n_vocab: int):
    from ramforge.sampling.params import sampler_params

    kw = dict(cfg)
    if kw.get("logit_bias") == BIAS:
        kw["logit_bias"] = bias_for(n_vocab)
    if "logit_bias" in kw:
        kw["logit_bias"] = [[t, -math.inf if b == "-inf" else b] for t, b in kw["logit_bias"]]
    return sampler_params(kw)


def build_chain(L, vocab, n_vocab: int, surface: str, p):
    """The llama_sampler chain of one surface for SamplerParams p (see the module doc)."""
    seed = 0xFFFFFFFF if p.seed is None else p.seed
    st = []
    if p.logit_bias:
        arr = (L.llama_logit_bias * len(p.logit_bias))()
        for i, (t, b) in enumerate(p.logit_bias):
            arr[i].token, arr[i].bias = t, b
        st.append(L.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), arr))

    def penalties_and_dry():
        st.append(L.llama_sampler_init_penalties(n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                                                 p.presence_penalty))
        brk = [s.encode() for s in p.dry_sequence_breakers]
        arr = (ctypes.c_char_p * len(brk))(*brk)
        st.append(L.llama_sampler_init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                           p.dry_penalty_last_n, arr, len(brk)))

    def filters():
        st.extend([L.llama_sampler_init_top_n_sigma(p.top_n_sigma), L.llama_sampler_init_top_k(p.top_k),
                   L.llama_sampler_init_typical(p.typical_p, p.min_keep), L.llama_sampler_init_top_p(p.top_p, p.min_keep),
                   L.llama_sampler_init_min_p(p.min_p, p.min_keep),
                   L.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, seed),
                   L.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent),
                   L.llama_sampler_init_dist(seed)])

    def mirostat():
        if p.mirostat == 1:
            st.append(L.llama_sampler_init_mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        else:
            st.append(L.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))

    if surface == LCPP:
        penalties_and_dry()
        if p.temperature == 0:
            st.append(L.llama_sampler_init_greedy())
        elif p.mirostat:
            mirostat()
        else:
            filters()
    elif p.mirostat:
        st.append(L.llama_sampler_init_temp(p.temperature))
        mirostat()
    else:
        penalties_and_dry()
        filters()
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for s in st:
        L.llama_sampler_chain_add(chain, s)
    return chain


def record_model(mid: str) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as L

    info = model_table()[mid]
    path = Path(info["path"]())
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, n_threads_batch=2,
                          verbose=False)
    vocab = L.llama_model_get_vocab(llm._model.model)
    n_vocab = llm.n_vocab()
    rec = {"format": 1, "model": {"id": mid, "file": path.name, "sha256": sha256_file(path), "n_vocab": n_vocab},
           "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX, "n_gen": N_GEN,
                      "recorder": "python tools/record_sampling.py",
                      "system_info": llama_cpp.llama_print_system_info().decode().strip()},
           "configs": [{"name": n, "surface": s, "params": _json_params(c, n_vocab)} for n, s, c in CONFIGS],
           "prompts": []}
    for name, text, special in PROMPTS[mid]:
        toks = llm.tokenize(text.encode(), add_bos=True, special=special)
        runs = []
        for cname, surface, cfg in CONFIGS:
            p = params_of(cfg, n_vocab)
            chain = build_chain(L, vocab, n_vocab, surface, p)
            if surface == LLAMA:
                for t in toks:
                    L.llama_sampler_accept(chain, t)
            llm.reset()
            llm.eval(toks)
            out, stop = [], "max_tokens"
            for j in range(N_GEN):
                tok = L.llama_sampler_sample(chain, llm._ctx.ctx, -1)
                out.append(tok)
                if L.llama_vocab_is_eog(vocab, tok):
                    stop = "eog"
                    break
                if j < N_GEN - 1:
                    llm.eval([tok])
            L.llama_sampler_free(chain)
            runs.append({"config": cname, "tokens": out, "stop": stop})
        rec["prompts"].append({"name": name, "special": special, "prompt_tokens": toks, "runs": runs})
    llm.close()
    return rec


def _json_params(cfg: dict, n_vocab: int) -> dict:
    out = dict(cfg)
    if out.get("logit_bias") == BIAS:
        out["logit_bias"] = bias_for(n_vocab)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", default=list(MODELS))
    ap.add_argument("--check", action="store_true", help="compare a fresh run with the committed records")
    a = ap.parse_args(argv)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    bad = 0
    for mid in a.ids:
        rec = record_model(mid)
        f = OUT_DIR / f"{mid}.json"
        n = sum(len(p["runs"]) for p in rec["prompts"])
        if a.check:
            same = json.loads(f.read_text())["prompts"] == rec["prompts"]
            bad += not same
            print(f"{mid}: {'ok' if same else 'DIFFERS'} ({n} runs)")
        else:
            f.write_text(dumps(rec) + "\n", encoding="utf-8")
            print(f"{mid}: {n} runs, {f.stat().st_size / 1024:.0f} KiB")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
