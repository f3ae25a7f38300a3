"""The collector across ``os.fork`` while its writer is inside a store write: the fork waits for the
write, and past :data:`~specscope.collector._collector.FORK_WAIT_S` goes on with a child that writes
nothing rather than one that can deadlock on SQLite's state copied mid-write.

A write is held in place inside its transaction (SQLite's write lock taken, ``BEGIN IMMEDIATE``) by a
listener of SQLAlchemy's ``commit`` event on the writer thread, never a mock: forked there, a child's
own writer found the database locked (a store it opens) or blocked forever (a store given open). Each
child leaves by ``os._exit`` with a status its parent checks. (A fork of a separate process, and
multiprocessing's, are in tests/test_faults_lifecycle.py.)
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from specscope import events as ev
from specscope.collector import Collector, _collector
from specscope.storage import Store, open_store

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

RUN = "run-fork"
HANG = 120.0  # a wait that has not ended after this long is a hang (detector, not a timing check)
PARENT, CHILD = 20, 300  # the parent's events (one batch: the held write); the child's events


def _tensor(i: int, rank: int) -> ev.TensorEvent:
    return ev.TensorEvent(run_id=RUN, rank=rank, hook_point="p", call_index=i, shape=(1,), dtype="float32",
                          device="cpu")


class HeldWrite:
    """The next commit of a collector's writer thread waits, its transaction open, until ``go``."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()

    def __call__(self, _conn: sa.Connection) -> None:
        if threading.current_thread().name == "specscope-collector" and not self.go.is_set():
            self.inside.set()
            self.go.wait(HANG)


@pytest.fixture
def held() -> Iterator[HeldWrite]:
    hold = HeldWrite()
    sa.event.listen(Engine, "commit", hold)
    yield hold
    hold.go.set()
    sa.event.remove(Engine, "commit", hold)


_AT_FORK: list[Callable[[], None]] = []  # run as the next fork begins, before the collector's hook


def _at_fork() -> None:
    while _AT_FORK:
        _AT_FORK.pop()()


# Registered after the collector's hook, so run before it (Python runs ``before`` hooks last-first).
os.register_at_fork(before=_at_fork)


def _collector_inside_a_write(target: Store | str, held: HeldWrite) -> Collector:
    """A collector whose writer is inside its first write, held there."""
    collector = Collector(target, batch_size=PARENT, flush_interval_s=HANG)
    for i in range(PARENT):  # the last one fills the batch, which wakes the writer
        collector.emit(_tensor(i, rank=0))
    assert held.inside.wait(HANG), "the writer never reached its commit"
    return collector


def _fork(child: Callable[[], bool]) -> int:
    """Fork; the child runs ``child`` and exits 0 when it returns True, 1 otherwise (also when it raises:
    never back into pytest). The parent gets the child's pid."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = 0 if child() else 1
        finally:
            os._exit(status)
    return pid


def _exit_status(pid: int) -> int:
    """The child's exit status; a child still running after HANG is killed and fails the test."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


def _emit_and_close(collector: Collector) -> tuple[int, int]:
    """The child's part: emit its events, close (bounded: the writer must have ended), (written, dropped)."""
    for i in range(CHILD):
        collector.emit(_tensor(i, rank=1))
    collector.close(HANG)
    assert not collector._writer.thread.is_alive()
    return collector.written, collector.dropped


def _ranks(path: str) -> dict[int, int]:
    with open_store(path, read_only=True) as store:
        return dict(store.query("SELECT rank, COUNT(*) FROM tensor_events GROUP BY rank")[1])


@pytest.mark.parametrize("given", ["url", "store"])
def test_a_fork_during_a_write_waits_for_it_and_the_child_writes(tmp_path, held: HeldWrite, given: str) -> None:
    path = str(tmp_path / "fork.db")
    store = open_store(path)
    collector = _collector_inside_a_write(path if given == "url" else store, held)
    _AT_FORK.append(held.go.set)  # the write goes on once the fork has begun

    pid = _fork(lambda: _emit_and_close(collector) == (CHILD, 0))
    assert collector.written == PARENT  # the fork went on only once the write had committed
    assert _exit_status(pid) == 0
    collector.close(HANG)
    assert _ranks(path) == {0: PARENT, 1: CHILD}
    store.close()


def test_a_fork_past_the_wait_goes_on_and_the_child_writes_nothing(tmp_path, held: HeldWrite, monkeypatch,
                                                                   caplog) -> None:
    monkeypatch.setattr(_collector, "FORK_WAIT_S", 0.1)  # the write below is held far longer
    path = str(tmp_path / "stuck.db")

    def child() -> bool:
        logged = [r for r in caplog.records if "forked while a collector was still using" in r.getMessage()]
        return _emit_and_close(collector) == (0, CHILD) and not collector.flush(HANG) and len(logged) == 1

    with caplog.at_level(logging.ERROR, logger="specscope"):
        collector = _collector_inside_a_write(path, held)
        pid = _fork(child)
    assert collector.written == 0  # the parent's write is still held: the fork did not wait for it
    held.go.set()
    assert _exit_status(pid) == 0
    assert collector.flush(HANG)  # the parent writes on
    collector.close(HANG)
    assert _ranks(path) == {0: PARENT}


def test_a_fork_from_the_writer_thread_does_not_wait_for_itself(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_collector, "FORK_WAIT_S", 10 * HANG)  # waiting for itself, the flush below times out
    statuses: list[int] = []

    def fork_at_run_end(store: Store, run_id: str) -> None:  # on the writer thread, inside the store
        statuses.append(_exit_status(_fork(lambda: _emit_and_close(collector) == (0, CHILD))))

    collector = Collector(str(tmp_path / "self.db"), flush_interval_s=0.01, on_run_end=fork_at_run_end)
    collector.emit(ev.RankStatus(run_id=RUN, rank=0, hook_calls=0, hook_errors=0, finished=True))
    assert collector.flush(HANG)
    collector.close(HANG)
    assert statuses == [0]


def test_a_child_forked_during_close_answers_its_flush_at_once(tmp_path, held: HeldWrite) -> None:
    """Forked while another thread closes the collector: the child's collector is closed too, so its
    flush answers False at once (a marker queued to a writer that runs no thread here waited forever)."""
    path = str(tmp_path / "closing.db")
    collector = _collector_inside_a_write(path, held)
    closing = threading.Thread(target=collector.close, args=(HANG,))
    closing.start()
    while not collector._writer.closing:
        time.sleep(0.001)
    _AT_FORK.append(held.go.set)

    def child() -> bool:
        collector.emit(_tensor(0, rank=1))
        return collector.flush() is False and (collector.written, collector.dropped) == (0, 1)

    pid = _fork(child)
    closing.join(HANG)
    assert _exit_status(pid) == 0
    assert _ranks(path) == {0: PARENT}


def test_a_fork_waits_for_the_writer_of_a_collector_already_dropped(tmp_path, held: HeldWrite) -> None:
    """A collector closed with a short timeout and dropped leaves its writer inside the write: the fork
    still waits for it, and a collector the child opens on the same store writes."""
    path = str(tmp_path / "dropped.db")
    collector = _collector_inside_a_write(path, held)
    collector.close(0.001)
    del collector
    gc.collect()
    _AT_FORK.append(held.go.set)

    def child() -> bool:
        return _emit_and_close(Collector(path, flush_interval_s=0.01)) == (CHILD, 0)

    assert _exit_status(_fork(child)) == 0
    assert _ranks(path) == {0: PARENT, 1: CHILD}
