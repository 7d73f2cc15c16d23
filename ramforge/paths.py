"""Where ramforge keeps files: the cache root, the compiled-kernel cache, and whether a directory keeps
its files in RAM (memory_filesystem: tmpfs, ramfs). A leaf: imports only ramforge.flags.

Numba's on-disk cache keys a function on its own file and bytecode only, not on the helpers it
calls from other files (numba issue 1833), nor on the environment switches that change the code a
kernel generates. So the kernel cache lives in a directory named after a hash of everything that
decides the machine code: every source file under ramforge/kernels/, the switches in CODE_SWITCHES
(the flags.FLAGS that affect kernels), and the ramforge, numba and llvmlite versions. Change any of
them and the next run compiles afresh into a new directory; directories left unused are pruned.

Numba's cache files are pickles: whoever can write the cache can run code in every process that
loads it. So a hashed directory is made private (0700) with a marker file (KERNEL_MARKER) inside,
the prune removes only directories holding that marker (never an unmarked `kernels-*` directory,
e.g. a sibling of a NUMBA_CACHE_DIR that is itself so named), and a cache folder or hashed directory
that another user owns or that group/others can write is not used: `import ramforge` warns
(KernelCacheWarning, naming the directory and the `chmod` fix) and the kernels compile into a
private temporary directory, removed at exit (the cache is off for that process).
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

from . import flags

# Environment switches that change the code a kernel generates (flags.FLAGS: add new ones there).
CODE_SWITCHES = tuple(f.name for f in flags.FLAGS if f.affects_kernels)
KERNEL_DIR_PREFIX = "kernels-"
KERNEL_MARKER = ".ramforge-kernels"  # written in each hashed directory ramforge made: only those are pruned
KEEP_KERNEL_DIRS = 4                 # the most recently used hashed directories that are always kept
PRUNE_AFTER_S = 7 * 24 * 3600        # others are removed once unused this long


def cache_dir() -> Path:
    """$RAMFORGE_HOME, else $XDG_CACHE_HOME/ramforge, else ~/.cache/ramforge."""
    home = flags.HOME.get()
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
    for name, value in flags.kernel_switches():
        h.update(f"{name}={value}\0".encode())
    h.update(f"ramforge={__version__} numba={_version('numba')} llvmlite={_version('llvmlite')} "
             f"python={sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def memory_filesystem(directory: str) -> str | None:
    """The type of the filesystem holding directory when its files live in RAM (tmpfs, ramfs), else
    None (also where it cannot be told: no /proc/self/mountinfo)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    path = os.path.realpath(directory)
    best, kind = -1, None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])    # "\\040": a space
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            if len(mount) >= best:                              # the deepest; a later one over the same point
                best, kind = len(mount), rest.split()[0]
    return kind if kind in MEMORY_FILESYSTEMS else None


class KernelCacheWarning(UserWarning):
    """The kernel cache directory is not safe to load from (another user owns it or can write it)."""


def kernel_cache_base() -> Path:
    """The folder holding the hashed directories: $NUMBA_CACHE_DIR as the user set it, else <cache>/numba.
    A NUMBA_CACHE_DIR that is itself a hashed directory ramforge made (named kernels-*, holding the
    marker; inherited from a parent ramforge process) stands for its parent folder, so a child hashes
    again from the same base instead of nesting."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if not env:
        return cache_dir() / "numba"
    p = Path(env)
    return p.parent if p.name.startswith(KERNEL_DIR_PREFIX) and _marked(p) else p


def _marked(d: Path) -> bool:
    """Whether d is a real directory (not a link) holding ramforge's marker file."""
    try:
        return stat.S_ISDIR(os.lstat(d).st_mode) and stat.S_ISREG(os.lstat(d / KERNEL_MARKER).st_mode)
    except OSError:
        return False


def unsafe_reason(d: Path) -> str | None:
    """Why d cannot hold code this process loads (owned by another user than this one or root, writable
    by group or others, not a directory), or None when it is safe (or does not exist, or on a system
    without owners)."""
    if os.name != "posix":
        return None
    try:
        st = os.stat(d)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be checked ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}, neither this user (uid {os.geteuid()}) nor root"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def prune_kernel_dirs(base: Path, current: Path, now: float | None = None) -> list[Path]:
    """Remove hashed kernel directories other than `current` that ramforge made (KERNEL_MARKER inside),
    beyond the KEEP_KERNEL_DIRS most recently used and unused for PRUNE_AFTER_S; returns those removed.
    Unmarked directories and links are never touched."""
    now = time.time() if now is None else now
    try:
        dirs = [d for d in base.iterdir() if d.name.startswith(KERNEL_DIR_PREFIX) and d != current and _marked(d)]
    except OSError:
        return []
    dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    removed = []
    for d in dirs[KEEP_KERNEL_DIRS - 1:]:
        if now - d.stat().st_mtime > PRUNE_AFTER_S:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _make_marked(path: Path) -> None:
    """Create the hashed directory (0700) with its marker, unless it exists already."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    fd = os.open(path / KERNEL_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("a ramforge kernel cache (ramforge.paths): pruned when unused\n")


def _private_fallback(key: str) -> Path:
    """A private hashed directory in a new temporary folder, removed at exit: caching off, safely."""
    tmp = Path(tempfile.mkdtemp(prefix="ramforge-nocache-"))
    atexit.register(shutil.rmtree, tmp, True)
    path = tmp / (KERNEL_DIR_PREFIX + key)
    _make_marked(path)
    return path


def setup_kernel_cache() -> Path:
    """Point numba's cache at <base>/kernels-<key> (made private and marked, marked as used, old ones
    pruned) and return it. Where the base or the directory is unsafe (unsafe_reason), a
    KernelCacheWarning names it and the fix, and a private temporary directory is used instead.

    Called on `import ramforge`, before numba compiles anything."""
    base = kernel_cache_base()
    key = kernel_cache_key()
    path = base / (KERNEL_DIR_PREFIX + key)
    bad = None
    try:
        if not base.exists():
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        for d in (base, path):              # the base checked before anything is made in it
            if (why := unsafe_reason(d)) is not None:
                bad = (d, why)
                break
            if d is base:
                _make_marked(path)
        if bad is None:
            os.utime(path)                  # mtime = last use, for pruning
            prune_kernel_dirs(base, path)
    except OSError:
        pass
    if bad is None and not path.is_dir():   # a read-only cache: off, rather than numba's in-tree fallback
        path = _private_fallback(key)
    if bad is not None:
        warnings.warn(f"the kernel cache {bad[0]} {bad[1]}: its files are pickles that every ramforge process "
                      f"loads, so it is not used and the kernels compile afresh in this process; fix: "
                      f"`chmod go-w {bad[0]}` (and make it yours), or set NUMBA_CACHE_DIR to a private directory",
                      KernelCacheWarning, stacklevel=2)
        path = _private_fallback(key)
    os.environ["NUMBA_CACHE_DIR"] = str(path)
    if "numba" in sys.modules:              # numba imported first: its config read the old value
        sys.modules["numba"].config.CACHE_DIR = str(path)
    return path
