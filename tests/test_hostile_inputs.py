"""Hostile CLI and dashboard inputs (issue 23): each is one line on stderr and exit 2 (or a clear
message on the page), never a traceback; ``--json`` is strict JSON; the table escapes terminal
control sequences of stored data. Real stores, the real CLI (in-process, and as a subprocess where
argv bytes matter), the real Streamlit app (AppTest)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _dashboard_traces import trace, write_store
from streamlit.testing.v1 import AppTest

from specscope import events as ev
from specscope.app import DB_ENV, ENTRY, TRACE_ENV
from specscope.cli import main
from specscope.results import to_json
from specscope.storage import open_store


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the CLI run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _one_line_exit_2(code: int, err: str) -> None:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.fixture
def db(store_url: str) -> str:
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="run-\x1b[2J\x1b]0;pwned\x07", engine="e", engine_version="1",
                                 target_model="t", draft_model="d", config={}, ts_wall=1.0)])
    return store_url


@pytest.mark.parametrize("url", [
    "postgresql://u@h:notaport/db", "postgresql+psycopg://[::1/db", "postgresql://u@127.0.0.1:99999/db",
    "postgresql+psycopg2://u@h/db", "mysql://u@h/db", "sqlite:///:memory:",
])
def test_malformed_store_urls(url: str) -> None:
    code, _, err = _cli(["query", "--db", url, "SELECT 1"])
    _one_line_exit_2(code, err)


@pytest.mark.parametrize("argv", [
    ["query", "--timeout", "1e306"], ["query", "--timeout", "nan"], ["query", "--timeout", "inf"],
    ["query", "--limit", "lots"],
])
def test_out_of_range_query_flags(argv: list[str], db: str) -> None:
    code, _, err = _cli([argv[0], "--db", db, *argv[1:], "SELECT 1"])
    _one_line_exit_2(code, err)
    assert err.startswith("specscope: error: argument")


@pytest.mark.parametrize("port", ["-1", "99999", "http"])
def test_dashboard_port_out_of_range(port: str, tmp_path: Path) -> None:
    code, _, err = _cli(["dashboard", "--db", str(tmp_path / "s.db"), "--port", port])
    _one_line_exit_2(code, err)
    assert "not a TCP port" in err and not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("command", [["dashboard"], ["demo", "--no-dashboard"],
                                     ["watch", "http://127.0.0.1:9/metrics", "--count", "1"]])
def test_a_command_that_creates_its_store_refuses_a_users_empty_file(command: list[str], tmp_path: Path) -> None:
    """SQLite takes an empty file for an empty database: demo and watch turned one into a store."""
    mine = tmp_path / "notes.txt"
    mine.touch()
    code, _, err = _cli([command[0], "--db", str(mine), *command[1:]])
    _one_line_exit_2(code, err)
    assert "empty file" in err and f"the {command[0]} creates the store there" in err and mine.read_bytes() == b""


def test_dashboard_refuses_a_store_in_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    """A mistyped folder made the folder and an empty store, and the page waited for runs never
    written there."""
    code, _, err = _cli(["dashboard", "--db", str(tmp_path / "typo" / "s.db")])
    _one_line_exit_2(code, err)
    assert f"no folder {tmp_path / 'typo'}" in err and not (tmp_path / "typo").exists()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_bad_trace_sql_setting(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_ENV, value)
    code, _, err = _cli(["dashboard", "--db", str(tmp_path / "s.db")])
    _one_line_exit_2(code, err)
    assert TRACE_ENV in err
    store = write_store(tmp_path / "t.db", [trace("run-t", requests=1, steps=2)])
    monkeypatch.setenv(DB_ENV, store)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert not at.exception and any(TRACE_ENV in e.value for e in at.error)


def test_demo_into_a_directory_fails_before_the_engine(tmp_path: Path) -> None:
    """Fails at once, without importing torch or loading a model (it ran the whole engine first)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "specscope", "demo", "--db",
                           str(tmp_path), "--no-dashboard"], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and lines == [f"specscope demo: error: {tmp_path} is a directory, not a "
                                              "specscope store"]
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def test_non_utf8_sql_from_argv(db: str) -> None:
    proc = subprocess.run([os.fsencode(sys.executable), b"-m", b"specscope", b"query", b"--db", os.fsencode(db),
                           b"SELECT '\xff\xfe'"], capture_output=True, timeout=120)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"not UTF-8 text" in proc.stderr


@pytest.mark.parametrize("sql", ["COPY runs TO STDOUT", "SELECT 1; SELECT 2", "SELEC 1"])
def test_statements_that_are_not_one_query(sql: str, db: str) -> None:
    code, _, err = _cli(["query", "--db", db, sql])
    _one_line_exit_2(code, err)


def test_json_is_strict_and_table_is_escaped(db: str) -> None:
    nonfinite = ("SELECT CAST('NaN' AS float) AS a, CAST('Infinity' AS float) AS b" if db.startswith("postgresql")
                 else "SELECT 1e999 AS a, -1e999 AS b")
    code, out, _ = _cli(["query", "--db", db, "--json", nonfinite])
    assert code == 0 and json.loads(out, parse_constant=lambda name: pytest.fail(name)) == [{"a": None, "b": None}]
    code, out, _ = _cli(["query", "--db", db, "SELECT run_id FROM runs"])
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "run-\\x1b[2J\\x1b]0;pwned\\x07" in out


def test_doctor_and_compare_escape_stored_run_ids(db: str) -> None:
    """A run id's escape sequences reached the terminal through doctor's and compare's run lines
    (found by an attack trial); each report line is escaped as query's table is."""
    run = "run-\x1b[2J\x1b]0;pwned\x07"
    served = [event for run_id in (run, "run-plain") for q in ("q0", "q1") for event in (
        ev.RequestStart(run_id=run_id, request_id=q, rank=0, prompt_tokens=3, ts_wall=2.0),
        *(ev.VerifyStep(run_id=run_id, request_id=q, rank=0, step=n, proposed=4, accepted=2, ts_wall=2.0)
          for n in range(4)),
        ev.RequestEnd(run_id=run_id, request_id=q, rank=0, output_tokens=12, verify_steps=4, ts_wall=3.0))]
    with open_store(db) as store:
        store.write([ev.RunStart(run_id="run-plain", engine="e", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=2.0), *served])
    doctor = _cli(["doctor", "--db", db])
    compare = _cli(["compare", "--base-db", db, "--db", db, "--base-run", "run-plain", "--run", run])
    for code, out, err in (doctor, compare):
        assert code in (0, 1, 3) and "Traceback" not in err, err
        assert not set(out) & {"\x1b", "\x07"} and "run-\\x1b[2J\\x1b]0;pwned\\x07" in out


def test_a_stored_newline_or_bidi_control_cannot_forge_a_report_line(store_url: str) -> None:
    """Each report line was escaped, not each stored value in it: a newline in a run id started a
    line of its own ("verdict: ..."), and a right-to-left override reordered the rest of the line
    (an attack trial)."""
    run = "run\nFORGED verdict: no change\u202eevil"
    served = [event for run_id in (run, "run-plain") for q in ("q0", "q1") for event in (
        ev.RequestStart(run_id=run_id, request_id=f"{q}\nFORGED", rank=0, prompt_tokens=3, ts_wall=2.0),
        *(ev.VerifyStep(run_id=run_id, request_id=f"{q}\nFORGED", rank=0, step=n, proposed=4, accepted=2,
                        ts_wall=2.0) for n in range(4)))]
    with open_store(store_url) as store:
        store.write([*(ev.RunStart(run_id=run_id, engine="e\nFORGED", engine_version="1", target_model="t",
                                   draft_model="d", config={}, fault="f\u2066", ts_wall=2.0)
                       for run_id in (run, "run-plain")), *served])
    doctor = _cli(["doctor", "--db", store_url])
    compare = _cli(["compare", "--base-db", store_url, "--db", store_url, "--base-run", "run-plain", "--run", "run\n"])
    for code, out, err in (doctor, compare):
        assert code in (0, 1, 3) and "Traceback" not in err, err
        assert "run\\x0aFORGED verdict: no change\\u202eevil" in out
        assert not any(line.startswith("FORGED") for line in out.splitlines()) and not set(out) & {"\u202e", "\u2066"}


def test_a_load_report_row_of_no_keys_is_one_line(store_url: str) -> None:
    """Written by another tool, a load report whose ``missing`` holds numbers failed the doctor with
    an AttributeError deep in a rule; now a one-line StoreError names the run and the column."""
    import sqlalchemy as sa

    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="run-k", engine="e", engine_version="1", target_model="t", draft_model="d",
                                 config={}, ts_wall=2.0),
                     ev.LoadReport(run_id="run-k", rank=0, module="draft", source="/m", strict=False, loaded=3,
                                   missing=("fc.weight",), ts_wall=2.0)])
    url = store_url if "://" in store_url else f"sqlite:///{store_url}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE load_reports SET missing = '[1, 2]'")
    engine.dispose()
    code, _, err = _cli(["doctor", "--db", store_url])
    _one_line_exit_2(code, err)
    assert "run run-k: load_reports.missing holds [1, 2], not a list of keys" in err


def test_to_json_of_a_report_with_nonfinite_evidence() -> None:
    from decimal import Decimal

    import numpy as np

    text = to_json({"ratio": float("nan"), "gap": np.float32("inf"), "big": Decimal(10) ** 400,
                    "ok": [1.5, Decimal("2.5")]})
    assert json.loads(text) == {"ratio": None, "gap": None, "big": "1.000000000000000000000000000E+400",
                                "ok": [1.5, 2.5]}


@pytest.mark.postgres
def test_sql_page_shows_huge_numerics(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SELECT 10::numeric ^ 100`` on the SQL page: a table, not a traceback."""
    with open_store(pg_url) as store:
        for events in [trace("run-n", requests=1, steps=2)]:
            store.write(events)
    monkeypatch.setenv(DB_ENV, pg_url)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    at.switch_page("screens/sql.py").run()
    at.text_area[0].set_value("SELECT 10::numeric ^ 100 AS huge, 'NaN'::numeric AS nan, 1.5::numeric AS x")
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [e.value for e in at.error]
    assert len(at.dataframe) == 1


LONG_NAME = "a" * 300  # past NAME_MAX (255): every system call on it fails with ENAMETOOLONG


# a byte that is not UTF-8 in argv arrives as a lone surrogate: the run lookup raised UnicodeEncodeError
@pytest.mark.parametrize("argv", [
    ["doctor", "--db", "{db}", "--run", "run\udcff"], ["replay", "--db", "{db}", "--run", "run\udcff"],
    ["compare", "--base-db", "{db}", "--db", "{db}", "--run", "run\udcff"],
    ["compare", "--base-db", "{db}", "--base-run", "run\udcff", "--db", "{db}"],
], ids=["doctor", "replay", "compare-run", "compare-base-run"])
def test_a_run_id_that_is_not_utf8(argv: list[str], db: str) -> None:
    code, _, err = _cli([a.format(db=db) for a in argv])
    _one_line_exit_2(code, err)
    assert "is not UTF-8 text (character 4)" in err


@pytest.mark.parametrize("argv", [
    ["query", "--db", "", "SELECT 1"], ["doctor", "--db", " "], ["compare", "--base-db", "", "--db", "x.db"],
    ["demo", "--db", ""],
], ids=["query", "doctor", "compare", "demo"])
def test_an_empty_store_location(argv: list[str]) -> None:
    """It named the current directory: "  is a directory, not a specscope store"."""
    code, _, err = _cli(argv)
    _one_line_exit_2(code, err)
    assert "the store location is empty" in err


@pytest.mark.parametrize("argv", [
    ["query", "--db", "~nosuchuser/x.db", "SELECT 1"], ["doctor", "--db", "~nosuchuser/x.db"],
    ["dashboard", "--db", "~nosuchuser/x.db"], ["doctor", "--db", "sqlite:///~nosuchuser/x.db"],
])
def test_home_of_an_unknown_user(argv: list[str]) -> None:
    code, _, err = _cli(argv)
    _one_line_exit_2(code, err)
    assert "no such user's home directory" in err


@pytest.mark.parametrize("command", [["query", "--db", "{path}", "SELECT 1"], ["doctor", "--db", "{path}"],
                                     ["dashboard", "--db", "{path}"], ["inspect", "{path}"]])
def test_a_file_name_too_long(command: list[str], tmp_path: Path) -> None:
    code, _, err = _cli([a.format(path=tmp_path / LONG_NAME) for a in command])
    _one_line_exit_2(code, err)
    assert "File name too long" in err


@pytest.mark.parametrize("command", [["dashboard", "--db", "{db}"], ["exporter", "--db", "{db}"],
                                     ["demo", "--db", "{db}"]])
@pytest.mark.parametrize("host", ["a..b", "-a", "a_b", "", "x" * 300])
def test_host_that_is_no_address(command: list[str], host: str, tmp_path: Path) -> None:
    """Refused by argparse: nothing opened, created or served (``a..b`` raised UnicodeError from
    the idna codec when bound)."""
    code, _, err = _cli([a.format(db=tmp_path / "s.db") for a in command] + [f"--host={host}"])
    _one_line_exit_2(code, err)
    assert "is not an IP address or host name" in err and not (tmp_path / "s.db").exists()


def test_dashboard_on_a_taken_port_names_the_option(tmp_path: Path) -> None:
    """Checked before the store is created and before Streamlit starts (which then failed on its own)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        code, _, err = _cli(["dashboard", "--db", str(tmp_path / "s.db"), "--port", str(taken.getsockname()[1])])
    _one_line_exit_2(code, err)
    assert "is taken" in err and "--port" in err and not (tmp_path / "s.db").exists()
