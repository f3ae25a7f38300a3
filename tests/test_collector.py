"""The collector against real stores: batching, flush, drop-and-count, failing and recovering stores.

Blocked writes use a real SQLite lock held by another connection (``BEGIN EXCLUSIVE``), never a mock.
"""

from __future__ import annotations

import logging
import sqlite3

import pytest

from specscope import events as ev
from specscope.collector import Collector
from specscope.errors import ConfigError
from specscope.storage import Store, open_store

RUN = "run-c"


def _tensor(i: int, rank: int = 0) -> ev.TensorEvent:
    return ev.TensorEvent(run_id=RUN, rank=rank, hook_point="draft.forward:hidden_states", call_index=i,
                          shape=(1, 1, 1728), dtype="float32", device="cpu", ts_wall=1000.0 + i)


def _stored_calls(store: Store) -> list[int]:
    """``call_index`` of the stored tensor events in the order they were inserted: tensor_events has no
    serial key (schema 17), so by SQLite's rowid, or by heap position on PostgreSQL (append-only rows
    of a fresh table, never updated)."""
    order = "rowid" if store.dialect == "sqlite" else "ctid"
    return [row[0] for row in store.query(f"SELECT call_index FROM tensor_events ORDER BY {order}")[1]]


def _count(store: Store, table: str = "tensor_events") -> int:
    return store.query(f"SELECT COUNT(*) FROM {table}")[1][0][0]


def _rank_counters(store: Store, rank: int = 0) -> tuple[int, int]:
    rows = store.query("SELECT events_written, events_dropped FROM run_ranks WHERE run_id = :r AND "
                       "rank = :k", {"r": RUN, "k": rank})[1]
    return rows[0] if rows else (0, 0)


def _locked(path) -> sqlite3.Connection:
    """Another connection holding the store's write lock until it rolls back."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    return blocker


def test_events_are_written_in_batches_with_counters(store: Store) -> None:
    with Collector(store, batch_size=7, flush_interval_s=0.01) as collector:
        collector.emit(ev.RankStart(run_id=RUN, rank=0, world_size=2, host="h", pid=1, device="cpu"))
        for i in range(50):
            collector.emit(_tensor(i, rank=i % 2))
        assert collector.flush(timeout_s=60)
        assert (collector.written, collector.dropped, collector.write_errors) == (51, 0, 0)
        assert _count(store) == 50
        assert _rank_counters(store, 0) == (26, 0)
        assert _rank_counters(store, 1) == (25, 0)
        assert _stored_calls(store) == list(range(50))  # emit order kept


def test_flush_covers_everything_emitted_before_it(tmp_path) -> None:
    path = str(tmp_path / "s.db")
    collector = Collector(path, batch_size=1000, flush_interval_s=60.0)  # only flush makes it write
    for i in range(10):
        collector.emit(_tensor(i))
    assert collector.flush(timeout_s=60)
    with open_store(path, read_only=True) as reader:  # another connection sees it committed
        assert _count(reader) == 10
    collector.close()
    assert collector.flush(timeout_s=1)  # nothing pending after close


def test_close_flushes_and_later_emits_are_dropped(tmp_path) -> None:
    path = str(tmp_path / "s.db")
    collector = Collector(path, flush_interval_s=60.0)
    for i in range(5):
        collector.emit(_tensor(i))
    collector.close()
    collector.close()  # idempotent
    collector.emit(_tensor(99))
    assert (collector.written, collector.dropped) == (5, 1)
    with open_store(path, read_only=True) as reader:
        assert _count(reader) == 5


def test_full_buffer_drops_and_counts_per_rank(tmp_path) -> None:
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=120.0)  # the blocked writer waits for the lock
    blocker = _locked(path)
    collector = Collector(store, capacity=10, batch_size=5, flush_interval_s=0.01)
    for i in range(25):  # the writer cannot commit: at most 10 are held, 15 dropped
        collector.emit(_tensor(i))
    assert collector.dropped == 15
    blocker.rollback()
    assert not collector.flush(timeout_s=120)  # everything kept is written, but 15 were dropped
    assert (collector.written, collector.dropped, collector.write_errors) == (10, 15, 0)
    assert collector.flush(timeout_s=120)  # nothing dropped since the previous flush
    assert _stored_calls(store) == list(range(10))
    collector.close()
    assert _rank_counters(store) == (10, 15)
    store.close()


def test_locked_store_drops_logs_once_and_recovers(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=0.05)  # give up on the lock quickly
    blocker = _locked(path)
    collector = Collector(store, batch_size=5, flush_interval_s=0.01)
    with caplog.at_level(logging.INFO, logger="specscope"):
        for round_ in range(3):
            for i in range(10):
                collector.emit(_tensor(round_ * 10 + i))  # never raises, never blocks
            assert not collector.flush(timeout_s=60)  # processed, but not committed
        assert collector.written == 0 and collector.dropped == 30 and collector.write_errors >= 2
        blocker.rollback()
        for i in range(3):
            collector.emit(_tensor(100 + i))
        assert collector.flush(timeout_s=60)
        collector.close()
    errors = [r for r in caplog.records if r.name == "specscope" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write to store" in errors[0].getMessage()
    assert (collector.written, collector.dropped) == (3, 30)
    assert _count(store) == 3
    assert _rank_counters(store) == (3, 30)  # the drops reached the store after it recovered
    store.close()



def test_a_run_started_while_the_store_is_locked_keeps_its_run_start(tmp_path) -> None:
    """The RunStart and RankStart go out once, as the engine starts: a store locked then loses the
    batch, but not them (without them every later row of the run is judged without its contract)."""
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=0.05)
    blocker = _locked(path)
    collector = Collector(store, batch_size=5, flush_interval_s=0.01)
    collector.emit(ev.RunStart(run_id=RUN, engine="e", engine_version="1", target_model="t", draft_model="d",
                               config={"k": 4}))
    collector.emit(ev.RankStart(run_id=RUN, rank=0, world_size=1, host="h", pid=1, device="cpu"))
    for i in range(3):
        collector.emit(_tensor(i))
    assert not collector.flush(timeout_s=60)  # the batch failed: its tensor events are lost
    assert (collector.written, collector.dropped) == (0, 3)
    blocker.rollback()
    collector.emit(_tensor(10))
    assert collector.flush(timeout_s=60)
    collector.close()
    assert (collector.written, collector.dropped) == (3, 3)
    assert store.query("SELECT engine, config FROM runs")[1] == [("e", '{"k":4}')]
    assert store.query("SELECT host, device FROM run_ranks")[1] == [("h", "cpu")]
    assert _count(store) == 1 and _rank_counters(store) == (3, 3)
    store.close()


def test_start_events_kept_through_an_outage_are_counted_dropped_at_close(tmp_path) -> None:
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=0.05)
    blocker = _locked(path)
    collector = Collector(store, batch_size=5, flush_interval_s=0.01)
    collector.emit(ev.RunStart(run_id=RUN, engine="e", engine_version="1", target_model="t", draft_model="d",
                               config={}))
    collector.emit(_tensor(0))
    assert not collector.flush(timeout_s=60)
    collector.close()
    blocker.rollback()
    assert (collector.written, collector.dropped) == (0, 2)
    assert _count(store, "runs") == 0
    store.close()

def test_unwritable_path_keeps_the_engine_going(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")  # a file where a directory should be: unwritable even for root
    with caplog.at_level(logging.ERROR, logger="specscope"):
        collector = Collector(str(not_a_dir / "store.db"), batch_size=4, flush_interval_s=0.01)
        for _ in range(3):
            for i in range(8):
                collector.emit(_tensor(i))
            assert not collector.flush(timeout_s=60)
        collector.close()
    assert (collector.written, collector.dropped) == (0, 24)
    assert collector.write_errors >= 3
    errors = [r for r in caplog.records if r.name == "specscope"]
    assert len(errors) == 1 and "a-file" in errors[0].getMessage()


def test_flush_times_out_while_the_store_is_locked(tmp_path) -> None:
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=120.0)
    blocker = _locked(path)
    collector = Collector(store, flush_interval_s=0.01)
    collector.emit(_tensor(0))
    assert not collector.flush(timeout_s=0.05)
    blocker.rollback()
    assert collector.flush(timeout_s=120)
    collector.close()
    assert collector.written == 1
    store.close()


@pytest.mark.parametrize("settings", [{"capacity": 0}, {"batch_size": 0}, {"flush_interval_s": 0.0},
                                      {"heartbeat_s": 0}, {"heartbeat_s": -1.0}, {"heartbeat_s": float("nan")},
                                      {"heartbeat_s": None}])
def test_invalid_settings_are_refused(tmp_path, settings: dict) -> None:
    with pytest.raises(ConfigError):
        Collector(str(tmp_path / "s.db"), **settings)


def test_a_failing_run_end_callback_is_one_log_line_whatever_the_run_id(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """The run id comes from the engine's side: a newline in it must not start a forged log line."""
    def verdict(store: Store, run_id: str) -> None:
        raise RuntimeError("verdict failed")

    run_id = "r1\nCRITICAL specscope: forged line"
    with caplog.at_level(logging.ERROR, logger="specscope"), open_store(str(tmp_path / "s.db")) as store, \
            Collector(store, on_run_end=verdict) as collector:
        collector.emit(ev.RankStatus(run_id=run_id, rank=0, hook_calls=0, hook_errors=0, finished=True))
    (failed,) = [r.getMessage() for r in caplog.records if "run-end callback failed" in r.getMessage()]
    assert failed.endswith(f"for run {run_id!r}") and "\n" not in failed
