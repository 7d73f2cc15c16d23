"""What a grammar costs per generated token: llguidance's mask, applying it, advancing the matcher.

    python benchmarks/grammar.py [--model default] [--tokens 128] [--threads N]

For JSON mode and a few schemas, greedy generation on the model: the decode time per token, and the
time the grammar stage takes within it (GrammarState.apply: llguidance's mask and the -inf writes, and
accept, timed around the calls, plus the logits' copy into the sampler's buffer), as a share of the
decode time without a grammar. Also the one-off costs: building llguidance's
tokenizer for the vocabulary (once per model) and compiling a grammar (cached).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMAS = {
    "json_object": {"type": "object"},
    "person": {"type": "object", "properties": {"name": {"type": "string"},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name"]},
    "shopping-list": {"type": "array", "minItems": 2, "items": {
        "type": "object", "properties": {"item": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
        "required": ["item", "qty"]}},
}
PROMPT = "Write a detailed JSON document about a city: its name, population, districts and landmarks."


class Timed:
    """Wraps a GrammarState, adding up the seconds spent in its calls."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def apply(self, logits):
        t = time.perf_counter()
        ok = self.inner.apply(logits)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return ok

    def accept(self, tok):
        t = time.perf_counter()
        self.inner.accept(tok)
        self.seconds += time.perf_counter() - t


def main(argv=None) -> int:
    import ramforge
    from ramforge.sampling.params import sampler_params
    from ramforge.sampling import Sampler
    from ramforge.structured import schema_grammar, matcher

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    with ramforge.Model(a.model, n_ctx=1024, n_threads=a.threads) as m:
        ids = m.tokenize(m.render_chat([{"role": "user", "content": PROMPT}]), special=True)
        n_vocab = m.engine.hp.n_vocab
        t = time.perf_counter()
        matcher.lltokenizer(m.tokenizer)
        print(f"llguidance tokenizer for {n_vocab} tokens: {time.perf_counter() - t:.2f} s (once per model)")

        def run(grammar):
            s = Sampler(sampler_params({"temperature": 0}), n_vocab, tokenizer=m.tokenizer, grammar=grammar)
            timed = None
            if grammar is not None:
                timed = s.grammar_state = Timed(s.grammar_state)
            list(m.engine.generate(ids, a.tokens, s, reuse_prefix=True))
            n = m.engine.timings.gen_tokens
            return m.engine.timings.gen_s / n, (timed.seconds / n if timed else 0.0), n

        # the stage's one extra copy per token: the logits into the sampler's work buffer
        x, w = np.random.rand(n_vocab).astype(np.float32), np.empty(n_vocab, np.float32)
        t = time.perf_counter()
        for _ in range(200):
            np.copyto(w, x)
        apply_s = (time.perf_counter() - t) / 200
        print(f"copying {n_vocab} logits: {apply_s * 1e3:.3f} ms/token")
        run(None)                                               # warm up (compile, caches)
        base = np.median([run(None)[0] for _ in range(3)])
        print(f"decode without a grammar: {base * 1e3:.2f} ms/token")
        print(f"{'grammar':<14} {'compile':>9} {'decode ms/tok':>14} {'grammar ms/tok':>15} {'share of decode':>16}")
        worst = 0.0
        for name, schema in SCHEMAS.items():
            gbnf = schema_grammar(schema)
            t = time.perf_counter()
            g = m.compile_grammar(gbnf)
            comp = time.perf_counter() - t
            results = [run(g) for _ in range(3)]
            dec = float(np.median([r[0] for r in results]))
            gram = float(np.median([r[1] for r in results])) + apply_s
            n = results[0][2]
            share = gram / base
            worst = max(worst, share)
            print(f"{name:<14} {comp * 1e3:>7.1f}ms {dec * 1e3:>14.2f} {gram * 1e3:>15.3f} {share:>15.1%}  ({n} tokens)")
        print(f"worst grammar share of decode time: {worst:.1%} (target <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
