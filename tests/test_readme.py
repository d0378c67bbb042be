"""The README and the guides in docs/: their Python examples run as written, the README's test
command is the one CI runs, the README stays an overview, and no code cites a document the
repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(page, block) for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def test_readme_has_examples():
    """The README shows the tensor level; docs/api.md, which it points to, the model level (a press, one call)."""
    assert sum(page == README for page, _ in BLOCKS) >= 1
    assert sum(page.name == "api.md" for page, _ in BLOCKS) >= 2 and "(docs/api.md)" in README.read_text()


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"{BLOCKS[i][0].name}-{i}")
def test_example_runs(index):
    page, block = BLOCKS[index]
    namespace: dict = {}
    exec(compile(block, f"{page.name}[python block {index}]", "exec"), namespace)


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    test_command = next(c.strip() for c in commands if "tests/tiers.sh" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci


def test_readme_is_an_overview_and_every_link_resolves():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_no_code_cites_a_document_outside_the_repository():
    cited = []
    for folder in ("src", "kernels", "analysis", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_readme.py":
                continue
            if "DESIGN.md" in path.read_text():
                cited.append(str(path.relative_to(ROOT)))
    assert "DESIGN.md" not in (ROOT / "Snakefile").read_text() and not cited, cited


def test_help_shows_plain_text():
    """--help of every command reads as text: no reStructuredText roles or literals from the docstrings."""
    from kvcert.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert "``" not in text and ":func:" not in text and ":mod:" not in text, name
