"""Repack speed: an expert cache's repack of experts read in file order (kernels.repack.repack_many), in place.

    python benchmarks/repack.py [--type Q4_K] [--rows 768] [--cols 2048] [--experts 256]
        [--per-call 1 8] [--threads 1 2]

Each expert is two matrices (gate and up) of `rows` rows of `cols`, random blocks in a pool of `experts`
experts (faulted in first, larger than the caches), repacked `per-call` experts a call, every expert once
after a warm-up call: ms an expert and GB/s of its bytes. The Qwen3-30B-A3B shape by default (its experts'
gate and up: 768 rows of 2048, Q4_K), the expert cache's work at an expert's second use (stream/experts.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from ramforge.gguf.constants import GGML_BLOCK, GGMLType
    from ramforge.kernels.repack import repack_many, repackable
    from ramforge.stream.io import aligned_empty

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", default="Q4_K", choices=["Q4_K", "Q8_0", "Q4_0"], help="a repackable type")
    ap.add_argument("--rows", type=int, default=768)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--per-call", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args(argv)
    t = GGMLType[a.type]
    if not repackable(t, (a.cols, a.rows)):
        ap.error(f"{a.type} {a.rows} x {a.cols} does not take the repacked layout")
    be, bb = GGML_BLOCK[t]
    mat = a.rows * a.cols // be * bb
    pool = aligned_empty(a.experts * 2 * mat, fault_in=max(a.threads))
    pool[:] = 0x21                                   # finite f16 scales; the bytes do not change the work
    print(f"{a.type}: an expert's gate and up, {a.rows} x {a.cols} each, {2 * mat / 1e6:.2f} MB; pool of {a.experts}")
    for per in a.per_call:
        for th in a.threads:
            def call(i: int) -> None:
                repack_many(pool, [(t, (i * per + j) * 2 * mat + m * mat, (a.cols, a.rows))
                                   for j in range(per) for m in (0, 1)], th)
            call(0)                                  # compile or load the kernel
            calls = a.experts // per - 1
            t0 = time.perf_counter()
            for i in range(1, calls + 1):
                call(i)
            dt = (time.perf_counter() - t0) / (calls * per)
            print(f"  {per} expert(s) a call, {th} thread(s): {dt * 1e3:.3f} ms an expert, "
                  f"{2 * mat / dt / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
