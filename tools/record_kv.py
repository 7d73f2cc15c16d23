"""Record llama.cpp's (llama-cpp-python 0.3.36) logits with quantized KV cache types, as small JSON files
under tests/fixtures/kv/<model-id>.json, for a few oracle models (tests/fixtures/oracle).

    python tools/record_kv.py                           # the default set (MODELS)
    python tools/record_kv.py llama-tiny-q8_0 gemma3-270m-q4_k_m

Per model and cache configuration (type_k, type_v) it replays the oracle record's prompts as the
oracle did (the prompt in one llama_decode with n_ubatch = n_ctx, then its greedy tokens one
llama_decode each) on `Llama(type_k=, type_v=, flash_attn=True)`: a quantized V cache needs flash
attention in llama.cpp, and ramforge reads every quantized cache through flash attention, so the
records are made with it on. Per evaluated position it stores the sha256 (first 16 hex digits) of the
float32 logits row, and its top TOP values exactly (the shortest decimal of each float32) with their ids:
a test compares the hashes bit for bit and, where one differs, the size of the difference.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before llama_cpp is first imported

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import ORACLE_DIR  # noqa: E402
from tools.oracle_report import model_path  # noqa: E402
from tools.record_oracle import N_THREADS, SEED, _cpu_name, dumps  # noqa: E402

FORMAT = 1
KV_DIR = ORACLE_DIR.parent / "kv"
# llama, qwen3 (QK norm), gemma2 (attention soft-cap), gemma3 (sliding window), gpt-oss (sinks, window); the
# F16 models need no llama.cpp to be built (tests in CI), the Q8_0 ones do
MODELS = ["llama-tiny-f16", "gpt-oss-tiny-f16", "llama-tiny-q8_0", "qwen3-tiny-q8_0", "gemma2-tiny-q8_0",
          "gemma3-linear-q8_0", "gpt-oss-tiny-q8_0", "gemma3-270m-q4_k_m"]
CONFIGS = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q8_0"), ("q8_0", "f16"), ("q4_0", "q8_0")]
GEMMA_PROMPTS = ("prose", "chat", "long")            # of the 270m record's prompts
N_GEN = 8
TOP = 3
GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}


def row_hash(row: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, np.float32).tobytes()).hexdigest()[:16]


def f32(v) -> float:
    """A float32 as the shortest decimal that reads back as the same float32."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def summarize(L: np.ndarray) -> dict:
    ids = np.argsort(-L, axis=1, kind="stable")[:, :TOP]
    return {"sha": [row_hash(r) for r in L], "top_ids": ids.tolist(),
            "top_vals": [[f32(v) for v in r] for r in np.take_along_axis(L, ids, 1)]}


def run_prompt(llm, ev: list[int], n_gen: int) -> dict:
    llm.reset()
    llm.eval(ev)
    rows = [np.array(llm.scores[:len(ev)], dtype=np.float32)]
    gen = []
    for _ in range(n_gen):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(nxt)
        llm.eval([nxt])
        rows.append(np.array(llm.scores[llm.n_tokens - 1:llm.n_tokens], dtype=np.float32))
    return {"gen_tokens": gen, "logits": summarize(np.concatenate(rows))}


def record_model(mid: str) -> dict:
    import llama_cpp
    oracle = json.loads((ORACLE_DIR / f"{mid}.json").read_text())
    gemma = oracle["model"]["source"] != "synthetic"
    path = model_path(oracle)
    n_ctx = oracle["oracle"]["n_ctx"]
    prompts = [(p["name"], p.get("tokens_special", p["tokens"]) if p["special"] else p["tokens"])
               for p in oracle["prompts"] if not gemma or p["name"] in GEMMA_PROMPTS]
    rec = {"format": FORMAT, "model": {k: oracle["model"][k] for k in ("id", "arch", "type", "sha256", "source")
                                       if k in oracle["model"]} | ({"spec": oracle["model"]["spec"]}
                                                                   if "spec" in oracle["model"] else {}),
           "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": n_ctx, "n_batch": n_ctx, "n_ubatch": n_ctx,
                      "n_threads": N_THREADS, "flash_attn": True, "logits_all": True, "n_gen": N_GEN,
                      "eval": "prompt in one llama_decode, then its greedy tokens one llama_decode each",
                      "cpu": _cpu_name(), "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                      "recorder": f"python tools/record_kv.py {mid}"},
           "prompts": [{"name": n, "tokens": t} for n, t in prompts], "configs": []}
    for tk, tv in CONFIGS:
        llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=N_THREADS,
                              n_threads_batch=N_THREADS, seed=SEED, logits_all=True, verbose=False,
                              flash_attn=True, type_k=GGML_TYPES[tk], type_v=GGML_TYPES[tv])
        runs = [run_prompt(llm, t, N_GEN) for _, t in prompts]
        llm.close()
        rec["configs"].append({"type_k": tk, "type_v": tv, "runs": runs})
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", help="model ids or globs (default: MODELS)")
    a = ap.parse_args(argv)
    ids = [m for m in MODELS if not a.ids or any(fnmatch.fnmatch(m, g) for g in a.ids)]
    KV_DIR.mkdir(parents=True, exist_ok=True)
    for mid in ids:
        t0 = time.perf_counter()
        rec = record_model(mid)
        (KV_DIR / f"{mid}.json").write_text(dumps(rec) + "\n")
        print(f"{mid}: {len(rec['configs'])} configurations in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
