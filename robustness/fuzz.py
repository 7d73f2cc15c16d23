"""Seeded fuzz run of the GGUF reader and the tokenizers, outside pytest (10k+ cases each).

    python robustness/fuzz.py                         # seed 0: 10,000 reader + 10,000 tokenizer + 2,000 vocab-file cases
    python robustness/fuzz.py --seed 7 --reader-cases 50000 --jobs 2
    python robustness/fuzz.py --seed 0 --replay reader:1234      # rerun one case, print its traceback

reader      mutated small GGUF files (robustness/gguf_cases.py: gen_case): open with GGUFFile, check the
            descriptors, read every tensor.  Parsed OK, or refused with a RamforgeError.
tokenizer   Gemma 3 (default model), qwen2 (BPE) and llama-spm (SPM) in turn; cases cycle through random
            Unicode text, random (mostly invalid UTF-8) bytes and random id sequences, with every
            property of robustness/tokenizer_cases.py (no crash, round trip, streaming == decode).
vocab       tiny hostile vocabulary GGUFs: parse, load_tokenizer, encode/decode a few texts.

Each case has its own random.Random(f"<section>:<seed>:<index>"), so any case replays alone.  Every
case runs under a time limit (SIGALRM stops a hang at 10x the limit) and tracemalloc (peak beyond
the input size).  Reader cases are timed under tracemalloc (they are tiny); tokenizer and vocab
cases run twice, timed untraced, then traced for the peak (tracing slows them several times).  Printed per section: tried, OK, refused cleanly (by exception class), wrong
answer (a property failed), crashed (any other exception, by class), hung (over the time limit),
over the allocation limit.  Exit status 1 if any of the last four is non-zero.
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SECTIONS = ("reader", "tokenizer", "vocab")
_STATE: dict = {}


# ---- one case ------------------------------------------------------------------------------------

class _Hung(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hung()


def _watched(fn, size: int, time_limit: float, alloc_limit: int) -> dict:
    """Run fn() twice: timed without tracemalloc (SIGALRM at 10x the limit stops a hang), then again
    under tracemalloc for the allocation peak (tracing slows allocation-heavy code several times, so
    timing the traced run would measure tracemalloc).  The second run sees warm caches; what it
    measures is the transient allocation of one call, the thing that could blow up."""
    from ramforge.errors import RamforgeError
    from robustness.tokenizer_cases import Mismatch
    res = {"status": "ok", "exc": None, "detail": "", "problems": []}
    main = threading.current_thread() is threading.main_thread()
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    if main:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, 10 * time_limit)
    t0 = time.perf_counter()
    try:
        refused = fn()
        if refused:
            res.update(status="refused", exc=refused)
    except _Hung:
        res["status"] = "hung"
    except Mismatch as e:
        res.update(status="mismatch", exc="Mismatch", detail=str(e)[:3000])
    except RamforgeError as e:
        res.update(status="refused", exc=type(e).__name__)
    except Exception as e:   # noqa: BLE001 - the finding
        res.update(status="crashed", exc=type(e).__name__, detail="".join(traceback.format_exception(e))[-3000:])
    finally:
        elapsed = time.perf_counter() - t0
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
    peak = 0
    if res["status"] != "hung":
        tracemalloc.start()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 20 * time_limit)
        try:
            fn()
        except (Exception, _Hung):   # noqa: BLE001 - classified by the first run
            pass
        finally:
            if main:
                signal.setitimer(signal.ITIMER_REAL, 0)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    if main:
        signal.signal(signal.SIGALRM, old)
    res.update(elapsed=elapsed, peak=peak, size=size)
    if res["status"] == "mismatch":
        res["problems"].append("wrong answer")
    if res["status"] == "crashed":
        res["problems"].append(f"crashed with {res['exc']}")
    if res["status"] == "hung" or elapsed > time_limit:
        res["problems"].append(f"took {elapsed:.2f} s")
    if peak > size + alloc_limit:
        res["problems"].append(f"allocated {peak:,} B")
    return res


def _init(sections, time_limit: float, alloc_limit: int, workdir: str) -> None:
    import warnings
    warnings.simplefilter("ignore")
    _STATE["dir"] = workdir
    _STATE["limits"] = (time_limit, alloc_limit)
    if "tokenizer" in sections:
        from robustness.tokenizer_cases import NAMES, load, check_text
        _STATE["toks"] = [load(n) for n in NAMES]
        for tok in _STATE["toks"]:           # warm the lazily built tables out of the measurements
            check_text(tok, "warm up <s> \u00e9 \U0001f600 'll 123\n\n  x")


def run_one(task: tuple[str, int, int]) -> tuple[str, int, dict]:
    section, seed, index = task
    time_limit, alloc_limit = _STATE["limits"]
    if section == "reader":
        from robustness.gguf_cases import case_bytes, run_case
        data = case_bytes(seed, index)
        out = run_case(data, os.path.join(_STATE["dir"], f"case-{os.getpid()}.gguf"), time_limit, alloc_limit,
                       hard_limit=10 * time_limit)
        status = {"ok": "ok", "refused": "refused", "crashed": "crashed", "hung": "hung"}[out.status]
        if status == "crashed" and out.exc == "AssertionError":
            status = "mismatch"          # a descriptor invariant of an accepted file failed
        res = {"status": status, "exc": out.exc, "detail": out.detail, "problems": list(out.problems),
               "elapsed": out.elapsed, "peak": out.peak, "size": out.size}
        return section, index, res
    from robustness import tokenizer_cases as T
    rng = random.Random(f"{section}:{seed}:{index}")
    if section == "vocab":
        data = T.random_vocab_file(rng)
        path = os.path.join(_STATE["dir"], f"vocab-{os.getpid()}.gguf")
        return section, index, _watched(lambda: (lambda r: None if r == "ok" else r)(T.check_vocab_file(data, path)),
                                         len(data), time_limit, alloc_limit)
    toks = _STATE["toks"]
    tok = toks[(index // 3) % len(toks)]
    kind = index % 3
    if kind == 0:
        text = T.random_text(rng)
        res = _watched(lambda: T.check_text(tok, text), 4 * len(text), time_limit, alloc_limit)
    elif kind == 1:
        data = T.random_bytes(rng)
        res = _watched(lambda: T.check_bytes(tok, data), len(data), time_limit, alloc_limit)
    else:
        ids = T.random_ids(rng, tok)
        res = _watched(lambda: T.check_ids(tok, ids), 8 * len(ids), time_limit, alloc_limit)
    res["what"] = f"{T.NAMES[(index // 3) % len(toks)]} {('text', 'bytes', 'ids')[kind]}"
    return section, index, res


# ---- the run -------------------------------------------------------------------------------------

def _tasks(section: str, seed: int, n: int):
    for i in range(n):
        yield section, seed, i


def run_section(section: str, seed: int, n: int, jobs: int, args, workdir: str) -> dict:
    counts = collections.Counter()
    refused = collections.Counter()
    crashed = collections.Counter()
    failures: list = []
    max_elapsed = max_peak = 0.0
    t0 = time.perf_counter()
    limits = (args.time_limit, args.alloc_limit_mib << 20, workdir)
    if jobs > 1:
        pool = mp.get_context("fork").Pool(jobs, initializer=_init, initargs=((section,), *limits))
        results = pool.imap_unordered(run_one, _tasks(section, seed, n), chunksize=25)
    else:
        _init((section,), *limits)
        pool, results = None, map(run_one, _tasks(section, seed, n))
    try:
        for done, (_, index, res) in enumerate(results, 1):
            counts["tried"] += 1
            counts[res["status"]] += 1
            if res["status"] == "refused":
                refused[res["exc"]] += 1
            if res["status"] == "crashed":
                crashed[res["exc"]] += 1
            if any(p.startswith("took") for p in res["problems"]):
                counts["hung"] += res["status"] != "hung"     # over the limit but finished
            if any(p.startswith("allocated") for p in res["problems"]):
                counts["over_alloc"] += 1
            if any(p.startswith("leaked") for p in res["problems"]):
                counts["fd_leak"] += 1
            if res["problems"]:
                failures.append((index, res))
            max_elapsed = max(max_elapsed, res["elapsed"])
            max_peak = max(max_peak, res["peak"] - res["size"])
            if args.progress and done % 1000 == 0:
                print(f"  {section}: {done}/{n} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return dict(counts=counts, refused=refused, crashed=crashed, failures=sorted(failures, key=lambda f: f[0]),
                seconds=time.perf_counter() - t0, max_elapsed=max_elapsed, max_peak=max_peak)


def report(section: str, r: dict, seed: int, flags: str = "") -> int:
    c = r["counts"]
    bad = c["mismatch"] + c["crashed"] + c["hung"] + c["over_alloc"] + c["fd_leak"]
    title = {"reader": "GGUF reader (mutated files)", "tokenizer": "tokenizers (text, bytes, ids)",
             "vocab": "tokenizer metadata (hostile vocabulary files)"}[section]
    print(f"\n== {title}: {c['tried']:,} cases in {r['seconds']:.1f} s")
    print(f"   tried                {c['tried']:>7,}")
    print(f"   parsed/handled OK    {c['ok']:>7,}")
    print(f"   refused cleanly      {c['refused']:>7,}   " +
          ", ".join(f"{k} {v:,}" for k, v in r["refused"].most_common()))
    print(f"   wrong answer         {c['mismatch']:>7,}")
    print(f"   crashed              {c['crashed']:>7,}   " + ", ".join(f"{k} {v:,}" for k, v in r["crashed"].most_common()))
    print(f"   hung (> time limit)  {c['hung']:>7,}   slowest case {r['max_elapsed'] * 1000:.1f} ms")
    print(f"   over alloc limit     {c['over_alloc']:>7,}   largest peak beyond the input {r['max_peak'] / 2**20:.2f} MiB")
    if section == "reader":
        print(f"   leaked a descriptor  {c['fd_leak']:>7,}")
    for index, res in r["failures"][:5]:
        print(f"\n   FAILED {section}:{index} {res.get('what', '')}: {'; '.join(res['problems'])}"
              f"\n   reproduce: python robustness/fuzz.py --seed {seed}{flags} --replay {section}:{index}")
        if res["detail"]:
            print("   " + res["detail"].rstrip().replace("\n", "\n   "))
    return bad


def replay(spec: str, seed: int, args) -> int:
    section, _, index = spec.partition(":")
    if section not in SECTIONS or not index.isdigit():
        sys.exit(f"--replay wants SECTION:INDEX with SECTION in {SECTIONS}")
    with tempfile.TemporaryDirectory(prefix="ramforge-fuzz-") as workdir:
        _init((section,), args.time_limit, args.alloc_limit_mib << 20, workdir)
        _, _, res = run_one((section, seed, int(index)))
    if section == "reader":
        from robustness.gguf_cases import case_bytes
        data = case_bytes(seed, int(index))
        print(f"input: {len(data)} bytes; robustness.gguf_cases.case_bytes({seed}, {index}) rebuilds it")
        if args.save:
            Path(args.save).write_bytes(data)
            print(f"saved to {args.save}")
    print({k: v for k, v in res.items() if k != "detail"})
    print(res["detail"])
    return 1 if res["problems"] else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reader-cases", type=int, default=10_000)
    ap.add_argument("--tokenizer-cases", type=int, default=10_000)
    ap.add_argument("--vocab-cases", type=int, default=2_000)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--time-limit", type=float, default=1.0, help="seconds per case (default 1)")
    ap.add_argument("--alloc-limit-mib", type=int, default=32, help="tracemalloc peak beyond the input (default 32)")
    ap.add_argument("--only", choices=SECTIONS, action="append")
    ap.add_argument("--replay", metavar="SECTION:INDEX")
    ap.add_argument("--save", metavar="PATH", help="with --replay reader:I, write the input file there")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    if args.replay:
        return replay(args.replay, args.seed, args)
    sizes = {"reader": args.reader_cases, "tokenizer": args.tokenizer_cases, "vocab": args.vocab_cases}
    sections = [s for s in SECTIONS if (not args.only or s in args.only) and sizes[s] > 0]
    cmd = (f"python robustness/fuzz.py --seed {args.seed} --reader-cases {args.reader_cases} "
           f"--tokenizer-cases {args.tokenizer_cases} --vocab-cases {args.vocab_cases} "
           f"--time-limit {args.time_limit:g} --alloc-limit-mib {args.alloc_limit_mib}"
           + "".join(f" --only {s}" for s in (args.only or [])))
    print(f"ramforge fuzz: seed {args.seed}, {args.jobs} process(es), limits {args.time_limit:g} s and "
          f"{args.alloc_limit_mib} MiB (tracemalloc peak beyond the input) per case")
    print(f"reproduce: {cmd}")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="ramforge-fuzz-") as workdir:
        for s in sections:
            bad += report(s, run_section(s, args.seed, sizes[s], args.jobs, args, workdir), args.seed,
                          f" --time-limit {args.time_limit:g} --alloc-limit-mib {args.alloc_limit_mib}")
    print(f"\n{'FAIL' if bad else 'PASS'}: {bad} case(s) crashed, hung, over the allocation limit or wrong")
    print(f"reproduce: {cmd}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
