"""The npm `ollama` client for the client-compatibility tests: installed once into the git-ignored fixture
cache (cache_dir()/"npm-ollama"), a test skipped with the reason where node/npm or the package is not there."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm_ollama() -> tuple[str, Path]:
    """(node, the folder whose node_modules holds `ollama`); installs it the first time, into a private
    folder renamed into place so concurrent sessions never see a half install. Skips the test when node or
    npm is missing or the install fails (offline)."""
    from tools._fixtures import cache_dir

    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node or npm is not installed")
    where = cache_dir() / "npm-ollama"
    if not (where / "node_modules" / "ollama").is_dir():
        tmp = where.with_name(f"{where.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--prefer-offline",
                                   "ollama"], capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                pytest.skip(f"the npm package ollama cannot be installed here (offline?): {done.stderr[-300:]}")
            try:
                tmp.rename(where)
            except OSError:                 # another session installed it meanwhile
                if not (where / "node_modules" / "ollama").is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return node, where


def run_node(source: str, *args: str, timeout: float = 600) -> dict:
    """Run the ES module `source` (which imports 'ollama') with node and `args`; its stdout's JSON."""
    node, where = npm_ollama()
    script = where / f"check-{os.getpid()}-{abs(hash(source))}.mjs"   # beside node_modules: 'ollama' resolves
    script.write_text(source)
    try:
        run = subprocess.run([node, str(script), *args], capture_output=True, text=True, timeout=timeout, cwd=where)
    finally:
        script.unlink(missing_ok=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)
