"""Collector and tracer lifecycle under attack: flush racing close, lossy closes, a bad event in a
batch, a store that keeps failing, fork, exit without close, contradictory verify steps and contracts,
a tracer built before torch.distributed. Real stores (SQLite and PostgreSQL), real threads and
processes."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from _list_sink import ListSink

from specscope import events as ev
from specscope.collector import Collector
from specscope.errors import ConfigError, InvalidEvent
from specscope.instrumentation import Tracer
from specscope.storage import Store, open_store

RUN = "run-f"
HANG = 120.0  # a join/flush that has not returned after this long is a hang (detector, not a timing check)


def _tensor(i: int, hook_point: str | None = "draft.forward:hidden_states") -> ev.TensorEvent:
    return ev.TensorEvent(run_id=RUN, rank=0, hook_point=hook_point, call_index=i, shape=(1, 1, 8),
                          dtype="float32", device="cpu", ts_wall=1000.0 + i)


def _count(store: Store, sql: str = "SELECT COUNT(*) FROM tensor_events") -> int:
    return store.query(sql)[1][0][0]


def _config(**changes) -> ev.RunConfig:
    values = dict(aux_layer_ids_resolved=(2, 15, 27), target_hidden_size=32, expected_fused_width=96,
                  k=4, num_target_layers=30)
    return ev.RunConfig(**{**values, **changes})


def test_flush_racing_close_always_returns(tmp_path) -> None:
    """Many rounds of flush() in one thread against close() in another: every flush returns."""
    store = open_store(str(tmp_path / "s.db"))
    for round_ in range(40):
        collector = Collector(store, flush_interval_s=0.01)
        for i in range(20):
            collector.emit(_tensor(round_ * 100 + i))
        results: list[bool] = []
        flusher = threading.Thread(target=lambda results=results, collector=collector: results.append(collector.flush()))
        closer = threading.Thread(target=collector.close)
        flusher.start()
        closer.start()
        flusher.join(HANG)
        closer.join(HANG)
        assert not flusher.is_alive() and not closer.is_alive(), f"hang in round {round_}"
        assert results == [True]  # nothing was lost, so the answer is True either way
    assert _count(store) == 40 * 20
    store.close()


def test_flush_after_a_lossy_close_is_false(tmp_path) -> None:
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    collector = Collector(store, flush_interval_s=0.01)
    for i in range(10):
        collector.emit(_tensor(i))
    collector.close()
    blocker.rollback()
    assert collector.dropped == 10 and collector.written == 0
    assert collector.flush() is False
    store.close()


def test_flush_after_a_clean_close_is_true(tmp_path) -> None:
    with Collector(str(tmp_path / "s.db"), flush_interval_s=0.01) as collector:
        collector.emit(_tensor(0))
    assert collector.flush() is True and collector.written == 1


def test_a_bad_event_is_quarantined_alone(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """Two events the database refuses (NOT NULL hook_point) among 200: they alone are dropped,
    counted and logged once; the other 198 and the counters are committed."""
    with caplog.at_level(logging.ERROR, logger="specscope"), \
            Collector(store, batch_size=500, flush_interval_s=60.0) as collector:
        collector.emit(ev.RankStart(run_id=RUN, rank=0, world_size=1, host="h", pid=1, device="cpu"))
        for i in range(200):
            collector.emit(_tensor(i, hook_point=None if i in (17, 150) else "draft.forward:hidden_states"))
        assert collector.flush(HANG) is False  # two events were not committed
        assert (collector.written, collector.rejected, collector.dropped) == (199, 2, 2)
    assert _count(store) == 198
    assert sorted(r[0] for r in store.query("SELECT call_index FROM tensor_events")[1]) == [
        i for i in range(200) if i not in (17, 150)]
    assert store.query("SELECT events_written, events_dropped FROM run_ranks")[1] == [(199, 2)]
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1


def test_failing_store_backs_off(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """A store locked for a while: write attempts are spaced out (doubling waits), not one per batch."""
    path = tmp_path / "s.db"
    store = open_store(str(path), busy_timeout_s=0.01)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    collector = Collector(store, batch_size=1, flush_interval_s=0.01)
    stop = threading.Event()
    emitted = 0
    while not stop.wait(0.002) and emitted < 750:  # 1.5 s of an engine emitting every 2 ms
        collector.emit(_tensor(emitted))
        emitted += 1
    # Without backoff each 1-event batch is one attempt (hundreds); with it: a handful.
    assert 1 <= collector.write_errors <= 12, collector.write_errors
    blocker.rollback()
    assert not collector.flush(HANG)  # events since the last flush were lost in the outage
    collector.emit(_tensor(emitted))
    emitted += 1
    assert collector.flush(HANG)  # recovered
    collector.close()
    assert collector.written + collector.dropped == emitted  # every event accounted for
    assert store.query("SELECT events_written, events_dropped FROM run_ranks")[1] == [
        (collector.written, collector.dropped)]
    store.close()


_FORK = textwrap.dedent("""
    import os, sys
    from specscope import events as ev
    from specscope.collector import Collector
    from specscope.storage import open_store

    def tensor(i, rank):
        return ev.TensorEvent(run_id="run-fork", rank=rank, hook_point="p", call_index=i, shape=(1,),
                              dtype="float32", device="cpu")

    target = sys.argv[1] if sys.argv[2] == "url" else open_store(sys.argv[1])
    collector = Collector(target, flush_interval_s=0.01)
    for i in range(5):
        collector.emit(tensor(i, 0))
    pid = os.fork()
    if pid == 0:  # the child: its own writer, its own connections
        for i in range(100):
            collector.emit(tensor(i, 1))
        ok = collector.flush(60)
        collector.close()
        os._exit(0 if ok and collector.written == 100 else 3)
    _, status = os.waitpid(pid, 0)
    for i in range(5, 10):
        collector.emit(tensor(i, 0))
    collector.close()
    print(os.waitstatus_to_exitcode(status), collector.written, flush=True)
""")


@pytest.mark.parametrize("given", ["url", "store"])
def test_a_forked_child_writes_what_it_emits(tmp_path, given: str) -> None:
    path = str(tmp_path / "fork.db")
    proc = subprocess.run([sys.executable, "-c", _FORK, path, given], capture_output=True, text=True,
                          timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "10"]  # child exited 0 (wrote its 100); parent wrote its 10
    with open_store(path, read_only=True) as store:
        assert store.query("SELECT rank, COUNT(*) FROM tensor_events GROUP BY rank ORDER BY rank")[1] == [
            (0, 10), (1, 100)]


_MULTIPROCESSING = textwrap.dedent("""
    import multiprocessing, sys
    from specscope import events as ev
    from specscope.collector import Collector

    collector = Collector(sys.argv[1], flush_interval_s=30)

    def work(how):
        for i in range(50):
            collector.emit(ev.TensorEvent(run_id="run-mp", rank=1 if how == "return" else 2, hook_point="p",
                                          call_index=i, shape=(1,), dtype="float32", device="cpu"))
        if how == "exit":
            sys.exit(0)

    if __name__ == "__main__":
        for how in ("return", "exit"):  # neither closes the collector; the child's exit does
            child = multiprocessing.get_context("fork").Process(target=work, args=(how,))
            child.start()
            child.join()
        collector.close()
""")


def test_a_multiprocessing_child_writes_what_it_emits_without_closing(tmp_path) -> None:
    path = str(tmp_path / "mp.db")
    proc = subprocess.run([sys.executable, "-c", _MULTIPROCESSING, path], capture_output=True, text=True,
                          timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    with open_store(path, read_only=True) as store:
        assert store.query("SELECT rank, COUNT(*) FROM tensor_events GROUP BY rank ORDER BY rank")[1] == [
            (1, 50), (2, 50)]


_NO_CLOSE = textwrap.dedent("""
    import sys
    from specscope.collector import Collector
    from specscope.events import RunConfig
    from specscope.instrumentation import Tracer

    collector = Collector(sys.argv[1], flush_interval_s=0.01)
    config = RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8, k=2,
                       num_target_layers=4)
    tracer = Tracer(collector, run_id="run-exit", engine="e", engine_version="0", target_model="t",
                    draft_model="d", config=config)
    tracer.start_request("q", 3)
    tracer.record_verify("q", proposed=2, accepted=1)
    # no tracer.close(), no collector.close(): the interpreter exits
""")


def test_final_status_is_sent_at_interpreter_exit(tmp_path) -> None:
    path = str(tmp_path / "exit.db")
    proc = subprocess.run([sys.executable, "-c", _NO_CLOSE, path], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr
    with open_store(path, read_only=True) as store:
        assert store.query("SELECT status FROM v_run_summary")[1] == [("finished",)]
        assert store.query("SELECT COUNT(*) FROM verify_steps")[1] == [(1,)]


@pytest.mark.parametrize("call", [
    dict(proposed=3, accepted=4),
    dict(proposed=3, accepted=1, accepted_mask=[1, 0, 1]),
    dict(proposed=3, accepted=1, accepted_mask="1000"),
    dict(proposed=3, accepted=-1),
    dict(proposed=70, accepted=2),
    dict(proposed="three", accepted=1),
    dict(proposed=3, accepted=1, emitted=5),
])
def test_contradictory_verify_steps_are_counted_never_raised(call: dict, caplog: pytest.LogCaptureFixture) -> None:
    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="specscope"), \
            Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                   config=_config()) as tracer:
        tracer.start_request("q", 3)
        tracer.record_verify("q", **call)
        tracer.record_verify("q", **call)
        tracer.record_verify("q", proposed=3, accepted=1)  # a good one still goes through, as step 0
    assert [(s.step, s.accepted) for s in sink.of(ev.VerifyStep)] == [(0, 1)]
    assert tracer.hook_errors == 2 and sink.of(ev.RankStatus)[-1].hook_errors == 2
    assert len([r for r in caplog.records if "record_verify" in r.getMessage()]) == 1  # logged once


def test_verify_step_of_a_request_never_started_is_dropped() -> None:
    sink = ListSink()
    with Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                config=_config()) as tracer:
        tracer.record_verify("ghost", proposed=3, accepted=1)
    assert sink.of(ev.VerifyStep) == [] and tracer.hook_errors == 1


@pytest.mark.parametrize("fields", [
    dict(proposed=3, accepted=4), dict(proposed=3, accepted=1, accepted_mask="101"),
    dict(proposed=3, accepted=1, accepted_mask="10"), dict(proposed=3, accepted=1, accepted_mask="1x0"),
    dict(proposed=65, accepted=0), dict(proposed=3.0, accepted=1),
])
def test_verify_step_constructor_refuses_contradictions(fields: dict) -> None:
    with pytest.raises(InvalidEvent):
        ev.VerifyStep(run_id=RUN, request_id="q", rank=0, step=0, **fields)


@pytest.mark.parametrize("fields", [
    dict(steps=-1, proposed=0, accepted=0), dict(steps=2, proposed=3, accepted=4),
    dict(steps=1, proposed=-3, accepted=0), dict(steps=2**31, proposed=0, accepted=0),
    dict(steps=1, proposed=3, accepted=1, accepted_mask="1x0"), dict(steps=1.0, proposed=3, accepted=1),
    dict(steps=0, proposed=40, accepted=40), dict(steps=20, proposed=80, accepted=0, accepted_mask="1111"),
    dict(steps=1, proposed=5000, accepted=5000, accepted_mask="1" * 5000),
])
def test_verify_group_constructor_refuses_contradictions(fields: dict) -> None:
    with pytest.raises(InvalidEvent):
        ev.VerifyGroup(run_id=RUN, request_id="q", rank=0, **{"accepted_mask": "", **fields})


@pytest.mark.parametrize("changes, words", [
    (dict(expected_fused_width=100), "3 aux layers x target_hidden_size 32 = 96"),
    (dict(aux_layer_ids_resolved=(2, 15, 31), expected_fused_width=96), "[31] outside"),
    (dict(aux_layer_ids_configured=(-1, 2, 3)), "[-1] outside"),
    (dict(k=0), "k must be an int >= 1"),
    (dict(target_hidden_size="32"), "target_hidden_size must be an int"),
    (dict(aux_layer_ids_resolved="2,15,27"), "sequence of ints"),
])
def test_run_config_contradictions_raise_config_error(changes: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _config(**changes)


@pytest.mark.parametrize("when", ["built_before", "started_before"])
def test_rank_resolved_when_torch_distributed_comes_up_later(tmp_path, when: str) -> None:
    from _rank_worker import run_rank

    torch.multiprocessing.spawn(run_rank, args=(str(tmp_path / "pg"), str(tmp_path), when), nprocs=2)
    assert (tmp_path / "rank0.txt").read_text() == "0 2 2 [0]"
    assert (tmp_path / "rank1.txt").read_text() == "1 2 2 [1]"


@pytest.mark.postgres
def test_a_value_too_long_for_its_column_costs_only_that_event(pg_url: str) -> None:
    """PostgreSQL enforces column lengths (SQLite does not): a 300-character hook point used to fail
    the whole transaction and take the batch's other events with it."""
    with open_store(pg_url) as store, Collector(store, batch_size=500, flush_interval_s=60.0) as collector:
        for i in range(100):
            collector.emit(_tensor(i, hook_point="x" * 300 if i == 42 else "draft.forward:hidden_states"))
        assert collector.flush(HANG) is False
        assert (collector.written, collector.rejected) == (99, 1)
        assert _count(store) == 99


@pytest.mark.parametrize("run_id", [["x"], b"run", 3, float("nan")])
def test_a_run_id_that_is_not_a_string_is_a_config_error(run_id: object) -> None:
    with pytest.raises(ConfigError, match="run_id must be a string"):
        Tracer(ListSink(), run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
               config=_config())


def test_a_request_id_with_a_lone_surrogate_never_raises_into_the_engine() -> None:
    """Sampled-out steps hash the request id: a lone surrogate in it used to raise UnicodeEncodeError."""
    sink = ListSink()
    with Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d", config=_config(),
                step_sample=0.5) as tracer:
        tracer.start_request("q\udcff", 3)
        tracer.record_verify("q\udcff", proposed=2, accepted=1)
        tracer.finish_request("q\udcff", 2)
    assert tracer.hook_errors == 0
    assert len(sink.of(ev.VerifyStep)) + sum(g.steps for g in sink.of(ev.VerifyGroup)) == 1


_DIES = textwrap.dedent("""
    import sys
    from specscope.collector import Collector
    from specscope.events import RunConfig
    from specscope.instrumentation import Tracer

    collector = Collector(sys.argv[1], flush_interval_s=0.01)
    config = RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8, k=2,
                       num_target_layers=4)
    tracer = Tracer(collector, run_id="run-dies", engine="e", engine_version="0", target_model="t",
                    draft_model="d", config=config)
    tracer.start_request("q", 3)
    if sys.argv[2] == "with":
        with tracer:
            raise RuntimeError("engine step failed")
    raise {"uncaught": RuntimeError("engine step failed"), "exit": SystemExit(0)}[sys.argv[2]]
""")


@pytest.mark.parametrize("how, status, error", [
    ("uncaught", "crashed", "RuntimeError: engine step failed"),
    ("with", "crashed", "RuntimeError: engine step failed"),
    ("exit", "finished", None),
])
def test_an_engine_dying_of_an_exception_reads_crashed(tmp_path, how: str, status: str, error: str | None) -> None:
    path = str(tmp_path / "dies.db")
    proc = subprocess.run([sys.executable, "-c", _DIES, path, how], capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == (0 if how == "exit" else 1), proc.stderr
    with open_store(path, read_only=True) as store:
        assert store.query("SELECT status, error FROM v_run_summary")[1] == [(status, error)]
