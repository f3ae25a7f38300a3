"""The in-process sink: the engine thread appends events, a background thread writes them in batches.

Design (docs/design.md, "Components and data flow", "Budgets"): ``emit`` is a few type checks
(:mod:`._boundary`) and a ``deque.append`` (atomic in CPython, no lock, never waits on the
database); the writer thread (:mod:`._writer`) takes up to ``batch_size`` events off the deque and
writes them in ONE store transaction together with the per-(run, rank) written / dropped counters
(:mod:`._counts`). ``flush`` enqueues a marker and waits for the writer to reach it, so FIFO order is
the whole synchronisation; ``flush`` and the writer's shutdown take one lock, so a marker is either
queued before the writer drains the queue for the last time or answered at once. ``capacity``
bounds the events held, queued or being written (checked without a lock: concurrent emitters can
overshoot it by at most one event each); beyond it ``emit`` drops and counts. A failing store
(locked, unwritable, unreachable) costs the failed batch, counted as dropped, and one logged error
per outage, save its RunStart and RankStart events, kept for the next attempt (sent once, when the
engine starts: without them a run's later rows are judged without its contract,
``RUN_START_MISSING``); the writer then waits before the next attempt (0.05 s doubling up to
:data:`~._writer.MAX_BACKOFF_S`), so a ``flush`` during an outage returns at its timeout (or after
about ``queued / batch_size * MAX_BACKOFF_S``), and ``close`` on a failing store drops what is
queued at once. An event whose values the database refuses is set aside alone (:mod:`._quarantine`;
counted in ``rejected`` and ``dropped``, logged once), the rest commits. Live ranks are kept heard
and ended ranks run ``on_run_end`` (:mod:`._liveness`). After ``os.fork`` the child gets an empty
queue, a writer thread of its own and fresh database connections (``os.register_at_fork``), so what
a forked worker emits is written at its exit (atexit, or multiprocessing's exit finalizers for its
children, which skip atexit); a child that leaves by ``os._exit`` itself must close the collector
first. The fork waits (at most :data:`FORK_WAIT_S`) for the writers to leave their stores; a child
forked past that wait writes nothing, counting what it emits as dropped (:func:`_before_fork`).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys
import threading
import time
import weakref
from typing import Any

from specscope.collector._boundary import key_of, refusal
from specscope.collector._counts import Tally
from specscope.collector._decode import Decoder
from specscope.collector._liveness import RunEnd
from specscope.collector._writer import LIVE_WRITERS, StoreHandle, Writer
from specscope.errors import ConfigError
from specscope.events import Event
from specscope.storage import Store

logger = logging.getLogger("specscope")

EXIT_TIMEOUT_S = 30.0  # longest wait of the close at interpreter exit for the writer (seconds)
HEARTBEAT_S = 30.0
"""Longest silence (seconds) of a live rank in the store: an idle writer marks the ranks it wrote for
and that have not ended as heard (``run_ranks.last_seen_wall``) this often, far below
:data:`specscope.storage.views.LOST_AFTER_S`."""
FORK_WAIT_S = 10.0
"""Longest wait (seconds, all writers together) of ``os.fork`` for the writer threads to leave their
stores (:func:`_before_fork`). A batch commits in milliseconds; one waiting for another process's
write lock fails after SQLite's busy timeout (5 s by default, ``open_store``). Twice that lets such a
write end, so the child still writes, while a store that hangs holds the forking thread (an engine
starting its workers) no longer."""


class Collector:
    """The sink instrumentation emits into: ``emit(event)``, ``flush()``, ``close()``.

    Args:
        store: an open :class:`~specscope.storage.Store` (left open by :meth:`close`), or a path / URL
            that the writer thread opens (creating the store) and closes; opening it never raises
            here: a store that cannot be opened is handled like one that cannot be written.
        capacity: most events held in memory (queued plus the batch being written).
        batch_size: most events per write transaction.
        flush_interval_s: longest time (seconds) an event waits before the writer picks it up. One
            second keeps commits rare (each costs CPU the engine's compute threads feel on a small
            host) while the dashboard, refreshing every 2 s, still looks live.
        tokenizer: decodes the token ids events carry (``VerifyStep.emitted_ids``,
            ``RequestEnd.output_ids``) in the writer thread: anything with Hugging Face's
            ``decode(ids, skip_special_tokens=)``; None stores no text for them.
        heartbeat_s: how often (seconds) an idle writer marks its live ranks heard.
        on_run_end: called as ``on_run_end(store, run_id)`` on the writer thread after a batch that
            ends a rank of ``run_id`` committed (e.g. :func:`specscope.readmodel.store_verdict`); an
            exception it raises is logged, never raised to the engine.

    Raises:
        ConfigError: capacity or batch_size not an int >= 1, or flush_interval_s not a finite
            positive number of seconds.

    Attributes (read at any time, from any thread):
        written: events committed to the store.
        dropped: events lost: refused by a full buffer, emitted after close, refused at emit, in a
            failed batch, or rejected by the database.
        rejected: of those, events refused at emit or whose values the database refused.
        write_errors: failed write attempts (a failed batch counts once).
        last_error: the exception of the latest failed write attempt (None before any).

    Usable as a context manager; also flushed and closed at interpreter exit (``atexit``) until closed.
    """

    def __init__(self, store: Store | str, *, capacity: int = 100_000, batch_size: int = 5_000,
                 flush_interval_s: float = 1.0, tokenizer: Any = None, on_run_end: RunEnd | None = None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        if not (_is_count(capacity) and _is_count(batch_size) and _is_period(flush_interval_s)
                and _is_period(heartbeat_s)):
            raise ConfigError(f"collector needs capacity >= 1, batch_size >= 1, flush_interval_s > 0 and "
                              f"heartbeat_s > 0, got {capacity}, {batch_size}, {flush_interval_s}, {heartbeat_s}")
        self._handle = StoreHandle(store)
        self._capacity = capacity
        self._settings = dict(batch_size=batch_size, interval_s=flush_interval_s, heartbeat_s=heartbeat_s,
                              decode=None if tokenizer is None else Decoder(tokenizer), on_run_end=on_run_end)
        self._batch_size = batch_size
        self._start_writer()
        _LIVE.add(self)
        multiprocessing.util.register_after_fork(self, Collector._close_with_multiprocessing_child)
        atexit.register(self._close_at_exit)

    def _start_writer(self, usable: bool = True) -> None:
        """Fresh counts and writer thread (at construction, and in a forked child); with ``usable``
        False a writer that drops everything, and no thread."""
        self._tally = Tally()
        self._writer = Writer(self._handle, self._tally, usable=usable, **self._settings)
        self._queue = self._writer.queue
        self._logged_refusal = False

    def _after_fork_in_child(self, usable: bool) -> None:
        # The parent's queued events are the parent's to write; its pooled connections must not be
        # used here (SQLAlchemy: Engine.dispose(close=False) in the child, which touches no database).
        if self._writer.closing:  # closed, or closing on another thread of the parent: never written here
            self._start_writer(usable=False)  # a flush answers at once, not a marker nobody would take
            return
        self._handle.after_fork()
        self._start_writer(usable)
        if not usable:
            logger.error("specscope collector: this process was forked while a collector was still using "
                         "its store (or at interpreter shutdown); it writes nothing to store %s, as the "
                         "database state it copied mid-operation could deadlock it: its events are "
                         "dropped and counted", self._handle.describe())

    def _close_with_multiprocessing_child(self) -> None:
        # multiprocessing's children leave through os._exit, past atexit; their own exit finalizers
        # close the collector instead (registered in the child, after multiprocessing cleared the
        # parent's), so what a worker emitted is written.
        multiprocessing.util.Finalize(self, self._close_at_exit, exitpriority=10)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    written = property(lambda self: self._tally.written, doc="Events committed to the store.")
    dropped = property(lambda self: self._tally.dropped, doc="Events lost (see the class).")
    rejected = property(lambda self: self._tally.rejected, doc="Of those, events refused (see the class).")
    write_errors = property(lambda self: self._tally.write_errors, doc="Failed write attempts.")
    last_error = property(lambda self: self._tally.last_error, doc="The latest failed write's exception.")

    def emit(self, event: Event) -> None:
        """Queue one event for writing (about a microsecond). Never blocks on the store and never
        raises; when ``capacity`` events are held, or after close, the event is dropped and counted
        for its (run_id, rank). Anything but a specscope event with a string run_id, a rank in
        0..2**31-1, a number for ts_wall (and a world_size >= 1) is refused: counted in ``dropped`` and
        ``rejected``, logged once."""
        reason = refusal(event)
        if reason is not None:
            self._refuse(event, reason)
            return
        queue, writer = self._queue, self._writer
        if writer.closing or len(queue) >= self._capacity:
            self._drop(event)
            return
        queue.append(event)
        if len(queue) == self._batch_size:
            writer.wake.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every event emitted before this call has been written or dropped.

        Safe against a concurrent :meth:`close`: it always returns (within ``timeout_s`` when given).

        Returns:
            True when all of them were committed (the store holds them, durably); False when the
            timeout (seconds) expired first, any event was dropped since the previous flush (a full
            buffer, a failed or rejected write: how many is in :attr:`dropped`), or the collector
            is closed and lost events at or after its close.
        """
        marker = self._writer.mark()
        if marker is None:  # the writer has stopped: nothing more can be written
            return not self._writer.lossy and not self._tally.new_drops()
        done = marker.done.wait(timeout_s) and marker.committed
        return not self._tally.new_drops() and done

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the writer thread and close a store this collector opened. Idempotent;
        events emitted once close has begun are dropped and counted (so threads that keep emitting
        cannot keep it waiting). On a failing store it does not retry: what is still queued is
        dropped and counted. At interpreter exit it waits at most :data:`EXIT_TIMEOUT_S`."""
        atexit.unregister(self._close_at_exit)
        writer = self._writer
        writer.closing = True
        writer.stop.set()
        writer.wake.set()
        writer.join(timeout_s)
        if writer.thread.is_alive():
            # The writer is still busy (a slow store or tokenizer): what it has not written yet may
            # be lost when the process exits, and nothing can count it in the store any more.
            writer.lossy = True
            logger.warning("specscope collector: store %s still being written after %ss at close; "
                           "%d event(s) not yet written may be lost", self._handle.describe(), timeout_s,
                           writer.unwritten())
        else:
            writer.abandon()  # an emit that raced the writer's last drain is counted, not left behind

    def _close_at_exit(self) -> None:
        self.close(EXIT_TIMEOUT_S)

    def _refuse(self, event: object, reason: str) -> None:
        key = key_of(event)  # a countable event with a bad value elsewhere (world_size) has one
        self._tally.drop(1, None if key is None else {key: 1}, rejected=True)
        if not self._logged_refusal:  # once per collector: a bad producer would flood the log
            self._logged_refusal = True
            logger.error("specscope collector: refused an event (%s); it is dropped, later refusals are "
                         "only counted", reason)

    def _drop(self, event: Event) -> None:
        self._tally.drop(1, {(event.run_id, event.rank): 1})
        if self._writer.closing:
            self._writer.lossy = True


def _is_period(value: object) -> bool:
    """A finite number of seconds above 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


_LIVE: weakref.WeakSet[Collector] = weakref.WeakSet()


class _Fork(threading.local):
    """The forking thread's view of its fork (two threads may fork at once)."""

    def __init__(self) -> None:
        self.held: list[threading.Lock] = []  # the writers' ``in_store`` locks held over the fork
        self.quiet = True  # every live writer was held out of its store


_FORK = _Fork()


def _before_fork() -> None:
    """Hold every live writer out of its store over the fork, waiting at most :data:`FORK_WAIT_S`.

    A child forked while a writer is inside SQLite inherits SQLite's process-wide mutexes and its
    file-lock bookkeeping as that thread left them: the child's own writer can block forever on a
    mutex nobody will release, or find the database locked by a transaction that does not exist in
    the child. The engine's fork matters more than its child's events, so past the wait the fork
    goes on and every collector of the child writes nothing (the mutexes are the whole process's).
    Locks are taken in one order (by id), so forks in two threads cannot hold each other up. It
    does not wait while the interpreter shuts down (its daemon writers are frozen where they stand,
    and a thread the child started would never run: Python 3.11's ``Thread.start`` then hangs), nor
    for the forking thread's own writer (a fork in ``on_run_end`` or a tokenizer: that thread may be
    inside the store), nor for writers whose thread has ended (the store closed, or a forked
    child's copy of its parent's writer)."""
    finalizing = sys.is_finalizing()
    deadline = time.monotonic() + (0.0 if finalizing else FORK_WAIT_S)
    writers = sorted((writer for writer in list(LIVE_WRITERS) if writer.thread.is_alive()), key=id)
    _FORK.held, _FORK.quiet = [], False  # until all are held: an interrupted wait (Ctrl-C) forks anyway
    for writer in writers:
        if writer.thread is not threading.current_thread() and \
                writer.in_store.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _FORK.held.append(writer.in_store)
    _FORK.quiet = len(_FORK.held) == len(writers) and not finalizing


def _after_fork_in_parent() -> None:
    held, _FORK.held = _FORK.held, []
    for lock in held:
        lock.release()


def _after_fork_in_child() -> None:
    # The locks held over the fork stay held: they are the parent's writers', which run no thread
    # here (the child's collectors get writers of their own).
    _FORK.held = []
    for collector in list(_LIVE):
        collector._after_fork_in_child(_FORK.quiet)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
