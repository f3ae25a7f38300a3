"""A run's names (run id, engine, engine version, fault label, host, device) must fit the store's
columns: PostgreSQL refuses a longer one, and with it the run's RunStart (the run would be stored
without it) while SQLite keeps it. They are refused where they are given, with one line."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
from _draft_fixture import run_config
from _list_sink import ListSink

from specscope import events as ev
from specscope.adapters.recorder import ResponseRecorder
from specscope.collector import Collector
from specscope.errors import ConfigError, EventRejected, InvalidEvent
from specscope.event_checks import MAX_HOST, MAX_NAME
from specscope.instrumentation import Tracer
from specscope.storage import open_store

NAMES = dict(engine="e", engine_version="1", target_model="t", draft_model="d")


@pytest.mark.parametrize("field", ["run_id", "engine", "engine_version", "fault", "device"])
def test_the_tracer_refuses_a_name_no_store_holds(field):
    with pytest.raises(ConfigError, match=f"tracer: {field} .* is 65 characters; a store holds 64"):
        Tracer(ListSink(), config=run_config(), **{**NAMES, field: "x" * (MAX_NAME + 1)})


def test_names_that_fit_start_the_run_with_them(store):
    names = {**NAMES, "engine_version": "v" * MAX_NAME, "fault": "f" * MAX_NAME}
    sink = ListSink()
    tracer = Tracer(sink, config=run_config(), run_id="r" * MAX_NAME, device="cpu", **names)
    tracer.start()
    store.write(sink.events)
    (row,) = store.query("SELECT run_id, engine_version, fault FROM runs")[1]
    assert row == ("r" * MAX_NAME, "v" * MAX_NAME, "f" * MAX_NAME)
    tracer.close()


def test_the_run_start_refuses_them_too():
    with pytest.raises(InvalidEvent, match="run start: host .* is 256 characters; a store holds 255"):
        ev.RunStart("r", "e", "1", "t", "d", {}, host="h" * (MAX_HOST + 1))
    with pytest.raises(InvalidEvent, match="run start: fault"):
        ev.RunStart("r", "e", "1", "t", "d", {}, fault="f" * (MAX_NAME + 1))
    ev.RunStart("r" * MAX_NAME, "e" * MAX_NAME, "1", "t", "d", {}, host="h" * MAX_HOST)


def test_the_response_recorder_refuses_a_long_run_id():
    with pytest.raises(ConfigError, match="response recorder: run_id"):
        ResponseRecorder(ListSink(), run_id="x" * (MAX_NAME + 1))


def _step(run_id: object, step: int = 0) -> ev.VerifyStep:
    return ev.VerifyStep(run_id=run_id, request_id="q", rank=0, step=step, proposed=2, accepted=1, draft_s=0.01,
                         verify_s=0.02, emitted=("a",), ts_wall=1000.0 + step)


@pytest.mark.parametrize("run_id, why", [(b"run-b", r"run_id b'run-b' is bytes, not text"),
                                          ("r" * (MAX_NAME + 1), "is 65 characters; a store holds 64"),
                                          ("", "an empty run_id"),
                                          ("run\x00b", "holds a NUL character")])
def test_a_store_refuses_a_run_id_it_cannot_hold_on_every_dialect(store_url, run_id, why):
    """SQLite kept a bytes run id (every dashboard page then failed ordering it beside text ones), an
    empty one (the doctor then refused the whole store), and one over 64 characters or holding NUL
    (PostgreSQL refuses them): all are refused on every dialect, as an event's rows or as a rank's
    counters alone, and nothing of the batch is written."""
    with open_store(store_url) as store:
        with pytest.raises(EventRejected, match=why):
            store.write([_step("ok"), _step(run_id, 1)])
        with pytest.raises(EventRejected, match=why):
            store.write((), counters={(run_id, 0): (1, 0)})
        assert store.query("SELECT COUNT(*) FROM verify_steps")[1] == [(0,)]
        assert store.query("SELECT COUNT(*) FROM run_ranks")[1] == [(0,)]
        store.write([_step("r" * MAX_NAME)])
        assert store.query("SELECT run_id FROM verify_steps")[1] == [("r" * MAX_NAME,)]


def test_the_collector_sets_aside_only_the_event_whose_run_id_no_store_holds(store_url):
    with open_store(store_url) as store, Collector(store, batch_size=100, flush_interval_s=60) as collector:
        for i in range(10):
            collector.emit(_step("ok", i))
        collector.emit(_step("r" * (MAX_NAME + 1)))
        assert not collector.flush(60)  # one was set aside: flush says so
        assert (collector.written, collector.rejected) == (10, 1)
        collector.close()
        assert store.query("SELECT run_id, events_written FROM run_ranks")[1] == [("ok", 10)]


def test_a_write_of_a_generator_writes_every_event(store_url):
    with open_store(store_url) as store:
        store.write(_step("ok", i) for i in range(5))
        store.write(iter([_step("ok", 5)]))
        assert store.query("SELECT COUNT(*) FROM verify_steps")[1] == [(6,)]


def test_an_empty_run_id_kept_by_an_older_store_is_diagnosed_with_the_others(tmp_path):
    """A store written before writes refused the empty run id: the doctor judges that run and the
    others, where it refused the whole store ("an empty run id names no run")."""
    import _traces as T

    db = tmp_path / "older.db"
    with open_store(str(db)) as store:
        T.healthy().write(store)
        T.no_aux_capture("broken").write(store)
    with sqlite3.connect(db) as conn:
        for (table,) in conn.execute("SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c "
                                     "WHERE m.type = 'table' AND c.name = 'run_id'").fetchall():
            conn.execute(f"UPDATE {table} SET run_id = '' WHERE run_id = 'broken'")
    out = subprocess.run([sys.executable, "-m", "specscope", "doctor", "--db", str(db), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert sorted(r["run_id"] for r in data["runs"]) == ["", "healthy"]
    assert any(f["run_id"] == "" and f["code"] == "ACCEPT_COLLAPSE" for f in data["findings"])
