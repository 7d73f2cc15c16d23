"""The docs stay true to the tree: README.md is a front page carrying CI's test command, every relative
link in README.md and docs/*.md reaches a file (and a heading, where it names one), docs/ARCHITECTURE.md
names every module under ramforge/, and no page cites a commit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 12_500

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HEX_WORD = re.compile(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w/.-])")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (links and headings inside them do not count)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(_prose(page.read_text(encoding="utf-8")))}


def _pytest_args(line: str) -> list[str]:
    words = line.split()
    return words[words.index("pytest") + 1:]


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= README_LIMIT, f"README.md has {len(text)} characters; move detail into docs/ (limit {README_LIMIT})"


def test_readme_carries_the_ci_test_command():
    ci = [ln for ln in (ROOT / ".ci/run").read_text().splitlines() if "-m pytest" in ln and not ln.lstrip().startswith("#")]
    assert len(ci) == 1, ci
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", readme, re.S | re.M)
    runs = [ln for b in blocks for ln in b.splitlines() if "pytest" in ln]
    assert len(runs) == 1, f"README.md must hold exactly one pytest command in a bash block, found {runs}"
    assert _pytest_args(runs[0]) == _pytest_args(ci[0]), (runs[0], ci[0])
    assert readme.index(runs[0]) < 1500, "the test command belongs at the top of README.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):              # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def _named(rel: Path, text: str, sections: list[tuple[str, str]]) -> bool:
    """Whether docs/ARCHITECTURE.md names ramforge/<rel>: its path from ramforge/, or its file name on a line
    or in a section that names its folder; a package's __init__.py by the folder itself."""
    parts = rel.parts
    if rel.name == "__init__.py" and len(parts) > 1:
        return f"{'/'.join(parts[:-1])}/" in text
    if len(parts) == 1:
        return re.search(rf"(?<![\w/]){re.escape(rel.name)}\b", text) is not None
    if rel.as_posix() in text:
        return True
    folder = f"{'/'.join(parts[:-1])}/"
    pat = re.compile(rf"(?<![\w/]){re.escape(rel.name)}\b")
    if any(folder in line and pat.search(line) for line in text.splitlines()):
        return True
    return any(folder in head and pat.search(body) for head, body in sections)


def test_architecture_names_every_module():
    text = (ROOT / "docs/ARCHITECTURE.md").read_text(encoding="utf-8")
    chunks = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    sections = list(zip(chunks[1::2], chunks[2::2]))
    package = ROOT / "ramforge"
    missing = [p.relative_to(package).as_posix() for p in sorted(package.rglob("*.py"))
               if not _named(p.relative_to(package), text, sections)]
    assert not missing, f"docs/ARCHITECTURE.md does not name: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_commit_hashes(page):
    """Figures are current, with their command; a commit named in the docs is history."""
    hits = [w for w in HEX_WORD.findall(page.read_text(encoding="utf-8"))
            if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not hits, f"{page.name} names commits: {hits}"
