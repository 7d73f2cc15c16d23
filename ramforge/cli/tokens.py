"""CLI commands on the tokenizer and the logits: tokenize, detokenize, logits."""
from __future__ import annotations

import json
import sys

import click
import numpy as np
from rich.table import Table

from ..errors import TokenIdError, check_token_ids
from .console import ctx_option, load_engine, load_tokenizer_of, out, ram_option


@click.command()
@click.argument("model")
@click.argument("text")
@click.option("--no-bos", is_flag=True, help="Do not add BOS/EOS as the model's flags ask.")
@click.option("--special", is_flag=True, help="Parse special tokens such as <start_of_turn> in TEXT.")
@click.option("--json", "as_json", is_flag=True)
def tokenize(model, text, no_bos, special, as_json):
    """Token ids of TEXT, as llama.cpp's llama_tokenize gives them."""
    tok = load_tokenizer_of(model)
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
    tok = load_tokenizer_of(model)
    try:
        check_token_ids(ids, tok.n_vocab)
    except TokenIdError as e:                      # a bad argument: click's usage error (exit 2)
        raise click.BadParameter(str(e), param_hint="IDS") from None
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
    with load_engine(model, ctx, ram) as eng:
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


COMMANDS = [tokenize, detokenize, logits]
