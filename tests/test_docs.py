"""Docs that cannot rot: every CLI subcommand, finding code, view and Makefile set-up command that
exists is named in README.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from specscope.cli import SUBCOMMANDS, build_parser
from specscope.doctor import CODES as RUNTIME_CODES
from specscope.inspector import CODES as CHECKPOINT_CODES
from specscope.storage.views import VIEWS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


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


def test_two_setup_commands_and_every_design_code():
    assert "    make demo\n    make test\n" in README
    design = Path(__file__).resolve().parents[2] / "shared" / "DESIGN.md"
    if design.exists():  # the shared design notes beside the checkout list every stable code
        section = design.read_text().split("## 6.")[1].split("## 7.")[0]
        for code in {*RUNTIME_CODES, *CHECKPOINT_CODES} - {"NOT_OBSERVED", "CHECKS_SKIPPED"}:  # newer
            assert code in section, f"{code} is not a DESIGN.md section 6 code"
