"""Mixture-of-experts out-of-core benchmark: a synthetic model with Qwen3-30B-A3B's layer shape
(embedding 2048, 32 heads, 4 KV heads, head size 128, 128 experts, 8 used, 768-wide experts) for
5 of its 48 layers, Q4_K_M, ~2 GB, run at 1/4 and 1/2 of the file's size, by ramforge and by
llama.cpp under the same memory cap.

    python benchmarks/moe_out_of_core.py                      # builds the model once (needs llama-cpp-python)
    python benchmarks/moe_out_of_core.py --quick              # smoke run: tiny synthetic qwen3moe, 4 tokens
    python benchmarks/moe_out_of_core.py [--model PATH] [--rams 1/4 1/2 768M] [--tokens 32] [--ctx 512]
        [--threads 2] [--policies lru lfu] [--prefetch on off] [--llama-repack] [--no-llama]
        [--repeat 3] [--json OUT.json] [--fair-disk [DIR] | --no-fair-disk] [--read-ahead-kb 128]

The model is tools/make_models.py's preset qwen3moe-30b-a3b-5l, built into the fixture cache on first
use (F16 then llama.cpp's quantizer: ~4 minutes on 2 cores, 7 GB of disk for the F16 meanwhile).

Both engines read the model from a fair disk (benchmarks/fairdisk.py: a copy on a loop-mounted ext4
image, direct I/O to its backing file, read-ahead 128 KiB as a typical NVMe's) where root and losetup
are; --no-fair-disk runs from the file's own disk (this VM's reads 8 MiB around every mmap fault).
The device's O_DIRECT bandwidth for expert-sized random reads (one expert's gate/up/down slice, 1 and
4 readers) is measured on the file, and each ramforge run's read rate is given as a share of it: over the
whole decode, and while the device is busy (its own counters, /sys/dev/block/.../stat: how long it had a read
in flight a token, and its rate then; reads known only once a router has run leave it idle between them).

Every measurement runs in a fresh child process, with the file evicted from the page cache before
it (posix_fadvise DONTNEED, as `dd iflag=nocache count=0`) and its page-cache residency (mincore,
as `fincore`) read after it. Decode seconds per token leave out the first decode pass (warm-up).

ramforge: `Engine.load(model, budget=MemoryBudget(B), io=...)`, a short prompt, then N decode passes
that each feed the next token of a fixed English text (teacher forcing, as in both engines: a synthetic
model's greedy output soon repeats one token, and its routing with it, which would flatter any cache;
the argmax of every pass is compared between the engines), once per expert-cache configuration (`--policies`, `--prefetch`: passed to Engine.load as
expert_policy / expert_prefetch only where its signature takes them; otherwise one default run).
Per token: seconds, bytes read and I/O wait (ramforge.profiling), and the storage bound = bytes
read / the file's O_DIRECT sequential read bandwidth, measured in the same run; the expert cache's
stats() (hits, misses, prefetch figures: whatever keys it has), over the measured tokens and over
the whole run; managed peak vs planned peak; peak RSS vs the budget; per-token latency p50/p90/p99 (both
engines, every round's measured tokens together).

llama.cpp (llama-cpp-python, mmap on, weight repacking off: use_extra_bufts = false; `--llama-repack`
adds a run with it on), the same prompt tokens, token count, batch and threads, inside a cgroup-v1
memory cgroup of the budget's size: a new child of this process's memory cgroup, removed afterwards.
The cap covers everything the process charges (its anonymous memory and the page cache it faults
in); an OOM kill is reported, not raised. Bytes read per token come from /proc/<pid>/io.

Prints a table per budget and, with --json, writes every raw figure. On a shared machine, run it
when it is idle: the `busy` column gives the cores' worth of CPU other processes took during each run,
and with --threads equal to the core count one busy core slows both engines several-fold; --repeat N
runs N rounds, each measurement once a round (so runs compared are side by side in time), and reports
the median run (all of them in the JSON). With a budget above the file (e.g. --rams 1/4 16G), each
out-of-core run is set against the in-RAM one: its share of in-RAM speed round by round, and the causal
bound of tools/moe_bound.py.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from ramforge.cli.report import peak_rss  # noqa: E402  (VmHWM: the child's own peak, not its parent's)
from ramforge.profiling import ExpertRecord, latency_percentiles  # noqa: E402
from benchmarks import fairdisk  # noqa: E402
from benchmarks.fairdisk import read_ahead_kb  # noqa: E402,F401  (the readahead of the device holding a file)

PRESET = "qwen3moe-30b-a3b-5l"
PROMPT = "The history of the printing press begins in the fifteenth century, when"
# Decode steps feed this text's tokens one per pass (teacher forcing), in both engines: a synthetic
# model's greedy output soon repeats one token, and its routing with it, which no real text does.
TEXT = ("a goldsmith in Mainz combined movable metal type, an oil-based ink and a screw press adapted from "
        "winemaking. Within fifty years presses were running in more than two hundred cities across Europe, "
        "and the price of books fell so far that pamphlets, calendars and broadsheets reached readers who had "
        "never owned a manuscript. Scholars argue about how quickly literacy followed, but the volume of print "
        "is not in doubt: millions of volumes by 1500, and a trade in paper, type metal and skilled labour.")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


# ---------------------------------------------------------------------------------------------
# children (one measurement each; the last stdout line is the JSON result)

def _proc_io() -> dict:
    try:
        return {k: int(v) for k, v in (ln.split(": ") for ln in Path("/proc/self/io").read_text().splitlines())}
    except OSError:
        return {}


def _delta(after: dict, before: dict) -> dict:
    """Counters over a window: numeric values subtracted, rates recomputed from the deltas."""
    out = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(b, (int, float)) \
                and not k.endswith(("rate", "precision")) and k not in ("slots", "slot_bytes"):
            out[k] = v - b
        else:
            out[k] = v
    counts = {f.name: out[f.name] for f in fields(ExpertRecord) if f.name != "layer" and f.name in out}
    if counts:                                      # the rates as the record gives them, of the window's counts
        rec = ExpertRecord("window", **counts)
        out.update({k: v for k, v in rec.as_dict().items() if k not in vars(rec)})
    return out


def child_ramforge(c: dict) -> dict:
    import numpy as np

    from ramforge.engine.engine import Engine
    from ramforge.memory import MemoryBudget
    from ramforge.profiling import PROFILE

    budget = MemoryBudget(c["budget"])
    kw = {k: c[k] for k in ("expert_policy", "expert_prefetch") if c.get(k) is not None}
    t0 = time.perf_counter()
    with Engine.load(c["model"], n_ctx=c["ctx"], budget=budget, io=c["io"], batch=c["batch"],
                     n_threads=c["threads"], **kw) as e:
        load = time.perf_counter() - t0
        if c.get("trace"):                  # the routing, for moe_bound's Belady replay
            from ramforge.models import routing_trace
            routing_trace.attach(e, c["trace"])
        cache = getattr(e.weights, "expert_cache", None)
        stats = (lambda: dict(cache.stats())) if cache is not None else (lambda: {})
        PROFILE.enabled = True
        PROFILE.reset()
        out, io0, st0, ru0 = [], {}, {}, None
        out.append(int(np.argmax(e.eval(c["prompt"], aligned=True)[-1])))
        for i, tok in enumerate(c["text"][:c["tokens"]]):
            out.append(int(np.argmax(e.eval([tok])[-1])))
            if i == 0:               # the first decode pass (warm-up) is done: the measured window opens
                io0, st0, ru0 = _proc_io(), stats(), resource.getrusage(resource.RUSAGE_SELF)
                ops0 = dict(PROFILE.ops)
                dev0 = fairdisk.device_reads(c["model"])
        io1, st1, ru1 = _proc_io(), stats(), resource.getrusage(resource.RUSAGE_SELF)
        dev1 = fairdisk.device_reads(c["model"])
        PROFILE.enabled = False
        s = PROFILE.summary()
        prefill = [p for p in s["passes"] if p["kind"] != "decode"]
        decode_all = [p for p in s["passes"] if p["kind"] == "decode"]
        decode = decode_all[1:]
        n = len(decode)
        p = e.plan
        plan = {k: getattr(p, k, None) for k in (
            "verdict", "min_budget", "resident_budget", "resident", "pinned", "n_buffers", "buffer_bytes",
            "embd_row_bytes", "experts_apart", "expert_slots", "expert_slot_bytes", "streamed_bytes_per_token")}
        experts_s = sum(v - ops0.get(k, 0.0) for k, v in PROFILE.ops.items() if k.startswith("experts"))
        experts_rd = sum(r["bytes_read"] for q in decode for r in q["layers"] if str(r["layer"]).startswith("experts"))
        return {
            "engine": "ramforge", "config": {k: c.get(k) for k in ("expert_policy", "expert_prefetch", "io")},
            "budget": budget.limit, "managed_peak": budget.peak, "planned_peak": p.planned_peak, "plan": plan,
            "n_layer": e.hp.n_layer, "load_s": load,
            "prefill_s": sum(q["seconds"] for q in prefill), "measured_tokens": n,
            "s_per_token": sum(q["seconds"] for q in decode) / n,
            "token_s": [q["seconds"] for q in decode_all],   # every decode pass, the warm-up first (as llama.cpp's)
            "bytes_per_token": sum(q["bytes_read"] for q in decode) / n,
            "expert_bytes_per_token": experts_rd / n,
            "expert_compute_per_token": experts_s / n,       # the experts' matmuls (ops "experts ...")
            "wait_per_token": sum(q["wait_s"] for q in decode) / n,
            "os_read_bytes_per_token": (io1.get("read_bytes", 0) - io0.get("read_bytes", 0)) / n,
            "majflt_per_token": (ru1.ru_majflt - ru0.ru_majflt) / n,
            "expert_cache": st1, "expert_cache_decode": _delta(st1, st0),
            "compile_s": s["compile_s"], "tokens": out,
            "device_busy_per_token": (dev1[1] - dev0[1]) / n if dev0 and dev1 else None,
            "device_bytes_per_token": (dev1[0] - dev0[0]) / n if dev0 and dev1 else None,
            "peak_rss": peak_rss(),
            "ramforge_file": sys.modules["ramforge"].__file__,
        }


def child_llama(c: dict) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as C
    import numpy as np

    if not c["repack"]:                  # llama_model_params.use_extra_bufts: the Llama constructor has no
        default = C.llama_model_default_params     # argument for it; it fills its params from this function

        def no_repack():
            p = default()
            p.use_extra_bufts = False
            return p
        C.llama_model_default_params = no_repack
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(c["model"], n_ctx=c["ctx"], n_batch=c["batch"], n_ubatch=c["batch"],
                          n_threads=c["threads"], n_threads_batch=c["threads"], use_mmap=True, verbose=False)
    load = time.perf_counter() - t0
    n_vocab = llm.n_vocab()

    def argmax() -> int:     # Llama.scores is filled only with logits_all: read the last output's logits
        return int(np.argmax(np.ctypeslib.as_array(C.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))))
    t0 = time.perf_counter()
    llm.eval(c["prompt"])
    prefill = time.perf_counter() - t0
    out, times = [argmax()], []
    io0, ru0 = {}, None
    for i, tok in enumerate(c["text"][:c["tokens"]]):
        if i == 1:
            io0, ru0 = _proc_io(), resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        llm.eval([tok])
        times.append(time.perf_counter() - t)
        out.append(argmax())
        print(f"progress {i + 1} {times[-1]:.3f}", flush=True)      # how far it got, if it is killed
    io1, ru1 = _proc_io(), resource.getrusage(resource.RUSAGE_SELF)
    n = len(times) - 1
    return {"engine": "llama.cpp", "config": {"repack": c["repack"], "mmap": True,
                                              "use_extra_bufts": bool(llm.model_params.use_extra_bufts)},
            "load_s": load, "prefill_s": prefill, "measured_tokens": n, "s_per_token": sum(times[1:]) / n,
            "token_s": times, "os_read_bytes_per_token": (io1.get("read_bytes", 0) - io0.get("read_bytes", 0)) / n,
            "majflt_per_token": (ru1.ru_majflt - ru0.ru_majflt) / n, "tokens": out,
            "peak_rss": peak_rss()}


def child_main(kind: str, cfg: str) -> int:
    c = json.loads(cfg)
    try:
        res = child_ramforge(c) if kind == "ramforge" else child_llama(c)
    except Exception as ex:                  # a typed refusal (e.g. BudgetTooSmall) is a result, not a crash
        res = {"engine": "llama.cpp" if kind == "llama" else kind, "error": f"{type(ex).__name__}: {ex}",
               "minimum": getattr(ex, "minimum", None)}
    print(json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# the memory cgroup (v1) and the parent's child runner

class MemoryCgroup:
    """A new child of this process's cgroup-v1 memory cgroup with memory.limit_in_bytes = limit;
    `prefix()` is a shell prefix that moves the command into it before exec. Removed on exit."""

    def __init__(self, limit: int, tag: str):
        self.limit, self.tag, self.path = limit, tag, None

    @staticmethod
    def parent() -> Path:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, rel = line.split(":", 2)
            if "memory" in ctrls.split(","):
                return CGROUP_V1 / rel.lstrip("/")
        raise RuntimeError("no cgroup-v1 memory controller in /proc/self/cgroup")

    def __enter__(self) -> "MemoryCgroup":
        self.path = self.parent() / f"ramforge-bench-{os.getpid()}-{self.tag}"
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            got = int((self.path / "memory.limit_in_bytes").read_text())
            if got > self.limit:
                raise RuntimeError(f"{self.path}: asked a limit of {self.limit}, got {got}")
        except BaseException:
            self.path.rmdir()
            raise
        return self

    def prefix(self) -> str:
        return f"echo $$ > {shlex.quote(str(self.path / 'cgroup.procs'))} && exec "

    def figures(self) -> dict:
        r = lambda n: (self.path / n).read_text()
        oom = dict(ln.split() for ln in r("memory.oom_control").splitlines())
        stat = dict(ln.split() for ln in r("memory.stat").splitlines())
        return {"limit": int(r("memory.limit_in_bytes")), "max_usage": int(r("memory.max_usage_in_bytes")),
                "failcnt": int(r("memory.failcnt")), "oom_kill": int(oom.get("oom_kill", 0)),
                "under_oom": int(oom.get("under_oom", 0)),
                **{k: int(stat[k]) for k in ("cache", "rss", "mapped_file", "pgmajfault") if k in stat}}

    def __exit__(self, *exc) -> None:
        procs = self.path / "cgroup.procs"
        for _ in range(50):                  # our child has exited; wait out a straggler, never kill others
            if not procs.read_text().split():
                break
            time.sleep(0.1)
        try:
            self.path.rmdir()
        except OSError as ex:
            print(f"warning: could not remove {self.path}: {ex}", file=sys.stderr)


def _cpu_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat), and its clock tick."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_child(kind: str, cfg: dict, timeout: float, cgroup: MemoryCgroup | None = None) -> dict:
    cmd = " ".join(shlex.quote(x) for x in (sys.executable, __file__, "--child", kind, json.dumps(cfg)))
    if cgroup is not None:
        cmd = cgroup.prefix() + cmd
    load = os.getloadavg()[0]            # the machine may be shared: a busy one slows both sides
    busy0, own0, t0 = _cpu_busy_s(), _children_cpu_s(), time.perf_counter()
    p = subprocess.Popen(["/bin/sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)          # our own child, by pid
        out, err = p.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    other = max(0.0, (_cpu_busy_s() - busy0) - (_children_cpu_s() - own0)) / wall
    lines = out.strip().splitlines()
    res = None
    if lines and lines[-1].startswith("{"):
        res = json.loads(lines[-1])
    if res is None:
        done = [ln.split() for ln in lines if ln.startswith("progress ")]
        res = {"engine": "llama.cpp" if kind == "llama" else kind,
               "error": "timed out" if timed_out else f"exit status {p.returncode}",
               "returncode": p.returncode, "stderr": err[-2000:],
               "tokens_done": len(done), "token_s": [float(x[2]) for x in done]}
    res["returncode"], res["timed_out"], res["loadavg_before"] = p.returncode, timed_out, load
    res["other_cpu"] = other             # cores' worth of CPU other processes used during the run
    if cgroup is not None:
        res["cgroup"] = cgroup.figures()
        res["oom_killed"] = (p.returncode == -signal.SIGKILL and not timed_out) or res["cgroup"]["oom_kill"] > 0
    return res


# ---------------------------------------------------------------------------------------------
# the parent

def parse_ram(s: str, size: int) -> int:
    """'1/4' or '0.25' (of the file) or a size ('768M', '1G', bytes)."""
    from ramforge.memory import parse_memory_size

    if "/" in s:
        a, b = s.split("/")
        return int(size * float(a) / float(b))
    try:
        x = float(s)
        if x <= 4:
            return int(size * x)
    except ValueError:
        pass
    return parse_memory_size(s)


def prompt_tokens(model: str) -> tuple[list[int], list[int]]:
    """The prompt's tokens and the decode text's."""
    from ramforge.gguf.reader import GGUFFile
    from ramforge.tokenizer import load_tokenizer

    with GGUFFile(model) as f:
        tok = load_tokenizer(f.metadata)
        return tok.encode(PROMPT), tok.encode(" " + TEXT, add_special=False)


def ramforge_configs(policies: list[str] | None, prefetch: list[str] | None) -> tuple[list[dict], list[str]]:
    """The expert-cache configurations Engine.load can take, and notes on the ones it cannot."""
    from ramforge.engine.engine import Engine

    params = inspect.signature(Engine.load).parameters
    notes = []
    pol: list = [None]
    if policies:
        if "expert_policy" in params:
            pol = policies
        else:
            notes.append(f"Engine.load has no expert_policy: --policies {' '.join(policies)} ignored")
    pre: list = [None]
    if prefetch:
        if "expert_prefetch" in params:
            pre = [x == "on" for x in prefetch]
        else:
            notes.append(f"Engine.load has no expert_prefetch: --prefetch {' '.join(prefetch)} ignored")
    return [{"expert_policy": a, "expert_prefetch": b} for a in pol for b in pre], notes


def label(r: dict) -> str:
    c = r.get("config", {})
    if r["engine"] == "llama.cpp":
        return "llama.cpp " + ("repack" if c.get("repack") else "mmap, no repack")
    parts = [c["expert_policy"] if c.get("expert_policy") else "default"]
    if c.get("expert_prefetch") is not None:
        parts.append("prefetch " + ("on" if c["expert_prefetch"] else "off"))
    return "ramforge " + ", ".join(parts)


def _pf_rate(st: dict):
    """Reads ahead that were picked, of those made (None where none were made)."""
    hits, issued = st.get("prefetch_hits"), st.get("prefetch_issued")
    return hits / issued if hits is not None and issued else None


def table(runs: list[dict], bw: float) -> str:
    """One row per run. MB/tok: bytes read per measured token (ramforge: its profile; llama.cpp: the
    process's storage reads, /proc/<pid>/io, as `io MB/tok` for both); bound: those bytes at the
    O_DIRECT bandwidth; RSS-budget: peak RSS (VmHWM) - budget (llama.cpp's counts its mapped file and shared
    libraries; its cgroup's peak charge is `cg` under peak/plan); cache MiB: the file's page cache after
    the run; same: greedy tokens equal to the first ramforge run's; busy: cores' worth of CPU that other
    processes took during the run (a shared machine: with --threads = the core count, a busy core slows
    both engines, ramforge's many short parallel kernels most)."""
    def fmt(x, f):
        return "-" if x is None else format(x, f)
    llama = next((r for r in runs if r["engine"] == "llama.cpp" and not r.get("config", {}).get("repack")
                  and "s_per_token" in r), None)
    rows = [f"{'':28s} {'s/tok':>7s} {'llama/rf':>8s} {'MB/tok':>7s} {'io MB/tok':>9s} {'wait/tok':>8s} "
            f"{'bound s':>7s} {'x bound':>7s} {'hit%':>5s} {'pf-hit%':>7s} {'RSS-budget':>10s} "
            f"{'peak/plan MiB':>13s} {'cache MiB':>9s} {'same':>4s} {'busy':>4s}"]
    for r in runs:
        name = label(r)
        pc = fmt(r.get("page_cache_after") and r["page_cache_after"] / 2**20, ".0f")
        if "s_per_token" not in r:
            why = r.get("error", "?")
            if r.get("oom_killed"):
                why = (f"OOM-killed after {r.get('tokens_done', 0)} decode tokens (cgroup oom_kill "
                       f"{r['cgroup']['oom_kill']}, failcnt {r['cgroup']['failcnt']})")
            rows.append(f"{name:28s} {why[:160]}")
            continue
        s, io = r["s_per_token"], r.get("os_read_bytes_per_token")
        rd = r.get("bytes_per_token", io)
        bound = rd / bw if rd else None
        hit = pf = ratio = wait = None
        if r["engine"] == "ramforge":
            st = r.get("expert_cache_decode") or {}
            hit, pf = st.get("hit_rate"), _pf_rate(st)
            ratio = llama["s_per_token"] / s if llama else None
            peak = f"{r['managed_peak'] / 2**20:.0f}/{r['planned_peak'] / 2**20:.0f}"
            wait = r["wait_per_token"]
        else:
            peak = f"cg {r['cgroup']['max_usage'] / 2**20:.0f}" if "cgroup" in r else "-"
        over = (r["peak_rss"] - r["budget_bytes"]) / 2**20
        rows.append(f"{name:28s} {s:7.3f} {fmt(ratio, '8.2f')} {fmt(rd / 1e6, '7.1f')} "
                    f"{fmt(io if io is None else io / 1e6, '9.1f')} {fmt(wait, '8.3f')} {fmt(bound, '7.3f')} "
                    f"{fmt(bound and s / bound, '7.2f')} {fmt(hit if hit is None else 100 * hit, '5.1f')} "
                    f"{fmt(pf if pf is None else 100 * pf, '7.1f')} {over:+9.0f}M {peak:>13s} {pc:>9s} "
                    f"{ {True: 'yes', False: 'NO'}.get(r.get('tokens_match'), '-'):>4s} "
                    f"{fmt(r.get('other_cpu'), '4.1f')}")
    return "\n".join(rows)


def latency(r: dict) -> dict | None:
    """The measured decode tokens' latency percentiles over the run and its repeats (token_p50_s, _p90_s, _p99_s:
    ramforge.profiling's), each run's warm-up pass left out as in s/token; None without per-token times."""
    ts = [t for x in [r, *r.get("repeats", [])] for t in x.get("token_s", [])[1:]]
    return latency_percentiles(ts, "token") if ts else None


def median(rs: list[dict]) -> dict:
    """The run of median s/token (a failed run, if any failed), the others kept under "repeats"."""
    bad = [r for r in rs if "s_per_token" not in r]
    pick = bad[0] if bad else sorted(rs, key=lambda r: r["s_per_token"])[(len(rs) - 1) // 2]
    if len(rs) > 1:
        pick["repeats"] = [{k: v for k, v in r.items() if k != "tokens"} for r in rs if r is not pick]
    return pick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help=f"a GGUF file (default: the {PRESET} preset at Q4_K_M, built once)")
    ap.add_argument("--rams", nargs="+", help="budgets: fractions of the file (1/4, 0.5) or sizes (768M); "
                                              "default 1/4 1/2")
    ap.add_argument("--tokens", type=int, help="decode tokens (the first is warm-up); default 32, --quick 4")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, help="prompt batch, ramforge's and llama.cpp's n_batch (default 64, "
                                               "--quick 8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io", default="direct", help="ramforge --io: direct, buffered or mmap")
    ap.add_argument("--policies", nargs="+", help="expert cache policies, e.g. lru lfu (where Engine.load takes one)")
    ap.add_argument("--prefetch", nargs="+", choices=["on", "off"], help="expert prefetch on/off (ditto)")
    ap.add_argument("--llama-repack", action="store_true", help="also run llama.cpp with weight repacking on")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per child run before it is killed")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (fresh process, file evicted); "
                                                           "the median s/token is reported")
    ap.add_argument("--quick", action="store_true", help="smoke run on the tiny synthetic qwen3moe, 4 tokens")
    ap.add_argument("--json", help="write all raw figures here")
    fairdisk.add_argument(ap)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child_main(*a.child)

    from tools._fixtures import llama_cpp_or_none

    have_llama = llama_cpp_or_none() is not None
    model = a.model
    if model is None:
        from tools.make_models import PRESETS, build, ensure_model

        if a.quick:
            model = str(ensure_model("qwen3moe", "Q8_0" if have_llama else "F16"))
        else:
            model = str(build(PRESETS[PRESET], "Q4_K_M", keep_f16=False))
    with fairdisk.for_benchmark(a.fair_disk, model, a.read_ahead_kb) as (model, disk):
        return bench(a, model, disk, have_llama)


def expert_read_bytes(model: str) -> int | None:
    """Bytes of one expert's slice of the first layer's ffn_gate_exps (ramforge reads an expert's gate, up
    and down slices apart), or None for a model without experts."""
    from ramforge.gguf.reader import GGUFFile

    with GGUFFile(model) as f:
        t = f.tensors.get("blk.0.ffn_gate_exps.weight")
        return t.nbytes // t.dims[2] if t is not None and len(t.dims) == 3 else None


def bench(a, model: str, disk, have_llama: bool) -> int:
    """The measurements, on `model` (a copy on the fair disk `disk`, or the file itself where disk is None)."""

    from ramforge.stream.io import evict, page_cache_residency, probe_read_speed

    tokens = a.tokens or (4 if a.quick else 32)
    rams = a.rams or (["1/2", "256M"] if a.quick else ["1/4", "1/2"])     # (256M: the tiny model resident)
    a.batch = a.batch or (8 if a.quick else 64)
    size = os.path.getsize(model)
    prompt, text = prompt_tokens(model)
    if tokens > len(text):
        raise SystemExit(f"error: --tokens {tokens}: the decode text has {len(text)} tokens")
    configs, notes = ramforge_configs(a.policies, a.prefetch)
    import ramforge

    print(f"model {model}: {size / 1e9:.3f} GB; prompt {len(prompt)} tokens, {tokens} decode tokens "
          f"(first one warm-up), ctx {a.ctx}, batch {a.batch}, {a.threads} threads; ramforge from "
          f"{Path(ramforge.__file__).parent}")
    for n in notes:
        print("note:", n)
    evict(model)
    bw = probe_read_speed(model, nbytes=min(1 << 30, size // 2) >> 20 << 20)   # whole MiB: O_DIRECT-aligned
    ra = read_ahead_kb(model)
    print(f"O_DIRECT sequential read bandwidth on this file: {bw / 1e9:.2f} GB/s; the device's read_ahead_kb "
          f"{ra} (an mmap fault reads around up to this much); load average {os.getloadavg()[0]:.2f}")
    xb = expert_read_bytes(model)
    expert_bw = [fairdisk.measure_bandwidth(model, xb, n) for n in (1, 4)] if xb else []
    bw_x = max((b.bytes_per_s for b in expert_bw), default=None)
    for b in expert_bw:
        print(f"O_DIRECT random reads of one expert's slice: {b.describe()}")
    llama_runs = [] if a.no_llama or not have_llama else [False] + ([True] if a.llama_repack else [])
    if not have_llama and not a.no_llama:
        print("llama.cpp: llama-cpp-python not importable; its side is skipped")
    report = {"model": model, "size": size, "prompt": prompt, "tokens": tokens, "ctx": a.ctx, "batch": a.batch,
              "threads": a.threads, "io": a.io, "bandwidth": bw, "read_ahead_kb": ra, "repeat": a.repeat,
              "notes": notes, "budgets": [], "fair_disk": asdict(disk.status()) if disk else None,
              "expert_read_bytes": xb, "expert_read_bandwidth": [asdict(b) for b in expert_bw]}
    common = {"model": model, "ctx": a.ctx, "batch": a.batch, "threads": a.threads, "tokens": tokens,
              "prompt": prompt, "text": text}
    tmp = tempfile.TemporaryDirectory(prefix="ramforge-moe-bench-")
    trace = Path(tmp.name) / "routing.npz" if xb else None

    def ramforge_run(cfg: dict, limit: int) -> dict:
        evict(model)
        if trace is not None and not trace.exists():    # one routing trace: every run routes alike
            cfg = {**cfg, "trace": str(trace)}
        r = run_child("ramforge", {**common, **cfg, "budget": limit, "io": a.io}, a.timeout)
        r["page_cache_after"], _ = page_cache_residency(model)
        if r.get("compile_s", 0) > 0.5:  # it compiled kernels (their cache was cold): that inflates the
            again = ramforge_run(cfg, limit)    # process's peak RSS, so measure again with the cache warm
            again["compiling_run"] = r
            return again
        return r

    def llama_run(repack: bool, limit: int, tag: str) -> dict:
        evict(model)
        try:
            with MemoryCgroup(limit, f"{tag}-{int(repack)}") as cg:
                r = run_child("llama", {**common, "repack": repack}, a.timeout, cg)
                r["page_cache_after"], _ = page_cache_residency(model)
                evict(model)             # drop what it faulted in while its cgroup still holds the charge
        except (OSError, RuntimeError) as ex:
            r = {"engine": "llama.cpp", "error": f"no memory cgroup: {ex}"}
        r.setdefault("config", {"repack": repack})
        return r

    limits = [parse_ram(ram, size) for ram in rams]
    done: dict[tuple, list[dict]] = {}      # (budget, engine, config) -> its runs, a round each
    for rnd in range(a.repeat):             # rounds: every measurement once a round, so that the ratios
        for b, (ram, limit) in enumerate(zip(rams, limits)):        # between them are side by side in time
            jobs = [(("rf", c), lambda c=c: ramforge_run(configs[c], limit)) for c in range(len(configs))]
            jobs += [(("llama", rp), lambda rp=rp: llama_run(rp, limit, f"{b}-{rnd}")) for rp in llama_runs]
            for key, job in jobs:
                r = job()
                r["round"] = rnd
                done.setdefault((b, *key), []).append(r)
                print(f"round {rnd + 1}/{a.repeat}, budget {ram}: {label(r)} "
                      + (f"{r['s_per_token']:.3f} s/token" if "s_per_token" in r else r.get("error", "?")[:80]), flush=True)
    for b, (ram, limit) in enumerate(zip(rams, limits)):
        print(f"\n== budget {ram} = {limit / 2**20:.0f} MiB ({100 * limit / size:.0f}% of the file) ==", flush=True)
        runs = [median(done[(b, "rf", c)]) for c in range(len(configs))]
        runs += [median(done[(b, "llama", rp)]) for rp in llama_runs]
        for r in runs:
            r["budget_bytes"] = limit
        ref = next((r["tokens"] for r in runs if r["engine"] == "ramforge" and "tokens" in r), None)
        for r in runs:
            if "tokens" in r and ref is not None:
                r["tokens_match"] = r["tokens"] == ref
        print(table(runs, bw))
        for r in runs:
            if r.get("repeats"):
                each = [r] + r["repeats"]
                print(f"  {label(r)}: s/token by round (busy cores) " + ", ".join(
                    f"{x['s_per_token']:.3f} ({x['other_cpu']:.1f})" if "s_per_token" in x else x.get("error", "?")[:30]
                    for x in sorted(each, key=lambda x: x["round"])))
            if bw_x and r["engine"] == "ramforge" and r.get("s_per_token"):
                r["read_share_of_expert_bw"] = r["bytes_per_token"] / r["s_per_token"] / bw_x
                print(f"  {label(r)}: reads {r['bytes_per_token'] / r['s_per_token'] / 1e9:.3f} GB/s while decoding = "
                      f"{100 * r['read_share_of_expert_bw']:.0f}% of the device's {bw_x / 1e9:.2f} GB/s for "
                      f"expert-sized reads")
                busy, dbytes = r.get("device_busy_per_token"), r.get("device_bytes_per_token")
                if busy and dbytes:               # the device's own counters: busy time, and its rate while busy
                    r["busy_share"], r["busy_read_share_of_expert_bw"] = busy / r["s_per_token"], dbytes / busy / bw_x
                    print(f"  {label(r)}: the device busy {1e3 * busy:.1f} ms a token ({100 * r['busy_share']:.0f}% of "
                          f"it), reading {dbytes / busy / 1e9:.3f} GB/s while busy = "
                          f"{100 * r['busy_read_share_of_expert_bw']:.0f}% of its bandwidth for expert-sized reads")
            lat = latency(r)
            if lat:
                r["latency"] = lat
                p50, p90, p99 = lat["token_p50_s"], lat["token_p90_s"], lat["token_p99_s"]
                print(f"  {label(r)}: per-token latency over its rounds p50 {p50:.3f}, p90 {p90:.3f}, p99 {p99:.3f} s "
                      f"(p99 {p99 / p50:.2f}x the median)")
            st = r.get("expert_cache_decode")
            if st:
                print(f"  {label(r)}: expert cache over the measured tokens {st}")
            if r["engine"] == "llama.cpp" and "cgroup" in r:
                print(f"  {label(r)}: cgroup {r['cgroup']}; returncode {r['returncode']}; "
                      f"OOM-killed {r['oom_killed']}" + (f"; {r['stderr'][-300:]!r}" if r.get("stderr") else ""))
            if "tokens_match" in r and not r["tokens_match"]:
                print(f"  {label(r)}: tokens differ from ramforge's: {r['tokens']} vs {ref}")
        report["budgets"].append({"ram": ram, "budget": limit, "runs": runs})
    if bw_x and trace is not None and trace.exists():
        report["causal_bounds"] = causal_bounds(report["budgets"], model, trace, bw_x)
    tmp.cleanup()
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"\nraw figures: {a.json}")
    return 0


def causal_bounds(budgets: list[dict], model: str, trace: Path, bw_x: float) -> list[dict]:
    """tools/moe_bound.py's bounds for each out-of-core ramforge run, against the in-RAM ramforge run
    of the same invocation (a budget above the file: no bytes read), printed; [] without one."""
    from tools.moe_bound import causal_bound, replay
    from ramforge.gguf.reader import GGUFFile
    from ramforge.models.weights import EXPERT_TENSORS, gguf_name
    from ramforge.stream.experts import DEFAULT_POLICY
    from ramforge.stream.layout import expert_span

    runs = [r for b in budgets for r in b["runs"] if r["engine"] == "ramforge" and "s_per_token" in r]
    ram = next((r for r in runs if r["bytes_per_token"] == 0), None)
    if ram is None:
        print("\n(no in-RAM ramforge run, e.g. --rams 1/4 16G: no causal bound)")
        return []
    with GGUFFile(model) as f:
        per_expert = expert_span([f.tensors[gguf_name(s, 0)] for s in EXPERT_TENSORS], 0).nbytes
        k = int(f.metadata[f"{f.metadata['general.architecture']}.expert_used_count"])
    t, e, x = ram["s_per_token"], ram["expert_compute_per_token"], per_expert / bw_x
    print(f"\ncausal bound (tools/moe_bound.py, no reading ahead): in RAM {t:.4f} s/token, {e:.4f} of it in "
          f"expert matmuls; an expert's read {per_expert / 1e6:.2f} MB, {1e3 * x:.2f} ms at {bw_x / 1e9:.2f} GB/s")
    out = []
    for r in runs:
        slots = (r.get("plan") or {}).get("expert_slots")
        if r is ram or not slots:
            continue
        dense = r["bytes_per_token"] - (r.get("expert_cache_decode") or {}).get("bytes_read", 0) / r["measured_tokens"]
        if dense > 0.01 * r["bytes_per_token"]:   # streamed layers too: reads known ahead, not bounded here
            print(f"  {label(r)}: streams {dense / 1e6:.1f} MB a token besides its experts: no causal bound")
            continue
        s, own = r["s_per_token"], (r.get("config") or {}).get("expert_policy") or DEFAULT_POLICY.value
        busy, dbytes = r.get("device_busy_per_token"), r.get("device_bytes_per_token")
        rate = dbytes / busy if busy and dbytes else None      # what the device gave this run while reading
        row = {}
        for policy in (own, "belady"):
            rp = replay(trace, slots, policy)
            row[policy] = {"misses_per_token": rp.misses_per_token, "bound": causal_bound(t, e, k, x, rp),
                           "bound_at_run_rate": rate and causal_bound(t, e, k, per_expert / rate, rp)}
            b, b2 = row[policy]["bound"], row[policy]["bound_at_run_rate"]
            print(f"  {label(r)} at {r['budget_bytes'] / 2**20:.0f} MiB ({slots} slots), {policy} replayed: "
                  f"{rp.misses_per_token:.2f} misses a token; bound {b:.4f} s/token = {t / b:.2f}x in-RAM speed"
                  + (f" ({b2:.4f} s = {t / b2:.2f}x at the {rate / 1e9:.2f} GB/s the device read at in this run)"
                     if b2 else ""))
        by_round = {x["round"]: x["s_per_token"] for x in [ram] + ram.get("repeats", []) if "s_per_token" in x}
        share = sorted(by_round[x["round"]] / x["s_per_token"] for x in [r] + r.get("repeats", [])
                       if "s_per_token" in x and x["round"] in by_round)
        if len(share) > 1:
            print(f"  {label(r)}: share of in-RAM speed round by round (the same round's in-RAM run): "
                  f"median {share[(len(share) - 1) // 2]:.2f}, {share[0]:.2f}-{share[-1]:.2f}")
        roof, bound = max(t, r["bytes_per_token"] / bw_x), row[own]["bound"]
        print(f"  {label(r)}: measured {s:.4f} s/token = {t / s:.2f}x in-RAM speed, {s / bound:.2f}x its policy's "
              f"bound; the roofline max(in RAM, its reads / bandwidth) {roof:.4f} s: that bound {bound / roof:.2f}x "
              f"it, measured {s / roof:.2f}x")
        out.append({"budget": r["budget_bytes"], "config": r.get("config"), "slots": slots, "s_per_token": s,
                    "t_ram": t, "e_ram": e, "expert_read_s": x, "roofline": roof, "bounds": row,
                    "share_by_round": share})
    return out


if __name__ == "__main__":
    sys.exit(main())
