"""Hostile SQL through every SQL surface: Store.query, `specscope query`, the dashboard's SQL page.

Each statement of the list is denied (ReadOnlyViolation / StoreError, exit 2 with one line) or bounded
(time limit, row and byte caps), on SQLite and PostgreSQL; nothing in the store changes and no file is
created beside it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specscope import events as ev
from specscope.cli import main
from specscope.errors import ReadOnlyViolation, StoreError
from specscope.storage import open_store

RECURSIVE_FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"
# statement -> (dialects where the database itself must refuse it as a write / escape)
SQLITE_DENIED = {
    "ATTACH DATABASE '{dir}/attached.db' AS x": "ATTACH",
    "VACUUM INTO '{dir}/copy.db'": "VACUUM",
    "CREATE TEMP TABLE t(a)": "",
    "CREATE TABLE t(a)": "changing the schema (CREATE / DROP)",
    "CREATE TEMP VIEW v AS SELECT 1": "",
    "PRAGMA user_version = 7": "PRAGMA user_version",
    "PRAGMA journal_mode = DELETE": "PRAGMA journal_mode",
    "PRAGMA query_only = OFF": "PRAGMA query_only",
    "SELECT load_extension('/tmp/nothing')": "load_extension",
    "SELECT fts3_tokenizer('simple')": "fts3_tokenizer",
    "DELETE FROM runs": "DELETE on runs",
    "INSERT INTO runs (run_id) VALUES ('x')": "INSERT on runs",
    "DROP TABLE runs": "changing the schema (CREATE / DROP)",
    "COMMIT": "transaction",
    "BEGIN IMMEDIATE": "transaction",
    "SAVEPOINT s": "SAVEPOINT",
    "ANALYZE": "",
    "REINDEX": "",
}
POSTGRES_REFUSED = [
    "DELETE FROM runs", "INSERT INTO runs (run_id) VALUES ('x')", "DROP TABLE runs",
    "CREATE TEMP TABLE t(a int)", "CREATE TABLE t(a int)", "COMMIT", "SET statement_timeout = 0",
    "SELECT 1; DELETE FROM runs", "COMMIT; DELETE FROM runs", "SELECT set_config('default_transaction_read_only', 'off', false); DELETE FROM runs",
]


@pytest.fixture
def db(store_url: str) -> str:
    with open_store(store_url) as store:
        store.write([ev.RunStart(run_id="run-a", engine="reference", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=1.0)])
    return store_url


def _snapshot(url: str) -> list[tuple]:
    with open_store(url, read_only=True) as store:
        return store.query("SELECT run_id, engine FROM runs ORDER BY run_id")[1]


@pytest.mark.parametrize("sql", list(SQLITE_DENIED))
def test_sqlite_authorizer_denies(sql: str, tmp_path: Path) -> None:
    url = str(tmp_path / "store.db")
    with open_store(url) as store:
        store.write([ev.RunStart(run_id="run-a", engine="reference", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=1.0)])
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreError) as info:
            store.query(sql.format(dir=tmp_path))
    message = str(info.value)
    assert "\n" not in message and SQLITE_DENIED[sql] in message
    # no attached.db / copy.db created (SQLite's own -wal / -shm files aside)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))] == ["store.db"]
    assert _snapshot(url) == [("run-a", "reference")]


def test_sqlite_denial_names_the_action(tmp_path: Path) -> None:
    url = str(tmp_path / "store.db")
    open_store(url).close()
    with open_store(url, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation, match=r"ATTACH \(or VACUUM INTO\) is not allowed"):
            store.query(f"ATTACH DATABASE '{tmp_path}/x.db' AS x")
        # the pooled connection is clean again: the next statement runs, schema PRAGMAs work
        assert store.query("SELECT 1")[1] == [(1,)]
        assert ("run_id",) in [(row[1],) for row in store.query("PRAGMA table_info(runs)")[1]]


@pytest.mark.postgres
@pytest.mark.parametrize("sql", POSTGRES_REFUSED)
def test_postgres_refuses(sql: str, pg_url: str) -> None:
    with open_store(pg_url) as store:
        store.write([ev.RunStart(run_id="run-a", engine="reference", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=1.0)])
    with open_store(pg_url, read_only=True) as store:
        with pytest.raises(StoreError) as info:
            store.query(sql)
    assert "\n" not in str(info.value)
    assert _snapshot(pg_url) == [("run-a", "reference")]


def test_runaway_statement_stops_at_the_time_limit(db: str) -> None:
    with open_store(db, read_only=True) as store:
        with pytest.raises(StoreError, match=r"time limit of 0.3 s"):
            store.query(RECURSIVE_FOREVER, timeout_s=0.3)
        assert store.query("SELECT COUNT(*) FROM runs")[1] == [(1,)]  # connection reusable


def test_huge_results_are_capped_in_rows_and_bytes(db: str) -> None:
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x, 'abcdefgh' FROM c"
    with open_store(db, read_only=True) as store:
        rows = store.query(endless, limit=1000)
        assert len(rows[1]) == 1000 and rows.truncated == "1,000 rows"
        wide = store.query(endless, max_bytes=8_000)
        assert 0 < len(wide[1]) < 1000 and wide.truncated == "8,000 bytes"
        whole = store.query("SELECT run_id FROM runs", limit=5)
        assert whole.truncated is None and whole[1] == [("run-a",)]


def test_cli_one_line_exit_2_and_timeout_flag(db: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "attached.db"
    assert main(["query", "--db", db, f"ATTACH DATABASE '{target}' AS x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not allowed" in err or "syntax error" in err
    assert not target.exists()
    assert main(["query", "--db", db, "--timeout", "0.3", RECURSIVE_FOREVER]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "time limit of 0.3 s" in err
    assert main(["query", "--db", db, "--limit", "0", "SELECT run_id FROM runs"]) == 0
    assert "the result has more (cut at 0 rows" in capsys.readouterr().err


@pytest.mark.parametrize("sql", list(SQLITE_DENIED))
def test_cli_denies_each_hostile_statement(sql: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    url = str(tmp_path / "store.db")
    open_store(url).close()
    assert main(["query", "--db", url, sql.format(dir=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specscope query: error: ") and SQLITE_DENIED[sql] in err
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))] == ["store.db"]


def test_cli_rejects_bad_timeout(db: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "specscope", "query", "--db", db, "--timeout", "-1",
                           "SELECT 1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("specscope: error: argument --timeout")


@pytest.mark.browser
def test_sql_page_in_chromium_shows_the_denials(tmp_path: Path) -> None:
    """Hostile statements typed on the dashboard's SQL page in a real Chromium: each denial (or the
    time limit) is shown as one message, and ATTACH created no file."""
    browser_tests = pytest.importorskip("test_dashboard_browser")
    if not browser_tests.CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (make browser)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from _dashboard_traces import trace, write_store

    store = write_store(tmp_path / "store.db", [trace("run-sql", requests=2, steps=4)])
    attached = tmp_path / "attached.db"
    hostile = {f"ATTACH DATABASE '{attached}' AS x": "ATTACH (or VACUUM INTO) is not allowed",
               "PRAGMA query_only = OFF": "PRAGMA query_only is not allowed",
               "DELETE FROM runs": "DELETE on runs is not allowed",
               RECURSIVE_FOREVER: "stopped after the time limit of 2 s"}
    proc, url = browser_tests._start(store)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(browser_tests.CHROMIUM),
                                        args=browser_tests.CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"{url}/sql")
                box = page.get_by_label("One read-only SQL statement")
                box.wait_for(timeout=60_000)
                for sql, message in hostile.items():
                    box.fill(sql)
                    page.get_by_role("button", name="Run").click()
                    page.get_by_text(message).first.wait_for(timeout=60_000)
                    assert page.get_by_text("Traceback").count() == 0
                page.screenshot(path=str(tmp_path / "sql-denied.png"))
            finally:
                browser.close()
    finally:
        browser_tests._stop(proc)
    assert not attached.exists()
    assert _snapshot(store)[0][0] == "run-sql"
