"""--profile and --memory-report: gather the figures (plain dicts) and render them with rich on stderr."""
from __future__ import annotations

import resource
from contextlib import contextmanager

import psutil
from rich.console import Console
from rich.table import Table

from ..memory import format_bytes
from ..stream.io import page_cache_residency

err = Console(stderr=True, highlight=False, soft_wrap=True)
COMPILING = "compiling kernels for this CPU — first run only"


@contextmanager
def compile_notice(console: Console = err):
    """While numba compiles (ramforge.jit.COMPILE), a status line on stderr (a spinner on a terminal,
    one plain line otherwise); after the block, one line with the seconds compiling took."""
    from ..jit import COMPILE

    status = console.status(COMPILING, spinner="dots") if console.is_terminal else None
    seen = [0.0, False]                             # seconds, announced (plain mode)

    def begin():
        if status is not None:
            status.start()
        elif not seen[1]:
            console.print(f"{COMPILING}…")
            seen[1] = True

    def end(dt):
        seen[0] += dt
        if status is not None:
            status.stop()

    with COMPILE.hooks(begin, end):
        try:
            yield
        finally:
            if status is not None:
                status.stop()
            if seen[0]:
                console.print(f"compiled kernels in {seen[0]:.1f} s (cached for later runs)")


def peak_rss() -> int:
    """This process's resident high-water mark, bytes: /proc/self/status VmHWM, which starts over at exec.
    getrusage's ru_maxrss keeps the parent's RSS at fork across the exec (a benchmark's child forked after
    two in-RAM 3B engines reported 5 GB under --ram 512M); it stands in where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_report(eng) -> dict:
    """Managed current/peak/budget, process RSS and peak RSS, the model's page-cache residency."""
    resident, size = page_cache_residency(eng.path)
    vm = psutil.virtual_memory()
    return {
        "managed_current": eng.budget.current, "managed_peak": eng.budget.peak, "budget": eng.budget.limit,
        "planned_peak": eng.plan.planned_peak,                    # at a full context (the KV cache grows as it fills)
        "kv_charged": eng.kv.nbytes, "kv_full": eng.kv.full_bytes, "kv_types": [eng.kv.type_k, eng.kv.type_v],
        "kv_spill": getattr(eng.kv, "dir", None),                # the spill files' directory, if it spills
        "rss": psutil.Process().memory_info().rss,
        "peak_rss": peak_rss(),
        "model_file_bytes": size, "page_cache_bytes": resident,
        "page_cache_fraction": resident / size if size else 0.0,
        "system_available": vm.available, "system_total": vm.total,
        "charges": eng.budget.charges()[:12],
    }


def render_memory(m: dict) -> None:
    t = Table(title="memory")
    t.add_column("what"), t.add_column("bytes", justify="right"), t.add_column("", justify="right")
    budget = m["budget"]
    rows = [("ramforge-managed now", m["managed_current"]), ("ramforge-managed peak", m["managed_peak"]),
            ("planned peak (a full context)", m["planned_peak"]),
            (f"KV cache ({'/'.join(m['kv_types'])}) charged now", m["kv_charged"]),
            ("KV cache at a full context", m["kv_full"]),
            ("budget", budget), ("process RSS", m["rss"]),
            ("process peak RSS", m["peak_rss"]), ("model file in page cache", m["page_cache_bytes"]),
            ("model file", m["model_file_bytes"]), ("system available", m["system_available"])]
    for name, v in rows:
        t.add_row(name, "unlimited" if v is None else f"{v:,}", "" if v is None else format_bytes(v))
    err.print(t)
    err.print(f"page cache holds {100 * m['page_cache_fraction']:.1f}% of the model file")
    if m.get("kv_spill"):
        err.print(f"the KV cache spills to {m['kv_spill']} (charged: its tails and read buffers)")


def render_profile(p: dict, timings: dict) -> None:
    passes = p["passes"]
    decode = [q for q in passes if q["kind"] == "decode"]
    last = decode[-1] if decode else (passes[-1] if passes else None)
    if last:
        t = Table(title=f"per layer, last {last['kind']} pass ({last['n_tokens']} tokens, {last['seconds'] * 1e3:.1f} ms)")
        for c in ("layer", "resident", "bytes read", "read ms", "wait ms", "compute ms"):
            t.add_column(c, justify="left" if c == "layer" else "right")
        for r in last["layers"]:
            t.add_row(str(r["layer"]), "pinned" if r["resident"] else "streamed", f"{r['bytes_read']:,}",
                      f"{r['read_s'] * 1e3:.2f}", f"{r['wait_s'] * 1e3:.2f}", f"{r['compute_s'] * 1e3:.2f}")
        err.print(t)
    if last and last.get("experts"):
        render_experts(last, p["experts"], len([q for q in passes if q["experts"]]))
    t = Table(title="per token")
    # kernel ms: inside compiled kernels; python ms: the rest of the pass (orchestration, I/O wait)
    spilled = p.get("kv_bytes_read", 0) > 0      # a spilled KV cache: its K/V read back, beside the weights
    for c in ("pass", "kind", "tokens", "ms", "kernel ms", "python ms", "kernel calls", "bytes read",
              *(("KV bytes read",) if spilled else ()), "wait ms"):
        t.add_column(c, justify="right")
    for i, q in enumerate(passes):
        t.add_row(str(i), q["kind"], str(q["n_tokens"]), f"{q['seconds'] * 1e3:.1f}", f"{q['kernel_s'] * 1e3:.1f}",
                  f"{q['python_s'] * 1e3:.1f}", str(q["kernel_calls"]), f"{q['bytes_read']:,}",
                  *((f"{q.get('kv_bytes_read', 0):,}",) if spilled else ()), f"{q['wait_s'] * 1e3:.2f}")
    err.print(t)
    t = Table(title="compute by op class")
    t.add_column("op"), t.add_column("calls", justify="right"), t.add_column("s", justify="right")
    for op, s in sorted(p["ops_s"].items(), key=lambda kv: -kv[1]):
        t.add_row(op, str(p["op_calls"][op]), f"{s:.3f}")
    err.print(t)
    err.print(f"layers: {p['hits']} hits (pinned), {p['misses']} misses (streamed); "
              f"{format_bytes(p['bytes_per_decode_token'])} streamed per decode token; storage "
              f"{p['storage_gb_s']:.2f} GB/s over {format_bytes(p['bytes_read'])}; I/O wait {p['wait_s']:.3f} s")
    if spilled:
        err.print(f"KV cache spilled: {format_bytes(p['kv_bytes_per_decode_token'])} of K/V read back per decode "
                  f"token (weights: {format_bytes(p['bytes_per_decode_token'])}); "
                  f"{format_bytes(p['kv_bytes_read'])} in all, {p['kv_read_s']:.3f} s reading")
    if any(q["kind"] == "decode" for q in passes):
        err.print(f"python overhead per decode token: {p['decode_python_s'] * 1e3:.2f} ms "
                  f"({100 * p['decode_python_fraction']:.1f}% of the token's {p['decode_token_s'] * 1e3:.2f} ms); "
                  f"{p['decode_kernel_calls']:.0f} compiled kernel calls per token, "
                  f"{p['decode_kernel_s'] * 1e3:.2f} ms inside them (profiling's own timers included)")
        err.print(f"decode token latency: p50 {p['decode_token_p50_s'] * 1e3:.2f} ms, p90 "
                  f"{p['decode_token_p90_s'] * 1e3:.2f} ms, p99 {p['decode_token_p99_s'] * 1e3:.2f} ms")
    spec = timings.get("speculative")
    if spec:
        n = max(timings["gen_tokens"], 1)
        err.print(f"speculative: {spec_line(spec)}; {p['verify_passes']} batched verifications; "
                  f"{format_bytes(p['bytes_after_prompt'] / n)} read per generated token")
    err.print(f"time to first token: load {timings['load_s']:.2f} s + prefill {timings['prompt_s']:.2f} s"
              f"{compiled(timings)}; decode {timings['gen_tokens']} tokens in {timings['gen_s']:.2f} s")


def spec_line(spec: dict) -> str:
    """One line of speculative decoding's figures (Timings.as_dict()["speculative"])."""
    return (f"drafted {spec['drafted']}, accepted {spec['accepted']} ({100 * spec['acceptance']:.0f}%), "
            f"{spec['tokens_per_pass']:.2f} tokens per weight pass")


def render_experts(last: dict, total: dict, n_passes: int) -> None:
    """The expert cache per layer in the last pass, and its totals per pass."""
    t = Table(title=f"experts per layer, last {last['kind']} pass")
    # hit: cached; pre: read ahead and picked; waste: read ahead, not picked; guess: picks the prediction named
    cols = ("layer", "hit", "pre", "miss", "waste", "guess", "read", "io ms", "wait", "ms")
    for c in cols:
        t.add_column(c, justify="right")
    for r in last["experts"]:
        t.add_row(str(r["layer"]), str(r["hits"]), str(r["prefetch_hits"]), str(r["misses"]),
                  str(r["prefetch_wasted"]), f"{r['predicted_right']}/{r['predicted']}", format_bytes(r["bytes_read"]),
                  f"{r['read_s'] * 1e3:.2f}", f"{r['wait_s'] * 1e3:.2f}", f"{r['compute_s'] * 1e3:.2f}")
    err.print(t)
    n = max(n_passes, 1)
    err.print(f"experts: hit rate {100 * total['hit_rate']:.1f}% ({total['hits']} hits + {total['prefetch_hits']} "
              f"prefetched, {total['misses']} misses); prediction {100 * total['prediction_rate']:.1f}% right, "
              f"{total['prefetch_wasted']} of {total['prefetch_issued']} read-aheads wasted, "
              f"{total['prefetch_skipped']} layers' guesses not read ahead (recent ones mostly wrong, or those not "
              f"cached: {100 * total['unseen_precision']:.0f}% of them picked); per pass "
              f"{format_bytes(total['bytes_read'] / n)} read, I/O wait {total['wait_s'] / n * 1e3:.1f} ms")


def compiled(timings: dict) -> str:
    """', compiling kernels X s' when a run compiled (its first), else ''."""
    return f", compiling kernels {timings['compile_s']:.1f} s" if timings.get("compile_s") else ""
