"""Docs that cannot rot: every CLI subcommand, finding code, view and Makefile set-up command that
exists is named in README.md; every finding code is in docs/design.md, and every reference to a section
of it names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specscope.cli import SUBCOMMANDS, build_parser
from specscope.doctor import CODES as RUNTIME_CODES
from specscope.inspector import CODES as CHECKPOINT_CODES
from specscope.storage.views import VIEWS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_documented(command):
    assert f"specscope {command}" in README
    assert command in build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("code", [*RUNTIME_CODES, *CHECKPOINT_CODES])
def test_finding_code_documented(code):
    assert f"`{code}`" in README


@pytest.mark.parametrize("view", VIEWS)
def test_view_documented(view):
    assert f"`{view}`" in README


def test_two_setup_commands():
    assert "    make demo\n    make test\n" in README


def _design_sections() -> dict[str, str]:
    """``docs/design.md`` by ``## `` heading."""
    sections, name = {}, None
    for line in DESIGN.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return sections


@pytest.mark.parametrize("code", [*RUNTIME_CODES, *CHECKPOINT_CODES])
def test_finding_code_in_the_design_notes(code):
    assert f"`{code}`" in _design_sections()["Finding codes"], f"{code} missing from docs/design.md"


def test_design_references_point_somewhere():
    """Every ``docs/design.md, "Section"`` a docstring or comment cites is a heading there, and
    nothing cites the design notes by number (they live in the repository, by name)."""
    sections = _design_sections()
    cited = {}
    for path in [*ROOT.glob("specscope/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("tests/*.py")]:
        if path.name == "test_docs.py":
            continue
        text = path.read_text()
        assert not re.search(r"DESIGN\.md (section|§)", text), f"{path}: cites DESIGN.md by number"
        for match in re.finditer(r'docs/design\.md,((?:\s*"[^"]+",?)+)', text):
            for name in re.findall(r'"([^"]+)"', match.group(1)):
                cited.setdefault(" ".join(name.split()), path)  # a name may wrap across lines
    missing = {name: str(path) for name, path in cited.items() if name not in sections}
    assert cited and not missing, missing
