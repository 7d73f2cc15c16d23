"""Where ramforge keeps files: the cache root and the compiled-kernel cache. A leaf: imports nothing
of ramforge.

Numba's on-disk cache keys a function on its own file and bytecode only, not on the helpers it
calls from other files (numba issue 1833), nor on the environment switches that change the code a
kernel generates. So the kernel cache lives in a directory named after a hash of everything that
decides the machine code: every source file under ramforge/kernels/, the switches in CODE_SWITCHES,
and the ramforge, numba and llvmlite versions. Change any of them and the next run compiles afresh
into a new directory; directories left unused are pruned.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

# Environment switches that change the code a kernel generates (one table: add new ones here).
CODE_SWITCHES = (
    "RAMFORGE_NO_VNNI",    # the generic integer-dot IR instead of vpdpbusd
    "RAMFORGE_PORTABLE",   # plain loops instead of LLVM vector intrinsics
)
KERNEL_DIR_PREFIX = "kernels-"
KEEP_KERNEL_DIRS = 4                 # the most recently used hashed directories that are always kept
PRUNE_AFTER_S = 7 * 24 * 3600        # others are removed once unused this long


def cache_dir() -> Path:
    """$RAMFORGE_HOME, else $XDG_CACHE_HOME/ramforge, else ~/.cache/ramforge."""
    home = os.environ.get("RAMFORGE_HOME")
    if home:
        return Path(home)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ramforge"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def kernel_sources() -> list[Path]:
    """Every source file whose contents can change a compiled kernel: ramforge/kernels/**/*.py."""
    root = Path(__file__).resolve().parent / "kernels"
    return sorted(root.rglob("*.py"))


def kernel_cache_key() -> str:
    """sha256 (16 hex digits) of the kernels' sources, the code switches and the versions."""
    from ._version import __version__

    h = hashlib.sha256()
    base = Path(__file__).resolve().parent
    for p in kernel_sources():
        h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    for name in CODE_SWITCHES:
        h.update(f"{name}={os.environ.get(name, '').strip()}\0".encode())
    h.update(f"ramforge={__version__} numba={_version('numba')} llvmlite={_version('llvmlite')} "
             f"python={sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


def kernel_cache_base() -> Path:
    """The folder holding the hashed directories: $NUMBA_CACHE_DIR as the user set it, else <cache>/numba.
    A NUMBA_CACHE_DIR that is itself a hashed directory (inherited from a parent ramforge process)
    stands for its parent folder, so a child hashes again from the same base instead of nesting."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if not env:
        return cache_dir() / "numba"
    p = Path(env)
    return p.parent if p.name.startswith(KERNEL_DIR_PREFIX) else p


def prune_kernel_dirs(base: Path, current: Path, now: float | None = None) -> list[Path]:
    """Remove hashed kernel directories other than `current` that are beyond the KEEP_KERNEL_DIRS most
    recently used and unused for PRUNE_AFTER_S; returns those removed."""
    now = time.time() if now is None else now
    try:
        dirs = [d for d in base.iterdir() if d.is_dir() and d.name.startswith(KERNEL_DIR_PREFIX) and d != current]
    except OSError:
        return []
    dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    removed = []
    for d in dirs[KEEP_KERNEL_DIRS - 1:]:
        if now - d.stat().st_mtime > PRUNE_AFTER_S:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def setup_kernel_cache() -> Path:
    """Point numba's cache at <base>/kernels-<key> (made, marked as used, old ones pruned) and return it.

    Called on `import ramforge`, before numba compiles anything."""
    base = kernel_cache_base()
    path = base / (KERNEL_DIR_PREFIX + kernel_cache_key())
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.utime(path)                      # mtime = last use, for pruning
        prune_kernel_dirs(base, path)
    except OSError:
        pass                                # a read-only cache: numba falls back to not caching
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    if "numba" in sys.modules:              # numba imported first: its config read the old value
        sys.modules["numba"].config.CACHE_DIR = str(path)
    return path
