"""How a mixture-of-experts model routes ordinary English: run it on a fixed text (the prompt of
benchmarks/moe_out_of_core.py, then its text and more, teacher-forced: one decode pass per token, as
that benchmark does), record the routing (stream.routing_trace) and print per layer:

  top 10/20/40/50 %   share of the decode tokens' activations taken by the most used 10/20/40/50 % of
                      the layer's experts (over the measured window)
  reuse               share of the previous token's k experts the next token picks again
  LRU X %             hit rate of an LRU cache of X % of the layer's experts (per-layer slots, warmed by
                      the prompt's prefill, decode lookups counted)

    python tools/routing_stats.py /work/models/qwen3moe-30b-a3b-6l-Q4_K_M.gguf [--tokens 256]
        [--lru 25 40 50] [--trace OUT.npz] [--json] [--threads N]

tools/make_direct.py --skew calibrates its routers on a different text, so these figures are
held-out ones for a skewed model.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.moe_out_of_core import PROMPT, TEXT  # noqa: E402
from ramforge.models.routing_trace import Trace  # noqa: E402

MORE = (" In England, William Caxton set up a press at Westminster in 1476 and printed Chaucer, Malory and "
        "a stream of devotional books, choosing a London dialect that helped to fix English spelling. Printers "
        "were also booksellers and editors: they chose what to publish, corrected manuscripts, cut woodblocks "
        "for illustrations and sold their stock at fairs in Frankfurt and Lyon. Governments soon noticed. "
        "Licensing laws, lists of forbidden books and privileges granting a printer the sole right to a title "
        "all appeared within a century, and the quarrels of the Reformation were fought as much in pamphlets "
        "as in pulpits. By 1600 a reader in Venice or Antwerp could buy maps, almanacs, grammars, music and "
        "news sheets, and scientists exchanged tables of observations that no scribe would have copied "
        "accurately. The steam-driven cylinder press of the nineteenth century multiplied output again, "
        "newspapers reached millions of households, and cheap paper made from wood pulp replaced rag. Each "
        "change in the machinery altered who could write, who could read, and what they expected a book to be.")
MEASURE_TEXT = " " + TEXT + MORE
TOPS = (0.1, 0.2, 0.4, 0.5)


def layer_stats(sel: np.ndarray, n_expert: int) -> dict:
    """Popularity and reuse of one layer's decode selections sel i[T, k]."""
    k = sel.shape[1]
    cnt = np.sort(np.bincount(sel.ravel(), minlength=n_expert))[::-1] / max(sel.size, 1)
    out = {f"top{round(p * 100)}": float(cnt[:max(1, round(p * n_expert))].sum()) for p in TOPS}
    same = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(sel[1:], sel[:-1])]
    out["reuse"] = float(np.mean(same) / k) if same else 0.0
    out["distinct"] = int((cnt > 0).sum())
    return out


def stats(trace: Trace, lru=(25, 40, 50)) -> dict:
    from tools.replay_routing import replay

    per = {il: layer_stats(sel, trace.n_expert) for il, sel in trace.decode_rows().items()}
    for pct in lru:
        slots = max(trace.k, round(pct / 100 * trace.n_expert))
        for il in per:
            one = Trace(trace.ids[trace.layer == il], trace.layer[trace.layer == il], trace.pass_[trace.layer == il],
                        trace.row[trace.layer == il], trace.n_expert, trace.n_layer, trace.k, trace.model)
            r = replay(one, slots, ("lru",), shared=False)[0]
            per[il][f"lru{pct}"] = r.hit_rate
    keys = next(iter(per.values())).keys() if per else []
    mean = {k: float(np.mean([v[k] for v in per.values()])) for k in keys}
    return {"model": trace.model, "n_expert": trace.n_expert, "k": trace.k,
            "tokens": int(len(next(iter(trace.decode_rows().values()), []))), "layers": per, "mean": mean}


def measure(model: str, tokens: int, trace_path: Path, threads: int | None = None) -> Trace:
    from ramforge.engine.engine import Engine
    from ramforge.models import routing_trace

    with Engine.load(model, n_ctx=tokens + 128, n_threads=threads) as e:
        prompt = e.tokenizer.encode(PROMPT, add_special=True)
        text = e.tokenizer.encode(MEASURE_TEXT, add_special=False)
        if tokens > len(text):
            raise SystemExit(f"--tokens {tokens}: the text has {len(text)} tokens")
        routing_trace.attach(e, trace_path)
        e.eval(prompt, aligned=True)
        for t in text[:tokens]:
            e.eval([t])
    return Trace.load(trace_path)


def render(s: dict, lru) -> str:
    cols = [f"top{round(p * 100)}" for p in TOPS] + ["reuse"] + [f"lru{p}" for p in lru]
    head = ["layer"] + [c.replace("top", "top ").replace("lru", "LRU ") + " %" if c != "reuse" else c for c in cols]
    lines = [f"{s['model']}: {s['tokens']} decode tokens, {s['n_expert']} experts, k {s['k']}",
             " ".join(f"{h:>9}" for h in head)]
    for il, v in list(s["layers"].items()) + [("mean", s["mean"])]:
        lines.append(f"{il!s:>9} " + " ".join(f"{v[c]:>9.1%}" for c in cols))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=256, help="decode tokens of the text (teacher-forced)")
    ap.add_argument("--lru", type=int, nargs="+", default=[25, 40, 50], help="LRU cache sizes, %% of a layer's experts")
    ap.add_argument("--trace", type=Path, help="keep the routing trace here (default: a temporary file)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = measure(a.model, a.tokens, a.trace or Path(tmp) / "trace.npz", a.threads)
    s = stats(trace, a.lru)
    print(json.dumps(s) if a.json else render(s, a.lru))
    return 0


if __name__ == "__main__":
    sys.exit(main())
