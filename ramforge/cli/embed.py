"""`ramforge embed MODEL [FILE|-]`: one document per line in, one embedding per document out, as
llama.cpp's llama-embedding computes them (generation/embed.py: several documents per llama_decode,
each decode's tokens in passes over the weights of the size stream.embed_plan picks from --ram).

Output: JSON lines (default: {"line": n, "embedding": [...]} per document, pooling none: a list per
token), --json (one JSON array of the embeddings, llama-embedding's --embd-output-format array), or
--npy OUT (a float32 matrix [n_docs, n_embd]). Blank lines are skipped (the `line` numbers stay the
file's). --normalize is llama.cpp's embd_normalize (2, Euclidean, by default as llama-embedding).
"""
from __future__ import annotations

import json
import sys
import time

import click
import numpy as np

from .console import ctx_option, err, load_engine, model_metadata, ram_option, threads_option

POOLINGS = ("none", "mean", "cls", "last", "rank")


def read_documents(stream) -> tuple[list[int], list[str]]:
    """(line numbers from 1, texts) of the stream's non-blank lines, their line ends removed."""
    lines, docs = [], []
    for i, line in enumerate(stream, 1):
        text = line.rstrip("\r\n")
        if text.strip():
            lines.append(i)
            docs.append(text)
    return lines, docs


@click.command()
@click.argument("model")
@click.argument("file", default="-", type=click.File("r", encoding="utf-8"))
@click.option("--json", "as_json", is_flag=True, help="One JSON array of all embeddings (default: JSON lines).")
@click.option("--npy", "npy", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a float32 matrix [documents, n_embd] to this .npy file instead.")
@click.option("--pooling", type=click.Choice(POOLINGS), default=None,
              help="Override the file's pooling ({arch}.pooling_type).")
@click.option("--normalize", type=click.IntRange(min=-1), default=2, show_default=True,
              help="llama.cpp's embd_normalize: -1 none, 0 max-abs (int16), 1 taxicab, 2 Euclidean, >2 p-norm.")
@click.option("--no-truncate", is_flag=True, help="Refuse a document longer than the batch instead of cutting it.")
@click.option("--profile", is_flag=True, help="Documents, tokens, weight passes and docs/s on stderr.")
@ctx_option
@ram_option
@threads_option
def embed(model, file, as_json, npy, pooling, normalize, no_truncate, profile, ctx, ram, threads):
    """Embeddings of FILE's lines (- or nothing: stdin), one document per line."""
    from ..generation.embed import EmbedStats, Embedder, Pooling, pooling_of

    if as_json and npy:
        raise click.UsageError("--json and --npy are exclusive")
    lines, docs = read_documents(file)
    if not docs:
        raise click.UsageError("no documents: FILE (or stdin) has no non-blank line")
    md, path = model_metadata(model)
    with load_engine(path, ctx, ram, threads=threads, embed=True) as eng:
        emb = Embedder(eng, pooling_of(md, eng.hp.arch, pooling))
        if npy and emb.pooling == Pooling.NONE:
            raise click.UsageError("--npy needs one vector per document, and the pooling is none "
                                   "(a vector per token): give --pooling mean, cls or last")
        toks = [emb.tokens(d, truncate=not no_truncate) for d in docs]
        stats = EmbedStats()
        t0 = time.perf_counter()
        vecs = emb.embed_many(toks, normalize, stats=stats)
        seconds = time.perf_counter() - t0
    if npy:
        np.save(npy, np.stack(vecs).astype(np.float32))
    elif as_json:
        sys.stdout.write(json.dumps([v.tolist() for v in vecs]) + "\n")
    else:
        for n, v in zip(lines, vecs):
            sys.stdout.write(json.dumps({"line": n, "embedding": v.tolist()}) + "\n")
    if profile:
        err.print(f"{stats.docs} documents, {stats.tokens} tokens, {stats.passes} weight passes "
                  f"({stats.docs_per_pass:.2f} documents per pass, {stats.chunk} tokens a pass), {seconds:.3f} s, "
                  f"{stats.docs / seconds if seconds else 0.0:.1f} docs/s, pooling {emb.pooling.name.lower()}")


COMMANDS = [embed]
