"""Weight throughput of the matmul kernels per quant type: float path vs integer-dot path.

    python benchmarks/matvec.py [--n 4096] [--threads 2] [--batch 32] [--types Q4_0,Q4_K] [--repacked] [--llama] [--asm]

For an n x n weight of each executable quantized type (random blocks with finite, normal scales):
GB/s of packed weight bytes per second for one token (a matvec) and, for a batch of `batch`
tokens, the weight bytes times tokens per second (what a sequence of matvecs would have to
stream to do the same work). "float" is kernels.matmul.matmul_reference (dequantize + f32 dot),
"int" is kernels.qmatmul (int8 dots; "int-portable" its plain-loop twin with --portable, "int-repacked"
the repacked layout with --repacked);
--llama adds llama.cpp's own mul_mat on the same weight (ggml's CPU backend, through ctypes).
--asm compiles the kernel afresh and counts its vector integer multiply-add instructions.
"""
from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def random_weight(t, n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """Random packed rows; every odd byte gets exponent bits 01xxx so each f16/f32 scale is normal
    (MXFP4: each block's E8M0 exponent byte in 120..135)."""
    from ramforge.gguf.constants import GGML_BLOCK, GGMLType

    be, bb = GGML_BLOCK[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=n_out * n_in // be * bb, dtype=np.uint8)
    raw[1::2] = (raw[1::2] & 0x9F) | 0x20
    if t == GGMLType.MXFP4:
        raw[::bb] = rng.integers(120, 136, size=raw.size // bb, dtype=np.uint8)
    return raw


def best_time(fn, min_time: float = 0.5, max_reps: int = 400) -> float:
    fn()                                           # warm (compile / cache load)
    best, spent, reps = float("inf"), 0.0, 0
    while (spent < min_time or reps < 3) and reps < max_reps:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return best


def asm_report() -> str:
    """Compile the kernel in a fresh cache dir and count its vector integer multiply-adds."""
    cache = tempfile.mkdtemp(prefix="ramforge-asm-")      # inspect_asm needs code compiled here
    atexit.register(shutil.rmtree, cache, True)
    os.environ["NUMBA_CACHE_DIR"] = cache
    from ramforge.gguf.constants import GGMLType
    from ramforge.kernels import qmatmul as qm
    from ramforge.kernels import unpack

    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    for t in (GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL):
        qm.qmatmul(np.zeros((1, 4), np.float32), x, t, random_weight(t, 4, 256), 4, 256, vector=True)
    pat = re.compile(r"\s+(v?pmaddwd|v?pmaddubsw|vpdpbusds?|vpdpwssds?|v?pmovsxbw|v?pmulld|v?pshufb|vpermb|"
                     r"sdot|smull2?|sadalp|smlal2?)\b")
    out = []
    kernels = [(f"qmatmul {t.name} {hi.name}{' packed' if packed else ''}", f)
               for (t, _, _, hi, packed), f in qm._KERNELS.items()]
    for name, f in kernels + [("_unpack_iq4_nl", unpack._unpack_iq4_nl)]:
        c = Counter()
        for sig in f.signatures:
            c.update(m.group(1) for line in f.inspect_asm(sig).splitlines() for m in [pat.match(line)] if m)
        out.append(f"{name}: " + (", ".join(f"{k} x{v}" for k, v in c.most_common()) or "no vector int ops"))
    return "\n".join(out)


def _ggml_timer(api, t, raw: np.ndarray, x: np.ndarray, n_out: int, n_in: int):
    """A function computing y = x @ W.T once with llama.cpp's own mul_mat (api: tools.ggml_ctypes.CpuBackend;
    a plain CPU buffer, no repacking), for a side-by-side column: the graph is built once."""
    cw, cg = api.init(api.Params(1 << 16, None, True)), api.init(api.Params(1 << 20, None, True))
    w, xt = api.new2d(cw, int(t), n_in, n_out), api.new2d(cw, 0, n_in, x.shape[0])
    y = api.mul_mat(cw, w, xt)
    api.alloc(cw, api.cpu_buft())
    x = np.ascontiguousarray(x, np.float32)
    api.tset(w, raw.ctypes.data, 0, raw.nbytes)
    api.tset(xt, x.ctypes.data, 0, x.nbytes)
    g = api.new_graph(cg)
    api.build(g, y)
    return lambda: api.compute(api.backend, g)

_REPACKED: dict = {}        # id(weight) -> (weight, its repacked copy, G)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--types", default="")
    ap.add_argument("--no-float", action="store_true", help="skip the (slow) float path")
    ap.add_argument("--portable", action="store_true", help="also time the plain-loop integer path")
    ap.add_argument("--repacked", action="store_true",
                    help="also time the repacked layout (kernels.repack; other types: '-')")
    ap.add_argument("--llama", action="store_true", help="also time llama.cpp's mul_mat (llama-cpp-python)")
    ap.add_argument("--asm", action="store_true")
    a = ap.parse_args(argv)
    if a.asm:
        print(asm_report())
        return 0

    import numba

    from ramforge.kernels.matmul import matmul_reference
    from ramforge.kernels.qmatmul import qmatmul
    from ramforge.kernels.registry import REGISTRY
    from tools.ggml_ctypes import CpuBackend

    numba.set_num_threads(a.threads)
    want = {s.strip().upper() for s in a.types.split(",") if s.strip()}
    types = [t for t, k in REGISTRY.items() if k.qdot is not None and (not want or t.name in want)]
    n, nb = a.n, a.batch
    rng = np.random.default_rng(1)
    x1 = rng.standard_normal((1, n)).astype(np.float32)
    xb = rng.standard_normal((nb, n)).astype(np.float32)
    paths = [("int", lambda *p: qmatmul(*p, vector=True))]
    if a.portable:
        paths.append(("int-portable", lambda *p: qmatmul(*p, vector=False)))
    if a.repacked:
        from ramforge.kernels.repack import repack, repackable

        def repacked(y, x, t, raw, n_out, n_in):
            if not repackable(t, (n_in, n_out)):
                return None
            if id(raw) not in _REPACKED:
                rep = raw.copy()
                _REPACKED[id(raw)] = (raw, rep, repack(t, rep, (n_in, n_out)))
            _, rep, g = _REPACKED[id(raw)]
            return qmatmul(y, x, t, rep, n_out, n_in, vector=True, repacked=g)
        paths.append(("int-repacked", repacked))
    if not a.no_float:
        paths.insert(0, ("float", matmul_reference))
    ggml = CpuBackend(a.threads) if a.llama else None
    print(f"{n} x {n} weight, {a.threads} threads; GB/s of packed weight bytes (x tokens for the batch)")
    head = "".join(f"{p + ' 1 tok':>20}{p + f' {nb} tok':>20}" for p, _ in paths)
    head += f"{'llama.cpp 1 tok':>20}{f'llama.cpp {nb} tok':>20}" if ggml else ""
    print(f"{'type':8}{'MB':>7}{head}")
    for t in types:
        raw = random_weight(t, n, n)
        gb = raw.nbytes / 1e9
        row = f"{t.name:8}{raw.nbytes / 1e6:7.1f}"
        for _, fn in paths:
            y1, yb = np.empty((1, n), np.float32), np.empty((nb, n), np.float32)
            if fn(y1, x1, t, raw, n, n) is None:                # (not repackable)
                row += f"{'-':>20}{'-':>20}"
                continue
            t1 = best_time(lambda: fn(y1, x1, t, raw, n, n))
            tb = best_time(lambda: fn(yb, xb, t, raw, n, n), min_time=0.5, max_reps=40)
            row += f"{gb / t1:20.2f}{gb * nb / tb:20.2f}"
        if ggml and t.name == "Q8_K":         # an activation type: ggml has no mul_mat with it as the weight
            row += f"{'-':>20}{'-':>20}"
        elif ggml:
            t1 = best_time(_ggml_timer(ggml, t, raw, x1, n, n))
            tb = best_time(_ggml_timer(ggml, t, raw, xb, n, n), min_time=0.5, max_reps=40)
            row += f"{gb / t1:20.2f}{gb * nb / tb:20.2f}"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
