"""Compare ramforge against the recorded llama.cpp oracle (tests/fixtures/oracle/*.json).

    python tools/oracle_report.py [MODEL_ID ...]      # prints one line per model

Per model: tokens equal; logits at every position of prompt + llama.cpp's greedy continuation
(teacher forcing) compared on the recorded ids (top-10 and 64 probes): max |dlogit| / std, top-1
agreement overall and where llama.cpp's top1-top2 gap exceeds 0.05 std ("decisive"); and the
free-running greedy continuation: identical tokens, or the first step where it differs and the
recorded gap there.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):             # run as `python tools/oracle_report.py`: make the `tools` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parent.parent
ORACLE_DIR = REPO / "tests" / "fixtures" / "oracle"
DECISIVE = 0.05          # the threshold: a top-1/top-2 gap above this many stds must not flip
NEAR_TIE = 0.10          # the threshold where llama.cpp's own batch-vs-sequential noise is ~0.1-0.75 std


def records() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(ORACLE_DIR.glob("*.json"))]


def model_path(rec: dict) -> Path:
    m = rec["model"]
    if m["source"] == "synthetic":
        from tools.make_models import ensure_model

        return ensure_model(m.get("spec", m["arch"]), m["type"])     # spec: the make_models key
    from ramforge.store.resolve import default_model_path

    return default_model_path()


@dataclass
class PromptResult:
    name: str
    tokens_equal: bool
    positions: int = 0
    max_rel: float = 0.0                 # max |dlogit| / std over positions and recorded ids
    max_rel_prompt: float = 0.0          # the same over the prompt rows only (comparable to llama_self_rel)
    llama_self_rel: float = 0.0          # llama.cpp's own batch-vs-sequential max |dlogit| / std
    top1_agree: int = 0
    decisive: int = 0
    decisive_agree: int = 0
    clear: int = 0                       # positions with gap > NEAR_TIE std
    clear_agree: int = 0
    greedy_equal: bool = False
    diverged_at: int | None = None       # first differing generated step
    gap_at_divergence: float | None = None   # recorded gap / std there


@dataclass
class ModelResult:
    model_id: str
    prompts: list[PromptResult] = field(default_factory=list)

    def summary(self) -> dict:
        p = self.prompts
        n = sum(r.positions for r in p)
        return {"model": self.model_id, "prompts": len(p), "tokens_equal": all(r.tokens_equal for r in p),
                "positions": n, "max_rel": max(r.max_rel for r in p),
                "llama_self_rel": max(r.llama_self_rel for r in p),
                "top1": sum(r.top1_agree for r in p) / max(n, 1),
                "max_rel_prompt": max(r.max_rel_prompt for r in p),
                "decisive": sum(r.decisive for r in p), "decisive_agree": sum(r.decisive_agree for r in p),
                "clear": sum(r.clear for r in p), "clear_agree": sum(r.clear_agree for r in p),
                "greedy_identical": sum(r.greedy_equal for r in p),
                "divergence_gaps": [round(r.gap_at_divergence, 4) for r in p if r.gap_at_divergence is not None]}


def compare(rec: dict, engine) -> ModelResult:
    """Run every recorded prompt through `engine` (a loaded ramforge Engine) and measure."""
    res = ModelResult(rec["model"]["id"])
    probe = np.asarray(rec["probe_ids"])
    tok = engine.tokenizer
    for pr in rec["prompts"]:
        prompt = pr["tokens_special"] if pr["special"] else pr["tokens"]       # the ids llama.cpp evaluated
        r = PromptResult(pr["name"], tok.encode(pr["text"]) == pr["tokens"] and
                         tok.encode(pr["text"], parse_special=True) == pr.get("tokens_special", pr["tokens"]))
        lg = pr["logits"]
        # as llama.cpp produced the record: the prompt in one llama_decode (ubatches of n_ubatch), then
        # llama.cpp's greedy tokens one llama_decode each (teacher forcing)
        engine.reset()
        engine.ubatch = rec["oracle"].get("n_ubatch", 512)
        ours = [engine.eval(prompt, all_logits=True, aligned=True)]
        ours += [engine.eval([t]) for t in list(pr["gen_tokens"])[:len(lg["top_ids"]) - len(prompt)]]
        ours = np.concatenate(ours)                                     # f32[positions, n_vocab]
        for i, (ids, vals, sd, gap) in enumerate(zip(lg["top_ids"], lg["top_vals"], lg["std"], lg["gap"])):
            ids, vals = np.asarray(ids), np.asarray(vals, np.float32)
            d = np.abs(ours[i, ids] - vals).max()
            if i < len(lg["probe"]):
                d = max(d, np.abs(ours[i, probe] - np.asarray(lg["probe"][i], np.float32)).max())
            r.max_rel = max(r.max_rel, float(d / sd))
            if i < len(prompt):
                r.max_rel_prompt = max(r.max_rel_prompt, float(d / sd))
            agree = int(np.argmax(ours[i])) == ids[0]
            agree = bool(agree)
            r.top1_agree += agree
            if gap > DECISIVE * sd:
                r.decisive += 1
                r.decisive_agree += agree
            if gap > NEAR_TIE * sd:
                r.clear += 1
                r.clear_agree += agree
            r.positions += 1
        r.llama_self_rel = max((m / s for m, s in zip(lg["seq_maxdiff"], lg["std"])), default=0.0)
        gen = list(engine.generate(prompt, len(pr["gen_tokens"]), stop_on_eog=pr["stop"] != "max_tokens"))
        r.greedy_equal = gen == pr["gen_tokens"]
        if not r.greedy_equal:
            k = next((j for j, (a, b) in enumerate(zip(gen, pr["gen_tokens"])) if a != b), min(len(gen), len(pr["gen_tokens"])))
            r.diverged_at = k
            pos = len(prompt) - 1 + k
            if pos < len(lg["gap"]):
                r.gap_at_divergence = lg["gap"][pos] / lg["std"][pos]
        res.prompts.append(r)
    return res


def main(argv: list[str]) -> int:
    from ramforge.engine.engine import Engine

    for rec in records():
        if argv and rec["model"]["id"] not in argv:
            continue
        try:
            path = model_path(rec)
        except Exception as e:                      # a quantized model needs llama_cpp to be built
            print(f"{rec['model']['id']:24s} skipped: {e}")
            continue
        with Engine.load(path, n_ctx=rec["oracle"]["n_ctx"]) as eng:
            s = compare(rec, eng).summary()
        print(json.dumps(s), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
