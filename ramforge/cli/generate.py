"""CLI commands that run the model or its tokenizer: run, tokenize, detokenize, logits."""
from __future__ import annotations

import json
import sys

import click
import numpy as np
from rich.table import Table

from .gguf.reader import GGUFFile
from .memory import MemoryBudget, parse_memory_size
from .resolve import resolve_model


def _tokenizer(model):
    from .tokenizer import load_tokenizer

    with GGUFFile(resolve_model(model)) as f:
        return load_tokenizer(f.metadata)


def _engine(model, ctx, ram, io="direct", threads=None):
    from .engine import Engine

    budget = MemoryBudget(parse_memory_size(ram) if ram else None)
    return Engine.load(resolve_model(model), n_ctx=ctx, budget=budget, io=io, n_threads=threads)


def _sampler(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, n_vocab):
    from .sampling import Sampler, SamplerParams

    params = SamplerParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                           repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed).validate()
    return Sampler(params, n_vocab)


ctx_option = click.option("--ctx", type=click.IntRange(min=1), default=None,
                          help="Context length (default: 4096, or the model's if smaller).")
ram_option = click.option("--ram", default=None, help="Memory budget, e.g. 4G (default: unlimited).")
threads_option = click.option("-t", "--threads", type=int, default=None,
                              help="Kernel threads (default: $RAMFORGE_THREADS or the physical cores).")
io_option = click.option("--io", type=click.Choice(["direct", "buffered", "mmap"]), default="direct", show_default=True,
                         help="How streamed weights are read: O_DIRECT, pread + fadvise(DONTNEED), or mmap.")


@click.command()
@click.argument("model", required=False)
@click.option("-p", "--prompt", required=True, help="Prompt text (special tokens like <bos> are parsed).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=128, show_default=True)
@click.option("--temp", type=float, default=0.8, show_default=True, help="Temperature; 0 is greedy.")
@click.option("--top-k", type=int, default=40, show_default=True, help="0 disables.")
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--min-p", type=float, default=0.05, show_default=True)
@click.option("--repeat-penalty", type=float, default=1.0, show_default=True)
@click.option("--repeat-last-n", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed for sampling (default: random).")
@ctx_option
@ram_option
@io_option
@threads_option
@click.option("--profile", is_flag=True, help="Per-layer I/O and per-op compute tables on stderr (and in --json).")
@click.option("--memory-report", is_flag=True, help="Managed, RSS and page-cache memory on stderr (and in --json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end instead of streaming.")
def run(model, prompt, max_tokens, temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, ctx, ram,
        io, threads, profile, memory_report, as_json):
    """Generate a continuation of PROMPT; text streams to stdout, stats to stderr."""
    from .profiling import PROFILE
    from .report import memory_report as mem_report, render_memory, render_profile

    PROFILE.enabled = profile
    PROFILE.reset()
    with _engine(model, ctx, ram, io, threads) as eng:
        sampler = _sampler(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, eng.hp.n_vocab)
        ids = eng.tokenizer.encode(prompt, add_special=True, parse_special=True)
        out, dec = [], eng.tokenizer.stream()
        for tok in eng.generate(ids, max_tokens, sampler):
            out.append(tok)
            if not as_json:
                sys.stdout.write(dec.feed(tok))
                sys.stdout.flush()
        t = eng.timings.as_dict()
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
                   f"decode {t['gen_tokens']} tokens at {t['decode_tok_s']:.1f} tok/s, load {t['load_s']:.2f} s",
                   err=True)
        if profile:
            render_profile(extra["profile"], t)
        if memory_report:
            render_memory(extra["memory"])


@click.command()
@click.argument("model")
@click.argument("text")
@click.option("--no-bos", is_flag=True, help="Do not add BOS/EOS as the model's flags ask.")
@click.option("--special", is_flag=True, help="Parse special tokens such as <start_of_turn> in TEXT.")
@click.option("--json", "as_json", is_flag=True)
def tokenize(model, text, no_bos, special, as_json):
    """Token ids of TEXT, as llama.cpp's llama_tokenize gives them."""
    from .cli import out

    tok = _tokenizer(model)
    ids = tok.encode(text, add_special=not no_bos, parse_special=special)
    if as_json:
        print(json.dumps({"ids": ids, "pieces": [tok.token_text(i) for i in ids]}))
        return
    t = Table()
    t.add_column("id", justify="right"), t.add_column("piece")
    for i in ids:
        t.add_row(str(i), repr(tok.token_text(i)))
    out.print(t)
    out.print(f"{len(ids)} tokens")


@click.command()
@click.argument("model")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--special", is_flag=True, help="Render control tokens too.")
def detokenize(model, ids, special):
    """Text of token IDS (UTF-8 assembled across byte tokens)."""
    tok = _tokenizer(model)
    bad = [i for i in ids if not 0 <= i < tok.n_vocab]
    if bad:
        raise click.BadParameter(f"token id {bad[0]} is outside 0..{tok.n_vocab - 1}", param_hint="IDS")
    sys.stdout.write(tok.decode(list(ids), special=special) + "\n")


@click.command()
@click.argument("model")
@click.argument("prompt")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True)
@ctx_option
@ram_option
@click.option("--json", "as_json", is_flag=True)
def logits(model, prompt, top, ctx, ram, as_json):
    """The top-N logits after PROMPT (BOS added as the model asks; special tokens not parsed)."""
    from .cli import out

    with _engine(model, ctx, ram) as eng:
        ids = eng.tokenizer.encode(prompt, add_special=True, parse_special=False)
        lg = eng.eval(ids, aligned=True)[-1]                # as llama.cpp computes a prompt
        order = np.argsort(-lg, kind="stable")[:top]
        rows = [{"id": int(i), "piece": eng.tokenizer.token_text(int(i)), "logit": float(lg[i])} for i in order]
        if as_json:
            print(json.dumps({"prompt_tokens": ids, "top": rows, "std": float(lg.std())}))
            return
        t = Table(title=f"top {top} logits after {len(ids)} tokens")
        for c in ("rank", "id", "piece", "logit"):
            t.add_column(c, justify="left" if c == "piece" else "right")
        for r, row in enumerate(rows, 1):
            t.add_row(str(r), str(row["id"]), repr(row["piece"]), f"{row['logit']:.4f}")
        out.print(t)


COMMANDS = [run, tokenize, detokenize, logits]


@click.command()
@click.argument("model", required=False)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--gen", type=click.IntRange(min=1), default=64, show_default=True)
@threads_option
@ram_option
@io_option
@click.option("--json", "as_json", is_flag=True)
def bench(model, prompt_tokens, gen, threads, ram, io, as_json):
    """Prefill and decode speed, and the weight bandwidth decode achieves (greedy, after a warm-up)."""
    import time as _time

    from .plan import layer_of

    with _engine(model, prompt_tokens + gen + 8, ram, io, threads) as eng:
        base = eng.tokenizer.encode("The history of the printing press begins in the fifteenth century, when ",
                                    add_special=False)
        ids = ([eng.tokenizer.bos_id] if eng.tokenizer.add_bos else []) + (base * prompt_tokens)[:prompt_tokens]
        ids = ids[:prompt_tokens]
        eng.eval(ids[:2])                                     # warm-up: numba loads its cache
        eng.reset()
        t0 = _time.perf_counter()
        logits = eng.eval(ids)[-1]
        prefill = _time.perf_counter() - t0
        tok, t1 = int(np.argmax(logits)), _time.perf_counter()
        for _ in range(gen):
            tok = int(np.argmax(eng.eval([tok])[-1]))
        decode = _time.perf_counter() - t1
        weights = sum(t.nbytes for n, t in eng.weights.f.tensors.items()
                      if layer_of(n) is not None or n in (eng.weights.out_name,))
        res = {"model": eng.path, "threads": __import__("numba").get_num_threads(), "prompt_tokens": len(ids),
               "gen_tokens": gen, "prefill_s": prefill, "prefill_tok_s": len(ids) / prefill,
               "decode_s": decode, "decode_tok_s": gen / decode, "weight_bytes_per_token": weights,
               "weight_gb_s": weights * gen / decode / 1e9, "load_s": eng.timings.load_s}
    if as_json:
        print(json.dumps(res))
        return
    click.echo(f"prefill {res['prefill_tok_s']:.1f} tok/s ({len(ids)} tokens), decode {res['decode_tok_s']:.2f} tok/s "
               f"({gen} tokens), weights {res['weight_gb_s']:.2f} GB/s, threads {res['threads']}")


COMMANDS.append(bench)


@click.command()
@click.argument("model", required=False)
@click.option("--chat-template", "template_file", type=click.File("r"), default=None,
              help="A Jinja chat template file overriding the model's tokenizer.chat_template.")
@click.option("--system", default=None, help="A system message to start the conversation.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--temp", type=float, default=0.8, show_default=True)
@click.option("--seed", type=int, default=None)
@ctx_option
@ram_option
@threads_option
def chat(model, template_file, system, max_tokens, temp, seed, ctx, ram, threads):
    """An interactive chat with history and streaming output; /exit (or Ctrl-D) quits."""
    from .api import Model

    template = template_file.read() if template_file else None
    history = [{"role": "system", "content": system}] if system else []
    with Model(model or "default", ram=ram, n_ctx=ctx or 4096, n_threads=threads, seed=seed,
               chat_template=template) as m:
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
            for chunk in m.create_chat_completion(history, max_tokens=max_tokens, temperature=temp, stream=True):
                piece = chunk["choices"][0]["delta"].get("content", "")
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            history.append({"role": "assistant", "content": "".join(reply)})


COMMANDS.append(chat)
