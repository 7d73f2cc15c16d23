"""Embedding throughput: docs/s of ramforge in RAM and under a budget of 1/4 of the file, beside
llama-cpp-python in RAM, on the same model and the same synthetic documents (~200 tokens each).

    python benchmarks/embeddings.py [--model M.gguf] [--docs 1000] [--tokens 200] [--threads 2] [--fraction 0.25]
        [--pooling mean|cls|last] [--json]

The model defaults to the synthetic bert fixture (tools/record_embeddings.py, bert-tiny-f16). Each side
is warmed up on a few documents first (numba's compilation, llama.cpp's first graph), then times
tokenizing and embedding all documents, normalized as the servers do (Euclidean). llama-cpp-python's
`Llama(embedding=True).embed(docs)` packs the documents into batches of n_batch tokens; ramforge's
Embedder.embed_many packs them the same way (one llama_decode per batch, in passes over the weights of
the tokens stream.embed_plan sizes from the budget: Engine.load(embed=True)). A budget too small for the
model (a tiny model's working set is larger than 1/4 of its file) is raised to the plan's minimum, and
the line says so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their has been would when who will more no if out so said what "
         "up its about into than them can only other new some time could these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people how too little state good very make world still "
         "own see men work long get here between both life being under never day same another know while last "
         "embedding vector retrieval document memory model budget layer weight token sequence attention").split()


def documents(n: int, n_tokens: int, tokenizer, seed: int = 0) -> list[str]:
    """n texts of random common words, each cut to about n_tokens tokens of the model's tokenizer."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = list(rng.choice(WORDS, size=n_tokens))
        while len(tokenizer.encode(" ".join(words))) > n_tokens:
            words.pop()
        out.append(" ".join(words))
    return out


def run_ramforge(path: str, docs: list[str], budget: int | None, threads: int, pooling: str | None = None) -> dict:
    from ramforge.engine.engine import Engine
    from ramforge.errors import BudgetTooSmall
    from ramforge.gguf.reader import GGUFFile
    from ramforge.generation.embed import EmbedStats, Embedder, pooling_of
    from ramforge.memory import MemoryBudget

    note = ""
    try:
        eng = Engine.load(path, n_ctx=512, budget=MemoryBudget(budget), n_threads=threads, embed=True)
    except BudgetTooSmall as e:
        note = f"1/4 of the file ({budget:,} B) is below the plan's minimum; ran at {e.minimum:,} B"
        budget = e.minimum
        eng = Engine.load(path, n_ctx=512, budget=MemoryBudget(budget), n_threads=threads, embed=True)
    with GGUFFile(path) as f, eng:
        emb = Embedder(eng, pooling_of(f.metadata, eng.hp.arch, pooling))
        emb.embed_many([emb.tokens(d) for d in docs[:4]], 2)                      # warm-up
        stats = EmbedStats()
        t0 = time.perf_counter()
        vecs = emb.embed_many([emb.tokens(d) for d in docs], 2, stats=stats)
        s = time.perf_counter() - t0
        resident = eng.plan.verdict
    return {"docs_s": len(docs) / s, "seconds": s, "tokens": stats.tokens, "passes": stats.passes,
            "tokens_per_pass": eng.plan.batch,
            "docs_per_pass": stats.docs_per_pass, "budget": budget, "plan": resident, "note": note,
            "first": np.asarray(vecs[0], np.float32)}


def run_llama_cpp(path: str, docs: list[str], threads: int, pooling: str | None = None) -> dict:
    import llama_cpp
    kw = {} if pooling is None else {"pooling_type": getattr(llama_cpp, f"LLAMA_POOLING_TYPE_{pooling.upper()}")}
    llm = llama_cpp.Llama(path, embedding=True, n_ctx=512, n_batch=512, n_threads=threads, verbose=False, **kw)
    try:
        llm.embed(docs[:4], normalize=True)                                        # warm-up
        t0 = time.perf_counter()
        vecs = llm.embed(docs, normalize=True)
        s = time.perf_counter() - t0
    finally:
        llm.close()
    return {"docs_s": len(docs) / s, "seconds": s, "first": np.asarray(vecs[0], np.float32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .gguf embedding model (default: the bert-tiny-f16 fixture)")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=200, help="tokens per document (about)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("RAMFORGE_THREADS", "2")))
    ap.add_argument("--fraction", type=float, default=0.25, help="the out-of-core budget as a part of the file")
    ap.add_argument("--pooling", choices=["mean", "cls", "last"], default=None,
                    help="over the file's pooling type (a causal model's file often has none)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.model is None:
        from tools.record_embeddings import model_file
        a.model = str(model_file("bert-tiny-f16"))
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer
    with GGUFFile(a.model) as f:
        tok = load_tokenizer(f.metadata)
    docs = documents(a.docs, a.tokens, tok)
    size = Path(a.model).stat().st_size
    ram = run_ramforge(a.model, docs, None, a.threads, a.pooling)
    ooc = run_ramforge(a.model, docs, int(size * a.fraction), a.threads, a.pooling)
    ref = run_llama_cpp(a.model, docs, a.threads, a.pooling)
    d = float(np.abs(ram["first"] - ref["first"]).max())
    res = {"model": a.model, "file_bytes": size, "docs": a.docs, "threads": a.threads,
           "ramforge_ram": {k: v for k, v in ram.items() if k != "first"},
           "ramforge_budget": {k: v for k, v in ooc.items() if k != "first"},
           "llama_cpp_python": {k: v for k, v in ref.items() if k != "first"},
           "budget_over_ram": ooc["docs_s"] / ram["docs_s"], "ram_over_llama_cpp": ram["docs_s"] / ref["docs_s"],
           "max_abs_diff_first_doc": d}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{a.docs} documents of ~{a.tokens} tokens ({ram['tokens']} tokens), {a.threads} threads, {a.model}")
    print(f"  ramforge in RAM          {ram['docs_s']:9.1f} docs/s  ({ram['passes']} weight passes, "
          f"{ram['docs_per_pass']:.2f} docs/pass, {ram['tokens_per_pass']} tokens/pass, plan {ram['plan']})")
    print(f"  ramforge at {ooc['budget']:>12,} B {ooc['docs_s']:9.1f} docs/s  ({ooc['passes']} passes, "
          f"{ooc['docs_per_pass']:.2f} docs/pass, {ooc['tokens_per_pass']} tokens/pass, plan "
          f"{ooc['plan']}){'; ' + ooc['note'] if ooc['note'] else ''}")
    print(f"  llama-cpp-python in RAM  {ref['docs_s']:9.1f} docs/s")
    print(f"  budget / RAM {res['budget_over_ram']:.2f}x   ramforge RAM / llama-cpp-python {res['ram_over_llama_cpp']:.2f}x"
          f"   first vector max |d| {d:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
