"""ramforge vs llama.cpp (llama-cpp-python 0.3.36) on the same file, prompt and threads, alternating.

    python benchmarks/vs_llamacpp.py [--models default llama-250m:Q4_0 llama-3b:Q4_K_M PATH ...]
                                     [--preset 1b 3b] [--types Q4_0 Q4_K_M Q5_K_M Q6_K Q8_0 IQ4_XS]
                                     [--threads 2] [--prompt-tokens 128] [--gen 32] [--rounds 3]
                                     [--interleave K]
                                     [--contend 0 1] [--ram 512M] [--json PATH]

--preset 1b / 3b: synthetic models of Llama-3.2-1B's / 3B's shape (tools/make_models.py's llama-1b,
llama-3b presets; random weights, the llama-spm vocab) in each of --types (default: the six above).
Build them first, one preset at a time (minutes each):
    nice -n 19 python tools/make_models.py --preset llama-1b --types Q4_0 Q4_K_M Q5_K_M Q6_K Q8_0 IQ4_XS
(a missing model is built on demand, its F16 intermediate deleted after).

Prints, per model and contention level, the median prefill and decode tok/s of each engine, the
ratios ramforge / llama.cpp, and the GB/s of weights one decode token reads (every layer tensor and
the output matrix, one embedding row: plan.active_bytes_per_token) over the time per decode token.
The machine is shared and noisy: rounds alternate the two so both see the same conditions.
--interleave K: within a round, both prompts first, then the decodes alternate every K tokens (a
neighbour's burst of memory traffic, seconds long, then slows both engines' decode alike, not one
engine's whole round); 0 (default): each engine's prompt and decode in turn.

--contend N [N ...]: run every model under each N busy processes (a spin loop each, beside both
engines, killed after); with 0 among them, also the decode ratio contended / quiet of each engine.
--ram SIZE: also ramforge out of core under that budget (benchmarks/out_of_core.py's child, in a fresh
process, the file evicted first): prefill tok/s beside llama.cpp's in-RAM figure, seconds per decode
token beside the storage bound (bytes streamed per token / the file's O_DIRECT read speed), and the
file's page-cache residency after (the in-RAM engines are closed first so their mappings do not count).
--json PATH: every figure, rewritten after each model.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import ramforge  # noqa: E402,F401  (before llama_cpp loads libgomp: ramforge's GOMP_SPINCOUNT holds for both engines)

PRESETS = {"250m": "llama-250m", "1b": "llama-1b", "3b": "llama-3b"}     # --preset -> make_models preset
TYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS")
ENGINES = ("ramforge", "llama.cpp")
# a busy process: spins until its parent is gone (no orphans if this one is killed outright)
SPIN = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(1000000): pass\n"


def model_path(spec: str) -> str:
    if spec == "default":
        from ramforge.store.resolve import default_model_path

        return str(default_model_path())
    if ":" in spec and not Path(spec).exists():
        from tools.make_models import PRESETS as BUILD, build, ensure_model

        name, qtype = spec.split(":")
        if name in BUILD:                       # e.g. llama-250m:Q4_0, built once into the fixture cache
            return str(build(BUILD[name], qtype.upper(), keep_f16=False, verbose=True))
        return str(ensure_model(name, qtype))
    return spec


def weight_bytes_per_token(path: str) -> int:
    """Bytes of the weights one decode token reads: every layer tensor and the output matrix, one
    embedding row (and the few norms outside the layers)."""
    from ramforge.gguf.reader import GGUFFile
    from ramforge.stream.plan import make_plan

    with GGUFFile(path) as f:
        return make_plan(f, None).active_bytes_per_token


@contextlib.contextmanager
def busy(n: int):
    """n spinning processes for the duration of the block, killed after (error and ^C included)."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN]))
        if n:
            time.sleep(0.5)                     # let them start spinning
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def prompt_ids(tok, n: int) -> list[int]:
    base = tok.encode("The history of the printing press begins in the fifteenth century, when ", add_special=False)
    return ([tok.bos_id] if tok.add_bos else []) + (base * n)[: n - 1]


class Timed:
    """One engine's prompt and its greedy decode, timed: prefill(ids) -> seconds, then decode(n) -> seconds
    (n more tokens, from where the last call left off)."""

    def __init__(self, eng):
        self.eng, self.tok = eng, 0


class Ramforge(Timed):
    def prefill(self, ids) -> float:
        self.eng.reset()
        t0 = time.perf_counter()
        self.tok = int(np.argmax(self.eng.eval(ids)[-1]))
        return time.perf_counter() - t0

    def decode(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            self.tok = int(np.argmax(self.eng.eval([self.tok])[-1]))
        return time.perf_counter() - t0


class Llama(Timed):
    def prefill(self, ids) -> float:
        llm = self.eng
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        self.tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return time.perf_counter() - t0

    def decode(self, n: int) -> float:
        llm = self.eng
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([self.tok])
            self.tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return time.perf_counter() - t0


def one_round(engines, ids, gen: int, interleave: int) -> list[tuple[float, float]]:
    """(prefill tok/s, decode tok/s) of each engine. interleave 0: each engine's prompt and decode in turn;
    K > 0: both prompts, then the decodes alternate every K tokens, so that both meet the same moments of
    a noisy machine (a neighbour's burst of memory traffic lasts seconds, a round of one engine as long)."""
    if interleave <= 0:
        return [(len(ids) / e.prefill(ids), gen / e.decode(gen)) for e in engines]
    pre = [len(ids) / e.prefill(ids) for e in engines]
    spent = [0.0] * len(engines)
    for done in range(0, gen, interleave):
        for i, e in enumerate(engines):
            spent[i] += e.decode(min(interleave, gen - done))
    return [(p, gen / t) for p, t in zip(pre, spent)]


def compare(eng, llm, ids: list[int], gen: int, rounds: int, wbytes: int, interleave: int = 0) -> dict:
    """Warm both (the whole prompt: a first call of each batch shape is not timed), then `rounds`
    alternating rounds (one_round); medians, ratios and decode GB/s."""
    engines = (Ramforge(eng), Llama(llm))
    one_round(engines, ids, 2, 0)
    raw = {"ramforge": [], "llama.cpp": []}
    for _ in range(rounds):
        for name, x in zip(raw, one_round(engines, ids, gen, interleave)):
            raw[name].append(x)
    out = {}
    for name, xs in raw.items():
        p, d = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        out[name] = {"prefill_tok_s": p, "decode_tok_s": d, "decode_gb_s": wbytes * d / 1e9,
                     "rounds": [{"prefill_tok_s": x[0], "decode_tok_s": x[1]} for x in xs]}
    r, c = out["ramforge"], out["llama.cpp"]
    out["ratio"] = {k: r[k] / c[k] for k in ("prefill_tok_s", "decode_tok_s")}
    return out


def print_run(res: dict) -> None:
    print(f"  {'':10s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'decode GB/s':>12s}")
    for name in ENGINES:
        x = res[name]
        print(f"  {name:10s} {x['prefill_tok_s']:14.1f} {x['decode_tok_s']:13.2f} {x['decode_gb_s']:12.2f}")
    q = res["ratio"]
    print(f"  {'ratio':10s} {q['prefill_tok_s']:13.2f}x {q['decode_tok_s']:12.2f}x {q['decode_tok_s']:11.2f}x",
          flush=True)


def print_ooc(o: dict, llama_prefill: float) -> None:
    print(f"  ramforge --ram {o['ram']} (out of core, pinned {o['pinned']}/{o['n_layer']} layers): prefill "
          f"{o['prefill_tok_s']:.1f} tok/s = {o['prefill_tok_s'] / llama_prefill:.2f}x llama.cpp in RAM; decode "
          f"{o['s_per_token']:.3f} s/token, storage bound {o['bound_s']:.3f} s ({o['bytes_per_token'] / 1e6:.0f} "
          f"MB/token at {o['read_gb_s']:.2f} GB/s O_DIRECT) = {o['s_per_token'] / max(o['bound_s'], 1e-12):.2f}x "
          f"the bound; I/O wait {o['wait_per_token']:.3f} s/token; peak RSS {o['peak_rss'] / 2**20:.0f} MiB; "
          f"page cache after {o['cache_after'] / 2**20:.1f} MiB ({100 * o['cache_after'] / o['file_bytes']:.1f}%)",
          flush=True)


def contention_summary(runs: list[dict]) -> list[dict]:
    """Each contended level against the quietest one (0 if run): decode contended / quiet per engine."""
    quiet = min(runs, key=lambda r: r["contend"])
    out = []
    for r in runs:
        if r is quiet:
            continue
        s = {"contend": r["contend"], "quiet": quiet["contend"],
             "ratio_quiet": quiet["ratio"]["decode_tok_s"], "ratio_contended": r["ratio"]["decode_tok_s"],
             **{f"{e}_contended_over_quiet": r[e]["decode_tok_s"] / quiet[e]["decode_tok_s"] for e in ENGINES}}
        out.append(s)
        print(f"  decode, {s['contend']} busy vs {s['quiet']}: ramforge / llama.cpp {s['ratio_quiet']:.2f}x -> "
              f"{s['ratio_contended']:.2f}x; contended / quiet: ramforge {s['ramforge_contended_over_quiet']:.2f}x, "
              f"llama.cpp {s['llama.cpp_contended_over_quiet']:.2f}x", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", help="default | arch:TYPE | make_models preset:TYPE | PATH "
                    "(default without --preset: default llama-250m:Q4_0 llama-250m:Q8_0 llama-250m:Q6_K)")
    ap.add_argument("--preset", nargs="+", choices=list(PRESETS), default=[],
                    help="synthetic models of that size in each of --types")
    ap.add_argument("--types", nargs="+", type=str.upper, default=list(TYPES), help="the types of --preset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interleave", type=int, default=0, metavar="K",
                    help="decode tokens alternate between the engines every K (0: a whole round each)")
    ap.add_argument("--contend", nargs="+", type=int, default=[0], metavar="N",
                    help="busy processes beside both engines; several: each in turn (0 1: quiet, then one)")
    ap.add_argument("--ram", help="also ramforge out of core under this budget (e.g. 512M)")
    ap.add_argument("--io", default="direct", help="--ram's I/O mode")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args()
    specs = (a.models or ([] if a.preset else ["default", "llama-250m:Q4_0", "llama-250m:Q8_0", "llama-250m:Q6_K"]))
    specs += [f"{PRESETS[p]}:{t}" for p in a.preset for t in a.types]
    from tools.make_models import ALL_TYPES

    if set(a.types) - set(ALL_TYPES):
        ap.error(f"unknown --types {sorted(set(a.types) - set(ALL_TYPES))}; choose from {ALL_TYPES}")
    if a.interleave < 0:
        ap.error("--interleave must be 0 (whole rounds) or a number of tokens")
    if a.ram and a.gen < 2:
        ap.error("--ram needs --gen 2 or more (the first decode pass is left out)")
    report = {"threads": a.threads, "prompt_tokens": a.prompt_tokens, "gen": a.gen, "rounds": a.rounds,
              "interleave": a.interleave,
              "contend": a.contend, "ram": a.ram, "cpus": os.cpu_count(), "models": []}
    try:
        for spec in specs:
            run_model(a, spec, report)
    finally:
        if a.json:
            a.json.write_text(json.dumps(report, indent=1))
    return 0


def run_model(a, spec: str, report: dict) -> None:
    """Every figure of one model into report["models"]."""
    import llama_cpp

    from ramforge.engine.engine import Engine

    path = model_path(spec)
    size, wbytes = os.path.getsize(path), weight_bytes_per_token(path)
    n_ctx = a.prompt_tokens + a.gen + 16
    bw = None
    if a.ram:                               # before the in-RAM engines read the file
        from ramforge.stream.io import evict, probe_read_speed

        evict(path)
        bw = probe_read_speed(path, nbytes=1 << 30)
    eng = Engine.load(path, n_ctx=n_ctx, n_threads=a.threads)
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=a.threads,
                          n_threads_batch=a.threads, verbose=False)
    ids = prompt_ids(eng.tokenizer, a.prompt_tokens)
    m = {"model": spec, "path": path, "file_bytes": size, "weight_bytes_per_token": wbytes, "runs": []}
    report["models"].append(m)
    try:
        for n in a.contend:
            with busy(n):
                print(f"{Path(path).name} ({size / 1e9:.2f} GB, {wbytes / 1e9:.3f} GB of weights per decode "
                      f"token): {a.threads} threads, {len(ids)} prompt tokens, {a.gen} generated, median of "
                      f"{a.rounds}{f', decodes alternating every {a.interleave} tokens' if a.interleave > 0 else ''}, "
                      f"{n} busy processes", flush=True)
                res = {"contend": n, **compare(eng, llm, ids, a.gen, a.rounds, wbytes, a.interleave)}
            m["runs"].append(res)
            print_run(res)
    finally:
        eng.close()
        llm.close()
        del llm
    if a.ram:                               # the in-RAM engines closed: their mappings hold no pages
        from benchmarks.out_of_core import run_budgeted

        for res in m["runs"]:
            with busy(res["contend"]):
                o = run_budgeted(path, a.ram, a.gen, n_ctx, a.io, bw, a.threads, ids, warm=True)
            res["out_of_core"] = o | {"read_gb_s": bw / 1e9, "file_bytes": size}
            print(f"{Path(path).name}, {res['contend']} busy processes:")
            print_ooc(res["out_of_core"], res["llama.cpp"]["prefill_tok_s"])
    if len(m["runs"]) > 1:
        m["contended_vs_quiet"] = contention_summary(m["runs"])
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
