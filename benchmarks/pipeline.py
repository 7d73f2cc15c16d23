"""A pipeline on a local Ray cluster against one process: each term of the latency model, measured.

    python benchmarks/pipeline.py [MODEL] [--stages 2] [--tokens 40] [--rounds 2] [--block 5] [--prompt 256] [--json]

Both are loaded at once (the single process in the driver, the stages in Ray's workers) and decode in
alternating blocks of --block tokens, so a busy machine's drift hits both alike: per decoded token,
the single process's seconds, the pipeline's wall seconds, and their paired difference (each
pipeline block against the single block that follows it); each stage's seconds inside
Stage.forward (its compute and I/O); the rest is Ray's (N actor calls, N-1 hidden-state hops, the
logits row back to the driver). Then Ray alone: a chain of N no-op actor calls passing a hidden
state (f32[n_embd]) and returning a logits row (f32[n_vocab]): the transport's floor. And the
prompt: single-process prefill against the pipelined one (chunks flowing through the stages at once).
Kernels are warmed first in every process. MODEL defaults to the 3B synthetic llama (resident).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def prefill(e, prompt: list[int]) -> tuple[int, float]:
    """(the greedy next token, seconds) of a fresh prompt."""
    e.reset()
    t = time.perf_counter()
    tok = int(np.argmax(e.eval(prompt, aligned=True)[-1]))
    return tok, time.perf_counter() - t


def steps(e, tok: int, n: int) -> tuple[int, list[float]]:
    """n greedy tokens after tok: (the last token, ms of each)."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        tok = int(np.argmax(e.eval([tok])[-1]))
        ts.append((time.perf_counter() - t) * 1e3)
    return tok, ts


def ray_floor(ray, n_stages: int, n_embd: int, n_vocab: int, n: int = 300) -> float:
    """ms of a chain of n_stages no-op actor calls carrying a hidden state, the last returning logits."""
    @ray.remote(num_cpus=0)
    class Hop:
        def f(self, x, last):
            return np.zeros(n_vocab, np.float32) if last else x

    hops = [Hop.remote() for _ in range(n_stages)]
    h = np.zeros((1, n_embd), np.float32)
    ts = []
    for i in range(n + 10):
        t = time.perf_counter()
        x = h
        for j, a in enumerate(hops):
            x = a.f.remote(x, j == n_stages - 1)
        ray.get(x)
        ts.append(time.perf_counter() - t)
    for a in hops:
        ray.kill(a)
    return float(np.median(ts[10:]) * 1e3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(REPO / "fixtures/cache/models/llama-3b-q4_k_m.gguf"))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--block", type=int, default=5, help="tokens per alternating block")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import ray

    from ramforge.cluster import RAY_SYSTEM_CONFIG, Pipeline
    from ramforge.engine.engine import Engine

    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             _system_config=RAY_SYSTEM_CONFIG)
    single, pipe, paired, busy, pre1, preN = [], [], [], [], [], []
    n_ctx = a.prompt + a.tokens + 16
    for r in range(a.rounds):
        with Engine.load(a.model, n_ctx=n_ctx) as e, Pipeline(a.model, a.stages, n_ctx=n_ctx) as p:
            layers, nice = [i["layers"] for i in p.infos], [i["nice"] for i in p.infos]
            n_embd, n_vocab = e.hp.n_embd, e.hp.n_vocab
            base = e.tokenizer.encode("The history of the printing press begins in the fifteenth century, when ",
                                      add_special=False)
            prompt = ([e.tokenizer.bos_id] + base * a.prompt)[:a.prompt]
            for m in (e, p):                               # warm: a first prefill and decode compile
                steps(m, prefill(m, prompt)[0], 4)
            (t1, s1), (tN, sN) = prefill(e, prompt), prefill(p, prompt)
            assert t1 == tN, "the pipeline's first token differs from one process's"
            pre1.append(s1), preN.append(sN)
            before = p.stage_info()
            blocks1, blocksN = [], []
            for _ in range(-(-a.tokens // a.block)):
                tN, ms = steps(p, tN, a.block)
                blocksN.append(ms)
                t1, ms = steps(e, t1, a.block)
                blocks1.append(ms)
            after = p.stage_info()
            assert t1 == tN, "the pipeline's tokens differ from one process's"
            n = a.block * len(blocksN)
            busy.append([(y["busy_s"] - x["busy_s"]) * 1e3 / n for x, y in zip(before, after)])
            single += [t for b in blocks1 for t in b]
            pipe += [t for b in blocksN for t in b]
            paired += [np.median(bN) - np.median(b1) for bN, b1 in zip(blocksN, blocks1)]
        print(f"round {r}: single {np.median(single[-n:]):.1f} ms/token, {a.stages} stages "
              f"{np.median(pipe[-n:]):.1f} ms/token; prefill of {len(prompt)}: {pre1[-1]:.2f} s vs {preN[-1]:.2f} s",
              file=sys.stderr)
    floor = ray_floor(ray, a.stages, n_embd, n_vocab)
    s1, sN = np.array(single), np.array(pipe)
    stage_ms = [float(np.mean([b[i] for b in busy])) for i in range(a.stages)]
    res = {"model": a.model, "stages": a.stages, "layers": layers, "tokens": len(sN), "block": a.block,
           "single_ms": float(np.median(s1)), "pipeline_ms": float(np.median(sN)),
           "overhead_ms": float(np.median(sN) - np.median(s1)),
           "overhead_paired_ms": float(np.median(paired)),
           "overhead_mean_ms": float(sN.mean() - s1.mean()),
           "single_p10_p90_ms": [float(np.percentile(s1, 10)), float(np.percentile(s1, 90))],
           "pipeline_p10_p90_ms": [float(np.percentile(sN, 10)), float(np.percentile(sN, 90))],
           "stage_ms": stage_ms, "stages_sum_ms": float(sum(stage_ms)),
           "pipeline_mean_ms": float(sN.mean()), "single_mean_ms": float(s1.mean()),
           "ray_ms": float(sN.mean() - sum(stage_ms)),
           "stage_nice": nice,
           "ray_floor_ms": floor, "hidden_bytes": 4 * n_embd, "logits_bytes": 4 * n_vocab,
           "prefill_tokens": a.prompt, "prefill_single_s": float(np.median(pre1)),
           "prefill_pipeline_s": float(np.median(preN))}
    ray.shutdown()
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
