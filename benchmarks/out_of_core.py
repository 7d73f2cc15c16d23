"""Out-of-core benchmark: a ~3B llama (Q4_K_M, ~1.8 GB) under --ram 512M and 1G.

    python benchmarks/out_of_core.py [--model PATH] [--tokens 16] [--ctx 512] [--rams 512M 1G]
        [--fair-disk [DIR] | --no-fair-disk] [--read-ahead-kb 128]

For each budget, in a fresh process with the file evicted from the page cache: seconds per decode
token against the I/O bound (bytes streamed per token / O_DIRECT read bandwidth measured on the
same file in the same run), peak RSS against the budget, and the file's page-cache residency after.
llama.cpp (llama-cpp-python, mmap) runs on the same file for reference when it is importable.
Both read the model from a fair disk (benchmarks/fairdisk.py: a copy on a loop-mounted ext4 image,
direct I/O to its backing file, read-ahead 128 KiB) where root and losetup are; --no-fair-disk runs
from the file's own disk.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


from ramforge.cli.report import peak_rss  # noqa: E402  (VmHWM: the child's own peak, not its parent's)
from benchmarks import fairdisk  # noqa: E402

PROMPT = [1, 450, 4996, 17354, 1701, 29916]      # llama-spm ids


def child_ramforge(model: str, ram: str, tokens: int, ctx: int, io: str, threads: int | None = None,
                   prompt: list[int] | None = None, warm: bool = False) -> dict:
    """One budgeted run: seconds per decode token (the first decode pass left out), bytes read per
    token, and the prompt's tok/s. warm: first run the prompt and 2 decode steps, so the first kernel
    calls of the process are not timed (vs_llamacpp.py --ram; out_of_core.py times it cold)."""
    from ramforge.engine.engine import Engine
    from ramforge.memory import MemoryBudget, parse_memory_size
    from ramforge.profiling import PROFILE

    prompt = prompt or PROMPT
    budget = MemoryBudget(parse_memory_size(ram))
    t0 = time.perf_counter()
    with Engine.load(model, n_ctx=ctx, budget=budget, io=io, n_threads=threads) as e:
        load = time.perf_counter() - t0
        if warm:
            list(e.generate(prompt, 2, stop_on_eog=False))
        PROFILE.enabled = True
        PROFILE.reset()
        out = list(e.generate(prompt, tokens + 1, stop_on_eog=False))
        PROFILE.enabled = False
        s = PROFILE.summary()
        prefill_s = sum(p["seconds"] for p in s["passes"] if p["kind"] == "prefill")
        decode = [p for p in s["passes"] if p["kind"] == "decode"][1:]      # the first decode pass warms up
        per_tok = sum(p["seconds"] for p in decode) / len(decode)
        bytes_tok = sum(p["bytes_read"] for p in decode) / len(decode)
        wait_tok = sum(p["wait_s"] for p in decode) / len(decode)
        return {"ram": ram, "budget": budget.limit, "managed_peak": budget.peak, "planned_peak": e.plan.planned_peak,
                "pinned": len(e.plan.pinned), "n_layer": e.hp.n_layer, "load_s": load, "s_per_token": per_tok,
                "bytes_per_token": bytes_tok, "wait_per_token": wait_tok, "tokens": out,
                "n_prompt": len(prompt), "prefill_tok_s": len(prompt) / prefill_s if prefill_s > 0 else 0.0,
                "peak_rss": peak_rss()}


def child_llama(model: str, tokens: int, ctx: int) -> dict:
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model, n_ctx=ctx, n_threads=2, use_mmap=True, verbose=False)
    n_vocab = llm.n_vocab()

    def argmax() -> int:          # llm.scores is filled only with logits_all: read the last output's logits
        logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(n_vocab,))))
    llm.eval(PROMPT)
    times = []
    tok = argmax()
    for _ in range(tokens):
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
        tok = argmax()
    return {"s_per_token": sum(times[1:]) / len(times[1:]),
            "peak_rss": peak_rss()}


def run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_budgeted(model: str, ram: str, tokens: int, ctx: int, io: str, bw: float, threads: int = 0,
                 prompt: list[int] | None = None, warm: bool = False) -> dict:
    """child_ramforge in a fresh process, the file evicted from the page cache before; adds the
    storage bound (bytes streamed per token / bw, bw from probe_read_speed) and the file's page-cache
    residency after (fincore)."""
    from ramforge.stream.io import evict, page_cache_residency

    evict(model)
    r = run_child(["ramforge", model, ram, str(tokens), str(ctx), io, str(threads),
                   ",".join(map(str, prompt or PROMPT)), str(int(warm))])
    r["bound_s"] = r["bytes_per_token"] / bw
    r["cache_after"], _ = page_cache_residency(model)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--rams", nargs="+", default=["512M", "1G"])
    ap.add_argument("--io", default="direct")
    fairdisk.add_argument(ap)
    ap.add_argument("--child", nargs="+")
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "ramforge":      # model ram tokens ctx io threads (0: default) prompt-ids warm
            res = child_ramforge(*rest[:2], int(rest[2]), int(rest[3]), rest[4], int(rest[5]) or None,
                                 [int(t) for t in rest[6].split(",")], rest[7] == "1")
        else:
            res = child_llama(rest[0], int(rest[1]), int(rest[2]))
        print(json.dumps(res))
        return 0
    model = a.model
    if model is None:
        from tools.make_models import PRESETS, build

        model = str(build(PRESETS["llama-3b"], "Q4_K_M", keep_f16=False))
    with fairdisk.for_benchmark(a.fair_disk, model, a.read_ahead_kb) as (model, _):
        return bench(a, model)


def bench(a, model: str) -> int:
    """The measurements, reading `model` (on the fair disk, or the file itself)."""
    from ramforge.stream.io import evict, page_cache_residency, probe_read_speed

    size = os.path.getsize(model)
    print(f"model {model}: {size / 1e9:.2f} GB")
    evict(model)
    bw = probe_read_speed(model, nbytes=1 << 30)
    print(f"O_DIRECT read bandwidth on this file: {bw / 1e9:.2f} GB/s; the device's read_ahead_kb "
          f"{fairdisk.read_ahead_kb(model)}")
    for ram in a.rams:
        r = run_budgeted(model, ram, a.tokens, a.ctx, a.io, bw)
        bound, res = r["bound_s"], r["cache_after"]
        print(f"ramforge --ram {ram}: {r['s_per_token']:.3f} s/token, bound {bound:.3f} s "
              f"({r['bytes_per_token'] / 1e6:.0f} MB/token at {bw / 1e9:.2f} GB/s) -> {r['s_per_token'] / bound:.2f}x the "
              f"bound; I/O wait {r['wait_per_token']:.3f} s/token; pinned {r['pinned']}/{r['n_layer']} layers; "
              f"managed peak {r['managed_peak'] / 2**20:.0f} MiB (planned {r['planned_peak'] / 2**20:.0f}) of "
              f"{r['budget'] / 2**20:.0f} MiB; peak RSS {r['peak_rss'] / 2**20:.0f} MiB = budget + "
              f"{(r['peak_rss'] - r['budget']) / 2**20:.0f} MiB; page cache after: {res / 2**20:.1f} MiB "
              f"({100 * res / size:.1f}%)")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama.cpp: llama-cpp-python not importable; reference skipped")
        return 0
    evict(model)
    r = run_child(["llama", model, str(a.tokens), str(a.ctx)])
    res, _ = page_cache_residency(model)
    print(f"llama.cpp (mmap): {r['s_per_token']:.3f} s/token; peak RSS {r['peak_rss'] / 2**20:.0f} MiB; "
          f"page cache after: {res / 2**20:.0f} MiB ({100 * res / size:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
