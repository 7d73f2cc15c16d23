"""KV cache bytes per 1k tokens per cache type, measured: what the engine charges once N positions are
filled (the cache grows in chunks as the context fills; a quantized row is stored in exactly its bytes).

    python benchmarks/kv_bytes.py [MODEL] [--tokens 1024] [--types f16,q8_0,q4_0] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(model: str, kind: str, n: int) -> dict:
    from ramforge.engine.engine import Engine
    from ramforge.store.resolve import resolve_model

    with Engine.load(resolve_model(model), n_ctx=n, type_k=kind, type_v=kind) as eng:
        ids = [(7 * i) % (eng.hp.n_vocab - 1) + 1 for i in range(n)]
        eng.eval(ids[:2])                               # kernels compiled and loaded before measuring
        eng.reset()
        eng.eval(ids)                                   # all n positions
        full = eng.kv.nbytes
        return {"type": kind, "positions": eng.n_past, "charged": full, "bytes_per_1k": round(full * 1000 / n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--tokens", type=int, default=1024, help="positions to fill (a multiple of 256)")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [measure(a.model, k, a.tokens) for k in a.types.split(",")]
    f16 = next((r["bytes_per_1k"] for r in rows if r["type"] == "f16"), None)
    for r in rows:
        r["share_of_f16"] = r["bytes_per_1k"] / f16 if f16 else None
    if a.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            share = f" ({100 * r['share_of_f16']:.1f}% of f16)" if f16 else ""
            print(f"{r['type']:5s} {r['bytes_per_1k'] / 1e6:8.3f} MB per 1k tokens{share}; {r['charged']:,} B "
                  f"charged for {r['positions']} positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
