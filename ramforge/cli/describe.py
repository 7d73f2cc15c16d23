"""CLI commands that read a model without running it: inspect, support, plan, show."""
from __future__ import annotations

import json
import os
from collections import Counter
from contextlib import contextmanager

import click
from rich.table import Table

from .. import flags
from ..gguf.constants import GGMLType, Keys
from ..memory.size import format_bytes, parse_memory_size
from ..sampling.gguf_defaults import gguf_sampling_defaults
from .console import kv_options, kv_types_of, open_gguf, out, short, spill_of, spill_option, summarise

ASSUMED_STORAGE_GB_S = 2.0       # a remote model's expected s/token, where no --storage-gb-s is given


@contextmanager
def open_header(model, hf: bool = False, insecure: bool = False):
    """(GGUF header, remote) of MODEL: a local file, store name or cached Hugging Face model as
    open_gguf opens it (remote None); else a Hugging Face source or an http(s) URL read by HTTP range
    requests, header(s) only (remote: {source, urls, size, bytes_fetched, requests})."""
    from ..gguf.reader import GGUFFile
    from ..store import hf as hfs, split_urls
    from ..store.ranged import RangeFile

    ref = hfs.parse_source(model, hf=hf) if isinstance(model, str) else None
    url = model if isinstance(model, str) and model.lower().startswith(("https://", "http://")) else None
    if ref is None and url is None:
        with open_gguf(model) as f:
            yield f, None
        return
    if ref is not None and (found := hfs.find_cached(ref)):
        with open_gguf(str(found[0])) as f:
            yield f, None
        return
    if ref is None:
        from ..store import InsecureSource

        if url.lower().startswith("http://") and not insecure:
            raise InsecureSource(f"{url} is plain http; pass --insecure to read its header anyway")
        urls, headers, source, total = split_urls(url), {}, url, None       # a shard's URL: its set's
    else:
        m = hfs.resolve(ref, insecure)
        urls, headers, source, total = m.urls(), hfs.auth_headers(), ref.source, m.size
    sources = [RangeFile(u, headers) for u in urls]
    with GGUFFile(sources) as f:                   # the shards joined with the reader's own checks
        remote = {"source": source, "urls": urls, "size": total or sum(s.size for s in sources),
                  "bytes_fetched": sum(s.bytes_fetched for s in sources), "requests": sum(s.requests for s in sources)}
        yield f, remote


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
            "sampling_defaults": gguf_sampling_defaults(md),
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
    if info["sampling_defaults"]:
        out.print("recommended sampling (general.sampling.*, applied by run and chat where no flag sets them): "
                  + ", ".join(f"{k} {v}" for k, v in info["sampling_defaults"].items()))
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
    from ..models import ARCHS
    from ..tokenizer import SUPPORTED_TOKENIZERS

    info = {
        "architectures": {"executable": sorted({a.name for a in ARCHS.values()}),
                          "aliases": {n: a.name for n, a in sorted(ARCHS.items()) if n != a.name},
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
              help="Storage read speed for the expected seconds per token (a remote MODEL: default 2; with "
                   "--stages: each node's, default --probe-io's, else 2).")
@click.option("--compute-gb-s", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="With --stages: weight bytes per second decode computes over in RAM (`ramforge bench`).")
@click.option("--net-gbit", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="With --stages: the network between stages, Gbit/s.")
@click.option("--latency-ms", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="With --stages: one-way latency of a hop between stages.")
@kv_options
@spill_option
@click.option("--hf", "hf", is_flag=True, help="MODEL is a Hugging Face ORG/REPO[:QUANT] (as llama.cpp's -hf).")
@click.option("--insecure", is_flag=True, help="Allow a plain http:// MODEL URL or HF_ENDPOINT.")
@click.option("--embed", "embed", is_flag=True,
              help="Plan for embedding documents (`ramforge embed`): the tokens a pass over the weights takes, "
                   "sized from the budget (an embedding model's plan, one with a pooling type or an encoder, always).")
@click.option("--doc-tokens", type=click.IntRange(min=1), default=200, show_default=True,
              help="With --embed: the document length documents per pass are counted in.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(model, ram, ctx, probe_io, hit_rate, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms, kv_type,
         kv_type_k, kv_type_v, kv_spill, hf, insecure, embed, doc_tokens, as_json):
    """How MODEL runs under a RAM budget: what stays resident, what streams, the minimum budget.

    MODEL may be remote (hf.co/ORG/REPO[:QUANT], an https URL): only its GGUF header(s) are read, by
    HTTP range requests, so the plan comes before a byte of weights moves."""
    from ..stream.embed_plan import embed_plan
    from ..stream.plan import plan_for_budget

    if stages is not None:
        return _plan_stages(model, ram, ctx, probe_io, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms,
                            as_json, hf, insecure)
    budget = parse_memory_size(ram)
    tk, tv = kv_types_of(kv_type, kv_type_k, kv_type_v)
    with open_header(model, hf, insecure) as (f, remote):
        spill = spill_of(kv_spill)
        if embed or is_embedding_model(f.metadata):
            if hit_rate is not None or spill:
                raise click.UsageError("--hit-rate and --kv-spill plan generation, not embedding")
            p, eb = embed_plan(f, budget, ctx, doc_tokens, type_k=tk, type_v=tv)
        else:
            p, eb = plan_for_budget(f, budget, ctx, hit_rate=hit_rate, type_k=tk, type_v=tv,
                                    kv_spill=None if spill is None else bool(spill)), None
    show_plan(p, budget, remote, probe_io, storage_gb_s, as_json, eb)


def is_embedding_model(md) -> bool:
    """A file that embeds rather than generates: a pooling type ({arch}.pooling_type) or a non-causal
    (encoder) architecture."""
    from ..models import ARCHS
    arch = md.get(Keys.ARCHITECTURE)
    a = ARCHS.get(arch)
    return md.get(f"{arch}.pooling_type") is not None or (a is not None and not a.causal)


def show_plan(p, budget, remote=None, probe_io=False, storage_gb_s=None, as_json=False, embed=None) -> None:
    """Print a plan (rich table or JSON); a remote model's source and the header bytes it cost; the
    expected seconds per token of I/O from --probe-io or a stated storage speed; embed (an EmbedBatch):
    the embedding batch the plan was sized for."""
    from ..stream.io import probe_read_speed

    info = p.to_json()
    if embed is not None:
        info["embed"] = embed.to_json()
    if remote is not None:
        if probe_io:
            raise click.UsageError("--probe-io measures a local file; pass --storage-gb-s for a remote model")
        info["remote"] = remote
        storage_gb_s = storage_gb_s or ASSUMED_STORAGE_GB_S
    if probe_io:
        bw = probe_read_speed(p.path)
        info["probe_io"] = {"read_gb_s": bw / 1e9, "seconds_per_token_io": p.expected_bytes_per_token / bw}
    elif storage_gb_s:
        info["storage"] = {"read_gb_s": storage_gb_s, "assumed": remote is not None and storage_gb_s == ASSUMED_STORAGE_GB_S,
                           "seconds_per_token_io": p.expected_bytes_per_token / (storage_gb_s * 1e9)}
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
            ("planned peak (managed)", p.planned_peak),
            ("streamed per pass over the weights (at most)" if embed is not None else "streamed per token (at most)",
             p.streamed_bytes_per_token),
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
    if "storage" in info:
        st = info["storage"]
        out.print(f"storage at {st['read_gb_s']:g} GB/s{' (assumed; --storage-gb-s states yours)' if st['assumed'] else ''}: "
                  f"about {st['seconds_per_token_io']:.3f} s per token of I/O for "
                  f"{format_bytes(p.expected_bytes_per_token)} streamed")
    if embed is not None:
        out.print(f"embedding: {embed.tokens_per_pass} tokens per pass over the weights, about "
                  f"{embed.docs_per_pass:.2f} documents of {embed.doc_tokens} tokens; batches (one llama_decode) "
                  f"of up to {embed.pack_tokens} tokens; {format_bytes(embed.streamed_bytes_per_pass)} streamed a pass, "
                  f"{format_bytes(int(embed.streamed_bytes_per_doc))} a document")
    if remote is not None:
        out.print(f"remote: {remote['source']}, {format_bytes(remote['size'])} to download; this plan read "
                  f"{format_bytes(remote['bytes_fetched'])} of header(s) in {remote['requests']} range requests")
    for n in p.notes:
        out.print(f"note: {n}")


def _plan_stages(model, ram, ctx, probe_io, stages, storage_gb_s, compute_gb_s, net_gbit, latency_ms, as_json,
                 hf=False, insecure=False):
    """`plan --stages N`: the layer ranges, each stage's verdict, and seconds per token."""
    from ..cluster.split import plan_stages
    from ..stream.io import probe_read_speed

    with open_header(model, hf, insecure) as (f, remote):
        if remote is not None and probe_io:
            raise click.UsageError("--probe-io measures a local file; pass --storage-gb-s for a remote model")
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




def _count(n: int) -> str:
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def model_facts(model) -> dict:
    """What `show` prints of MODEL: its model facts, capabilities, parameters, template and license."""
    from ..generation.api import is_default_model, model_chat_template
    from ..store.resolve import resolve_model

    path = str(resolve_model(model or "default"))
    with open_gguf(path) as f:
        md = f.metadata
        n_params = sum(int(t.n_elements) for t in f.tensors.values())
        types = Counter(t.ggml_type.name for t in f.tensors.values())
    arch = md.get(Keys.ARCHITECTURE) or ""
    template = model_chat_template(md, is_default_model(model, path))
    tokens = md.get("tokenizer.ggml.tokens") or []
    fim = all(isinstance(md.get(f"tokenizer.ggml.fim_{k}_token_id"), int) for k in ("pre", "suf", "mid")) or all(
        t in tokens for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    caps = ["completion"]
    if "tools" in template.text or isinstance(md.get("tokenizer.chat_template.tool_use"), str):
        caps.append("tools")
    if fim:
        caps.append("insert")
    if any(s in template.text for s in ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")):
        caps.append("thinking")
    stops = []
    for key in ("eos", "eot", "eom"):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(i, int) and 0 <= i < len(tokens) and str(tokens[i]) not in stops:
            stops.append(str(tokens[i]))
    ftype = md.get("general.file_type")
    quant = types.most_common(1)[0][0] if types else ""
    if isinstance(ftype, int):
        quant = _FILE_TYPES.get(int(ftype), quant)
    return {"path": path, "model": {"architecture": arch, "parameters": _count(n_params),
                                    "context length": md.get(Keys.of(Keys.CONTEXT_LENGTH, arch)) if arch else None,
                                    "embedding length": md.get(Keys.of(Keys.EMBEDDING_LENGTH, arch)) if arch else None,
                                    "quantization": quant},
            "capabilities": caps, "parameters": {"stop": stops, **gguf_sampling_defaults(md)},
            "template": template.text, "template_source": template.source,
            "license": md.get("general.license"), "system": None,
            "metadata": {k: summarise(v) for k, v in md.items()}}


# llama_ftype (general.file_type) -> its name, as Ollama shows it
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
               12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
               19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
               26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
               36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


@click.command()
@click.argument("model", required=False)
@click.option("--license", "part", flag_value="license", help="Only the license.")
@click.option("--parameters", "part", flag_value="parameters", help="Only the parameters.")
@click.option("--template", "part", flag_value="template", help="Only the chat template.")
@click.option("--system", "part", flag_value="system", help="Only the system message.")
@click.option("--modelfile", "part", flag_value="modelfile", help="An Ollama Modelfile of the model.")
@click.option("-v", "--verbose", is_flag=True, help="The GGUF metadata too.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(model, part, verbose, as_json):
    """Facts, capabilities, parameters and license of MODEL, as ollama show (reads the file; no server)."""
    d = model_facts(model)
    if not verbose:
        d.pop("metadata")
    if as_json:
        print(json.dumps(d, indent=1, default=str))
        return
    params = [(k, json.dumps(s) if k == "stop" else str(s)) for k, v in d["parameters"].items()
              for s in (v if isinstance(v, list) else [v])]
    if part == "license":
        click.echo(d["license"] or "")
    elif part == "template":
        click.echo(d["template"])
    elif part == "system":
        click.echo(d["system"] or "")
    elif part == "parameters":
        for k, v in params:
            click.echo(f"{k:<20}{v}")
    elif part == "modelfile":
        click.echo(f"# Modelfile generated by \"ramforge show\"\nFROM {d['path']}\nTEMPLATE \"\"\"{d['template']}\"\"\"")
        for k, v in params:
            click.echo(f"PARAMETER {k} {v}")
        if d["license"]:
            click.echo(f"LICENSE \"\"\"{d['license']}\"\"\"")
    else:
        click.echo("  Model")
        for k, v in d["model"].items():
            if v is not None:
                click.echo(f"    {k:<20}{v}")
        click.echo("\n  Capabilities")
        for c in d["capabilities"]:
            click.echo(f"    {c}")
        if params:
            click.echo("\n  Parameters")
            for k, v in params:
                click.echo(f"    {k:<20}{v}")
        if d["license"]:
            click.echo("\n  License")
            click.echo(f"    {str(d['license']).splitlines()[0]}")
        if verbose:
            click.echo("\n  Metadata")
            for k, v in d["metadata"].items():
                click.echo(f"    {k:<40}{short(v) if not isinstance(v, str) else v[:100]}")
        click.echo()


COMMANDS = [inspect, support, plan, show]
