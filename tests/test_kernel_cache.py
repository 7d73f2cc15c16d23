"""The compiled-kernel cache cannot go stale (ramforge.paths).

Numba keys a cached function on its own file only. These tests run a copy of the package in child
processes that share one cache folder, change a helper in another kernels file (or a code switch)
between runs, and check that the caller's result follows the change.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ramforge
from ramforge import paths

PKG = Path(ramforge.__file__).resolve().parent

HELPER = '''
from numba import njit


@njit(cache=True)
def helper(x):
    return x + {delta}
'''
CALLER = '''
from numba import njit

from ramforge.kernels._probe_helper import helper


@njit(cache=True)
def caller(x):
    return helper(x) * 10
'''
RUN = "import ramforge, os; from ramforge.kernels._probe_caller import caller; print(caller(1), os.environ['NUMBA_CACHE_DIR'])"


@pytest.fixture
def package_copy(tmp_path):
    """A copy of ramforge (sources only) with a two-file probe in kernels/; returns (root, env)."""
    root = tmp_path / "src"
    shutil.copytree(PKG, root / "ramforge", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "ramforge" / "kernels" / "_probe_caller.py").write_text(CALLER)
    (root / "ramforge" / "kernels" / "_probe_helper.py").write_text(HELPER.format(delta=1))
    env = {k: v for k, v in os.environ.items() if k not in paths.CODE_SWITCHES}
    env.update(PYTHONPATH=str(root), RAMFORGE_HOME=str(tmp_path / "home"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("NUMBA_CACHE_DIR", None)
    return root, env


def _run(root: Path, env: dict) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", RUN], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    value, cache = out.stdout.split()
    return int(value), cache


def test_changed_helper_in_another_file_is_recompiled(package_copy):
    root, env = package_copy
    assert _run(root, env)[0] == 20                      # (1 + 1) * 10, compiled and cached
    assert _run(root, env)[0] == 20                      # the same, from the cache
    time.sleep(0.01)
    (root / "ramforge" / "kernels" / "_probe_helper.py").write_text(HELPER.format(delta=2))
    value, cache = _run(root, env)
    assert value == 30, "the caller ran a stale cached copy of the old helper"
    assert Path(cache).name.startswith(paths.KERNEL_DIR_PREFIX)


def test_code_switches_have_caches_of_their_own(package_copy):
    root, env = package_copy
    _, plain = _run(root, env)
    for name in paths.CODE_SWITCHES:
        _, switched = _run(root, dict(env, **{name: "1"}))
        assert switched != plain and Path(switched).parent == Path(plain).parent
    assert _run(root, env)[1] == plain                   # same inputs, same directory


def test_user_cache_dir_is_the_base(package_copy, tmp_path):
    root, env = package_copy
    _, cache = _run(root, dict(env, NUMBA_CACHE_DIR=str(tmp_path / "mine")))
    assert Path(cache).parent == tmp_path / "mine"
    _, again = _run(root, dict(env, NUMBA_CACHE_DIR=cache))   # a child inheriting it does not nest
    assert again == cache


def test_old_directories_are_pruned(tmp_path):
    base = tmp_path / "numba"
    base.mkdir()
    now = time.time()
    old = now - 3 * paths.PRUNE_AFTER_S
    dirs = []
    for i in range(paths.KEEP_KERNEL_DIRS + 3):
        d = base / f"{paths.KERNEL_DIR_PREFIX}{i:04d}"
        paths._make_marked(d)
        age = paths.PRUNE_AFTER_S * (2 if i >= 2 else 0) + i
        os.utime(d, (now - age, now - age))
        dirs.append(d)
    other = base / "not-ours"
    other.mkdir()
    unmarked = base / f"{paths.KERNEL_DIR_PREFIX}someone-elses"      # old, named like ours, no marker
    (unmarked / "data").mkdir(parents=True)
    os.utime(unmarked, (old, old))
    target = tmp_path / "elsewhere"
    paths._make_marked(target)                                       # a marked directory outside, linked in
    link = base / f"{paths.KERNEL_DIR_PREFIX}link"
    link.symlink_to(target)
    os.utime(target, (old, old))
    current = base / f"{paths.KERNEL_DIR_PREFIX}current"
    current.mkdir()
    removed = paths.prune_kernel_dirs(base, current, now=now)
    # kept: current, the KEEP-1 most recent others, anything recent, anything unmarked or linked;
    # removed: old marked ones beyond those
    assert current.exists() and other.exists() and (unmarked / "data").is_dir()
    assert link.is_symlink() and (target / paths.KERNEL_MARKER).is_file()
    assert dirs[0].exists() and dirs[1].exists()
    assert sorted(removed) == sorted(d for d in dirs[paths.KEEP_KERNEL_DIRS - 1:])
    assert all(not d.exists() for d in removed)


FACTORY = '''
from numba import njit


def make(k):
    @njit(cache=True)
    def inner(x):
        return x + k

    @njit(cache=True)
    def outer(x):
        return inner(x) * 2          # a closure over another dispatcher
    return outer


kernel = make(3)
'''


def test_a_closure_over_a_dispatcher_is_served_from_the_cache(package_copy):
    # numba pickles a closure's cells for its cache key, and a dispatcher pickles with a per-process
    # uuid: without kernels.naming.stable_cache_keys every process compiled such kernels again
    root, env = package_copy
    (root / "ramforge" / "kernels" / "_probe_factory.py").write_text(FACTORY)
    run = ("import ramforge; from ramforge.kernels._probe_factory import kernel; "
           "print(kernel(1), sum(kernel.stats.cache_hits.values()))")
    outs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", run], cwd=root, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout.split())
    assert outs == [["8", "0"], ["8", "1"]]           # compiled once, then loaded


def test_prefetch_level_follows_the_cpu_numba_caches_for(monkeypatch):
    """The weights' prefetch level is chosen by the target CPU's name, which numba's cache index keys on
    (its codegen's magic tuple), so a cache shared between an AMD and an Intel host keeps both."""
    from numba.core import config
    from numba.core.registry import cpu_target

    from ramforge.kernels import llvmir

    assert cpu_target.target_context.codegen().magic_tuple()[1] == llvmir.target_cpu_name()
    for name, level in (("znver5", 3), ("znver3", 3), ("rocketlake", 2), ("sapphirerapids", 2), ("generic", 2)):
        monkeypatch.setattr(config, "CPU_NAME", name)
        assert llvmir.target_cpu_name() == name
        assert llvmir.prefetch_locality() == level


# ---- the cache's own safety: only its own directories pruned, an unsafe cache not loaded -------------

@pytest.fixture
def fresh_env(monkeypatch, tmp_path):
    """setup_kernel_cache run in this process, with NUMBA_CACHE_DIR and numba's config put back after."""
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", numba.config.CACHE_DIR)
    monkeypatch.setenv("RAMFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    return monkeypatch


def test_a_new_cache_directory_is_private_and_marked(fresh_env, tmp_path):
    path = paths.setup_kernel_cache()
    assert path.parent == tmp_path / "home" / "numba" and os.environ["NUMBA_CACHE_DIR"] == str(path)
    assert (path / paths.KERNEL_MARKER).is_file()
    assert os.stat(path).st_mode & 0o777 == 0o700 and os.stat(path.parent).st_mode & 0o777 == 0o700
    # a child process inheriting the marked directory hashes from its parent folder, not nesting
    assert paths.kernel_cache_base() == path.parent


def test_a_numba_cache_dir_named_like_a_hashed_directory_is_the_base(fresh_env, tmp_path):
    """NUMBA_CACHE_DIR=/x/kernels-mine (the user's, unmarked): its old `kernels-*` siblings are not
    ramforge's and stay; the cache goes inside it."""
    mine = tmp_path / "projects" / f"{paths.KERNEL_DIR_PREFIX}mine"
    mine.mkdir(parents=True, mode=0o700)
    old = time.time() - 3 * paths.PRUNE_AFTER_S
    siblings = []
    for i in range(paths.KEEP_KERNEL_DIRS + 2):
        d = mine.parent / f"{paths.KERNEL_DIR_PREFIX}sibling{i}"
        (d / "work").mkdir(parents=True)
        os.utime(d, (old, old))
        siblings.append(d)
    fresh_env.setenv("NUMBA_CACHE_DIR", str(mine))
    path = paths.setup_kernel_cache()
    assert path.parent == mine and (path / paths.KERNEL_MARKER).is_file()
    assert all((d / "work").is_dir() for d in siblings)


def _owned_by_another(monkeypatch, d: Path) -> None:
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)                   # nobody
    else:                                           # not root: this process pretends to be someone else
        monkeypatch.setattr(paths.os, "geteuid", lambda: os.stat(d).st_uid + 1)


@pytest.mark.parametrize("problem", ["group-writable base", "world-writable hashed dir", "base of another user"])
def test_an_unsafe_cache_is_not_loaded(fresh_env, tmp_path, problem):
    base = tmp_path / "shared"
    base.mkdir(mode=0o700)
    fresh_env.setenv("NUMBA_CACHE_DIR", str(base))
    planted = base / (paths.KERNEL_DIR_PREFIX + paths.kernel_cache_key())
    if problem == "group-writable base":
        os.chmod(base, 0o775)
        bad, why = base, "writable by group or others (mode 0775)"
    elif problem == "world-writable hashed dir":
        planted.mkdir()
        os.chmod(planted, 0o777)
        bad, why = planted, "writable by group or others (mode 0777)"
    else:
        _owned_by_another(fresh_env, base)
        bad, why = base, "is owned by uid"
    with pytest.warns(paths.KernelCacheWarning) as w:
        path = paths.setup_kernel_cache()
    msg = str(w[0].message)
    assert str(bad) in msg and why in msg and f"chmod go-w {bad}" in msg and "NUMBA_CACHE_DIR" in msg
    # the kernels compile into a private temporary directory of this process, not the unsafe one
    assert path.parent.name.startswith("ramforge-nocache-") and os.environ["NUMBA_CACHE_DIR"] == str(path)
    assert os.stat(path).st_mode & 0o777 == 0o700 and (path / paths.KERNEL_MARKER).is_file()
    assert not (planted / paths.KERNEL_MARKER).exists()     # nothing written into the unsafe cache


def test_import_with_an_unsafe_cache_warns_and_still_runs(package_copy, tmp_path):
    root, env = package_copy
    base = tmp_path / "open"
    base.mkdir()
    os.chmod(base, 0o777)
    out = subprocess.run([sys.executable, "-c", RUN], cwd=root, env=dict(env, NUMBA_CACHE_DIR=str(base)),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    value, cache = out.stdout.split()
    assert value == "20" and "KernelCacheWarning" in out.stderr and f"chmod go-w {base}" in out.stderr
    assert not Path(cache).exists()                  # the private directory is removed at exit
    assert list(base.iterdir()) == []
