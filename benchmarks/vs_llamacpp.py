"""ramforge vs llama.cpp (llama-cpp-python 0.3.36) on the same file, prompt and threads, alternating.

    python benchmarks/vs_llamacpp.py [--models default llama-250m:Q4_0 llama-250m:Q8_0 llama-250m:Q6_K]
                                     [--threads 2]
                                     [--prompt-tokens 128] [--gen 32] [--rounds 3]

Prints, per model, the median prefill and decode tok/s of each and the ratios ramforge / llama.cpp.
The machine is shared and noisy: rounds alternate the two so both see the same conditions.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def model_path(spec: str) -> str:
    if spec == "default":
        from ramforge.resolve import default_model_path

        return str(default_model_path())
    if ":" in spec and not Path(spec).exists():
        from tools.make_models import PRESETS, build, ensure_model

        name, qtype = spec.split(":")
        if name in PRESETS:                     # e.g. llama-250m:Q4_0, built once into the fixture cache
            return str(build(PRESETS[name], qtype.upper(), verbose=True))
        return str(ensure_model(name, qtype))
    return spec


def prompt_ids(tok, n: int) -> list[int]:
    base = tok.encode("The history of the printing press begins in the fifteenth century, when ", add_special=False)
    return ([tok.bos_id] if tok.add_bos else []) + (base * n)[: n - 1]


def time_ramforge(eng, ids, gen):
    eng.reset()
    t0 = time.perf_counter()
    tok = int(np.argmax(eng.eval(ids)[-1]))
    t1 = time.perf_counter()
    for _ in range(gen):
        tok = int(np.argmax(eng.eval([tok])[-1]))
    return len(ids) / (t1 - t0), gen / (time.perf_counter() - t1)


def time_llama(llm, ids, gen):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t1 = time.perf_counter()
    for _ in range(gen):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return len(ids) / (t1 - t0), gen / (time.perf_counter() - t1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["default", "llama-250m:Q4_0", "llama-250m:Q8_0",
                                                      "llama-250m:Q6_K"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import llama_cpp

    from ramforge.engine import Engine

    for spec in a.models:
        path = model_path(spec)
        n_ctx = a.prompt_tokens + a.gen + 16
        eng = Engine.load(path, n_ctx=n_ctx, n_threads=a.threads)
        llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=a.threads,
                              n_threads_batch=a.threads, verbose=False)
        ids = prompt_ids(eng.tokenizer, a.prompt_tokens)
        time_ramforge(eng, ids[:8], 2)                       # warm both
        time_llama(llm, ids[:8], 2)
        rf, lc = [], []
        for _ in range(a.rounds):
            rf.append(time_ramforge(eng, ids, a.gen))
            lc.append(time_llama(llm, ids, a.gen))
        med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
        rp, rd, lp, ld = med(rf, 0), med(rf, 1), med(lc, 0), med(lc, 1)
        print(f"{Path(path).name}: prefill ramforge {rp:.1f} / llama.cpp {lp:.1f} tok/s = {rp / lp:.2f}x; "
              f"decode ramforge {rd:.2f} / llama.cpp {ld:.2f} tok/s = {rd / ld:.2f}x "
              f"({a.threads} threads, {len(ids)} prompt tokens, {a.gen} generated, median of {a.rounds})", flush=True)
        eng.close()
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
