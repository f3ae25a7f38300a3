"""Hostile SQL, round three: functions reached by attribute notation and from extensions (refused by
what runs), a statement deep enough to overflow the parser's stack, SQLite built-ins whose one call
outlived the time limit, result caps that counted arrays, JSON and non-ASCII text short, and wrongly
typed arguments to Store.query."""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from specscope import events as ev
from specscope.app import DB_ENV
from specscope.errors import ReadOnlyViolation, StoreError
from specscope.storage import open_store, schema, views
from specscope.storage.queries import EXAMPLES


def _seed(url: str) -> str:
    with open_store(url) as store:
        store.write([ev.RunStart(run_id="run-a", engine="reference", engine_version="1", target_model="t",
                                 draft_model="d", config={}, ts_wall=1.0),
                     ev.RankStart(run_id="run-a", rank=0, world_size=1, host="h", pid=1, device="cpu",
                                  ts_wall=1.0)])
    return url


def _snapshot(url: str) -> list[tuple]:
    with open_store(url, read_only=True) as store:
        return store.query("SELECT run_id, engine FROM runs ORDER BY run_id").rows


# statement -> what the refusal names; each one runs a function PostgreSQL reaches through attribute
# notation, a function outside pg_catalog, or a built-in that changes state
POSTGRES_FUNCTIONS_REFUSED = {
    "SELECT (1590018206::bigint).pg_advisory_xact_lock, pg_sleep(10)": "pg_advisory_xact_lock() (advisory locks)",
    "SELECT ('SELECT pg_advisory_lock(1)'::text).ts_stat": "ts_stat() (SQL run from a string)",
    "SELECT ('/etc/hostname'::text).pg_read_file": "pg_read_file() (server files and logs)",
    "SELECT (pid).pg_terminate_backend FROM (SELECT pg_backend_pid() AS pid) s": "pg_terminate_backend() (sessions",
    "SELECT a.pid.pg_cancel_backend FROM (SELECT pg_backend_pid() AS pid) a": "pg_cancel_backend() (sessions",
    "SELECT pg_stat_reset()": "pg_stat_reset() (statistics resets)",
    "SELECT (10).pg_sleep": "pg_sleep() (not a read-only built-in of pg_catalog)",
    "SELECT runs.pg_sleep FROM runs": "pg_sleep() (not a read-only built-in of pg_catalog)",
    "SELECT txid_current()": "txid_current() (not a read-only built-in",
    "SELECT nextval('runs_seq')": "nextval() (not a read-only built-in",
    "SELECT * FROM crosstab('SELECT 1') AS t(a int)": "crosstab() (SQL run from a string)",
    "SELECT public.lower('x')": "public.lower() (only built-ins of pg_catalog run)",
    "SELECT 1 OPERATOR(public.+) 1": "operator public.+ (only built-ins of pg_catalog run)",
}


@pytest.mark.postgres
@pytest.mark.parametrize("sql", list(POSTGRES_FUNCTIONS_REFUSED))
def test_postgres_functions_refused_by_what_runs(sql: str, pg_url: str) -> None:
    """On the test server's superuser connection; attribute notation ``(x).f`` used to run ``f(x)``."""
    _seed(pg_url)
    with open_store(pg_url, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation) as info:
            store.query(sql)
    message = str(info.value)
    assert "\n" not in message and POSTGRES_FUNCTIONS_REFUSED[sql] in message and "not allowed" in message
    assert _snapshot(pg_url) == [("run-a", "reference")]


@pytest.fixture
def extensions(pg_url: str):
    """dblink and tablefunc installed in the test's schema (the superuser can), dropped afterwards.
    An extension is the database's, not the schema's: a session lock keeps a test running beside
    this one (another pytest worker) from installing them at the same time."""
    admin = sa.create_engine(pg_url)
    with admin.connect() as held:
        held.exec_driver_sql("SELECT pg_advisory_lock(hashtext('specscope tests: extensions'))")
        try:
            with admin.begin() as conn:
                # left by a run killed before its teardown (in a schema nobody dropped then)
                conn.exec_driver_sql("DROP EXTENSION IF EXISTS dblink, tablefunc CASCADE")
                conn.exec_driver_sql("CREATE EXTENSION dblink SCHEMA " + conn.exec_driver_sql(
                    "SELECT current_schema()").scalar())
                conn.exec_driver_sql("CREATE EXTENSION tablefunc")
            try:
                yield pg_url
            finally:
                with admin.begin() as conn:
                    conn.exec_driver_sql("DROP EXTENSION dblink")
                    conn.exec_driver_sql("DROP EXTENSION tablefunc")
        finally:
            held.exec_driver_sql("SELECT pg_advisory_unlock(hashtext('specscope tests: extensions'))")
    admin.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("sql, named", [
    ("SELECT (('UPDATE runs SET engine = ''changed''')::text).dblink_exec", "dblink_exec() (sessions"),
    ("SELECT (('dbname=test', 'UPDATE runs SET engine = ''changed''')::record).dblink_exec",
     "dblink_exec() (sessions"),
    ("SELECT * FROM crosstab('SELECT run_id, engine, engine FROM runs') AS t(a text, b text)",
     "crosstab() (SQL run from a string)"),
    ("SELECT * FROM normal_rand(3, 0, 1)", "normal_rand() (not a read-only built-in of pg_catalog)"),
])
def test_postgres_extension_functions_refused(sql: str, named: str, extensions: str) -> None:
    """Extension functions never run, however they are called: nothing changed."""
    _seed(extensions)
    with open_store(extensions, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation, match="not allowed") as info:
            store.query(sql)
    assert named in str(info.value)
    assert _snapshot(extensions) == [("run-a", "reference")]


@pytest.mark.postgres
@pytest.mark.parametrize("sql, named", [
    ("SELECT 1 === 1", "operator === (one of that name is not a built-in of pg_catalog)"),
    ("SELECT x FROM generate_series(1, 2) x WHERE x === ANY (ARRAY[1])", "operator === (one of that"),
    ("SELECT 1 OPERATOR({schema}.===) ANY (SELECT 1)", "operator {schema}.=== (only built-ins"),
    ("SELECT x FROM generate_series(1, 2) x ORDER BY x USING OPERATOR({schema}.<)", "operator {schema}.< (only"),
])
def test_postgres_operators_of_a_roles_own_never_run(sql: str, named: str, pg_url: str) -> None:
    """An operator on the store's schema whose function takes an advisory lock (what a role with
    CREATE there can leave): refused before it runs, unqualified (it shadows nothing and resolves to
    it) or qualified in a subquery comparison or an ORDER BY (the parse checked ``a OP b`` only, an
    attack trial ran it through ``OPERATOR(s.===) ANY (subquery)``); no lock was taken."""
    _seed(pg_url)
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        schema_name = conn.exec_driver_sql("SELECT current_schema()").scalar()
        conn.exec_driver_sql("CREATE FUNCTION grab(a int, b int) RETURNS boolean LANGUAGE sql AS "
                             "'SELECT pg_advisory_xact_lock(4242) IS NOT NULL'")
        conn.exec_driver_sql("CREATE OPERATOR === (LEFTARG = int, RIGHTARG = int, FUNCTION = grab)")
        conn.exec_driver_sql("CREATE OPERATOR < (LEFTARG = int, RIGHTARG = int, FUNCTION = grab)")
    engine.dispose()
    with open_store(pg_url, read_only=True) as store:
        with pytest.raises(ReadOnlyViolation, match="not allowed") as info:
            store.query(sql.format(schema=schema_name), timeout_s=60)  # refused, never near a limit
    assert named.format(schema=schema_name) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.postgres
def test_postgres_columns_and_builtins_still_run(pg_url: str) -> None:
    """No false refusal: every column of every table and view read qualified (``t.col``, which
    PostgreSQL would resolve to a function were it not a column), the SQL page's examples, and the
    ordinary built-ins of an ad-hoc query."""
    _seed(pg_url)
    relations = {table.name: [c.name for c in table.columns] for table in schema.metadata.sorted_tables}
    with open_store(pg_url, read_only=True) as store:
        # about a hundred statements, each planned cold, on a CI machine that may be loaded (one ran
        # out of 2 s there): the default limit is for a person's query, not this sweep
        query = functools.partial(store.query, timeout_s=60)
        for name in views.VIEWS:
            relations[name] = query(f"SELECT * FROM {name} LIMIT 0").columns
        for name, columns in relations.items():
            listed = ", ".join(f"t.{column}" for column in columns)
            assert query(f"SELECT {listed} FROM {name} t LIMIT 1").columns == columns
        for example in EXAMPLES.values():
            query(example.format(run_id="run-a"))
        row = query(
            "SELECT count(*), avg(x), max(x) FILTER (WHERE x < 3), string_agg(x::text, ',' ORDER BY x), "
            "rank() OVER (ORDER BY x), date_trunc('hour', now()) <= now(), extract(epoch FROM now()) > 0, "
            "to_char(now(), 'YYYY') > '2000', coalesce(NULL, 1), greatest(1, 2), "
            "json_build_object('a', x) ->> 'a', jsonb_build_object('k', x) -> 'k', "
            "upper(substring('abc' FROM 2)), trim(both ' ' FROM ' y '), position('b' IN 'abc'), "
            "round(x / 3.0, 2), length(repeat('z', x)), (ARRAY[1, 2, 3])[x], current_database() <> '' "
            "FROM generate_series(1, 3) x GROUP BY x ORDER BY x LIMIT 1").rows
        assert query("SELECT (r).run_id, (r).engine FROM runs r").rows == [("run-a", "reference")]
    assert row[0][:4] == (1, 1, 1, "1")


def test_a_deep_expression_is_refused_and_the_process_lives(store_url: str) -> None:
    """30,000 terms (60 KB) killed ``specscope query`` on PostgreSQL with SIGSEGV (exit 139) inside
    the parser."""
    open_store(store_url).close()
    proc = subprocess.run([sys.executable, "-m", "specscope", "query", "--db", store_url,
                           "SELECT " + "+".join(["1"] * 30_000)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("specscope query: error: ")


@pytest.mark.postgres
def test_postgres_long_flat_statements_still_run(pg_url: str) -> None:
    """The bound counts what deepens the parse: 4,000 OR-ed comparisons and an IN list of 20,000
    values run."""
    _seed(pg_url)
    ors = " OR ".join(f"run_id = 'run-{i}'" for i in range(4_000))
    values = ", ".join(f"'run-{i}'" for i in range(20_000))
    with open_store(pg_url, read_only=True) as store:
        assert store.query(f"SELECT run_id FROM runs WHERE {ors}").rows == []
        assert store.query(f"SELECT run_id FROM runs WHERE run_id IN ({values}, 'run-a')").rows == [("run-a",)]


def test_a_statement_over_the_length_bound_is_refused(store_url: str) -> None:
    open_store(store_url).close()
    with open_store(store_url, read_only=True) as store:
        with pytest.raises(StoreError, match="1,200,009 characters long, over the 1,000,000"):
            store.query(f"SELECT '{'x' * 1_200_000}'")


def _sqlite_store(tmp_path: Path) -> str:
    url = str(tmp_path / "store.db")
    open_store(url).close()
    return url


NEAR = "replace(hex(zeroblob(150000)), '0', 'a')"  # 300,000 characters
HAYSTACK = "replace(hex(zeroblob(2000000)), '0', 'a')"  # 4,000,000: the needle never matches
SQLITE_OVER_BUDGET = {
    f"SELECT instr({HAYSTACK}, {NEAR} || 'b')": "instr() of a 4,000,000-character value and a 300,001",
    f"SELECT length(replace({HAYSTACK}, {NEAR} || 'b', 'x'))": "replace() of a 4,000,000-character",
    "SELECT length(ltrim(replace(hex(zeroblob(50000)), '0', 'a'), replace(hex(zeroblob(50000)), '0', 'b') "
    "|| 'a'))": "ltrim() of a 100,000-character value",
    f"SELECT length(trim({HAYSTACK}, replace(hex(zeroblob(2000)), '0', 'b') || 'a'))": "trim() of a",
    "WITH RECURSIVE s(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM s WHERE v < 30000), "
    "k(j) AS (SELECT json_group_object('k' || v, 1) FROM s) SELECT length(json_patch(j, j)) FROM k":
        "json_patch() of a",
    f"SELECT {HAYSTACK} LIKE '%' || replace(hex(zeroblob(10000)), '0', 'a') || 'b'":
        "like() of a 4,000,000-character value and a 20,002-character one",
    f"SELECT {HAYSTACK} GLOB '*' || replace(hex(zeroblob(10000)), '0', 'a') || 'b'": "glob() of a 4,000,000",
    f"SELECT {HAYSTACK} LIKE '%' || replace(hex(zeroblob(10000)), '0', 'a') || 'b' ESCAPE '!'": "like() of a",
    "SELECT length(printf('%.*c', 2000000000, 'x'))": "printf() with a width or precision of 2,000,000,000",
    "SELECT length(format('%2000000000c', 'x'))": "format() with a width or precision of 2,000,000,000",
    "SELECT length(printf('%.*c', ' 2000000000 x', 'x'))": "printf() with a width or precision of 2,000,000,000",
}


@pytest.mark.parametrize("sql", list(SQLITE_OVER_BUDGET))
def test_sqlite_calls_over_their_budget_are_refused(sql: str, tmp_path: Path) -> None:
    """Each ran 1.6 to 47 s in one call under ``--timeout 1`` (SQLite never interrupts a call)."""
    url = _sqlite_store(tmp_path)
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreError) as info:
            store.query(sql, timeout_s=1)
        assert store.query("SELECT instr('abc', 'c')").rows == [(3,)]  # the connection is reusable
    message = str(info.value)
    assert "\n" not in message and SQLITE_OVER_BUDGET[sql] in message and "refused" in message


BOUNDED_CALLS = [
    "instr('abcabc', 'ca')", "instr(X'010203', X'03')", "instr('a' || X'62', 'b')", "instr(12345, 34)",
    "instr(1.5, '.')", "instr('abc', '')", "instr(NULL, 'a')", "replace('aXbX', 'X', 'yy')",
    "replace('abc', '', 'z')", "replace(1.25, '.', ',')", "replace('a', 'a', NULL)", "trim('xxaxx', 'x')",
    "ltrim('  a  ', ' ')", "rtrim(12300, 0)", "trim('éaé', 'é')", "json_patch('{\"a\":1}', '{\"b\":[2]}')",
    "printf('%5.2f|%d|%s|%%', 3.14159, 42, 'x')", "printf('%.*c', 3, 'x')", "printf('%*d', '5', 7)",
    "format('%-4s|', 'ab')", "printf(NULL)", "printf('%s')", "printf('%q', 'it''s')", "printf()",
    "'abc' LIKE 'A%'", "'aXc' LIKE 'a_c'", "'a_c' LIKE 'a!_c' ESCAPE '!'", "'é' LIKE 'É'", "X'61' LIKE 'a'",
    "NULL LIKE 'a'", "12 LIKE '1%'", "'abc' GLOB 'a*'", "'abc' GLOB 'A*'", "'abc' GLOB '[a-c]?c'",
    f"{HAYSTACK} LIKE '%cuda%'",
]


@pytest.mark.parametrize("call", BOUNDED_CALLS)
def test_sqlite_bounded_builtins_give_sqlites_own_results(call: str, tmp_path: Path) -> None:
    url = _sqlite_store(tmp_path)
    native = sqlite3.connect(":memory:").execute(f"SELECT {call}, typeof({call})").fetchone()
    with open_store(url, read_only=True) as store:
        assert store.query(f"SELECT {call}, typeof({call})").rows == [native]


def test_sqlite_bounded_builtins_keep_their_errors_and_limits(tmp_path: Path) -> None:
    url = _sqlite_store(tmp_path)
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreError, match="malformed JSON"):
            store.query("SELECT json_patch('not json', '{}')")
        with pytest.raises(StoreError, match="larger than the per-value limit of 4,194,304 bytes"):
            store.query("SELECT replace(hex(zeroblob(1500000)), '0', 'aa')")
        assert store.query("SELECT printf('ab%.*c', 4194304, 'x') IS NULL").rows == [(1,)]


def test_sqlite_byte_cap_counts_utf8_bytes(tmp_path: Path) -> None:
    """Each row: 64 for the row, 8 per value, an integer (8) and 100 two-byte characters (200 bytes):
    3 fit in 1,000 bytes (9 did, counted as characters)."""
    url = _sqlite_store(tmp_path)
    endless = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
               "SELECT x, replace(hex(zeroblob(50)), '0', 'é') FROM c")
    with open_store(url, read_only=True) as store:
        result = store.query(endless, max_bytes=1_000)
    assert len(result.rows) == 3 and result.truncated == "1,000 bytes"


@pytest.mark.parametrize("columns", ["NULL", ", ".join(["''"] * 50)])
def test_byte_cap_bounds_many_tiny_rows(columns: str, tmp_path: Path) -> None:
    """Rows of NULLs or empty strings count their rows and values: 8,388,608 rows of one NULL came
    back under the 64 MiB cap (1.5 GB in this process, found by an attack trial)."""
    url = _sqlite_store(tmp_path)
    endless = f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT {columns} FROM c"
    per_row = 64 + 8 * (1 if columns == "NULL" else 50) + (8 if columns == "NULL" else 0)
    with open_store(url, read_only=True) as store:
        result = store.query(endless, max_bytes=1_000_000, timeout_s=60)
    assert result.truncated == "1,000,000 bytes" and len(result.rows) == 1_000_000 // per_row


@pytest.mark.postgres
@pytest.mark.parametrize("value", ["array_fill(1, ARRAY[200000])",
                                   "(SELECT jsonb_agg(i) FROM generate_series(1, 200000) i)"])
def test_postgres_byte_cap_counts_arrays_and_json(value: str, pg_url: str) -> None:
    """200 rows of a 200,000-element array or JSON list each, under a 16 MiB cap: each row counted
    as 8 bytes, all 200 came back (180 MB under a 64 MiB cap in the attack); now each comes as
    PostgreSQL's text of it, counted whole, and the cap cuts them."""
    open_store(pg_url).close()
    with open_store(pg_url, read_only=True) as store:
        result = store.query(f"SELECT {value} FROM generate_series(1, 200)", max_bytes=16 * 2**20,
                             timeout_s=60)
    assert result.truncated == "16,777,216 bytes" and 0 < len(result.rows) < 200
    assert sum(len(value) for (value,) in result.rows) <= 16 * 2**20
    assert result.rows[0][0].startswith(("{1,1,", "[1, 2,"))


@pytest.mark.parametrize("arguments", [
    {"sql": 123}, {"sql": b"SELECT 1"}, {"sql": "SELECT 1", "params": [1]},
    {"sql": "SELECT 1", "limit": "5"}, {"sql": "SELECT 1", "limit": 1.5},
    {"sql": "SELECT 1", "timeout_s": "1"}, {"sql": "SELECT 1", "max_bytes": "x"},
    {"sql": "SELECT 1", "max_bytes": -1}, {"sql": "SELECT 1", "limit": True},
])
def test_wrongly_typed_arguments_are_one_store_error(arguments: dict, store_url: str) -> None:
    open_store(store_url).close()
    with open_store(store_url, read_only=True) as store:
        with pytest.raises(StoreError) as info:
            store.query(**arguments)
    assert "\n" not in str(info.value)


SQL_PAGE = """
import sys
from streamlit.testing.v1 import AppTest
from specscope.app import ENTRY
at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
at.switch_page("screens/sql.py").run()
at.text_area[0].set_value(sys.argv[1])
at.button[0].click().run()
print([e.value for e in at.error], len(at.exception))
"""


@pytest.mark.postgres
def test_sql_page_refuses_a_deep_expression(pg_url: str) -> None:
    """The same statement on the dashboard's SQL page took the whole Streamlit server down; the page
    (run under AppTest in a child process, which the crash would kill) now shows one refusal."""
    _seed(pg_url)
    proc = subprocess.run([sys.executable, "-c", SQL_PAGE, "SELECT " + "+".join(["1"] * 30_000)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, DB_ENV: pg_url})
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "operators and keywords, more than the 5,000" in proc.stdout and proc.stdout.rstrip().endswith(" 0")


def test_a_refused_sqlite_read_leaves_the_folder_as_it_was(tmp_path: Path, capsys) -> None:
    """A refused statement on a clean store file, through the API and ``specscope query``: no
    ``-wal`` / ``-shm`` left beside it (SQLite created both for the read-only connection and kept
    them), and the file's bytes unchanged; a store still open elsewhere keeps its files."""
    from specscope.cli import main

    url = _sqlite_store(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    content = Path(url).read_bytes()
    with open_store(url, read_only=True) as store, pytest.raises(ReadOnlyViolation):
        store.query("DELETE FROM runs")
    assert main(["query", "--db", url, "DROP TABLE runs"]) == 2
    assert "not allowed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and Path(url).read_bytes() == content
    with open_store(url) as writer:  # a writer still open: its files stay
        with open_store(url, read_only=True) as store, pytest.raises(ReadOnlyViolation):
            store.query("DELETE FROM runs")
        assert {f"{Path(url).name}-wal", f"{Path(url).name}-shm"} <= {p.name for p in tmp_path.iterdir()}
        assert writer.query("SELECT COUNT(*) FROM runs").rows == [(0,)]
