"""The shape of `ramforge/` (issue 40): no module over 500 lines but data tables, no function over 100
lines but the IR builders listed, and few public modules at the top level (the rest in packages).

Everything is read with `ast` / line counts; nothing is imported. An exception is listed by path (and
function name) here, so a new one is a visible change to this file."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ramforge"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
MAX_TOP_LEVEL_MODULES = 8

# Modules allowed past MAX_MODULE_LINES: data tables, and one being split elsewhere.
LONG_MODULES = {
    "kernels/grids.py",            # data: ggml-common.h's IQ2 / IQ3 codebooks (tools/gen_grids.py writes it)
    "kernels/lowbit_tables.py",    # data: MXFP4 / TQ / IQ1 tables as ggml defines them
}
# (module, function) allowed past MAX_FUNCTION_LINES: IR builders, one straight-line program each.
LONG_FUNCTIONS = {
    ("kernels/rows.py", "_prow"),             # IR builder: a row kernel's LLVM IR
    ("kernels/tiles.py", "_tile_codegen"),    # IR builder: a tile kernel's LLVM IR
}
NOT_COUNTED = {"__init__.py", "__main__.py", "_version.py"}


def _modules() -> dict[str, Path]:
    return {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_exceptions_name_real_modules_and_functions():
    mods = _modules()
    assert LONG_MODULES <= mods.keys(), sorted(LONG_MODULES - mods.keys())
    for rel, name in LONG_FUNCTIONS:
        tree = ast.parse(mods[rel].read_text(encoding="utf-8"))
        assert any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree)), \
            f"{rel}: no function {name} (drop it from LONG_FUNCTIONS)"


def test_no_module_over_500_lines():
    long = {rel: n for rel, p in _modules().items() if rel not in LONG_MODULES and (n := _lines(p)) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them, or list a data table): {long}"


def test_no_function_over_100_lines():
    long = []
    for rel, p in _modules().items():
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and (rel, n.name) not in LONG_FUNCTIONS:
                size = n.end_lineno - n.lineno + 1          # the def line through the body's last line
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{n.lineno} {n.name} ({size} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_few_top_level_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in NOT_COUNTED and not p.name.startswith("_"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} public modules directly under ramforge/: {top}"


def test_the_checks_see_a_long_module_and_function(tmp_path):
    """The counts above do count: a made-up 501-line module with a 101-line function is over both."""
    body = "\n".join(f"    x{i} = {i}" for i in range(100))
    src = "def f():\n" + body + "\n" + "\n".join(f"y{i} = {i}" for i in range(400)) + "\n"
    p = tmp_path / "m.py"
    p.write_text(src)
    assert _lines(p) == 501 > MAX_MODULE_LINES
    fn = ast.parse(src).body[0]
    assert fn.end_lineno - fn.lineno + 1 == 101 > MAX_FUNCTION_LINES
