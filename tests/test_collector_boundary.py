"""One malformed event costs only itself: what ``Collector.emit`` refuses, and a writer that survives
what gets past it. Real SQLite and PostgreSQL stores, real threads; a flush that has not returned
after HANG seconds is a hang (a detector, not a timing check)."""

from __future__ import annotations

import logging
import threading

import pytest

from specscope import events as ev
from specscope.collector import Collector
from specscope.storage import open_store

RUN = "run-b"
LATER = 202  # good events emitted after the bad one
HANG = 120.0


def _tensor(i: int, run_id: object = RUN, rank: object = 0, ts_wall: object = None) -> ev.TensorEvent:
    return ev.TensorEvent(run_id=run_id, rank=rank, hook_point="draft.forward:hidden_states", call_index=i,
                          shape=(1, 1, 8), dtype="float32", device="cpu",
                          ts_wall=1000.0 + i if ts_wall is None else ts_wall)


def _rank_start(world_size: object) -> ev.RankStart:
    return ev.RankStart(run_id=RUN, rank=0, world_size=world_size, host="h", pid=1, device="cpu")


def _flush(collector: Collector) -> bool | None:
    """``collector.flush()`` without a timeout, in a thread: None when it hangs."""
    result: list[bool] = []
    flusher = threading.Thread(target=lambda: result.append(collector.flush()), daemon=True)
    flusher.start()
    flusher.join(HANG)
    return result[0] if result else None


def _counters(store) -> list[tuple]:
    return store.query("SELECT run_id, rank, events_written, events_dropped FROM run_ranks ORDER BY rank")[1]


# name -> (bad event, whether its (run_id, rank) can be counted in run_ranks)
REFUSED = {
    "unhashable run_id": (lambda: _tensor(0, run_id=["x"]), False),
    "unhashable rank": (lambda: _tensor(0, rank={}), False),
    "NaN run_id": (lambda: _tensor(0, run_id=float("nan")), False),
    "bytes run_id": (lambda: _tensor(0, run_id=b"run-b"), False),
    "rank over 2**31-1": (lambda: _tensor(0, rank=2**70), False),
    "negative rank": (lambda: _tensor(0, rank=-1), False),
    "not an event": (lambda: object(), False),
    "a dict shaped like an event": (lambda: {"run_id": RUN, "rank": 0, "kind": "tensor"}, False),
    "world_size 0": (lambda: _rank_start(0), True),
    "world_size -2": (lambda: _rank_start(-2), True),
    "RunStart world_size 0": (lambda: ev.RunStart(RUN, "e", "0", "t", "d", {}, world_size=0), True),
    # stored by SQLite as given, every reader's arithmetic on the time then failed (an attack trial)
    "ts_wall text": (lambda: _tensor(0, ts_wall="now"), True),
    "ts_wall None": (lambda: ev.RankStatus(RUN, 0, 1, 0, ts_wall=None), True),
    "ts_wall bool": (lambda: ev.Finding(code="X", severity="info", message="m", evidence={}, fix="f",
                                        run_id=RUN, ts_wall=True), True),
}


@pytest.mark.parametrize("bad", REFUSED)
def test_a_malformed_event_is_refused_alone(bad: str, store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The bad event, queued with LATER good ones in one batch: refused at emit, counted, logged
    once; every good one written; flush() returns (False once, then True: nothing poisoned)."""
    make, counted = REFUSED[bad]
    with caplog.at_level(logging.ERROR, logger="specscope"), open_store(store_url) as store, \
            Collector(store, batch_size=1000, flush_interval_s=60.0) as collector:
        collector.emit(make())
        collector.emit(make())
        for i in range(LATER):
            collector.emit(_tensor(i + 1))
        assert _flush(collector) is False
        assert (collector.written, collector.dropped, collector.rejected) == (LATER, 2, 2)
        collector.emit(_tensor(LATER + 1))
        assert _flush(collector) is True
        assert _counters(store) == [(RUN, 0, LATER + 1, 2 if counted else 0)]
    refused = [r for r in caplog.records if "refused an event" in r.getMessage()]
    assert len(refused) == 1 and "\n" not in refused[0].getMessage()


# named ids: an id with a lone surrogate cannot travel to a pytest-xdist worker (UTF-8 only)
@pytest.mark.parametrize("run_id", ["run\udcff", "run\x00"], ids=["lone-surrogate", "nul"])
def test_a_run_id_the_database_refuses_leaves_the_counters_of_others(run_id: str, store_url: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A run id that passes emit but not the database (a lone surrogate anywhere; a NUL on
    PostgreSQL): its events and its run_ranks counters are set aside; the other runs' counters keep
    committing (they were refused with them, at every later flush, before). The log names the run
    escaped: a UTF-8 log file can hold the line."""
    if "\x00" in run_id and not store_url.startswith("postgresql"):
        pytest.skip("SQLite stores a NUL as it is")
    with caplog.at_level(logging.ERROR, logger="specscope"), open_store(store_url) as store, \
            Collector(store, batch_size=1000, flush_interval_s=60.0) as collector:
        collector.emit(_tensor(0, run_id=run_id))
        for i in range(LATER):
            collector.emit(_tensor(i + 1))
        _flush(collector)
        for round_ in range(3):
            collector.emit(_tensor(1000 + round_))
            assert _flush(collector) is True
        assert (RUN, 0, LATER + 3, 0) in _counters(store)
        assert collector.written == LATER + 3
    (rejected,) = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert f"of run {run_id!r} (" in rejected
    rejected.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate


def test_the_writer_survives_an_event_broken_after_emit(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """An event changed past its checks once queued (a producer's bug): its batch is lost and counted,
    the flush waiting behind it returns, and the writer writes what comes next."""
    with caplog.at_level(logging.ERROR, logger="specscope"), \
            Collector(str(tmp_path / "s.db"), batch_size=1000, flush_interval_s=60.0) as collector:
        broken = _tensor(0)
        collector.emit(broken)
        object.__setattr__(broken, "run_id", ["x"])  # the writer is asleep: it has not taken it yet
        for i in range(3):
            collector.emit(_tensor(i + 1))
        assert _flush(collector) is False
        assert (collector.written, collector.dropped) == (0, 4)
        for i in range(LATER):
            collector.emit(_tensor(100 + i))
        assert _flush(collector) is True
        assert collector.written == LATER
    assert len([r for r in caplog.records if "failed unexpectedly" in r.getMessage()]) == 1
