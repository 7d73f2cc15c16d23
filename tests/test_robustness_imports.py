"""robustness/ stands on its own: none of its modules imports from tests/ (what both share lives in
robustness/ or tools/), so the harnesses run without the test suite's modules."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_from_tests(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(folder)}:{node.lineno}: {n}" for n in names
                      if n == "tests" or n.startswith("tests.")]
    return found


def test_robustness_does_not_import_tests():
    assert imports_from_tests(ROOT / "robustness") == []


def test_the_scan_sees_an_import(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from tests.test_x import y\n    import tests\n")
    (tmp_path / "b.py").write_text("from tools.ggufbuild import valid_model\nfrom .tests import z\n")
    assert imports_from_tests(tmp_path) == ["a.py:2: tests.test_x", "a.py:3: tests"]
