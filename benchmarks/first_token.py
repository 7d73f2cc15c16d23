"""Start to first token: `ramforge run` as a user starts it, timed from the process's start to the first
byte of generated text on stdout (issue 14's "warm start to first token").

    python benchmarks/first_token.py [MODEL] [--runs 5] [--prompt TEXT] [--cold] [--source]

Warm: the kernels are in the cache (one untimed run first fills it) and ramforge's modules are
byte-compiled (`compileall`, as `pip install` leaves a package; where PYTHONDONTWRITEBYTECODE is set,
as in this sandbox, an editable checkout otherwise compiles ~90 modules from source at every start,
~0.1-0.2 s; --source keeps that). --cold: each run gets an empty NUMBA_CACHE_DIR of its own, so it
compiles what the model needs. Reported per run: seconds to the
first byte and to exit; then the medians and the range. The model file is left in the page cache as
it is (with O_DIRECT, the default io, the pinned weights are read from storage anyway).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _once(cmd: list[str], env: dict) -> tuple[float, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    first = p.stdout.read(1)
    t1 = time.perf_counter()
    p.stdout.read()
    if p.wait() != 0 or not first:
        sys.exit(f"{' '.join(cmd)} failed (exit {p.returncode})")
    return t1 - t0, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--cold", action="store_true", help="an empty kernel cache for every run")
    ap.add_argument("--source", action="store_true", help="warm runs without byte-compiling ramforge first")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "ramforge", "run", a.model, "--prompt", a.prompt, "--max-tokens", "4"]
    if not a.cold:
        if not a.source:                                 # ramforge's bytecode, as an installed package has it
            find = "import os, ramforge; print(os.path.dirname(ramforge.__file__))"
            where = subprocess.run([sys.executable, "-c", find], capture_output=True, text=True, check=True).stdout.strip()
            subprocess.run([sys.executable, "-m", "compileall", "-q", where], check=True)
        _once(cmd, dict(os.environ))                     # fills the kernel cache
    firsts, exits = [], []
    for i in range(a.runs):
        with tempfile.TemporaryDirectory(prefix="ramforge-cold-") as d:
            env = dict(os.environ, **({"NUMBA_CACHE_DIR": d} if a.cold else {}))
            f, e = _once(cmd, env)
        firsts.append(f)
        exits.append(e)
        print(f"run {i}: first token {f:.3f} s, exit {e:.3f} s (load average {os.getloadavg()[0]:.2f})")
    print(f"{'cold' if a.cold else 'warm'} start to first token: median {statistics.median(firsts):.3f} s "
          f"(range {min(firsts):.3f}-{max(firsts):.3f}); to exit: median {statistics.median(exits):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
