"""Record llama.cpp's (llama-cpp-python 0.3.36, its low-level API) batched decode of several sequences,
and llama-server's context shift, as small JSON files under tests/fixtures/parallel/<model>-<case>.json.

    python tools/record_parallel.py                      # every model and case
    python tools/record_parallel.py llama-tiny-f16       # globs over the model ids

The context is llama-server's with an explicit --parallel N: n_seq_max = N, kv_unified = false (a
stream of n_ctx / N cells per sequence), F16 cache without flash attention, n_batch = n_ubatch = 512.
Cases:
- par2, par4: each sequence's prompt in its own llama_decode (in turns), then N_STEPS passes where
  every sequence adds its greedy token in one shared llama_batch; par4 then removes sequence 1
  (seq_rm) and a new prompt joins it in the next shared batch (after the others' tokens, as
  llama-server's update_slots orders a batch), and more shared passes follow.
- join4: four prompts in one llama_decode (split_equal: a ubatch of 4 x 4 tokens whose outputs, rows
  3, 7 and 11, are not contiguous, then the longer prompt's tail), N_STEPS shared passes, sequences 2
  and 3 removed and two 6-token prompts joining them in one batch beside 0 and 1's tokens (a ubatch of
  4 single tokens, then one of 2 x 5 tokens, outputs rows 4 and 9), N_STEPS shared passes:
  llama-server's update_slots with several prompts at once.
- shift: one sequence (n_ctx 256) generating greedily past its context with llama-server's context
  shift (pre_decode: n_keep + BOS kept, half the rest discarded: seq_rm, seq_add, the K-shift).
- cp2: sequence 0's prompt, seq_cp(0, 1) (a whole stream copied), then both go on from other tokens.
Each step is stored with the tokens it fed (so a replay feeds the same) and, per output, the sha256
(16 hex digits) of the float32 logits row, its argmax and top values (record_kv.summarize).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools._fixtures import ORACLE_DIR  # noqa: E402
from tools.record_kv import summarize  # noqa: E402
from tools.record_oracle import N_THREADS, _cpu_name, dumps  # noqa: E402

FORMAT = 1
PAR_DIR = ORACLE_DIR.parent / "parallel"
N_STEPS = 6
N_KEEP = 4
SHIFT_AFTER = 24            # tokens generated after the first context shift
# model id -> (make_models spec, type) or None: the default gemma-3-270m
MODELS = {"llama-tiny-f16": ("llama", "f16"), "gemma3-linear-f16": ("gemma3-linear", "f16"),
          "llama-tiny-q8_0": ("llama", "q8_0"), "gemma3-270m": None}
CASES = ("par2", "par4", "shift", "par4-q8kv", "cp2", "join4")   # par4-q8kv: par4 with Q8_0 K and V (flash attention)
# ramforge refuses (NotReproduced) a shift where llama.cpp's sliding-window cache reuses cells whose keys
# left a window shorter than the context (gemma3-linear's 8): no record for it
SKIP = {("gemma3-linear-f16", "shift"), ("gemma3-linear-f16", "par4-q8kv"), ("llama-tiny-q8_0", "par4-q8kv")}
PROMPTS = [[1, 15043, 29892, 920], [1, 450, 4996, 17354, 1701, 29916, 432], [1, 3532, 29879, 6778, 13],
           [1, 1724, 338, 278, 7483, 310], [1, 376, 1576, 2355, 1497, 29892, 263, 4177, 6520]]


def model_file(mid: str) -> Path:
    spec = MODELS[mid]
    if spec is None:
        from ramforge.store.resolve import default_model_path
        return default_model_path()
    from tools.make_models import ensure_model
    return ensure_model(*spec)


def prompts_for(mid: str, n_vocab: int) -> list[list[int]]:
    """Token prompts valid for the model's vocabulary (ids folded into it, BOS kept)."""
    return [[p[0]] + [t % n_vocab for t in p[1:]] for p in PROMPTS]


class Oracle:
    """A llama.cpp context driven through llama_batch / llama_decode / llama_memory_seq_*."""

    def __init__(self, path: Path, n_ctx: int, n_seq: int, q8kv: bool = False):
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, n_seq
        cp.n_threads = cp.n_threads_batch = N_THREADS
        cp.kv_unified = False
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if q8kv else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if q8kv:
            cp.type_k = cp.type_v = 8                        # GGML_TYPE_Q8_0
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.add_bos = bool(L.llama_vocab_get_add_bos(L.llama_model_get_vocab(self.model)))
        self.batch = L.llama_batch_init(512, 0, n_seq)

    def pos_max(self, s: int) -> int:
        return int(self.L.llama_memory_seq_pos_max(self.mem, s))

    def decode(self, entries: list[tuple[int, list[int]]]) -> dict[int, np.ndarray]:
        """One llama_decode of [(seq, tokens)], positions continuing each sequence, its last token an output."""
        b, i, outs = self.batch, 0, {}
        for s, toks in entries:
            p0 = self.pos_max(s) + 1
            for j, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, p0 + j, 1
                b.seq_id[i][0] = s
                b.logits[i] = j == len(toks) - 1
                if b.logits[i]:
                    outs[s] = i
                i += 1
        b.n_tokens = i
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return {s: np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, k), shape=(self.n_vocab,)).copy()
                for s, k in outs.items()}

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def _decode_step(o: Oracle, entries, steps: list, last: dict) -> None:
    p0 = {s: o.pos_max(s) + 1 for s, _ in entries}
    logits = o.decode(entries)
    steps.append({"decode": [[s, t, p0[s]] for s, t in entries],
                  "out": {str(s): summarize(logits[s][None]) for s in logits}})
    last.update({s: int(np.argmax(v)) for s, v in logits.items()})


def record_par(o: Oracle, n_seq: int) -> list:
    steps, last = [], {}
    prompts = prompts_for("", o.n_vocab)
    for s in range(n_seq):                                   # prompts in turns
        _decode_step(o, [(s, prompts[s])], steps, last)
    for _ in range(N_STEPS):                                 # one token per sequence, one batch
        _decode_step(o, [(s, [last[s]]) for s in range(n_seq)], steps, last)
    if n_seq >= 4:                                           # sequence 1 leaves, a new prompt joins it
        o.L.llama_memory_seq_rm(o.mem, 1, -1, -1)
        steps.append({"rm": [1, -1, -1]})
        _decode_step(o, [(s, [last[s]]) for s in range(n_seq) if s != 1] + [(1, prompts[4])], steps, last)
        for _ in range(N_STEPS):
            _decode_step(o, [(s, [last[s]]) for s in range(n_seq)], steps, last)
    return steps


def record_join(o: Oracle) -> list:
    steps, last = [], {}
    prompts = prompts_for("", o.n_vocab)
    _decode_step(o, [(0, prompts[0][:4]), (1, prompts[1][:4]), (2, prompts[2][:4]), (3, prompts[3])], steps, last)
    for _ in range(N_STEPS):
        _decode_step(o, [(s, [last[s]]) for s in range(4)], steps, last)
    for s in (2, 3):
        o.L.llama_memory_seq_rm(o.mem, s, -1, -1)
        steps.append({"rm": [s, -1, -1]})
    _decode_step(o, [(0, [last[0]]), (1, [last[1]]), (2, prompts[4][:6]), (3, prompts[1][1:7])], steps, last)
    for _ in range(N_STEPS):
        _decode_step(o, [(s, [last[s]]) for s in range(4)], steps, last)
    return steps


def record_cp(o: Oracle) -> list:
    steps, last = [], {}
    _decode_step(o, [(0, prompts_for("", o.n_vocab)[1])], steps, last)
    o.L.llama_memory_seq_cp(o.mem, 0, 1, -1, -1)
    steps.append({"cp": [0, 1]})
    last[1] = 13 % o.n_vocab
    for _ in range(N_STEPS):
        _decode_step(o, [(s, [last[s]]) for s in range(2)], steps, last)
    return steps


def record_shift(o: Oracle, n_ctx: int) -> list:
    """llama-server's generation loop of one slot with --context-shift, n_keep = N_KEEP."""
    steps, last = [], {}
    _decode_step(o, [(0, prompts_for("", o.n_vocab)[1])], steps, last)
    after = None
    while after is None or after < SHIFT_AFTER:
        n_past = o.pos_max(0) + 1
        if n_past + 1 >= n_ctx:                              # pre_decode
            keep = min(n_ctx - 4, N_KEEP + int(o.add_bos))
            n_left = n_past - keep
            n_discard = min(max(n_left // 2, 0), max(0, n_left - 1))
            o.L.llama_memory_seq_rm(o.mem, 0, keep, keep + n_discard)
            o.L.llama_memory_seq_add(o.mem, 0, keep + n_discard, n_past, -n_discard)
            steps.append({"rm": [0, keep, keep + n_discard]})
            steps.append({"add": [0, keep + n_discard, n_past, -n_discard]})
            after = after or 0
        _decode_step(o, [(0, [last[0]])], steps, last)
        if after is not None:
            after += 1
    return steps


def record(mid: str, case: str) -> dict:
    import llama_cpp
    path = model_file(mid)
    n_seq = {"par2": 2, "par4": 4, "shift": 1, "par4-q8kv": 4, "cp2": 2, "join4": 4}[case]
    n_ctx = 256 * n_seq
    q8kv = case.endswith("q8kv")
    o = Oracle(path, n_ctx, n_seq, q8kv)
    try:
        steps = (record_shift(o, n_ctx) if case == "shift" else record_cp(o) if case == "cp2"
                 else record_join(o) if case == "join4" else record_par(o, n_seq))
    finally:
        o.close()
    return {"format": FORMAT, "model": {"id": mid, "spec": MODELS[mid]}, "case": case,
            "oracle": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": n_ctx, "n_seq_max": n_seq,
                       "kv_unified": False, "flash_attn": q8kv, "type_k": "q8_0" if q8kv else "f16",
                       "type_v": "q8_0" if q8kv else "f16", "n_batch": 512, "n_ubatch": 512,
                       "n_threads": N_THREADS, "n_keep": N_KEEP if case == "shift" else None, "cpu": _cpu_name(),
                       "recorder": f"python tools/record_parallel.py {mid} --case {case}"},
            "steps": steps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", help="model ids or globs (default: all)")
    ap.add_argument("--case", action="append", choices=CASES)
    a = ap.parse_args(argv)
    PAR_DIR.mkdir(parents=True, exist_ok=True)
    for mid in [m for m in MODELS if not a.ids or any(fnmatch.fnmatch(m, g) for g in a.ids)]:
        for case in [c for c in a.case or CASES if (mid, c) not in SKIP]:
            t0 = time.perf_counter()
            rec = record(mid, case)
            (PAR_DIR / f"{mid}-{case}.json").write_text(dumps(rec) + "\n")
            print(f"{mid} {case}: {len(rec['steps'])} steps in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
