"""CLI commands that run the model: run, chat, bench."""
from __future__ import annotations

import json
import sys
from contextlib import nullcontext

import click
import numpy as np

from .. import flags
from ..sampling.params import sampler_params
from ..models import routing_trace
from .console import (chat_template_of, cluster_of, cluster_options, ctx_option, drafter_of, expert_options,
                      io_option, kv_options, kv_types_of, load_engine, model_metadata, prompt_text, spill_of,
                      spill_option, with_gguf_defaults,
                      ram_option, sampler_options, speculative_options, threads_option)

trace_option = click.option(
    "--trace-routing", "trace_routing", type=click.Path(dir_okay=False, writable=True), default=None,
    help="Record every pass's per-layer selected experts to this .npz file (mixture-of-experts models; "
         "tools/replay_routing.py replays it against cache policies).")


@click.command()
@click.argument("model", required=False)
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("-p", "--prompt", default=None, help="Prompt text, instead of PROMPT (special tokens like <bos> are "
                                                   "parsed).")
@click.option("--raw", is_flag=True, help="A plain completion of PROMPT, without the model's chat template.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=128, show_default=True)
@sampler_options
@ctx_option
@ram_option
@io_option
@threads_option
@expert_options
@kv_options
@spill_option
@speculative_options
@cluster_options
@click.option("--context-shift", is_flag=True,
              help="When generation fills the context, keep --keep tokens (+ BOS) and drop half of the rest, as "
                   "llama-server's --context-shift.")
@click.option("--keep", "n_keep", type=click.IntRange(min=-1), default=0, show_default=True,
              help="Tokens a context shift keeps (-1: the prompt).")
@click.option("--profile", is_flag=True, help="Per-layer I/O and per-op compute tables on stderr (and in --json).")
@click.option("--memory-report", is_flag=True, help="Managed, RSS and page-cache memory on stderr (and in --json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end instead of streaming.")
@trace_option
def run(model, prompt_arg, prompt, raw, max_tokens, ctx, ram, io, threads, expert_cache, expert_prefetch, kv_type, kv_type_k, kv_type_v,
        kv_spill, lookup, lookup_ngram, lookup_fixed, draft_model, draft_max, draft_min, draft_p_min, ray_address,
        stages, stage_ram, ray_timeout, stage_timeout, placement, context_shift, n_keep, profile, memory_report,
        as_json, trace_routing, **sampling):
    """Answer PROMPT (as ollama run and llama-cli do: through the model's chat template, if it has one;
    --raw for a plain completion); text streams to stdout, stats to stderr.

    PROMPT is read from stdin when it is `-`, or when it is left out and stdin is not a terminal. The
    GGUF's recommended sampler settings (general.sampling.*) apply where no flag sets them, as in
    llama.cpp. With --ray, the model runs as --stages layer ranges on a Ray cluster (ramforge.cluster);
    the tokens are those of one process."""
    from ..profiling import PROFILE
    from .report import compile_notice, compiled, memory_report as mem_report, render_memory, render_profile, spec_line
    from ..sampling import LLAMA, Sampler

    text = prompt_text(prompt_arg, prompt)
    md, path = model_metadata(model)
    params = sampler_params(with_gguf_defaults(sampling, md))      # a bad value fails before the model loads
    template = None if raw else chat_template_of(md, model, path)
    drafter = drafter_of(lookup, lookup_ngram, lookup_fixed, draft_model, draft_max, draft_min, draft_p_min)
    cluster = cluster_of(ray_address, stages, stage_ram, ray_timeout, stage_timeout, placement)
    if cluster is not None and (profile or memory_report):
        raise click.UsageError("--profile and --memory-report are not supported with --ray")
    if trace_routing and cluster is not None:
        raise click.UsageError("--trace-routing is not supported with --ray")
    if context_shift and (cluster is not None or drafter is not None):
        raise click.UsageError("--context-shift is not supported with --ray or speculative decoding")
    shift = {"context_shift": True, "n_keep": n_keep} if context_shift else {}
    PROFILE.enabled = profile
    PROFILE.reset()
    kv = kv_types_of(kv_type, kv_type_k, kv_type_v)
    from ..jit import COMPILE

    k0 = COMPILE.kernels
    if template is not None:
        text = template.strip_special(template.render([{"role": "user", "content": text}]))
    early = cold_start(md, path, text, threads, kv, not as_json) if cluster is None else None
    with compile_notice(), early or nullcontext(), load_engine(model, ctx, ram, io, threads, expert_cache,
                                                                expert_prefetch, drafter, cluster, kv,
                                                                spill_of(kv_spill)) as eng:
        if trace_routing:
            routing_trace.attach(eng, trace_routing)
        sampler = Sampler(params, eng.hp.n_vocab, chain=LLAMA, tokenizer=eng.tokenizer)
        ids = eng.tokenizer.encode(text, add_special=True, parse_special=True)
        out, dec = [], eng.tokenizer.stream()
        background = decode_kernels_in_background(eng, early, COMPILE.kernels > k0, not as_json, len(ids))
        try:
            for tok in eng.generate(ids, max_tokens, sampler, draft=drafter, **shift):
                out.append(tok)
                if not as_json:
                    sys.stdout.write(dec.feed(tok))
                    sys.stdout.flush()
        finally:
            if background is not None:          # what it has not finished is not needed by this run
                background.cancel()
        t = eng.timings.as_dict()
        if profile:
            t["compile_s"] = max(t["compile_s"], PROFILE.compile_s)
        finish = "length" if len(out) == max_tokens else "stop"
        extra = {}
        if profile:
            extra["profile"] = PROFILE.summary()
            PROFILE.enabled = False
        if memory_report:
            extra["memory"] = mem_report(eng)
        if as_json:
            print(json.dumps({"text": eng.tokenizer.decode(out), "prompt_tokens": ids, "completion_tokens": out,
                              "n_prompt": len(ids), "n_completion": len(out), "finish_reason": finish,
                              "timings": t, **extra}))
            return
        sys.stdout.write(dec.flush() + "\n")
        click.echo(f"prompt {t['prompt_tokens']} tokens, prefill {t['prefill_tok_s']:.1f} tok/s, "
                   f"decode {t['gen_tokens']} tokens at {t['decode_tok_s']:.1f} tok/s, load {t['load_s']:.2f} s"
                   f"{compiled(t)}", err=True)
        if "speculative" in t:
            click.echo(f"speculative: {spec_line(t['speculative'])}", err=True)
        if profile:
            render_profile(extra["profile"], t)
        if memory_report:
            render_memory(extra["memory"])


def cold_start(md: dict, path: str, text: str, threads, kv, say: bool):
    """On a fresh kernel cache (engine.warmup.cold), start the warm-up workers before the model loads
    (engine.warmup.start_early: a dry first pass over the prompt, which compiles its kernels but the
    matmuls', then the sampler's, which this process waits for if it gets there first), and say how long
    the first token will take. None when warm."""
    from ..engine.warmup import cold, start_early

    if not cold():
        return None
    if say:
        say_first_run()
    return start_early(md, path, text, threads, kv)


class ColdRun:
    """What a cold `run` compiles beside its first pass (`cancel` at the end: what is left is not needed)."""

    def __init__(self, warmup, deferral, first):
        self.warmup, self.deferral, self.first = warmup, deferral, first

    def cancel(self) -> None:
        self.first.release()
        self.warmup.cancel()
        self.deferral.release()


def decode_kernels_in_background(eng, warmup, cold: bool, say: bool, n_prompt: int):
    """On a cold kernel cache (cold_start's warmup, or the load compiled kernels), compile in the warm-up
    workers, while this process evaluates the prompt: the first pass's matmul kernels, shared with this
    process (engine.warmup.FirstPass: the workers take them last-needed first, this process first-needed
    first), then the sampler's (unless queued already) and the fused decode kernels. The sampler's job,
    if no worker has begun it (the dry first pass still on), is taken back and run here first: the worker
    goes on with the matmuls meanwhile. Until each fused kernel's job has ended, decode runs the
    per-matrix kernels the prefill compiled (engine.warmup.Deferral: the same arithmetic, bit for bit).
    A kernel both reach compiles once into the disk cache, and the other loads it from there. Returns a
    ColdRun, or None when warm."""
    from ..engine.warmup import Deferral, FirstPass, sampler_job, warm_jobs
    from ..jit import Warmup, worker_count

    if warmup is None and not cold:
        return None
    jobs = warm_jobs(eng, prefill=False)
    if warmup is None:
        if say:
            say_first_run()
        warmup = Warmup([], worker_count(reserve=1), more=True)
    else:
        jobs = jobs[1:]                             # the sampler's: queued before the load (early_jobs)
    deferral = Deferral(jobs)
    try:
        warmup.on_job = deferral.on_job
        first = FirstPass(eng, n_prompt, warmup, deferral)
        warmup.add(jobs)
        warmup.seal()
        sampler = next((j for j in warmup.jobs if j.module == sampler_job(1).module), None)
        if sampler is not None and warmup.take(sampler, wait=False):
            sampler.run()       # no worker has begun it (the dry pass's still on): here, while it goes on
    except BaseException:
        deferral.release()
        warmup.cancel()
        raise
    return ColdRun(warmup, deferral, first)


def say_first_run() -> None:
    """run's notice on a cold kernel cache (stderr), with how long the first token will take."""
    from ..jit import worker_count

    click.echo(f"first run: compiling this model's kernels for this CPU, once (about "
               f"{first_run_estimate(worker_count()):.0f} s before the first token; later runs load them "
               f"from the cache)", err=True)


def first_run_estimate(cores: int) -> float:
    """Seconds from this notice to the first token of a first run on a quiet machine, roughly: on two
    cores or more, the larger share of two processes (FIRST_RUN_S): this one compiles the load's
    kernels, the sampler's and some of the first pass's matmuls while a worker runs the dry first pass
    (the pass's other kernels) and the rest of its matmuls; on one core, all of them."""
    return FIRST_RUN_S if cores > 1 else FIRST_RUN_ONE_CORE_S


# gemma-3 270m, from COMPILE.records' CPU seconds and /proc at the first token (session 48, a busy host: ~15 s
# each; ~28 s in all, as before the dry pass): this process ~5 s of the load's kernels, ~5 s of the sampler's,
# a part of ~6 s of matmuls and ~2 s else; the worker ~2 s to start and load, ~8 s of the dry pass, the rest
FIRST_RUN_S = 16.0           # on 2 cores or more: the larger share
FIRST_RUN_ONE_CORE_S = 30.0  # on one core: both


@click.command()
@click.argument("model", required=False)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--gen", type=click.IntRange(min=1), default=64, show_default=True)
@threads_option
@ram_option
@io_option
@expert_options
@kv_options
@spill_option
@click.option("--json", "as_json", is_flag=True)
@trace_option
def bench(model, prompt_tokens, gen, threads, ram, io, expert_cache, expert_prefetch, kv_type, kv_type_k, kv_type_v,
          kv_spill, as_json, trace_routing):
    """Prefill and decode speed, and the weight bandwidth decode achieves (greedy, after a warm-up)."""
    import numba

    from ..jit import COMPILE, Stopwatch
    from ..profiling import latency_percentiles
    from .report import compile_notice

    c0 = COMPILE.seconds
    kv = kv_types_of(kv_type, kv_type_k, kv_type_v)
    with compile_notice(), load_engine(model, prompt_tokens + gen + 8, ram, io, threads, expert_cache,
                                       expert_prefetch, kv=kv, kv_spill=spill_of(kv_spill)) as eng:
        base = eng.tokenizer.encode("The history of the printing press begins in the fifteenth century, when ",
                                    add_special=False)
        ids = ([eng.tokenizer.bos_id] if eng.tokenizer.add_bos else []) + (base * prompt_tokens)[:prompt_tokens]
        ids = ids[:prompt_tokens]
        eng.eval(ids[:2])                                     # warm-up: numba loads its cache
        eng.reset()
        if trace_routing:                                     # the measured passes only
            routing_trace.attach(eng, trace_routing)
        with Stopwatch() as sw:                               # compiling kernels left out
            logits = eng.eval(ids)[-1]
        prefill = sw.seconds
        tok = int(np.argmax(logits))
        per_token = []
        for _ in range(gen):
            with Stopwatch() as sw:
                tok = int(np.argmax(eng.eval([tok])[-1]))
            per_token.append(sw.seconds)
        decode = sum(per_token)
        weights = eng.plan.active_bytes_per_token             # what a token reads: a mixture's k experts a layer
        res = {"model": eng.path, "threads": numba.get_num_threads(), "prompt_tokens": len(ids),
               "gen_tokens": gen, "prefill_s": prefill, "prefill_tok_s": len(ids) / prefill,
               "decode_s": decode, "decode_tok_s": gen / decode, "weight_bytes_per_token": weights,
               "weight_gb_s": weights * gen / decode / 1e9, "load_s": eng.timings.load_s,
               "compile_s": COMPILE.seconds - c0, "type_k": eng.kv.type_k, "type_v": eng.kv.type_v,
               "kv_bytes_per_1k": 1000 * eng.kv.bytes_per_pos, **latency_percentiles(per_token, "decode_token")}
    if as_json:
        print(json.dumps(res))
        return
    click.echo(f"prefill {res['prefill_tok_s']:.1f} tok/s ({len(ids)} tokens), decode {res['decode_tok_s']:.2f} tok/s "
               f"({gen} tokens; per token p50 {res['decode_token_p50_s'] * 1e3:.1f} ms, p90 "
               f"{res['decode_token_p90_s'] * 1e3:.1f}, p99 {res['decode_token_p99_s'] * 1e3:.1f}), weights "
               f"{res['weight_gb_s']:.2f} GB/s, threads {res['threads']}")


@click.command()
@click.argument("model", required=False)
@click.option("--chat-template", "template_file", type=click.File("r"), default=None,
              help="A Jinja chat template file overriding the model's tokenizer.chat_template.")
@click.option("--system", default=None, help="A system message to start the conversation.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=512, show_default=True)
@sampler_options
@ctx_option
@ram_option
@threads_option
@kv_options
@spill_option
def chat(model, template_file, system, max_tokens, ctx, ram, threads, kv_type, kv_type_k, kv_type_v, kv_spill,
         **sampling):
    """An interactive chat with history and streaming output; /exit (or Ctrl-D) quits."""
    from ..generation.api import Model
    from ..sampling import LLAMA

    md, _ = model_metadata(model)
    params = sampler_params(with_gguf_defaults(sampling, md)).as_dict()
    template = template_file.read() if template_file else None
    history = [{"role": "system", "content": system}] if system else []
    type_k, type_v = kv_types_of(kv_type, kv_type_k, kv_type_v)
    with Model(model or "default", ram=ram, n_ctx=ctx or flags.DEFAULT_CTX, n_threads=threads, chat_template=template,
               type_k=type_k, type_v=type_v, kv_spill=spill_of(kv_spill)) as m:
        m.sampler_chain = LLAMA                 # the CLI samples as llama.cpp's common_sampler
        click.echo(f"chatting with {m.path}; /exit to quit", err=True)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if line.strip() in ("/exit", "/quit", "/bye"):
                break
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            reply = []
            for chunk in m.create_chat_completion(history, max_tokens=max_tokens, stream=True, **params):
                piece = chunk["choices"][0]["delta"].get("content", "")
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            history.append({"role": "assistant", "content": "".join(reply)})


COMMANDS = [run, chat, bench]
