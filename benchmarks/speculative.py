"""Speculative decoding out of core: s/token with and without drafts, acceptance, tokens per pass.

    python benchmarks/speculative.py [--ram 64M --ctx 512 --tokens 64] [--big] [--json]

gemma-3-270m (the default model) streamed under --ram (64M: ~200 MiB read per token) on
input-grounded tasks (copy a function with one change, continue a repeating list, quote a passage)
and on free text; modes: plain, `lookup` (prompt lookup, adaptive length: the CLI's --lookup),
`lookup-fixed` (llama-cpp-python's LlamaPromptLookupDecoding rules) and `self-draft` (the model
itself as a resident draft model beside its streamed copy, charged to the same budget raised by the
draft's size: an upper bound for a draft model, as no smaller same-vocabulary gemma exists here).
--big adds the 3B synthetic llama (random weights: nothing to accept) at --big-ram 512M, for the
cost of verification and the no-slowdown check, with a tiny same-vocabulary synthetic draft.

Each run is a fresh process with the model file evicted from the page cache first; kernels are
warmed on another prompt in that process (compiling is not timed). Greedy tokens are compared with
the plain run's. The page cache's share of the file after each run is reported (fincore).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FUNC = '''def order_total(items, tax_rate):
    """Sum the price of every item, then add tax."""
    subtotal = 0.0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return round(subtotal + tax, 2)'''
PASSAGE = ("The lighthouse on Gull Point was built in 1871 from granite quarried on the island itself. Its "
           "lamp, first lit on the night of March 3rd, burned whale oil until 1890, when kerosene replaced it. "
           "The last keeper, Ada Thornton, left in 1962 after the light was automated, and she wrote that the "
           "silence of the empty tower was louder than any storm she had known.")
LIST = "".join(f"{d}: gym at 7, lunch with Sam, read for an hour\n" for d in
               ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"))
TASKS = {
    "copy-function": ("grounded", f"Here is a Python function:\n\n```python\n{FUNC}\n```\n\nRewrite it exactly, "
                                  f"changing only the function's name to `cart_total`."),
    "repeat-list": ("grounded", f"Here is my weekly plan:\n{LIST}Write it out again for next week, the same "
                                f"plan for each day, Monday to Friday."),
    "quote-passage": ("grounded", f"{PASSAGE}\n\nQuote, word for word, the two sentences of the passage about "
                                  f"the lamp and the last keeper."),
    "free-text": ("free", "Write a short story about a dragon who learns to bake bread."),
}
WARM = "<start_of_turn>user\nSay hello twice: hello hello<end_of_turn>\n<start_of_turn>model\n"
MODES = ("plain", "lookup", "lookup-fixed", "self-draft")


def drafter_for(mode: str, draft_path: str | None):
    from ramforge.engine.speculative import DraftModel, PromptLookup

    if mode == "lookup":
        return PromptLookup(2, 10, adaptive=True)
    if mode == "lookup-fixed":
        return PromptLookup(2, 10)
    if mode in ("self-draft", "draft"):
        return DraftModel(draft_path, n_max=8)
    return None


def child(model: str, ram: str, ctx: int, mode: str, prompt: str, tokens: int, draft_path: str | None) -> dict:
    from ramforge.engine.engine import Engine
    from ramforge.memory import MemoryBudget
    from ramforge.profiling import PROFILE
    from ramforge.engine.speculative import DraftModel

    budget = MemoryBudget(None if ram == "unlimited" else ram)
    drafter = drafter_for(mode, draft_path)
    if isinstance(drafter, DraftModel):
        drafter.attach(Engine.load, budget, ctx)
    with Engine.load(model, n_ctx=ctx, budget=budget) as eng:
        if isinstance(drafter, DraftModel):
            drafter.check_vocab(eng.tokenizer)
        warm = eng.tokenizer.encode(WARM, parse_special=True) if "gemma" in eng.hp.arch else [1, 450, 4996, 17354]
        list(eng.generate(warm, 3, draft=drafter, stop_on_eog=False))
        if hasattr(drafter, "reset"):
            drafter.reset()
        ids = eng.tokenizer.encode(prompt, parse_special=True)
        PROFILE.enabled = True
        PROFILE.reset()
        out = list(eng.generate(ids, tokens, draft=drafter, stop_on_eog=False))
        PROFILE.enabled = False
        t, p = eng.timings, PROFILE.summary()
        res = {"mode": mode, "tokens": out, "n": len(out), "s_per_token": t.gen_s / max(len(out), 1),
               "bytes_per_token": p["bytes_after_prompt"] / max(len(out), 1), "pinned": len(eng.plan.pinned),
               "n_layer": eng.hp.n_layer, "spec": t.spec.as_dict() if t.spec else None, "n_prompt": len(ids),
               "prefill_s": t.prompt_s}
    if isinstance(drafter, DraftModel):
        drafter.close()
    return res


def run(model, ram, ctx, mode, prompt, tokens, draft_path=None) -> dict:
    from ramforge.stream.io import evict, page_cache_residency

    for f in {model, draft_path} - {None}:
        evict(f)
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps([model, ram, ctx, mode, prompt, tokens,
                                                                         draft_path])],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"child failed ({mode}): {r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    resident, size = page_cache_residency(model)
    res["cache_after"] = resident / size
    return res


def table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'task':15} {'mode':13} {'s/token':>8} {'speedup':>8} {'MB/token':>9} {'accept':>7} {'tok/pass':>8} "
          f"{'same':>5} {'cache':>6}")
    for r in rows:
        s = r["spec"] or {}
        print(f"{r['task']:15} {r['mode']:13} {r['s_per_token']:8.3f} {r['speedup']:7.2f}x "
              f"{r['bytes_per_token'] / 2**20:9.1f} {100 * s.get('acceptance', 0):6.0f}% "
              f"{s.get('tokens_per_pass', 1.0):8.2f} {'yes' if r['same'] else 'NO':>5} {100 * r['cache_after']:5.1f}%")


def bench(model, ram, ctx, tokens, tasks, modes, draft_ram=None, draft_path=None, chat=True) -> list[dict]:
    rows = []
    for task, (kind, text) in tasks.items():
        prompt = f"<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n" if chat else text
        base = None
        for mode in modes:
            budget = draft_ram if mode in ("self-draft", "draft") else ram
            r = run(model, budget, ctx, mode, prompt, tokens, draft_path if mode in ("self-draft", "draft") else None)
            base = base or r
            r.update(task=task, kind=kind, speedup=base["s_per_token"] / r["s_per_token"],
                     same=r["tokens"] == base["tokens"])
            rows.append(r)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="default: the embedded gemma-3-270m")
    ap.add_argument("--ram", default="64M", help="the target's budget; 'unlimited': in RAM")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS), help="none: --big alone")
    ap.add_argument("--big", action="store_true", help="also the 3B synthetic llama out of core")
    ap.add_argument("--big-ram", default="512M")
    ap.add_argument("--big-tokens", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(*json.loads(a.child))))
        return 0
    from ramforge.memory import parse_memory_size
    from ramforge.store.resolve import default_model_path

    model = a.model or str(default_model_path())
    size = os.path.getsize(model)
    # the draft's weights, KV and state on top of the target's budget
    draft_ram = a.ram if a.ram == "unlimited" else str(parse_memory_size(a.ram) + int(size * 1.15))
    out = {}
    if a.tasks:
        rows = bench(model, a.ram, a.ctx, a.tokens, {t: TASKS[t] for t in a.tasks}, a.modes, draft_ram, model)
        table(f"{Path(model).name} at --ram {a.ram} (self-draft: --ram {draft_ram}), "
              f"{a.tokens} greedy tokens", rows)
        out["gemma"] = rows
    if a.big:
        from tools.make_models import PRESETS, build, ensure_model

        big = str(build(PRESETS["llama-3b"], "Q4_K_M", keep_f16=False))
        tiny = str(ensure_model("llama", "Q8_0", verify=False))
        big_draft_ram = str(parse_memory_size(a.big_ram) + int(os.path.getsize(tiny) * 1.5) + (64 << 20))
        rows = bench(big, a.big_ram, a.ctx, a.big_tokens, {"free-text": ("free", "The history of the city")},
                     ("plain", "lookup", "lookup-fixed", "draft"), big_draft_ram, tiny, chat=False)
        table(f"{Path(big).name} at --ram {a.big_ram} (draft {Path(tiny).name}), {a.big_tokens} greedy tokens", rows)
        out["big"] = rows
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
