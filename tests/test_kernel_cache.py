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
    now = time.time()
    dirs = []
    for i in range(paths.KEEP_KERNEL_DIRS + 3):
        d = base / f"{paths.KERNEL_DIR_PREFIX}{i:04d}"
        d.mkdir(parents=True)
        age = paths.PRUNE_AFTER_S * (2 if i >= 2 else 0) + i
        os.utime(d, (now - age, now - age))
        dirs.append(d)
    other = base / "not-ours"
    other.mkdir()
    current = base / f"{paths.KERNEL_DIR_PREFIX}current"
    current.mkdir()
    removed = paths.prune_kernel_dirs(base, current, now=now)
    # kept: current, the KEEP-1 most recent others, anything recent; removed: old ones beyond those
    assert current.exists() and other.exists()
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
