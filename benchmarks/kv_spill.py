"""The KV cache spilled to storage against the same context in RAM: a long prompt under a small budget.

    python benchmarks/kv_spill.py [MODEL] [--ctx 4096] [--prompt 4000] [--gen 8] [--ram 64M]
                                  [--kv-type f16] [--modes spill auto ram] [--json]

Each mode runs in a fresh process with the model file evicted from the page cache first (as
`dd if=F iflag=nocache count=0`): the prompt (--prompt tokens, aligned as llama.cpp splits it), then
--gen greedy tokens under --profile's records. `spill`: --ram as given, the KV cache spilled (forced: the least tail in RAM, 320 positions a layer for
f16 at chunks of 64). `auto`: --ram as given, spilled only if the budget cannot hold the cache (its tail
then holds what the cache in RAM would have). `ram`: the cache in RAM, the budget raised by exactly the difference between the whole cache and the
spilled cache's charge, so the weights get the same room in both. Reported per mode: prefill seconds,
seconds per decode token (the first decode pass left out), weight and KV bytes read per decode token,
the managed peak against the budget, and whether the decode tokens agree.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child(model: str, mode: str, ctx: int, n_prompt: int, gen: int, ram: str, kind: str, threads: int | None) -> dict:
    from ramforge.engine.engine import Engine
    from ramforge.gguf.reader import GGUFFile
    from ramforge.memory import MemoryBudget, parse_memory_size
    from ramforge.stream.plan import plan_for_budget
    from ramforge.profiling import PROFILE
    from ramforge.stream.io import evict

    budget = parse_memory_size(ram)
    if mode == "ram":                    # the same room for the weights: the budget plus the cache's difference
        with GGUFFile(model) as f:
            sp = plan_for_budget(f, budget, ctx, type_k=kind, type_v=kind, kv_spill=True)
        budget += sp.kv_bytes_per_pos * ctx - sp.kv_bytes
    evict(model)
    b = MemoryBudget(budget)
    t0 = time.perf_counter()
    with Engine.load(model, n_ctx=ctx, budget=b, type_k=kind, type_v=kind, n_threads=threads,
                     kv_spill={"spill": True, "auto": None, "ram": False}[mode]) as eng:
        load_s = time.perf_counter() - t0
        ids = [(7 * i) % (eng.hp.n_vocab - 3) + 2 for i in range(n_prompt)]
        PROFILE.enabled = True
        PROFILE.reset()
        out = list(eng.generate(ids, gen + 1, stop_on_eog=False))
        PROFILE.enabled = False
        s = PROFILE.summary()
        prefill = [p for p in s["passes"] if p["kind"] == "prefill"]
        decode = [p for p in s["passes"] if p["kind"] == "decode"][1:]      # the first decode pass warms up
        n = max(len(decode), 1)
        return {"mode": mode, "model": model, "ctx": ctx, "prompt": n_prompt, "kv_type": kind, "budget": budget,
                "spilled": bool(eng.plan.kv_spill), "kv_tail": eng.plan.kv_tail, "load_s": load_s,
                "prefill_s": sum(p["seconds"] for p in prefill),
                "prefill_kv_bytes": sum(p["kv_bytes_read"] for p in prefill),
                "s_per_token": sum(p["seconds"] for p in decode) / n,
                "weight_bytes_per_token": sum(p["bytes_read"] for p in decode) / n,
                "kv_bytes_per_token": sum(p["kv_bytes_read"] for p in decode) / n,
                "wait_s_per_token": sum(p["wait_s"] for p in decode) / n,
                "plan_kv_read_bytes_per_token": eng.plan.kv_read_bytes_per_token,
                "kv_charged": eng.kv.nbytes, "kv_whole": eng.kv.full_bytes,
                "managed_peak": b.peak, "pinned": len(eng.plan.pinned), "n_layer": eng.hp.n_layer, "tokens": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=4000, help="prompt tokens (the context filled before decoding)")
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--ram", default="64M")
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", nargs="+", choices=["spill", "auto", "ram"], default=["spill", "auto", "ram"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from ramforge.store.resolve import resolve_model
    model = str(resolve_model(a.model))
    if a.child:
        print(json.dumps(child(model, a.child, a.ctx, a.prompt, a.gen, a.ram, a.kv_type, a.threads)))
        return 0
    rows = []
    for mode in a.modes:
        cmd = [sys.executable, __file__, model, "--ctx", str(a.ctx), "--prompt", str(a.prompt), "--gen", str(a.gen),
               "--ram", a.ram, "--kv-type", a.kv_type, "--child", mode]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    for r in rows:
        r["same_tokens"] = r["tokens"] == rows[-1]["tokens"]          # against the last mode (ram by default)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['mode']:5s} (tail {r['kv_tail']}) ctx {r['ctx']} prompt {r['prompt']} {r['kv_type']} budget {r['budget'] / 2**20:.1f} MiB "
              f"(KV charged {r['kv_charged'] / 2**20:.1f} of {r['kv_whole'] / 2**20:.1f} MiB, peak "
              f"{r['managed_peak'] / 2**20:.1f} MiB, {r['pinned']}/{r['n_layer']} layers pinned): prefill "
              f"{r['prefill_s']:.1f} s; decode {r['s_per_token']:.3f} s/token, weights "
              f"{r['weight_bytes_per_token'] / 2**20:.1f} MiB + KV {r['kv_bytes_per_token'] / 2**20:.2f} MiB read "
              f"per token (plan: {r['plan_kv_read_bytes_per_token'] / 2**20:.2f}), I/O wait "
              f"{r['wait_s_per_token'] * 1e3:.1f} ms/token" + (f"; same tokens: {r['same_tokens']}"
                                                               if "same_tokens" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
