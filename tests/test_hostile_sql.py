"""Hostile SQL through every SQL surface: Store.query, `specscope query`, the dashboard's SQL page.

Each statement of the list is denied (ReadOnlyViolation / StoreError, exit 2 with one line) or bounded
(time limit, row and byte caps), on SQLite and PostgreSQL; nothing in the store changes and no file is
created beside it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
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
    "PRAGMA Writable_Schema = ON": "PRAGMA Writable_Schema",
    "SELECT sql FROM sqlite_stmt": "reading sqlite_stmt",
    "WITH RECURSIVE c(x) AS (SELECT 1) SELECT sql FROM c, SQLITE_STMT": "reading sqlite_stmt",
    "UPDATE sqlite_master SET sql = 'x'": "table sqlite_master may not be modified",
    "WITH c AS (SELECT 1) UPDATE sqlite_schema SET name = 'x' WHERE name = 'runs'": "may not be modified",
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
    "SELECT 1; DELETE FROM runs", "COMMIT; DELETE FROM runs", "EXPLAIN SELECT 1",
    # the plan prints the folded constant: a 200 MB line past the result cap
    "EXPLAIN VERBOSE SELECT repeat('x', 200000000)",
    "EXPLAIN (FORMAT JSON) WITH c(x) AS (VALUES ('x')) SELECT * FROM runs, c WHERE engine = repeat(x, 200000000)",
    "SELECT set_config('default_transaction_read_only', 'off', false); DELETE FROM runs",
]


def _seed(url: str) -> str:
    """A store at ``url`` holding one run, ``run-a``."""
    with open_store(url) as store:
        store.write([ev.RunStart(run_id="run-a", engine="reference", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=1.0)])
    return url


@pytest.fixture
def db(store_url: str) -> str:
    return _seed(store_url)


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


def test_sqlite_reads_through_table_valued_functions_and_pragmas_as_sqlite_spells_them(tmp_path: Path) -> None:
    url = _seed(str(tmp_path / "store.db"))
    with open_store(url, read_only=True) as store:  # each a first use on its connection
        assert store.query("SELECT name FROM pragma_table_info('runs') WHERE name = 'run_id'")[1] == [("run_id",)]
        assert store.query("SELECT COUNT(*) FROM json_each('[1, 2, 3]')")[1] == [(3,)]
        assert store.query("SELECT r.run_id, j.value FROM runs r, json_each('[7]') j")[1] == [("run-a", 7)]
        assert ("run_id",) in [(row[1],) for row in store.query("PRAGMA Table_Info(runs)")[1]]
    assert _snapshot(url) == [("run-a", "reference")]


def test_sqlite_a_crafted_table_named_like_a_temp_schema_table_is_refused_by_the_authorizer(tmp_path: Path) -> None:
    """The pass a table-valued function's first use needs (an UPDATE of main's schema table) is not
    given to a table of a crafted file that SQLite loads under a temp schema table's name."""
    import sqlite3

    url = _seed(str(tmp_path / "store.db"))
    with sqlite3.connect(url) as conn:
        conn.execute("CREATE TABLE yy(a)")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET name = 'sqlite_temp_master', tbl_name = 'sqlite_temp_master', "
                     "sql = 'CREATE TABLE sqlite_temp_master(a)' WHERE name = 'yy'")
    conn.close()
    before = (tmp_path / "store.db").read_bytes()
    with open_store(url, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation, match="UPDATE on sqlite_temp_master is not allowed"):
            store.query("UPDATE main.sqlite_temp_master SET a = 3")
        assert store.query("SELECT COUNT(*) FROM json_each('[1]')")[1] == [(1,)]
    assert (tmp_path / "store.db").read_bytes() == before


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


def test_a_count_sqlite_runs_in_one_step_stops_at_the_time_limit(tmp_path) -> None:
    """``count(*)`` of a whole table is one step of SQLite's program (it counts the table's pages in C):
    a progress handler is never called during it, the interrupt of the time limit is."""
    db = _seed(str(tmp_path / "store.db"))
    with sqlite3.connect(db) as conn:  # 60 MB: counted in tens of milliseconds, a limit of 1 µs is long past
        conn.execute("CREATE TABLE big (payload BLOB)")
        conn.execute("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 600000) "
                     "INSERT INTO big SELECT zeroblob(100) FROM r")
    with open_store(db, read_only=True) as store:
        with pytest.raises(StoreError, match=r"stopped after the time limit of 1e-06 s"):
            store.query("SELECT count(*) FROM big", timeout_s=1e-6)
        assert store.query("SELECT count(*) FROM big", timeout_s=60).rows == [(600_000,)]


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


# -- round two (issue 23): refused before running, whatever the role; once; bounded per value ------

# statement -> what the refusal names; each would run a program, touch or read a server file, hold a
# lock or a large object, read the roles' secrets or other sessions, or escape the transaction, if it
# ran at all (the test server's connection is a superuser's: every one of them would run)
POSTGRES_REFUSED_BEFORE_RUNNING = {
    "COPY (SELECT 1) TO PROGRAM 'touch {marker}'": "COPY",
    "COPY (SELECT 1) TO '{marker}'": "COPY",
    "COPY runs TO STDOUT": "COPY",
    "SELECT pg_read_file('/etc/hostname')": "pg_read_file() (server files",
    "SELECT * FROM pg_catalog.pg_ls_dir('.')": "pg_ls_dir() (server files",
    "SELECT lo_import('/etc/hostname')": "lo_import() (large objects)",
    "SELECT pg_advisory_lock(1)": "pg_advisory_lock() (advisory locks)",
    "SELECT pg_try_advisory_lock(1)": "pg_try_advisory_lock() (advisory locks)",
    "SELECT set_config('statement_timeout', '0', false)": "set_config() (sessions",
    "SELECT pg_terminate_backend(pg_backend_pid())": "pg_terminate_backend() (sessions",
    "SELECT query_to_xml('SELECT pg_advisory_lock(1)', true, true, '')": "query_to_xml() (SQL run from a string)",
    "SELECT * FROM pg_largeobject": "pg_largeobject (large objects)",
    "SELECT * FROM pg_hba_file_rules": "pg_hba_file_rules (server files)",
    "SELECT sourcefile, setting FROM pg_catalog.pg_file_settings": "pg_file_settings (server files)",
    "SELECT rolname, rolpassword FROM pg_authid": "pg_authid (roles' secrets)",
    'SELECT (SELECT count(*) FROM "pg_shadow")': "pg_shadow (roles' secrets)",
    "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid()": "pg_stat_activity (other sessions)",
    "TABLE pg_catalog.pg_statistic": "pg_statistic (other tables' values)",
    "WITH gone AS (DELETE FROM runs RETURNING *) SELECT * FROM gone": "DELETE inside a query",
    "SELECT * FROM runs FOR UPDATE": "row locks",
    "SELECT * INTO copied FROM runs": "SELECT INTO",
    "LOCK TABLE runs": "LOCK",
    "DO $$ BEGIN PERFORM pg_advisory_lock(1); END $$": "DO",
    "LISTEN specscope": "LISTEN",
    "PREPARE p AS SELECT 1": "PREPARE",
}


@pytest.mark.postgres
@pytest.mark.parametrize("sql", list(POSTGRES_REFUSED_BEFORE_RUNNING))
def test_postgres_refuses_before_running(sql: str, pg_url: str, tmp_path: Path) -> None:
    """On the superuser connection of the test server: the statement is refused by its parse, so the
    program never ran and no file was written (the server could write to /tmp)."""
    marker = Path("/tmp") / f"specscope-refused-{tmp_path.name}"
    _seed(pg_url)
    with open_store(pg_url, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation) as info:
            store.query(sql.format(marker=marker))
    message = str(info.value)
    assert "\n" not in message and POSTGRES_REFUSED_BEFORE_RUNNING[sql] in message and "not allowed" in message
    assert not marker.exists()
    assert _snapshot(pg_url) == [("run-a", "reference")]


def _advisory_locks(engine, key: int) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {key}").scalar()


@pytest.mark.postgres
def test_postgres_reader_lock_never_outlives_its_query(pg_url: str) -> None:
    """A role's own function is refused before it runs; a lock the reader's statement could still
    take (here through a view of the role's own, whose body the parse cannot see) dies with the
    reader's connection: a writer opening the store afterwards is not held up, and no advisory lock
    remains."""
    import sqlalchemy as sa

    from specscope.storage._dialect import PG_MIGRATION_LOCK as _PG_MIGRATION_LOCK

    with open_store(pg_url):
        pass
    admin = sa.create_engine(pg_url)
    with admin.begin() as conn:  # what a role with CREATE on its schema could have left there
        conn.exec_driver_sql("CREATE FUNCTION grab(key bigint) RETURNS void LANGUAGE sql AS "
                             "'SELECT pg_advisory_lock(key)'")
        conn.exec_driver_sql(f"CREATE VIEW grabbing AS SELECT grab({_PG_MIGRATION_LOCK})::text AS held")
    try:
        with open_store(pg_url, read_only=True) as reader:
            with pytest.raises(ReadOnlyViolation, match=r"function grab\(\) \(not a read-only built-in"):
                reader.query(f"SELECT grab({_PG_MIGRATION_LOCK})")
            assert len(reader.query("SELECT * FROM grabbing").rows) == 1
            # The reader's connection is closed after the query; its server process exits a moment
            # later, and a store opened in another test (another pytest worker) holds the lock briefly.
            deadline = time.monotonic() + 5
            while (held := _advisory_locks(admin, _PG_MIGRATION_LOCK)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert held == 0
            with open_store(pg_url, lock_timeout_s=5) as writer:  # takes the migration lock
                writer.write([ev.RunStart(run_id="run-b", engine="e", engine_version="1", target_model="t",
                                          draft_model="d", config={}, ts_wall=1.0)])
    finally:
        admin.dispose()


@pytest.mark.postgres
def test_migration_lock_wait_is_bounded(pg_url: str) -> None:
    """Any session holding the store's migration lock (a tool of the reader's own) makes a writer's
    open fail after lock_timeout_s with one line naming the lock, instead of waiting forever."""
    import sqlalchemy as sa

    from specscope.storage._dialect import PG_MIGRATION_LOCK as _PG_MIGRATION_LOCK

    open_store(pg_url).close()
    holder = sa.create_engine(pg_url)
    with holder.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_MIGRATION_LOCK})")
        with pytest.raises(StoreError, match="migration lock") as info:
            open_store(pg_url, lock_timeout_s=0.5)
        assert "\n" not in str(info.value)
    holder.dispose()
    open_store(pg_url, lock_timeout_s=5).close()  # the lock is gone with its session


@pytest.mark.postgres
def test_postgres_statement_runs_once(pg_url: str) -> None:
    """A SELECT with no rows runs once (it ran twice to learn its columns): the reader's sequential
    scans of runs, counted by the server's statistics once the reader's session has ended, grow by
    exactly one, and the columns are there without a row."""
    import sqlalchemy as sa

    name = "specscope-once"
    url = str(sa.make_url(pg_url).update_query_dict({"application_name": name}))
    open_store(pg_url).close()
    admin = sa.create_engine(pg_url)

    def scans() -> int:
        with admin.connect() as conn:
            for _ in range(2_400):  # its stats arrive when its backend exits (the store is closed)
                # a transaction reads pg_stat_activity once and keeps it: without clearing, a backend
                # still exiting at the first look stays there for every later look
                conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                if not conn.exec_driver_sql("SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                            f"= '{name}'").scalar():
                    break
                conn.exec_driver_sql("SELECT pg_sleep(0.05)")
            else:
                pytest.fail(f"a backend named {name} is still there after 120 s")
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            return conn.exec_driver_sql("SELECT coalesce(seq_scan, 0) FROM pg_stat_user_tables WHERE "
                                        "relname = 'runs' AND schemaname = current_schema()").scalar()

    try:
        before = scans()
        with open_store(url, read_only=True) as reader:
            result = reader.query("SELECT run_id, engine FROM runs WHERE started_wall < 0")
        assert result.columns == ["run_id", "engine"] and result.rows == []
        assert scans() == before + 1
    finally:
        admin.dispose()


def _outcome_with_peak(url: str, sql: str, **options) -> tuple[str, int]:
    """(the StoreError's message, or ``returned``; MiB the statement added to the peak RSS) of
    ``Store.query(sql)`` in a fresh subprocess, after one small query warmed it up."""
    script = (
        "import re, sys\n"
        "def peak():  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "from specscope.storage import open_store\n"
        "from specscope.errors import StoreError\n"
        "with open_store(sys.argv[1], read_only=True) as store:\n"
        "    store.query('SELECT 1')\n"
        "    before = peak()\n"
        "    try:\n"
        f"        store.query(sys.argv[2], timeout_s=60, **{options!r})\n"
        "        print('returned')\n"
        "    except StoreError as exc:\n"
        "        print(exc)\n"
        "    print((peak() - before) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, url, sql], capture_output=True, text=True, timeout=120)
    message, added = proc.stdout.strip().splitlines()
    return message, int(added)


def test_value_over_the_byte_cap_stops_while_computed(tmp_path: Path) -> None:
    """Three 200 MB zeroblobs under a 64 MiB cap: refused as the first is built (it peaked at 1.2 GB
    before); the query adds less than one of them to the subprocess's peak RSS."""
    url = str(tmp_path / "store.db")
    open_store(url).close()
    message, added_mib = _outcome_with_peak(url, "SELECT zeroblob(200000000), zeroblob(200000000), "
                                                 "zeroblob(200000000)")
    assert "larger than the per-value limit of 4,194,304 bytes" in message
    assert added_mib < 190


def test_nested_replace_is_bounded_per_row(tmp_path: Path) -> None:
    """Nested replace() on a large string ran 7.4 s under a 1 s limit (SQLite looks at its interrupt
    between rows, never between the calls computing one row). Each call's value is now
    bounded while it is computed (4 MiB), and so is the count of calls in a statement."""
    url = str(tmp_path / "store.db")
    open_store(url).close()
    nested = "hex(zeroblob(30000000))"  # 60 MB of text, under the 64 MiB result cap
    for _ in range(25):
        nested = f"replace({nested}, '0', '1')"
    many = " + ".join(["abs(1)"] * 300)
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreError, match="larger than the per-value limit of 4,194,304 bytes"):
            store.query(f"SELECT length({nested})", timeout_s=1)
        with pytest.raises(ReadOnlyViolation, match="more than 256 functions"):
            store.query(f"SELECT {many}")
        assert store.query(f"SELECT {' + '.join(['abs(1)'] * 200)}").rows == [(200,)]
        assert store.query("SELECT 1").rows == [(1,)]


@pytest.mark.parametrize("timeout_s", [1e306, float("inf"), float("nan"), 0, -1])
def test_time_limit_out_of_range_is_refused(db: str, timeout_s: float) -> None:
    with open_store(db, read_only=True) as store:
        with pytest.raises(StoreError, match="time limit must be > 0 and at most 86400"):
            store.query("SELECT 1", timeout_s=timeout_s)


def test_non_utf8_sql_is_one_line(db: str) -> None:
    with open_store(db, read_only=True) as store:
        with pytest.raises(StoreError, match="not UTF-8 text"):
            store.query(b"SELECT '\xff'".decode("utf-8", "surrogateescape"))


@pytest.mark.postgres
def test_postgres_row_over_the_byte_cap_never_reaches_the_client(pg_url: str) -> None:
    """Two 40 MB values in one row under the SQL page's 16 MiB cap: the server stops the statement
    at that row (the whole row used to arrive before the cap applied)."""
    open_store(pg_url).close()
    message, added_mib = _outcome_with_peak(pg_url, "SELECT repeat('x', 40000000) AS a, "
                                                    "repeat('y', 40000000) AS b", max_bytes=16 * 2**20)
    assert "larger than the result cap of 16,777,216 bytes" in message
    assert added_mib < 40


@pytest.mark.postgres
def test_postgres_array_takes_about_its_text_in_the_client(pg_url: str) -> None:
    """A ``numeric[]`` of 4M elements, 8 MB of text under the 64 MiB cap: it comes back as PostgreSQL
    writes it, taking about its text's size (read as Decimals it added 579 MB to the client, 56 times
    its text, so a value under the cap could exhaust memory: found by an attack trial)."""
    open_store(pg_url).close()
    outcome, added_mib = _outcome_with_peak(pg_url, "SELECT array_fill(0::numeric, ARRAY[4000000]) AS a")
    assert outcome == "returned"
    assert added_mib < 100


@pytest.mark.postgres
@pytest.mark.parametrize("sql, rows", [
    ("SELECT x FROM generate_series(1, 4) x ORDER BY x DESC", [(4,), (3,), (2,), (1,)]),
    ("SELECT 1 AS q, 2 AS q -- a trailing comment", [(1, 2)]),
    ("SELECT 'é€' AS x; -- after the semicolon", [("é€",)]),
    ("WITH t AS (SELECT 1 AS a) SELECT * FROM t", [(1,)]),
    ("VALUES (1, 'a'), (2, 'b')", [(1, "a"), (2, "b")]),
    ("SELECT '50%' AS p", [("50%",)]),
])
def test_postgres_queries_keep_their_rows_under_the_cap(sql: str, rows: list, pg_url: str) -> None:
    """The cap's wrapping keeps order, duplicate column names, comments, CTEs and VALUES."""
    open_store(pg_url).close()
    with open_store(pg_url, read_only=True) as store:
        assert store.query(sql).rows == rows
