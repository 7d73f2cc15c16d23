"""Shared paths and small helpers for the fixture tools (make_models, record_oracle).

Tools and tests only; the ramforge package never imports this.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ORACLE_DIR = REPO_ROOT / "tests" / "fixtures" / "oracle"

# vocab GGUF (file stem after "ggml-vocab-") used by each synthetic arch
VOCAB_FILES = {"llama-spm": "ggml-vocab-llama-spm.gguf", "qwen2": "ggml-vocab-qwen2.gguf",
               "phi-3": "ggml-vocab-phi-3.gguf"}


def cache_dir() -> Path:
    """Fixture cache root: $RAMFORGE_FIXTURES or <repo>/fixtures/cache (git-ignored)."""
    env = os.environ.get("RAMFORGE_FIXTURES")
    return Path(env) if env else REPO_ROOT / "fixtures" / "cache"


def models_dir() -> Path:
    return cache_dir() / "models"


def vocab_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the vocab GGUFs live: the argument, else $RAMFORGE_VOCAB_DIR, else <cache>/vocab."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("RAMFORGE_VOCAB_DIR")
    return Path(env) if env else cache_dir() / "vocab"


def vocab_path(name: str, explicit_dir: str | os.PathLike[str] | None = None) -> Path:
    d = vocab_dir(explicit_dir)
    p = d / VOCAB_FILES[name]
    if not p.is_file() and explicit_dir is None and not os.environ.get("RAMFORGE_VOCAB_DIR"):
        from tools.fetch_vocab import fetch_vocab          # download llama.cpp's vocab files once

        fetch_vocab(d)
    if not p.is_file():
        raise FileNotFoundError(
            f"vocab GGUF {p} not found; run `python tools/fetch_vocab.py` to fill {cache_dir() / 'vocab'}, "
            f"or point RAMFORGE_VOCAB_DIR at a directory holding {VOCAB_FILES[name]}")
    return p


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from strings/ints, stable across processes (unlike hash())."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little")


_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


def read_gguf_header(path: str | os.PathLike[str]):
    """Fast GGUF header parse (gguf.GGUFReader takes ~10 s on a 150k-token vocab).
    Returns (kv, tensors): kv[key] = (vtype, value, subtype) with strings as raw bytes and
    numeric arrays as numpy arrays; tensors = [(name, ne (ggml order), ggml type id, offset)]."""
    import numpy as np
    with open(path, "rb") as f:
        buf = f.read(1 << 20)
        pos = 0

        def need(n: int) -> None:
            nonlocal buf
            while pos + n > len(buf):
                more = f.read(max(n, 1 << 22))
                if not more:
                    raise ValueError(f"{path}: truncated GGUF header")
                buf += more

        def take(fmt: str, n: int = 1):
            nonlocal pos
            dt = np.dtype(fmt)
            need(dt.itemsize * n)
            a = np.frombuffer(buf, dt, n, pos)
            pos += dt.itemsize * n
            return a

        def take_str() -> bytes:
            nonlocal pos
            n = int(take("<u8")[0])
            need(n)
            s = bytes(buf[pos:pos + n])
            pos += n
            return s

        if take("S4")[0] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        take("<u4")
        n_tensors, n_kv = (int(x) for x in take("<u8", 2))
        kv = {}
        for _ in range(n_kv):
            key = take_str().decode()
            vt = int(take("<u4")[0])
            if vt == ARRAY:
                st, n = int(take("<u4")[0]), int(take("<u8")[0])
                val = [take_str() for _ in range(n)] if st == STRING else take(_SCALAR[st], n).copy()
                kv[key] = (vt, val, st)
            elif vt == STRING:
                kv[key] = (vt, take_str(), None)
            else:
                v = take(_SCALAR[vt])[0].item()
                kv[key] = (vt, bool(v) if vt == 7 else v, None)
        tensors = []
        for _ in range(n_tensors):
            name = take_str().decode()
            nd = int(take("<u4")[0])
            ne = tuple(int(x) for x in take("<u8", nd))
            ty, off = int(take("<u4")[0]), int(take("<u8")[0])
            tensors.append((name, ne, ty, off))
    return kv, tensors


def llama_cpp_or_none():
    try:
        import llama_cpp  # noqa: PLC0415
    except Exception:  # ImportError, or a broken shared library
        return None
    return llama_cpp
