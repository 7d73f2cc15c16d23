"""CLI commands that read a model without running it: inspect, support, plan."""
from __future__ import annotations

import json
import os
from collections import Counter

import click
from rich.table import Table

from .. import flags
from ..gguf.constants import GGMLType, Keys
from ..memory.size import format_bytes, parse_memory_size
from .console import kv_options, kv_types_of, open_gguf, out, short, spill_of, spill_option, summarise


@click.command()
@click.argument("model", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inspect(model, as_json):
    """Metadata, quantization summary and tensor table of MODEL (reads no tensor data)."""
    with open_gguf(model) as f:
        md = f.metadata
        arch = md.get(Keys.ARCHITECTURE)
        types = Counter(t.ggml_type.name for t in f.tensors.values())
        tbytes = Counter()
        for t in f.tensors.values():
            tbytes[t.ggml_type.name] += t.nbytes
        info = {
            "path": f.path, "version": f.version, "file_size": f.size, "alignment": f.alignment,
            "data_offset": f.data_offset, "architecture": arch,
            "block_count": md.get(Keys.of(Keys.BLOCK_COUNT, arch)) if arch else None,
            "embedding_length": md.get(Keys.of(Keys.EMBEDDING_LENGTH, arch)) if arch else None,
            "tensor_count": len(f.tensors),
            "types": dict(types.most_common()),
            "type_bytes": {k: tbytes[k] for k, _ in types.most_common()},
            "metadata": {k: summarise(v) for k, v in md.items()},
            "tensors": [{"name": t.name, "type": t.ggml_type.name, "dims": list(t.dims),
                         "offset": t.offset, "nbytes": t.nbytes} for t in f.tensors.values()],
        }
    if as_json:
        print(json.dumps(info, indent=1))
        return
    out.print(f"[bold]{info['path']}[/] GGUF v{info['version']}, {format_bytes(info['file_size'])}, "
              f"{info['tensor_count']} tensors, architecture [bold]{arch}[/]")
    meta = Table(title="metadata", show_lines=False)
    meta.add_column("key"), meta.add_column("value", overflow="fold")
    for k, v in md.items():
        meta.add_row(k, short(v))
    out.print(meta)
    q = Table(title="quantization")
    for c in ("type", "tensors", "bytes", "share"):
        q.add_column(c, justify="right" if c != "type" else "left")
    total = sum(tbytes.values()) or 1
    for name, n in types.most_common():
        q.add_row(name, str(n), format_bytes(tbytes[name]), f"{100 * tbytes[name] / total:.1f}%")
    out.print(q)
    tt = Table(title="tensors")
    for c in ("name", "type", "dims", "bytes", "offset"):
        tt.add_column(c, justify="right" if c in ("bytes", "offset") else "left")
    for t in info["tensors"]:
        tt.add_row(t["name"], t["type"], " x ".join(map(str, t["dims"])), f"{t['nbytes']:,}", f"{t['offset']:,}")
    out.print(tt)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def support(as_json):
    """What ramforge executes, inspects only, or refuses."""
    from ..kernels.registry import is_executable as type_ok
    from ..models import ALIASES, ARCHITECTURES
    from ..tokenizer import SUPPORTED_TOKENIZERS

    info = {
        "architectures": {"executable": sorted(ARCHITECTURES), "aliases": dict(ALIASES),
                          "inspect_only": "every other GGUF architecture"},
        "quant_types": {
            "executable": [t.name for t in GGMLType if type_ok(t)],
            "refused": [t.name for t in GGMLType if not type_ok(t)],
        },
        "tokenizers": {m: list(p) for m, p in SUPPORTED_TOKENIZERS.items()},
    }
    if as_json:
        print(json.dumps(info, indent=1))
        return
    t = Table(title="ramforge support")
    t.add_column("kind"), t.add_column("status"), t.add_column("names", overflow="fold")
    t.add_row("architecture", "executable", ", ".join(info["architectures"]["executable"]) or "(none yet)")
    t.add_row("architecture", "inspect-only", info["architectures"]["inspect_only"])
    t.add_row("quant type", "executable", ", ".join(info["quant_types"]["executable"]))
    t.add_row("quant type", "refused", ", ".join(info["quant_types"]["refused"]))
    for m, pres in info["tokenizers"].items():
        t.add_row("tokenizer", m, ", ".join(pres) or "-")
    out.print(t)


@click.command()
@click.argument("model", required=False)
@click.option("--ram", required=True, help="Memory budget, e.g. 4G, 512MiB, 1.5G.")
@click.option("--ctx", type=click.IntRange(min=1), default=None, help=f"Context length (default: {flags.DEFAULT_CTX}, or the model's if smaller).")
@click.option("--probe-io", is_flag=True, help="Measure the file's O_DIRECT read speed and estimate seconds per token.")
@click.option("--hit-rate", type=click.FloatRange(0, 1), default=None,
              help="Expert cache hit rate for the expected bytes per token (default: the share of experts cached).")
@click.option("--stages", type=int, default=None,
              help="Plan a pipeline of this many layer ranges (ramforge run --ray); --ram is then one size per "
                   "stage or a list, 4G,8G.")
@click.option("--storage-gb-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --stages: each node's storage read speed (default: --probe-io's, else 2).")
@click.option("--compute-gb-s", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="With --stages: weight bytes per second decode computes over in RAM (`ramforge bench`).")
@click.option("--net-gbit", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="With --stages: the network between stages, Gbit/s.")
@click.option("--latency-ms", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="With --stages: one-way latency of a hop between stages.")
@kv_options
@spill_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(model, ram, ctx, probe_io, hit_rate, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms, kv_type,
         kv_type_k, kv_type_v, kv_spill, as_json):
    """How MODEL runs under a RAM budget: what stays resident, what streams, the minimum budget."""
    from ..stream.plan import plan_for_budget
    from ..stream.io import probe_read_speed

    if stages is not None:
        return _plan_stages(model, ram, ctx, probe_io, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms,
                            as_json)
    budget = parse_memory_size(ram)
    tk, tv = kv_types_of(kv_type, kv_type_k, kv_type_v)
    with open_gguf(model) as f:
        spill = spill_of(kv_spill)
        p = plan_for_budget(f, budget, ctx, hit_rate=hit_rate, type_k=tk, type_v=tv,
                            kv_spill=None if spill is None else bool(spill))
    info = p.to_json()
    if probe_io:
        bw = probe_read_speed(p.path)
        info["probe_io"] = {"read_gb_s": bw / 1e9, "seconds_per_token_io": p.expected_bytes_per_token / bw}
    if as_json:
        print(json.dumps(info, indent=1))
        return
    li, lb = p.largest_layer
    t = Table(title=f"plan: {os.path.basename(p.path)} ({p.arch}) at --ram {format_bytes(budget)}, ctx {p.n_ctx}, batch {p.batch}")
    t.add_column("item"), t.add_column("bytes", justify="right"), t.add_column("", justify="right")
    rows = [("model weights", p.model_bytes),
            (f"persistent tensors ({len(p.persistent)}); resident: {', '.join(p.resident) or 'none'}", p.persistent_bytes),
            (f"layers ({len(p.layer_bytes)}); largest read span is layer {li}", lb),
            (f"pinned layers ({len(p.pinned)} of {len(p.layer_bytes)})", sum(p.layer_bytes[i - p.layers[0]] for i in p.pinned)),
            (f"stream buffers ({p.n_buffers})", p.n_buffers * p.buffer_bytes),
            (f"KV cache (K {p.type_k}, V {p.type_v}, {p.kv_positions:,} positions"
             f"{'' if p.kv_positions == p.n_ctx else f' of ctx {p.n_ctx:,}'}; charged as they fill)", p.kv_bytes)
            if not p.kv_spill else
            (f"KV cache spilled (K {p.type_k}, V {p.type_v}, ctx {p.n_ctx:,}): {p.kv_tail} recent positions a layer "
             f"and 2 read buffers in RAM", p.kv_bytes),
            ("KV cache per 1k tokens", p.kv_bytes_per_1k), (f"activations (batch {p.batch})", p.state_bytes),
            ("planned peak (managed)", p.planned_peak), ("streamed per token (at most)", p.streamed_bytes_per_token),
            ("active weights per token", p.active_bytes_per_token),
            *([("KV spill files on disk", p.kv_spill_file_bytes),
               ("KV read back per token (at a full context)", p.kv_read_bytes_per_token)] if p.kv_spill else []),
            ("fully resident needs", p.resident_budget), ("minimum budget", p.min_budget)]
    if p.experts_apart:
        rows[5:5] = [(f"expert cache ({p.expert_slots} of {p.expert_count} experts, {format_bytes(p.expert_slot_bytes)} each)",
                      p.expert_slots * p.expert_slot_bytes),
                     ("routers kept to predict experts", p.predictor_bytes)]
        rows.insert(-2, (f"expected per token at a {100 * p.expert_hit_rate:.0f}% expert hit rate",
                         p.expected_bytes_per_token))
    for name, v in rows:
        t.add_row(name, f"{v:,}", format_bytes(v))
    out.print(t)
    if p.max_ctx is not None:
        out.print(f"longest context this budget holds: {p.max_ctx:,} tokens (KV cache K {p.type_k}, V {p.type_v}, "
                  f"{format_bytes(p.kv_bytes_per_1k)} per 1k tokens; the model was trained on {p.n_ctx_train:,})")
    colour = {"resident": "green", "streaming": "yellow", "insufficient": "red"}[p.verdict]
    extra = f"; needs at least {format_bytes(p.min_budget)} ({p.min_budget:,} B)" if p.verdict == "insufficient" else ""
    out.print(f"verdict: [bold {colour}]{p.verdict}[/]{extra}")
    if probe_io:
        pi = info["probe_io"]
        out.print(f"storage reads at {pi['read_gb_s']:.2f} GB/s: about {pi['seconds_per_token_io']:.3f} s per token "
                  f"of I/O for {format_bytes(p.expected_bytes_per_token)} streamed")
    for n in p.notes:
        out.print(f"note: {n}")


def _plan_stages(model, ram, ctx, probe_io, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms, as_json):
    """`plan --stages N`: the layer ranges, each stage's verdict, and seconds per token."""
    from ..cluster.split import plan_stages
    from ..stream.io import probe_read_speed

    with open_gguf(model) as f:
        cp = plan_stages(f, stages, ram, ctx)
    if storage_gb_s is None:
        storage_gb_s = probe_read_speed(cp.path) / 1e9 if probe_io else 2.0
    est = cp.estimate(storage_gb_s, compute_gb_s, net_gbit, latency_ms)
    if as_json:
        print(json.dumps({**cp.to_json(), "estimate": est}, indent=1))
        return
    t = Table(title=f"{os.path.basename(cp.path)}: {len(cp.stages)} stages of {cp.n_layer} layers, "
                    f"ctx {cp.stages[0].plan.n_ctx}")
    for c in ("stage", "layers", "budget", "verdict", "minimum", "peak", "read/token", "compute s", "I/O s"):
        t.add_column(c, justify="left" if c in ("layers", "verdict") else "right")
    for s, e in zip(cp.stages, est["stages"]):
        p = s.plan
        colour = {"resident": "green", "streaming": "yellow"}[p.verdict]
        t.add_row(str(s.index), f"{s.layers[0]}-{s.layers[1] - 1}",
                  format_bytes(s.budget) if s.budget else "unlimited", f"[{colour}]{p.verdict}[/]",
                  format_bytes(p.min_budget), format_bytes(p.planned_peak),
                  format_bytes(p.expected_bytes_per_token) if s.streams else "0",
                  f"{e['compute_s']:.4f}", f"{e['io_s']:.4f}")
    out.print(t)
    out.print(f"per token: {est['s_per_token']:.4f} s = stages {est['s_per_token'] - est['hops_s']:.4f} s + "
              f"{len(cp.stages) - 1} hops x {est['hop_s'] * 1e3:.2f} ms (hidden state {cp.n_embd * 4:,} B at "
              f"{net_gbit:g} Gbit/s, {latency_ms:g} ms); a driver on another node adds "
              f"{est['logits_s'] * 1e3:.2f} ms for the logits")
    out.print(f"assumed: storage {storage_gb_s:.2f} GB/s{' (probed here)' if probe_io else ''}, compute "
              f"{compute_gb_s:g} GB/s of weights; a streaming stage counts max(compute, I/O): it reads ahead")


COMMANDS = [inspect, support, plan]
