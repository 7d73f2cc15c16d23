"""Parallel sequences (continuous batching) against one: total and per-request tokens/s, in RAM and out of core.

    python benchmarks/parallel.py [MODEL] [--ns 1 2 4] [--gen 32] [--prompt 32] [--ctx 1024]
                                  [--rams 4G 64M] [--reps 3] [--threads T] [--json PATH]

MODEL defaults to `default` (the embedded gemma-3-270m Q4_K_M, resolved as the CLI resolves it).
A configuration is a budget (--rams: one large enough that nothing streams is "in RAM", a small one
such as 64M is out of core: layers and the output stream every pass) and N parallel sequences: the
engine loaded with n_seq=N (`Model(n_seq=N)`, `ramforge serve --parallel N`: a slot of PAD(ctx / N,
256) KV cells each; the same --ctx for every N, so every configuration has the same plan) under
ramforge.generation.batcher.Batcher, and N requests with distinct prompts (--prompt tokens of text) submitted
at once, each generating --gen greedy tokens. Each configuration runs in a fresh process, the model
file evicted from the page cache before (as benchmarks/out_of_core.py); inside it, one untimed round
of N requests (other prompts, N + 2 tokens) first, so the first pass of every batch shape (kernels
loaded from numba's cache, buffers touched) is left out of the timed round.

Reported per configuration: total tokens/s (N * gen / the wall time from submitting the N requests
to the last token, joins included), per-request tokens/s (gen / each request's own wall time from
submission, median over the requests) and its decode rate (gen - 1 over the time from its first
token to its last), the median seconds of a full decode pass (N tokens, one per slot), the passes
over the weights (one per ubatch: prompts joining while others decode take two, their first tokens
beside the others' and the rest together, as llama.cpp's split_equal cuts the batch), weight bytes read
per pass and per generated token (--profile's records), the I/O wait, the ratio of
total tokens/s to the N=1 configuration of the same budget in the same round, the managed peak,
the file's page-cache residency after the process ended (fincore-like: mincore on a fresh mapping),
the load average when each configuration started, and two checks of every request's tokens:
`= replay`, they equal a replay of the scheduler's passes (Batcher(log=True)) through
Engine.eval_batch on a fresh engine in RAM (must hold: a mismatch is a bug, in the batcher or out of
core); `= solo`, they equal a solo greedy run of the prompt (Engine.generate, one sequence, in RAM,
computed once in its own process). The second need not hold: a request that joins while others
decode has its prompt cut as llama.cpp's split_equal cuts it (its first token in the ubatch of the
others' tokens, the rest in the next), and a ubatch of 4+ tokens takes the batch kernels; on
gemma-3-270m a prompt's logits move by up to ~1.0 between a 32-token ubatch and 1 + 31 (llama.cpp's
as well, bit for bit), so a near tie may flip; the first differing token is printed.
Configurations run interleaved: with --reps R, R rounds of every (budget, N), the ratios taken within
a round and medians reported.
The issue's target (issue 17): out of core, 4 parallel sequences >= 3x the total tokens/s of one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TEXTS = [
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps aloud while the wind "
    "pushed against the old glass windows and the sea below turned from green to a deep and restless grey.",
    "To bake a simple loaf of bread you need flour, water, salt and yeast; mix them, knead the dough for ten "
    "minutes, let it rise until doubled, shape it, and bake it in a hot oven until the crust sounds hollow.",
    "In 1969 the first humans walked on the Moon. The mission took years of planning by thousands of "
    "engineers, scientists and technicians, and it was watched on television by hundreds of millions of people.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "# print the first ten numbers of the sequence and their sum\nvalues = [fibonacci(i) for i in range(10)]\n",
    "Dear committee, I am writing to apply for the position of research assistant advertised last month. "
    "My background in statistics and field ecology has prepared me well for the survey work described.",
    "Photosynthesis converts light energy into chemical energy: chlorophyll absorbs red and blue light, water "
    "is split, oxygen is released, and carbon dioxide is fixed into sugars in the Calvin cycle of the leaf.",
    "The train left the station twelve minutes late. Maria checked her ticket again, found her seat by the "
    "window, and watched the grey suburbs give way to fields, rivers and low hills covered in morning fog.",
    "A good password is long, unique to each site, and stored in a password manager; reusing one password "
    "everywhere means that a single leaked database can expose your email, your bank and your social accounts.",
]


def prompts(tok, n: int, length: int) -> list[list[int]]:
    """n distinct prompts of exactly `length` tokens (BOS and the start of TEXTS[i])."""
    out = []
    for i in range(n):
        ids = tok.encode(TEXTS[i % len(TEXTS)] + (f" ({i // len(TEXTS)})" if i >= len(TEXTS) else ""))
        if len(ids) < length:
            raise SystemExit(f"text {i} has only {len(ids)} tokens; --prompt {length} is too long")
        out.append(ids[:length])
    return out


def warm_prompts(n: int, length: int, n_vocab: int) -> list[list[int]]:
    """Other prompts of the same length (token ids), for the untimed round."""
    return [[(97 * i + 13 * j + 1000) % (n_vocab - 300) + 200 for j in range(length)] for i in range(n)]


def child_solo(model: str, n: int, n_prompt: int, gen: int, ctx: int, threads: int | None) -> dict:
    """The reference: each prompt alone, greedy, Engine.generate with one sequence, in RAM."""
    from ramforge.engine.engine import Engine

    with Engine.load(model, n_ctx=ctx, n_threads=threads) as eng:
        res = []
        for p in prompts(eng.tokenizer, n, n_prompt):
            eng.reset()
            res.append(list(eng.generate(p, gen, stop_on_eog=False)))
        return {"tokens": res}


def child_parallel(model: str, ram: str, n: int, n_prompt: int, gen: int, ctx: int, threads: int | None) -> dict:
    from ramforge.generation.batcher import Batcher
    from ramforge.engine.engine import Engine
    from ramforge.jit import COMPILE
    from ramforge.memory import MemoryBudget, parse_memory_size
    from ramforge.profiling import PROFILE
    from ramforge.cli.report import peak_rss

    budget = MemoryBudget(parse_memory_size(ram))
    t0 = time.perf_counter()
    with Engine.load(model, n_ctx=ctx, budget=budget, n_threads=threads, n_seq=n) as eng:
        load_s = time.perf_counter() - t0
        b = Batcher(eng, max_wait=600.0, log=True)
        try:
            def round_(ps: list[list[int]], g: int) -> tuple[float, list[list[int]], list[tuple[float, float]]]:
                """All of ps submitted at once; (t_submit, tokens, (first, last) token times) per request."""
                toks: list[list[int]] = [[] for _ in ps]
                times: list[list[float]] = [[] for _ in ps]
                errs: list[BaseException] = []
                start = time.perf_counter()
                streams = [b.generate(p, g, stop_on_eog=False) for p in ps]     # each joins a slot now

                def consume(i: int) -> None:
                    try:
                        for t in streams[i]:
                            toks[i].append(t)
                            times[i].append(time.perf_counter())
                    except BaseException as e:             # noqa: BLE001 (reported by the parent)
                        errs.append(e)
                th = [threading.Thread(target=consume, args=(i,)) for i in range(len(ps))]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                if errs:
                    raise errs[0]
                return start, toks, [(ts[0], ts[-1]) for ts in times]

            # untimed: every batch shape of the timed round once (joins, then N tokens a pass)
            round_(warm_prompts(n, n_prompt, eng.hp.n_vocab), n + 2)
            ps = prompts(eng.tokenizer, n, n_prompt)
            c0 = COMPILE.seconds
            b.schedule = []
            PROFILE.enabled = True
            PROFILE.reset()
            start, toks, spans = round_(ps, gen)
            PROFILE.enabled = False
            compile_s = COMPILE.seconds - c0
            schedule = list(b.schedule)
        finally:
            b.close()
        s = PROFILE.summary()
        passes = s["passes"]
        wall = max(last for _, last in spans) - start
        full = [p["seconds"] for p in passes if p["kind"] == "decode" and p["n_tokens"] == n]
        read = sum(p["bytes_read"] for p in passes)
        rec = {"ram": ram, "n": n, "ctx": ctx, "budget": budget.limit, "gen": gen, "prompt": n_prompt, "load_s": load_s,
                "compile_s": compile_s, "wall_s": wall, "total_tok_s": n * gen / wall,
                "per_request_tok_s": [gen / (last - start) for _, last in spans],
                "decode_tok_s": [(gen - 1) / (last - first) if last > first else 0.0 for first, last in spans],
                "passes": len(passes), "full_pass_s": statistics.median(full) if full else 0.0,
                "pass_seconds": sum(p["seconds"] for p in passes),
                "bytes_read": read, "bytes_per_pass": read / max(len(passes), 1), "bytes_per_token": read / (n * gen),
                "wait_s": sum(p["wait_s"] for p in passes),
                "pinned": len(eng.plan.pinned), "n_layer": eng.hp.n_layer,
                "streamed_per_pass_plan": eng.plan.streamed_bytes_per_token,
                "managed_peak": budget.peak, "peak_rss": peak_rss(),
                "tokens": toks}
    rec["charged_after_close"] = budget.current                       # a leak if not 0
    rec["replay"] = replay(model, ctx, n, schedule, ps, gen)          # after the budgeted engine closed
    return rec


def replay(model: str, ctx: int, n: int, schedule: list, ps: list[list[int]], gen: int) -> list[list[int]]:
    """The scheduler's passes (Batcher(log=True)) again through Engine.eval_batch on a fresh engine in RAM,
    greedy: each request's tokens as the batched decode computes them (tests/test_parallel.py's replay)."""
    from ramforge.generation.batcher import replay as replay_passes
    from ramforge.engine.engine import Engine

    with Engine.load(model, n_ctx=ctx, n_seq=n) as eng:
        segs = replay_passes(eng, schedule)
    return [next(o for t, o in segs if t == p)[:gen] for p in ps]


def report(rows: list[dict]) -> None:
    """The table: medians over rounds of every (budget, N), then notes (compiling, tokens unlike solo)."""
    med = statistics.median
    rams = list(dict.fromkeys(r["ram"] for r in rows))
    ns = list(dict.fromkeys(r["n"] for r in rows))
    r0 = rows[0]
    print(f"model {r0.get('model', '')} ({r0['file_size'] / 2**20:.0f} MiB), prompts of {r0['prompt']} tokens, "
          f"{r0['gen']} generated each, ctx {r0.get('ctx', '?')}, {len({r['rep'] for r in rows})} round(s); "
          f"medians over rounds" + (f"; load average {min(r['load'] for r in rows):.1f}-"
                                    f"{max(r['load'] for r in rows):.1f} at the starts" if "load" in rows[0] else ""))
    print(f"{'budget':>7s} {'streams':>7s} {'N':>2s} {'tok/s total':>11s} {'x N=1':>6s} {'tok/s/req':>9s} "
          f"{'dec tok/s/req':>13s} {'pass s':>7s} {'passes':>6s} {'MiB/pass':>8s} {'MiB/token':>9s} {'I/O wait s':>10s} "
          f"{'peak MiB':>8s} {'page cache after':>16s} {'= replay':>8s} {'= solo':>6s}")
    for ram in rams:
        for n in ns:
            g = [r for r in rows if r["ram"] == ram and r["n"] == n]
            if not g:
                continue
            r0 = g[0]
            rep = sum(sum(t == x for t, x in zip(r["tokens"], r["replay"])) for r in g if "replay" in r)
            solo = sum(sum(r["same_as_solo"]) for r in g if r["same_as_solo"] is not None)
            total = sum(len(r["tokens"]) for r in g)
            ratio = [r["ratio_to_1"] for r in g if r["ratio_to_1"] is not None]
            cache = med(r["cache_after"] for r in g)
            print(f"{ram:>7s} {'yes' if r0['streamed_per_pass_plan'] else 'no':>7s} {n:2d} "
                  f"{med(r['total_tok_s'] for r in g):11.2f} {med(ratio) if ratio else float('nan'):6.2f} "
                  f"{med(med(r['per_request_tok_s']) for r in g):9.2f} {med(med(r['decode_tok_s']) for r in g):13.2f} "
                  f"{med(r['full_pass_s'] for r in g):7.3f} {med(r['passes'] for r in g):6.0f} "
                  f"{med(r['bytes_per_pass'] for r in g) / 2**20:8.1f} {med(r['bytes_per_token'] for r in g) / 2**20:9.1f} "
                  f"{med(r['wait_s'] for r in g):10.2f} {max(r['managed_peak'] for r in g) / 2**20:8.1f} "
                  f"{cache / 2**20:9.1f} ({100 * cache / r0['file_size']:3.0f}%) "
                  f"{f'{rep}/{total}':>8s} {f'{solo}/{total}' if g[0]['same_as_solo'] is not None else '-':>6s}")
        r0 = next(r for r in rows if r["ram"] == ram)
        print(f"  --ram {ram}: {r0['pinned']}/{r0['n_layer']} layers pinned, plan streams "
              f"{r0['streamed_per_pass_plan'] / 2**20:.1f} MiB per pass")
    for r in rows:
        if r.get("charged_after_close"):
            print(f"round {r['rep']} --ram {r['ram']} N={r['n']}: {r['charged_after_close']:,} B still charged after "
                  f"the engine closed (a leak)")
        if r["compile_s"] > 0.05:
            print(f"round {r['rep']} --ram {r['ram']} N={r['n']}: {r['compile_s']:.2f} s of compiling in the timed round")
        for i, t in enumerate(r["tokens"]):
            if "replay" in r and t != r["replay"][i]:
                print(f"round {r['rep']} --ram {r['ram']} N={r['n']}: request {i} differs from the replay of its "
                      f"passes (a bug)")
        for i, k in enumerate(r.get("first_diff") or []):
            if r["same_as_solo"][i] is False:
                print(f"round {r['rep']} --ram {r['ram']} N={r['n']}: request {i} differs from its solo run "
                      f"from generated token {k} on")


def run_child(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"child {args[-3:]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--ns", nargs="+", type=int, default=[1, 2, 4], help="parallel sequences per configuration")
    ap.add_argument("--gen", type=int, default=32, help="tokens each request generates")
    ap.add_argument("--prompt", type=int, default=32, help="tokens of each request's prompt")
    ap.add_argument("--ctx", type=int, default=1024, help="the context, split into N slots")
    ap.add_argument("--rams", nargs="+", default=["4G", "64M"], help="budgets (one that holds everything: in RAM)")
    ap.add_argument("--reps", type=int, default=3, help="rounds of every configuration, interleaved")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-check", action="store_true", help="skip the solo greedy reference")
    ap.add_argument("--json", metavar="PATH", help="also write every configuration's record (tokens too) there")
    ap.add_argument("--table", metavar="PATH", help="print the table of a --json file and exit")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.table:
        report(json.loads(Path(a.table).read_text()))
        return 0
    from ramforge.store.resolve import resolve_model
    model = str(resolve_model(a.model))
    threads = a.threads or None
    if a.child:
        kind, *rest = a.child
        if kind == "solo":
            res = child_solo(model, int(rest[0]), a.prompt, a.gen, a.ctx, threads)
        else:
            res = child_parallel(model, rest[0], int(rest[1]), a.prompt, a.gen, a.ctx, threads)
        print(json.dumps(res))
        return 0
    from ramforge.stream.io import evict, page_cache_residency

    common = [model, "--gen", str(a.gen), "--prompt", str(a.prompt), "--ctx", str(a.ctx), "--threads", str(a.threads)]
    ref = None if a.no_check else run_child([*common, "--child", "solo", str(max(a.ns))])["tokens"]
    rows = []
    for rep in range(a.reps):
        for ram in a.rams:
            for n in a.ns:
                evict(model)
                load = os.getloadavg()[0]
                r = run_child([*common, "--child", "par", ram, str(n)])
                r["load"] = load
                r["cache_after"], r["file_size"] = page_cache_residency(model)
                r["rep"], r["model"] = rep, model
                r["same_as_solo"] = None if ref is None else [t == ref[i] for i, t in enumerate(r["tokens"])]
                r["first_diff"] = None if ref is None else [  # the first generated token that differs (None: none)
                    next((j for j, (x, y) in enumerate(zip(t, ref[i])) if x != y), None) for i, t in enumerate(r["tokens"])]
                rows.append(r)
                print(f"  round {rep} --ram {ram} N={n}: {r['total_tok_s']:.2f} tok/s total", file=sys.stderr, flush=True)
    for r in rows:
        one = next((x for x in rows if x["rep"] == r["rep"] and x["ram"] == r["ram"] and x["n"] == 1), None)
        r["ratio_to_1"] = r["total_tok_s"] / one["total_tok_s"] if one else None
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
