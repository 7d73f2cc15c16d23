"""Replay a routing trace (`ramforge run/bench --trace-routing FILE`) against expert-cache policies,
offline, and print each one's hit rate: per-layer slots (N per layer) and one pool of N x layers
slots shared across layers (keys (layer, expert), as stream.experts.ExpertCache holds them).

    python tools/replay_routing.py trace.npz --slots 32 [--policies lru lfu belady static] [--shared-pool]
    python tools/replay_routing.py trace.npz --slots 32 64 --json
    python tools/replay_routing.py trace.npz --slots 25 --policies lfu --shared-pool --half-life 4 12 64
    python tools/replay_routing.py trace.npz --slots 25 --policies lfu static --shared-pool --calibrate other.npz

A step is one layer of one pass (a decode token, or a prefill chunk): its distinct experts are
looked up in order; a miss reads the expert into a slot, evicting one the step does not use (or,
when the step uses more experts than there are slots, one it has finished with). Hits are counted
over decode steps (one-token passes; prefill warms the cache) unless --count all.
Policies: lru; lfu as the engine's (stream.experts: uses decay with HALF_LIFE tokens, LRU among
equals; --half-life: other half-lives than the engine's); belady (evict the expert used again
furthest in the future: the bound no policy beats); static (the N most used experts of the whole
trace pinned, a miss read past the cache: a calibrated resident set, in-sample; it caches nothing on
demand, so Belady does not bound it; --calibrate OTHER: pinned by another trace's counts instead, out of
sample, as a resident set chosen before the text is known would be).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ramforge.stream.experts import HALF_LIFE  # noqa: E402
from ramforge.models.routing_trace import Step, Trace  # noqa: E402

POLICIES = ("lru", "lfu", "belady", "static")
NEVER = 1 << 60


@dataclass
class Result:
    policy: str
    layout: str               # "per-layer" or "shared"
    slots: int                # per layer (the shared pool holds slots x layers)
    hits: int
    misses: int
    half_life: float | None = None   # lfu's, in tokens

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def as_dict(self) -> dict:
        return {"policy": self.policy, "layout": self.layout, "slots": self.slots, "hits": self.hits,
                "misses": self.misses, "hit_rate": self.hit_rate, "half_life": self.half_life}


def simulate(steps: list[Step], n_slots: int, policy: str, counted: list[bool], tokens: list[float],
             per_step: list[int] | None = None, half_life: float = HALF_LIFE,
             calibration: Counter | None = None) -> tuple[int, int]:
    """(hits, misses) of one cache of n_slots over steps (keys (layer, expert)); counted[i]: whether
    step i's lookups count; tokens[i]: the token clock at step i (LFU's decay, its weight halving every
    half_life tokens). per_step, if given, gets each step's misses (counted or not) appended. static pins
    the most used keys of steps' layers by calibration's counts (another trace's), else by steps' own."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {POLICIES}")
    keys_at = [[(s.layer, e) for e in s.experts] for s in steps]
    if policy == "static":
        layers = {s.layer for s in steps}
        uses = Counter(k for ks in keys_at for k in ks) if calibration is None else \
            Counter({k: n for k, n in calibration.items() if k[0] in layers})
        pinned = {k for k, _ in sorted(uses.items(), key=lambda kv: (-kv[1], kv[0]))[:n_slots]}
        if per_step is not None:
            per_step += [sum(k not in pinned for k in ks) for ks in keys_at]
        hits = sum(k in pinned for ks, c in zip(keys_at, counted) if c for k in ks)
        return hits, sum(len(ks) for ks, c in zip(keys_at, counted) if c) - hits
    nxt: list[list[int]] = []                  # belady: each lookup's next use (step index)
    if policy == "belady":
        last: dict = {}
        nxt = [[NEVER] * len(ks) for ks in keys_at]
        for i in range(len(keys_at) - 1, -1, -1):
            for j, k in enumerate(keys_at[i]):
                nxt[i][j] = last.get(k, NEVER)
                last[k] = i
    slot_of: dict = {}
    key = [None] * n_slots
    used = np.zeros(n_slots)                   # last use tick (lru; lfu's ties)
    score = np.zeros(n_slots)                  # lfu: log2 of the decayed count at time 0; belady: next use
    freq: dict = {}                            # lfu: key -> (count, at tokens)
    busy = np.zeros(n_slots, bool)             # used by this step
    free = list(range(n_slots - 1, -1, -1))
    tick, hits, misses = 0, 0, 0
    for i, ks in enumerate(keys_at):
        busy[:] = False
        t = tokens[i]
        step_misses = 0
        for j, k in enumerate(ks):
            tick += 1
            s = slot_of.get(k)
            if s is not None:
                hits += counted[i]
            else:
                misses += counted[i]
                step_misses += 1
                if free:
                    s = free.pop()
                else:
                    cand = np.flatnonzero(~busy)
                    if cand.size == 0:                   # the step needs more experts than slots
                        cand = np.arange(n_slots)
                        busy[:] = False
                    if policy == "lru":
                        s = int(cand[np.argmin(used[cand])])
                    elif policy == "lfu":
                        low = cand[score[cand] <= score[cand].min() + 1e-9]
                        s = int(low[np.argmin(used[low])])
                    else:
                        s = int(cand[np.argmax(score[cand])])
                    del slot_of[key[s]]
                slot_of[k] = s
                key[s] = k
            busy[s] = True
            used[s] = tick
            if policy == "lfu":                  # the engine's decayed count: c * 2^((t0 - t) / H) + 1
                c, t0 = freq.get(k, (0.0, t))
                c = c * 2.0 ** ((t0 - t) / half_life) + 1.0
                freq[k] = (c, t)
                score[s] = np.log2(c) + t / half_life     # the order of counts decayed to any common time
            elif policy == "belady":
                score[s] = nxt[i][j]
        if per_step is not None:
            per_step.append(step_misses)
    return hits, misses


def replay(trace: Trace, slots: int, policies=POLICIES, shared: bool = True, count: str = "decode",
           half_lives: tuple[float, ...] = (HALF_LIFE,), calibrate: Trace | None = None) -> list[Result]:
    """Each policy's hits and misses (lfu's at each of half_lives), per layer and, if shared, in one pool;
    static's pins by calibrate's counts where given (out of sample)."""
    steps = trace.steps()
    cal = None if calibrate is None else Counter((s.layer, e) for s in calibrate.steps() for e in s.experts)
    decode_pass = decode_passes(steps)
    counted = [count == "all" or s.pass_ in decode_pass for s in steps]
    tokens = token_clock(steps)
    layers = sorted({s.layer for s in steps})
    out = []
    for p, hl in ((p, hl) for p in policies for hl in (half_lives if p == "lfu" else (None,))):
        h = m = 0
        for il in layers:
            idx = [i for i, s in enumerate(steps) if s.layer == il]
            a, b = simulate([steps[i] for i in idx], slots, p, [counted[i] for i in idx], [tokens[i] for i in idx],
                            half_life=hl or HALF_LIFE, calibration=cal)
            h, m = h + a, m + b
        out.append(Result(p, "per-layer", slots, h, m, hl))
        if shared:
            a, b = simulate(steps, slots * len(layers), p, counted, tokens, half_life=hl or HALF_LIFE, calibration=cal)
            out.append(Result(p, "shared", slots, a, b, hl))
    return out


def decode_passes(steps: list[Step]) -> set[int]:
    """The passes of one token each (decode passes)."""
    rows: dict[int, int] = {}
    for s in steps:
        rows[s.pass_] = max(rows.get(s.pass_, 0), s.rows)
    return {p for p, r in rows.items() if r == 1}


def token_clock(steps: list[Step]) -> list[float]:
    """Each step's token clock (LFU's decay): tokens routed through the first layer so far, as the engine's
    ExpertCache counts them."""
    first = min((s.layer for s in steps), default=0)
    clock, tokens = 0.0, []
    for s in steps:
        clock += s.rows if s.layer == first else 0
        tokens.append(clock)
    return tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--slots", type=int, nargs="+", required=True, help="cache slots per layer")
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--shared-pool", action="store_true", help="also one pool of slots x layers across layers")
    ap.add_argument("--count", choices=("decode", "all"), default="decode",
                    help="which steps' lookups count (prefill always warms the cache)")
    ap.add_argument("--half-life", type=float, nargs="+", default=[HALF_LIFE],
                    help=f"lfu's half-lives to replay, in tokens (default: the engine's, {HALF_LIFE:g})")
    ap.add_argument("--calibrate", type=Path, metavar="TRACE",
                    help="static pins by this trace's counts (another text's: out of sample) instead of its own")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    trace = Trace.load(a.trace)
    cal = None if a.calibrate is None else Trace.load(a.calibrate)
    if cal is not None and (cal.n_expert, cal.n_layer) != (trace.n_expert, trace.n_layer):
        ap.error(f"--calibrate: {cal.n_layer} layers of {cal.n_expert} experts, "
                 f"the trace {trace.n_layer} of {trace.n_expert}")
    if any(not 1 <= n <= trace.n_expert for n in a.slots):
        ap.error(f"--slots: between 1 and the {trace.n_expert} experts of a layer")
    if any(not h > 0 for h in a.half_life):
        ap.error("--half-life: a number of tokens above 0")
    res = [r for n in a.slots for r in replay(trace, n, a.policies, a.shared_pool, a.count, tuple(a.half_life), cal)]
    if a.json:
        print(json.dumps({"trace": str(a.trace), "model": trace.model, "n_expert": trace.n_expert, "k": trace.k,
                          "calibration": None if cal is None else str(a.calibrate),
                          "results": [r.as_dict() for r in res]}))
        return 0
    print(f"{a.trace}: {trace.model}, {trace.n_expert} experts (k {trace.k}), {a.count} lookups counted"
          + ("" if cal is None else f"; static pinned by {a.calibrate}'s counts"))
    print(f"{'slots/layer':>11} {'share':>6} {'policy':>10} {'layout':>9} {'hit rate':>8} {'misses':>7}")
    for r in res:
        name = r.policy if r.half_life is None else f"{r.policy}/{r.half_life:g}"
        print(f"{r.slots:>11} {r.slots / trace.n_expert:>6.0%} {name:>10} {r.layout:>9} {r.hit_rate:>8.1%} {r.misses:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
