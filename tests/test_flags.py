"""ramforge/flags.py: one table of environment switches, one parser, the only reader of RAMFORGE_*.

- the parser: one rule for "false" (0/false/no/off/empty, any case), integers, refusals naming the
  variable;
- docs/USAGE.md's table is the table flags.py renders (regenerate: `python -m ramforge.flags`);
- no module under ramforge/ but flags.py reads a RAMFORGE_* variable (an ast scan: os.environ and
  getenv calls, click's envvar=, and any code string that is a RAMFORGE_ name);
- the kernel cache key hashes exactly the switches marked affects_kernels, by parsed value.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ramforge import flags, paths
from ramforge.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"RAMFORGE_[A-Z0-9_]+")


@pytest.mark.parametrize("text", ["", "0", "false", "FALSE", "No", "off", "  off  "])
def test_false_has_one_rule(text):
    for f in flags.FLAGS:
        if f.type is bool:
            assert f.get({f.name: text}) is False


@pytest.mark.parametrize("text", ["1", "true", "Yes", "ON"])
def test_true(text):
    assert flags.PORTABLE.get({flags.PORTABLE.name: text}) is True
    assert flags.NO_REPACK.get({flags.NO_REPACK.name: text}) is True


def test_bad_values_are_refused_with_the_name():
    with pytest.raises(InvalidArgument, match="RAMFORGE_NO_VNNI='maybe'"):
        flags.NO_VNNI.get({"RAMFORGE_NO_VNNI": "maybe"})
    with pytest.raises(InvalidArgument, match="RAMFORGE_THREADS='four' is not an integer"):
        flags.THREADS.get({"RAMFORGE_THREADS": "four"})


def test_typed_values_and_defaults():
    assert flags.THREADS.get({}) is None and flags.THREADS.get({"RAMFORGE_THREADS": " 3 "}) == 3
    assert flags.KV_TYPE.get({"RAMFORGE_KV_TYPE": "q8_0,f16"}) == "q8_0,f16"
    assert flags.HOME.get({"RAMFORGE_HOME": ""}) is None
    assert {f.name for f in flags.FLAGS} >= {"RAMFORGE_THREADS", "RAMFORGE_NO_REPACK", "RAMFORGE_API_KEY",
                                              "RAMFORGE_NO_VNNI", "RAMFORGE_PORTABLE", "RAMFORGE_REPACK_STREAMED",
                                              "RAMFORGE_KV_TYPE", "RAMFORGE_HOME", "RAMFORGE_DEBUG"}
    assert len({f.name for f in flags.FLAGS + flags.FOREIGN}) == len(flags.FLAGS + flags.FOREIGN)
    assert all(f.type in (bool, int, str) and f.doc for f in flags.FLAGS + flags.FOREIGN)


def test_threads_default_reads_the_flag(monkeypatch):
    from ramforge.engine.runtime import default_threads

    monkeypatch.setenv("RAMFORGE_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("RAMFORGE_THREADS", "x")
    with pytest.raises(InvalidArgument, match="RAMFORGE_THREADS"):
        default_threads()


def test_threads_default_never_exceeds_numbas(monkeypatch):
    """With NUMBA_NUM_THREADS below the cores, the default is numba's count (set_threads accepts it)."""
    import numba
    import psutil

    from ramforge.engine import runtime

    monkeypatch.delenv("RAMFORGE_THREADS", raising=False)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: numba.config.NUMBA_NUM_THREADS + 3)
    assert runtime.default_threads() == numba.config.NUMBA_NUM_THREADS


def test_usage_table_is_the_flags_table():
    text = (ROOT / "docs/USAGE.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- switches: [^\n]*-->\n(.*?)\n<!-- end switches -->", text, re.S)
    assert m, "docs/USAGE.md has no switches table between its markers"
    assert m.group(1) == flags.markdown_table(), "regenerate it: python -m ramforge.flags"


def _reads_outside_flags(package: Path = ROOT / "ramforge") -> list[str]:
    """file:line of every RAMFORGE_ name in code (not a docstring) of the package outside its flags.py."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "flags.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                if NAME.fullmatch(node.value.strip().lstrip("$")):
                    found.append(f"{path.relative_to(package)}:{node.lineno}: {node.value!r}")
    return found


def test_only_flags_reads_ramforge_variables():
    assert _reads_outside_flags() == []


def test_the_scan_finds_a_reader(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "flags.py").write_text('import os\nX = os.environ.get("RAMFORGE_X")\n')
    (pkg / "sub" / "a.py").write_text('"""Reads $RAMFORGE_X (a docstring: fine)."""\nimport os\n'
                                      'x = os.environ.get("RAMFORGE_X", "")\n'
                                      'def f():\n    """RAMFORGE_Y"""\n    return os.getenv("$RAMFORGE_Y")\n')
    (pkg / "b.py").write_text('import click\nopt = click.option("--k", envvar="RAMFORGE_API_KEY")\n')
    assert _reads_outside_flags(pkg) == ["b.py:2: 'RAMFORGE_API_KEY'", "sub/a.py:3: 'RAMFORGE_X'",
                                         "sub/a.py:6: '$RAMFORGE_Y'"]


def test_kernel_key_hashes_the_kernel_switches(monkeypatch):
    assert paths.CODE_SWITCHES == tuple(f.name for f in flags.FLAGS if f.affects_kernels)
    assert set(paths.CODE_SWITCHES) == {"RAMFORGE_PORTABLE", "RAMFORGE_NO_VNNI"}
    for name in paths.CODE_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    plain = paths.kernel_cache_key()
    for off in ("0", "off", "false"):
        monkeypatch.setenv("RAMFORGE_NO_VNNI", off)
        assert paths.kernel_cache_key() == plain              # the same code: the same cache
    per = {}
    for name in paths.CODE_SWITCHES:
        monkeypatch.setenv(name, "yes")
        per[name] = paths.kernel_cache_key()
        monkeypatch.setenv(name, "1")
        assert paths.kernel_cache_key() == per[name]          # parsed: "yes" and "1" are one setting
        monkeypatch.delenv(name)
    assert plain not in per.values() and len(set(per.values())) == len(per)
    monkeypatch.setenv("RAMFORGE_NO_REPACK", "1")                 # not a code switch
    assert paths.kernel_cache_key() == plain


def test_cli_says_a_bad_switch_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT), RAMFORGE_DEBUG="maybe")
    r = subprocess.run([sys.executable, "-m", "ramforge", "plan", "--help"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "RAMFORGE_DEBUG='maybe'" in r.stderr and "Traceback" not in r.stderr
