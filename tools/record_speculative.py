"""Record llama-cpp-python's (0.3.36) speculative greedy decoding with prompt lookup, as small JSON
files under tests/fixtures/speculative/<model-id>.json, for every oracle model whose record ramforge
reproduces (tests/fixtures/oracle, made by an AVX-512 build).

    python tools/record_speculative.py                  # all
    python tools/record_speculative.py 'llama-tiny-*' gemma3-270m-q4_k_m

Per prompt and drafter configuration it stores the tokens of
``Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens)).generate`` at
temperature 0, and the sequence of batches it evaluated (position, size): those batches decide the
arithmetic, and ramforge's speculative loop must submit the very same ones. Beside them, the same
Llama without a draft model gives the plain greedy tokens, so a test can tell where llama.cpp's own
speculative output equals its plain one.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before llama_cpp is first imported

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import ORACLE_DIR  # noqa: E402
from tools.oracle_report import model_path  # noqa: E402
from tools.record_oracle import N_THREADS, SEED, dumps  # noqa: E402

FORMAT = 1
SPEC_DIR = ORACLE_DIR.parent / "speculative"
REPRODUCED_BUILD = "AVX512 = 1"
CONFIGS = [(2, 10), (3, 4)]           # (max_ngram_size, num_pred_tokens); (2, 10) is llama-cpp-python's default
# a seeded run too: llama-cpp-python's chain (top-k, typical, top-p, min-p, temperature, dist with
# Llama(seed=SEED)'s std::mt19937), each sampled position drawn once, as without a draft model
SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, repeat_penalty=1.0)
N_GEN = {"gemma3": 48, "synthetic": 32}
_REPEAT = {
    "gemma3": ("copy", "Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape.\n"
                       "Repeat the list exactly:\napple, banana,"),
    "synthetic": ("repeat", "one two three four five six seven eight, one two three four five six seven eight, one"),
}
GEMMA_PROMPTS = ("code", "numbers", "long")     # of the oracle record's prompts, those with text to look up


def prompts_of(oracle: dict) -> list[tuple[str, list[int], str]]:
    """(name, token ids, text) per prompt: the oracle record's (gemma: a few), plus a repetitive one."""
    gemma = oracle["model"]["source"] != "synthetic"
    out = [(p["name"], p.get("tokens_special", p["tokens"]) if p["special"] else p["tokens"], p["text"])
           for p in oracle["prompts"] if not gemma or p["name"] in GEMMA_PROMPTS]
    return out


def run(llm, ids: list[int], n_gen: int, draft, sampling: dict | None = None) -> tuple[list[int], list[list[int]]]:
    """Tokens of llm.generate (greedy, or with `sampling`; stopping at EOG or n_gen) and the batches
    llm.eval saw."""
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    batches, inner = [], llm.eval

    def logged(tokens):
        batches.append([llm.n_tokens, len(tokens)])
        return inner(tokens)
    llm.eval = logged
    llm.draft_model = draft
    llm.reset()
    out = []
    try:
        kw = dict(temp=0.0, repeat_penalty=1.0) if sampling is None else \
            {("temp" if k == "temperature" else k): v for k, v in sampling.items()}
        for t in llm.generate(ids, reset=True, **kw):
            if llama_cpp.llama_vocab_is_eog(vocab, t):
                break
            out.append(int(t))
            if len(out) == n_gen:
                break
    finally:
        llm.eval = inner
    return out, batches


def record_model(oracle: dict) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    m, o = oracle["model"], oracle["oracle"]
    kind = "gemma3" if m["source"] != "synthetic" else "synthetic"
    path = model_path(oracle)
    kw = dict(n_ctx=o["n_ctx"], n_batch=o["n_batch"], n_ubatch=o["n_ubatch"], n_threads=N_THREADS,
              n_threads_batch=N_THREADS, seed=SEED, verbose=False)
    spec = llama_cpp.Llama(str(path), draft_model=LlamaPromptLookupDecoding(), **kw)   # logits_all, as it sets
    plain = llama_cpp.Llama(str(path), **kw)
    name, text = _REPEAT[kind]
    prompts = prompts_of(oracle) + [(name, spec.tokenize(text.encode(), add_bos=True, special=False), text)]
    rec = {"format": FORMAT,
           "model": {k: m[k] for k in ("id", "arch", "type", "file", "sha256", "size", "source", "generator")
                     if k in m} | ({"spec": m["spec"]} if "spec" in m else {}),
           "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": o["n_ctx"], "n_batch": o["n_batch"],
                      "n_ubatch": o["n_ubatch"], "n_threads": N_THREADS,
                      "generate": "Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens))"
                                  ".generate(ids, temp=0.0, repeat_penalty=1.0); stop at EOG or n_gen",
                      "batches": "[n_past, n_tokens] of every Llama.eval call",
                      "plain": "the same Llama without draft_model (plain_sampled: with the run's sampling)",
                      "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                      "recorder": f"python tools/record_speculative.py {m['id']}"},
           "n_gen": N_GEN[kind], "prompts": []}
    for pname, ids, ptext in prompts:
        base, _ = run(plain, ids, N_GEN[kind], None)
        entry = {"name": pname, "text": ptext, "tokens": ids, "plain": base, "runs": []}
        for g, k in CONFIGS:
            toks, batches = run(spec, ids, N_GEN[kind], LlamaPromptLookupDecoding(max_ngram_size=g, num_pred_tokens=k))
            entry["runs"].append({"max_ngram_size": g, "num_pred_tokens": k, "tokens": toks, "batches": batches})
        toks, batches = run(spec, ids, N_GEN[kind], LlamaPromptLookupDecoding(), SAMPLING)
        entry["runs"].append({"max_ngram_size": 2, "num_pred_tokens": 10, "sampling": SAMPLING | {"seed": SEED},
                              "tokens": toks, "batches": batches})
        entry["plain_sampled"], _ = run(plain, ids, N_GEN[kind], None, SAMPLING)
        rec["prompts"].append(entry)
    spec.close()
    plain.close()
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", help="model ids or globs (default: every reproduced oracle record)")
    a = ap.parse_args(argv)
    SPEC_DIR.mkdir(parents=True, exist_ok=True)
    for f in sorted(ORACLE_DIR.glob("*.json")):
        oracle = json.loads(f.read_text())
        mid = oracle["model"]["id"]
        if a.ids and not any(fnmatch.fnmatch(mid, p) for p in a.ids):
            continue
        if REPRODUCED_BUILD not in oracle["oracle"].get("system_info", ""):
            continue
        t0 = time.perf_counter()
        rec = record_model(oracle)
        (SPEC_DIR / f"{mid}.json").write_text(dumps(rec) + "\n")
        print(f"{mid}: {len(rec['prompts'])} prompts in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
