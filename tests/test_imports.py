"""The import graph of `ramforge/` has no cycles.

Every module under ramforge/ is parsed with `ast` (nothing is imported). Every import statement
counts, wherever it stands: module level, inside a function (lazy imports), under
`if TYPE_CHECKING:` or in a `try: ... except ImportError:`. A lazy import breaks no cycle: it
only moves the moment the cycle bites (a half-initialised module, or a layering nobody can
read), so the graph keeps it.

Edges:
- `import a.b.c` and `from a.b import c` point at the deepest module named (`a.b.c` when `c` is a
  submodule, else `a.b`); relative imports are resolved against the importing module's package.
- Importing `a.b.c` also runs the `__init__` of `a.b` and `a`: those packages get an edge too,
  except the importer's own enclosing packages, which always start running before it does.
- Only modules inside ramforge/ are nodes.

A cycle is reported as a path `a -> b -> ... -> a`, with the line of each import.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ramforge"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py under root (a package's `__init__.py` is the package)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """Modules of `modules` that `name` imports, each with the line of its first import."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    named: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                named.append((sub if sub in modules else base, node.lineno))
    own = set(_ancestors(name))
    edges: dict[str, int] = {}
    for target, line in named:
        while target and target not in modules:          # `import ramforge.x.y` names a function? its module
            target = target.rpartition(".")[0]
        if not target or target == name:
            continue
        for t in [target] + [a for a in _ancestors(target) if a in modules and a not in own]:
            if t != name:
                edges.setdefault(t, line)
    return edges


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted): the modules that
    import each other, directly or not."""
    index, low, stack, on_stack, comps, counter = {}, {}, [], set(), [], [0]

    def strongconnect(v):                               # Tarjan, iterative
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return comps


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a closed path) per strongly connected component."""
    return [_closed_path(graph, set(c), c[0]) for c in components(graph)]


def _closed_path(graph, comp: set[str], start: str) -> list[str]:
    """A shortest path start -> ... -> start inside one component (breadth first)."""
    prev, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in comp:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a component but on no cycle")  # pragma: no cover


def describe(graph, path: list[str]) -> str:
    hops = [f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])]
    return " -> ".join(hops + [path[-1]])


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "ramforge.engine.engine" in graph
    found = components(graph)
    report = [f"{describe(graph, _closed_path(graph, set(c), c[0]))}\n    (all of: {', '.join(c)})" for c in found]
    assert not found, "import cycles in ramforge/:\n  " + "\n  ".join(report)


# ---- the checker checks: a synthetic package with the kinds of import the real one uses

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_sees_function_level_and_relative_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from ..a import thing\n",            # lazy, two dots
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "d.py": "import pkg.c\n",
        "e.py": "from . import f\n",
        "f.py": "x = 1\n",
    })
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.sub.b": 1, "pkg.sub": 1}
    assert graph["pkg.sub.b"] == {"pkg.a": 2}
    found = {tuple(c) for c in cycles(graph)}
    assert found == {("pkg.a", "pkg.sub.b", "pkg.a"), ("pkg.c", "pkg.d", "pkg.c")}
    assert "pkg.a (line 1) -> pkg.sub.b (line 2) -> pkg.a" == describe(graph, ["pkg.a", "pkg.sub.b", "pkg.a"])


def test_checker_counts_package_inits_run_on_the_way(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from .store.names import N\n",         # runs store/__init__ first
        "store/__init__.py": "from .names import N\nfrom .blobs import B\n",
        "store/names.py": "N = 1\n",
        "store/blobs.py": "from ..low import f\nB = 2\n",
    })
    graph = import_graph(root)
    assert set(graph["pkg.low"]) == {"pkg.store.names", "pkg.store"}
    assert "pkg" not in graph["pkg.store.blobs"]                        # its own package: not an edge
    assert cycles(graph) == [["pkg.low", "pkg.store", "pkg.store.blobs", "pkg.low"]]


@pytest.mark.parametrize("text", ["from . import __version__\n", "import pkg\n"])
def test_checker_counts_explicit_imports_of_an_enclosing_package(tmp_path, text):
    root = _package(tmp_path, {"__init__.py": "from .leaf import x\n__version__ = '1'\n", "leaf.py": text + "x = 1\n"})
    assert cycles(import_graph(root)) == [["pkg", "pkg.leaf", "pkg"]]


# ---- tests reach tools/ and robustness/ as packages, never by file path

REPO = PACKAGE.parent


def test_tests_import_tools_and_harnesses_as_packages():
    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "SourceFileLoader"):
                offenders.append(f"{where} loads a module from a file path")
            elif (isinstance(node, ast.Attribute) and node.attr in ("insert", "append")
                  and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
                  and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"):
                offenders.append(f"{where} changes sys.path")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] == "benchmarks" for n in names):
                    offenders.append(f"{where} imports benchmarks/ (speed only: nothing to import)")
    assert not offenders, offenders
    for package in ("tools", "robustness"):
        assert (REPO / package / "__init__.py").is_file(), package
    assert not {"fuzz.py", "fuzz_atheris.py", "load_server.py"} & {p.name for p in (REPO / "benchmarks").glob("*.py")}


@pytest.mark.parametrize("args", [["tools/make_models.py", "--help"], ["-m", "tools.make_models", "--help"],
                                  ["robustness/fuzz.py", "--help"], ["-m", "robustness.load_server", "--help"]])
def test_tools_and_harnesses_still_run_as_scripts(args):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]


# ------------------------------------------------------------------------------------- layering

# The tiers of ramforge/, lowest first: a package imports only from tiers below its own (leaf
# modules, tier 0, import each other and nothing else). Docs: docs/ARCHITECTURE.md draws the same picture.
TIERS = [
    {"_version", "errors", "paths", "flags", "jit", "profiling", "cancel"},   # leaves
    {"gguf"},
    {"store"},
    {"kernels"},
    {"memory"},
    {"models", "kv", "sampling", "tokenizer", "structured"},
    {"stream"},
    {"engine"},
    {"cluster"},
    {"generation"},
    {"server"},
    {"cli"},
    {"ramforge", "__main__"},        # the package's own __init__ (lazy public names) and `python -m`
]
TIER = {name: i for i, names in enumerate(TIERS) for name in names}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ramforge"


def layering_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    out = []
    for module, deps in sorted(graph.items()):
        here = package_of(module)
        for dep, line in sorted(deps.items()):
            there = package_of(dep)
            if there != here and (TIER[there] > TIER[here] or TIER[there] == TIER[here] > 0):
                out.append(f"{module} (tier {TIER[here]}) imports {dep} (tier {TIER[there]}) at line {line}")
    return out


def test_every_package_has_a_tier():
    assert {package_of(m) for m in module_names(PACKAGE)} <= set(TIER)


def test_packages_import_only_lower_tiers():
    assert layering_violations(import_graph()) == []


def test_the_layering_check_sees_an_upward_import():
    graph = {"ramforge.kernels.ops": {"ramforge.engine.engine": 3}, "ramforge.engine.engine": {}}
    assert layering_violations(graph) == ["ramforge.kernels.ops (tier 3) imports ramforge.engine.engine (tier 7) at line 3"]


def test_only_the_cli_uses_rich():
    users = sorted(str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
                   if any(isinstance(n, (ast.Import, ast.ImportFrom)) and
                          any((getattr(n, "module", None) or a.name).split(".")[0] == "rich" for a in n.names)
                          for n in ast.walk(ast.parse(p.read_text()))))
    assert users and all(u.startswith("ramforge/cli/") for u in users), users
