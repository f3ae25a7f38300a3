"""Docs that cannot rot: every CLI subcommand, finding code, view and Makefile set-up command that
exists is named in README.md; every finding code is in docs/design.md, and every reference to a section
of it names one that exists."""

from __future__ import annotations

import argparse
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


def _command_rows() -> dict[str, str]:
    """README's command table: subcommand -> its row."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `specscope (\w+) .*$", README, re.MULTILINE)}


def _arguments(command: str) -> list[str]:
    """What README's row of ``command`` must name, read from its argparse parser: every flag, the
    metavar of every positional argument, and every choice a flag offers."""
    parser = build_parser(command)._subparsers._group_actions[0].choices[command]
    names = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            names.append(max(action.option_strings, key=len))
        else:
            names.append(action.metavar or action.dest.upper())
        names += [str(choice) for choice in action.choices or ()]
    return names


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_command_table_names_every_argument(command):
    """The command table is checked against the parsers: a flag, positional or choice added to a
    subcommand fails here until its row names it."""
    row = _command_rows().get(command, "")
    assert row, f"README's command table has no row for specscope {command}"
    missing = [name for name in _arguments(command) if name not in row]
    assert not missing, f"README's row of specscope {command} lacks {missing}"


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
