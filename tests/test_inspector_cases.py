"""Every shared checkpoint case under ../shared/cases/checkpoints passes through the real CLI.

The cases live beside the checkout (CI has them). Without them these tests skip, unless
``SPECSCOPE_REQUIRE_SHARED=1`` (set by ``.ci/run``) turns their absence into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specscope.cli import main

REPO = Path(__file__).resolve().parents[1]
CASES = REPO.parent / "shared" / "cases" / "checkpoints"
CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "EXPECTED.json").is_file()) if CASES.is_dir() else []
pytestmark = pytest.mark.skipif(not CASES.is_dir() and os.environ.get("SPECSCOPE_REQUIRE_SHARED") != "1",
                                reason=f"no shared checkpoint cases at {CASES} (a checkout without ../shared)")


def _check(expected: dict, rc: int, report: dict) -> None:
    codes = {f["code"] for f in report["findings"]}
    assert set(expected.get("must_include", [])) <= codes, codes
    banned = set(expected.get("must_exclude_severity", []))
    assert not [f["code"] for f in report["findings"] if f["severity"] in banned]
    assert rc == expected["exit_code"]
    for f in report["findings"]:
        assert f["fix"] and f["message"] and isinstance(f["evidence"], dict)


def test_cases_exist():
    assert CASE_DIRS, f"no checkpoint cases under {CASES}"


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case_in_process(case, capsys):
    expected = json.loads((case / "EXPECTED.json").read_text())
    rc = main(["inspect", str(case), *expected["args"], "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == str(case) and report["engine"] in expected["args"] + ["sglang"]
    _check(expected, rc, report)


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case_human_output_matches_exit_code(case, capsys):
    expected = json.loads((case / "EXPECTED.json").read_text())
    rc = main(["inspect", str(case), *expected["args"]])
    out = capsys.readouterr().out
    assert rc == expected["exit_code"]
    for code in expected.get("must_include", []):
        assert code in out
    assert "fix:" in out


def test_console_script_subprocess():
    case = CASES / "d2t-absolute"
    script = Path(sys.executable).with_name("specscope")
    proc = subprocess.run([str(script), "inspect", str(case), "--engine", "sglang", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    codes = [f["code"] for f in json.loads(proc.stdout)["findings"]]
    assert codes[0] == "D2T_NOT_OFFSETS"  # errors first
