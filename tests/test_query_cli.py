"""`specscope query`: table / JSON / CSV output of known rows, refused writes, missing stores."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from specscope import events as ev
from specscope.cli import main
from specscope.storage import open_store

SQL = "SELECT run_id, engine, fault, world_size FROM runs ORDER BY run_id"


def _run(run_id: str, engine: str, fault: str | None, world_size: int) -> ev.RunStart:
    return ev.RunStart(run_id=run_id, engine=engine, engine_version="1", target_model="t",
                       draft_model="d", config={}, fault=fault, world_size=world_size, ts_wall=1.0)


@pytest.fixture
def db(store_url: str) -> str:
    """A store with two known runs and four verify steps (AL 2.75)."""
    with open_store(store_url) as store:
        store.write([_run("run-a", "reference", None, 1), _run("run-b", "vllm", "aux_off", 8),
                     *(ev.VerifyStep(run_id="run-a", request_id="q", rank=0, step=i, proposed=4,
                                     accepted=a) for i, a in enumerate([0, 1, 4, 2]))])
    return store_url


def test_table_output(db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, SQL]) == 0
    assert capsys.readouterr().out == (
        "run_id  engine     fault    world_size\n"
        "------  ---------  -------  ----------\n"
        "run-a   reference  NULL              1\n"
        "run-b   vllm       aux_off           8\n"
        "(2 rows)\n")


def test_json_output(db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, "--json", SQL]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"run_id": "run-a", "engine": "reference", "fault": None, "world_size": 1},
        {"run_id": "run-b", "engine": "vllm", "fault": "aux_off", "world_size": 8}]
    assert main(["query", "--db", db, "--json",
                 "SELECT mean_acceptance_length, acceptance_rate FROM v_run_acceptance"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"mean_acceptance_length": 2.75, "acceptance_rate": 0.4375}]


def test_json_keeps_columns_of_one_name(db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, "--json", "SELECT 1 AS a, 2 AS a, 3 AS a_2"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"a": 1, "a_2": 2, "a_2_2": 3}]


def test_csv_output_and_limit(db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, "--csv", "--limit", "1", SQL]) == 0
    out, err = capsys.readouterr()
    assert list(csv.reader(io.StringIO(out))) == [
        ["run_id", "engine", "fault", "world_size"], ["run-a", "reference", "", "1"]]
    assert "showing the first 1 row(s); the result has more" in err  # said where the rows are not
    assert main(["query", "--db", db, "--csv", "--limit", "100", SQL]) == 0
    assert capsys.readouterr().err == ""  # nothing cut, nothing said


def test_a_binary_value_reads_the_same_in_table_csv_and_json(db: str, capsys: pytest.CaptureFixture) -> None:
    """A SQLite BLOB or PostgreSQL bytea: PostgreSQL's hex text in every form, never Python's repr."""
    sql = (r"SELECT '\x00ff41'::bytea AS b" if db.startswith("postgresql") else "SELECT x'00ff41' AS b")
    query = ["query", "--db", db, "--timeout", "60"]  # the default 2 s ran out on a loaded CI machine
    assert main([*query, sql]) == 0
    assert capsys.readouterr().out == "b\n--------\n\\x00ff41\n(1 row)\n"
    assert main([*query, "--csv", sql]) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [["b"], ["\\x00ff41"]]
    assert main([*query, "--json", sql]) == 0
    assert json.loads(capsys.readouterr().out) == [{"b": "\\x00ff41"}]


@pytest.mark.parametrize("sql", ["DELETE FROM runs", "UPDATE runs SET engine = 'x'",
                                 "INSERT INTO positions (pos) VALUES (999)", "DROP TABLE runs",
                                 "CREATE TABLE intruder (a INTEGER)"])
def test_write_statements_exit_2_and_change_nothing(db: str, sql: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, sql]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specscope query: error:") and "read-only" in err[0]
    assert main(["query", "--db", db, "--json", SQL]) == 0
    assert [row["engine"] for row in json.loads(capsys.readouterr().out)] == ["reference", "vllm"]
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT COUNT(*) FROM positions WHERE pos >= 999")[1] == [(0,)]


def test_missing_store_exits_2_without_creating_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "absent.db"
    assert main(["query", "--db", str(path), "SELECT 1"]) == 2
    assert "no specscope store" in capsys.readouterr().err
    assert not path.exists()


def test_bad_sql_exits_2(db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["query", "--db", db, "SELECT * FROM no_such_table"]) == 2
    assert "no_such_table" in capsys.readouterr().err


@pytest.mark.postgres
def test_postgres_types_without_a_binary_reader_print_as_postgresql_writes_them(pg_url: str,
                                                                              capsys: pytest.CaptureFixture) -> None:
    open_store(pg_url).close()
    sql = "SELECT 'pg_class'::regclass AS rel, xmlparse(content '<a>1</a>') AS doc, point(1, 2) AS p"
    assert main(["query", "--db", pg_url, "--json", sql]) == 0
    assert json.loads(capsys.readouterr().out) == [{"rel": "pg_class", "doc": "<a>1</a>", "p": "(1,2)"}]


@pytest.mark.postgres
def test_postgres_whole_numerics_keep_their_digits_in_json(pg_url: str, capsys: pytest.CaptureFixture) -> None:
    """As a float, 9007199254740993::numeric became ...992, a number never stored; whole numbers are
    exact (past int64 as their digits), as a bigint column reads."""
    open_store(pg_url).close()
    sql = ("SELECT 9007199254740993::numeric AS m, 9007199254740993::bigint AS b, "
           "12345678901234567891::numeric AS n, 2.75::numeric AS f")
    assert main(["query", "--db", pg_url, "--timeout", "60", "--json", sql]) == 0
    assert json.loads(capsys.readouterr().out) == [{"m": 9007199254740993, "b": 9007199254740993,
                                                    "n": "12345678901234567891", "f": 2.75}]


@pytest.mark.postgres
def test_postgres_dates_out_of_pythons_range_and_intervals_print_as_postgresql_writes_them(
        pg_url: str, capsys: pytest.CaptureFixture) -> None:
    open_store(pg_url).close()
    sql = ("SELECT 'infinity'::date AS d, '-infinity'::timestamp AS t, '0044-03-15 BC'::date AS bc, "
           "'1 mon'::interval AS m, '-178000000 years'::interval AS y, '2026-01-02'::date AS ok")
    assert main(["query", "--db", pg_url, "--json", sql]) == 0
    assert json.loads(capsys.readouterr().out) == [{"d": "infinity", "t": "-infinity", "bc": "0044-03-15 BC",
                                                    "m": "1 mon", "y": "-178000000 years", "ok": "2026-01-02"}]
