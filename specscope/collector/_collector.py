"""The in-process sink: the engine thread appends events, a background thread writes them in batches.

Design (docs/design.md, "Components and data flow", "Budgets"): ``emit`` is a bounds check and a ``deque.append`` (atomic in
CPython, no lock, never waits on the database); the writer thread takes up to ``batch_size`` events
off the deque and writes them in ONE store transaction together with the per-(run, rank) written /
dropped counters. ``flush`` enqueues a marker and waits for the writer to reach it, so FIFO order is
the whole synchronisation; ``flush`` and the writer's shutdown take one lock, so a marker is either
queued before the writer drains the queue for the last time or answered at once (no marker is ever
left unanswered). ``capacity`` bounds the events held, queued or being written (checked without a
lock: concurrent emitters can overshoot it by at most one event each); beyond it ``emit`` drops and
counts. A failing store (locked, unwritable, unreachable) costs the failed batch, counted as dropped,
and one logged error per outage; the writer then waits before the next attempt (0.05 s doubling up to
:data:`MAX_BACKOFF_S`), so it recovers when the store does without spinning; meanwhile the queue
drains one batch per wait, so a ``flush`` during an outage returns at its timeout (or after about
``queued / batch_size * MAX_BACKOFF_S``), and ``close`` on a failing store drops what is queued at once. An event whose values
the database refuses (:class:`~specscope.errors.EventRejected`) is isolated by writing its batch in
halves: it alone is dropped (counted in ``rejected`` and ``dropped``, logged once), the rest commits.
Each committed batch also tells the collector which ranks it heard from: while a rank has not ended,
the writer marks it heard whenever the store has not heard from it for ``heartbeat_s`` seconds
(``Store.touch``; busy with other ranks or idle), so a live engine with nothing to record never
reads 'lost' (``v_run_summary``); when a batch that ends a rank commits
(``RankStatus(finished=True)``), ``on_run_end(store, run_id)`` runs on the writer thread, off the
engine's (the read model's :func:`specscope.readmodel.store_verdict` stores the doctor's verdict then).
After ``os.fork`` the child gets an empty queue, a writer thread of its own and fresh database
connections (``os.register_at_fork``), so what a forked worker emits is written, not silently lost:
at its exit (atexit, or multiprocessing's exit finalizers for its children, which skip atexit); a
child that leaves by ``os._exit`` itself must close the collector first.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from specscope.collector._boundary import Key, key_of, refusal
from specscope.collector._decode import Decoder
from specscope.errors import ConfigError, EventRejected
from specscope.events import Event
from specscope.storage import Store, open_store

logger = logging.getLogger("specscope")

FIRST_BACKOFF_S = 0.05  # wait after the first failed write; doubled per failure in a row
MAX_BACKOFF_S = 2.0  # longest wait between two write attempts on a failing store (seconds)
EXIT_TIMEOUT_S = 30.0  # longest wait of the close at interpreter exit for the writer (seconds)
HEARTBEAT_S = 30.0
"""Longest silence (seconds) of a live rank in the store: an idle writer marks the ranks it wrote for
and that have not ended as heard (``run_ranks.last_seen_wall``) this often, far below
:data:`specscope.storage.views.LOST_AFTER_S`."""
RunEnd = Callable[[Store, str], None]


class _FlushMarker:
    """Placed in the queue by flush(); the writer sets ``done`` once everything before it is handled."""

    __slots__ = ("done", "committed")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.committed = True


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
        dropped: events lost: refused by a full buffer, emitted after close, in a failed batch, or
            rejected by the database.
        rejected: of those, events whose values the database refused (quarantined one by one).
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
        self._store = store if isinstance(store, Store) else None
        self._store_url = None if isinstance(store, Store) else str(store)
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._decode = None if tokenizer is None else Decoder(tokenizer)
        self._on_run_end = on_run_end
        self._heartbeat_s = heartbeat_s
        self._closing = False
        self._start_writer()
        _LIVE.add(self)
        multiprocessing.util.register_after_fork(self, Collector._close_with_multiprocessing_child)
        atexit.register(self._close_at_exit)

    def _start_writer(self) -> None:
        """Fresh state and writer thread (at construction, and in a forked child)."""
        self.written = 0
        self.dropped = 0
        self.rejected = 0
        self.write_errors = 0
        self.last_error: Exception | None = None
        self._queue: deque[Event | _FlushMarker] = deque()
        self._in_flight = 0  # events taken off the queue and not yet handled (writer thread only)
        self._wake = threading.Event()
        self._stop = threading.Event()  # set by close(): cuts a backoff wait short
        self._closed = False
        self._lossy_close = False  # events were lost at or after close: flush() answers False
        self._dropped_reported = 0  # `dropped` as the last flush() saw it
        self._lock = threading.Lock()  # serialises flush()'s marker with the writer's shutdown
        self._drop_lock = threading.Lock()  # guards dropped and _emit_drops (the rare path)
        self._emit_drops: dict[Key, int] = {}
        # Writer thread only: counts not yet committed to run_ranks, failures since the last marker.
        self._pending_drops: dict[Key, int] = {}
        self._pending_written: dict[Key, int] = {}
        self._failed_since_marker = False
        self._failing = False
        self._backoff_s = FIRST_BACKOFF_S
        self._logged_rejection = False
        self._logged_refusal = False
        self._logged_bug = False
        # ranks written for that have not ended -> when the store last heard from each (writer thread only)
        self._live: dict[Key, float] = {}
        self._thread = threading.Thread(target=self._run, name="specscope-collector", daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        # The parent's queued events are the parent's to write; its pooled connections must not be
        # used here (SQLAlchemy: Engine.dispose(close=False) in the child).
        if self._closing:
            return
        if self._store_url is not None:
            self._store = None
        elif self._store is not None:
            self._store.after_fork()
        self._start_writer()

    def _close_with_multiprocessing_child(self) -> None:
        # multiprocessing's children leave through os._exit, past atexit; their own exit finalizers
        # close the collector instead (registered in the child, after multiprocessing cleared the
        # parent's), so what a worker emitted is written.
        multiprocessing.util.Finalize(self, self._close_at_exit, exitpriority=10)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def emit(self, event: Event) -> None:
        """Queue one event for writing (about a microsecond). Never blocks on the store and never
        raises; when ``capacity`` events are held, or after close, the event is dropped and counted
        for its (run_id, rank). Anything but a specscope event with a string run_id, a rank in
        0..2**31-1 (and a world_size >= 1) is refused: counted in ``dropped`` and ``rejected``, logged once."""
        reason = refusal(event)
        if reason is not None:
            self._refuse(event, reason)
            return
        queue = self._queue
        if self._closing or len(queue) + self._in_flight >= self._capacity:
            self._drop(event)
            return
        queue.append(event)
        if len(queue) == self._batch_size:
            self._wake.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every event emitted before this call has been written or dropped.

        Safe against a concurrent :meth:`close`: it always returns (within ``timeout_s`` when given).

        Returns:
            True when all of them were committed (the store holds them, durably); False when the
            timeout (seconds) expired first, any event was dropped since the previous flush (a full
            buffer, a failed or rejected write: how many is in :attr:`dropped`), or the collector
            is closed and lost events at or after its close.
        """
        with self._lock:
            if self._closed:  # the writer has stopped: nothing more can be written
                return not self._lossy_close and not self._new_drops()
            marker = _FlushMarker()
            self._queue.append(marker)
        self._wake.set()
        done = marker.done.wait(timeout_s) and marker.committed
        return not self._new_drops() and done

    def _new_drops(self) -> bool:
        """Whether events were dropped since the previous call (by any flush)."""
        with self._drop_lock:
            seen, self._dropped_reported = self._dropped_reported, self.dropped
        return self.dropped != seen

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the writer thread and close a store this collector opened. Idempotent;
        events emitted once close has begun are dropped and counted (so threads that keep emitting
        cannot keep it waiting). On a failing store it does not retry: what is still queued is
        dropped and counted. At interpreter exit it waits at most :data:`EXIT_TIMEOUT_S`."""
        atexit.unregister(self._close_at_exit)
        self._closing = True
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            # The writer is still busy (a slow store or tokenizer): what it has not written yet may
            # be lost when the process exits, and nothing can count it in the store any more.
            pending = self._in_flight + sum(not isinstance(item, _FlushMarker) for item in list(self._queue))
            self._lossy_close = True
            logger.warning("specscope collector: store %s still being written after %ss at close; "
                           "%d event(s) not yet written may be lost", self._describe(), timeout_s, pending)
        else:
            self._abandon()  # an emit that raced the writer's last drain is counted, not left behind
            if self._store_url is not None and self._store is not None:
                self._store.close()

    def _close_at_exit(self) -> None:
        self.close(EXIT_TIMEOUT_S)

    def _refuse(self, event: object, reason: str) -> None:
        key = key_of(event)
        with self._drop_lock:
            self.dropped += 1
            self.rejected += 1
            if key is not None:  # a countable event with a bad value elsewhere (world_size)
                self._emit_drops[key] = self._emit_drops.get(key, 0) + 1
            logged, self._logged_refusal = self._logged_refusal, True
        if not logged:  # once per collector: a bad producer would flood the log
            logger.error("specscope collector: refused an event (%s); it is dropped, later refusals are "
                         "only counted", reason)

    def _drop(self, event: Event) -> None:
        key = (getattr(event, "run_id", None), getattr(event, "rank", 0))
        with self._drop_lock:
            self.dropped += 1
            self._emit_drops[key] = self._emit_drops.get(key, 0) + 1
            if self._closing:
                self._lossy_close = True

    # --- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:  # also when the loop died of a bug: no flush may wait forever
            with self._lock:
                self._closing = self._closed = True  # emit() drops from now on: nobody would write it
            self._abandon()

    def _loop(self) -> None:
        queue = self._queue
        while True:
            self._wake.clear()
            if not queue and not self._closing:
                # A flush period longer than the heartbeat (watch holds a scrape's events until its
                # flush) still marks live ranks heard while it waits, and writes nothing early.
                until = time.monotonic() + self._interval
                while not self._wake.wait(max(0.0, min(self._heartbeat_s, until - time.monotonic()))):
                    if time.monotonic() >= until:
                        break
                    self._heartbeat()
            chunk: list[Event] = []
            marker = None
            while queue and len(chunk) < self._batch_size:
                item = queue.popleft()
                if isinstance(item, _FlushMarker):
                    marker = item
                    break
                chunk.append(item)
                self._in_flight += 1
            try:
                if self._decode is not None:
                    chunk = [self._decode(event) for event in chunk]
                committed = self._write(chunk)
            except Exception as exc:  # noqa: BLE001 - a bug here must cost this batch, not the writer
                committed = False
                self._lost(chunk, exc)
            if not committed and chunk:
                self._failed_since_marker = True
            self._in_flight = 0
            if marker is not None:
                marker.committed = not self._failed_since_marker
                self._failed_since_marker = False
                marker.done.set()
            if self._closing and (not queue or self._failing):
                if self._failed_since_marker:
                    self._lossy_close = True
                return  # a failing store at close: do not hold the process up per batch
            if self._failing:  # bounded backoff: no retry storm against a store that is down
                self._stop.wait(self._backoff_s)
                self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)

    def _abandon(self) -> None:
        lost = 0
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, _FlushMarker):
                item.committed = False
                item.done.set()
            else:
                lost += 1
        with self._drop_lock:
            self.dropped += lost
            if lost:
                self._lossy_close = True

    def _write(self, chunk: Sequence[Event]) -> bool:
        """Write one batch with the pending counters in one transaction; False when any of it failed."""
        with self._drop_lock:
            emit_drops, self._emit_drops = self._emit_drops, {}
        _add(self._pending_drops, emit_drops)
        if not chunk and not self._pending_drops:
            self._heartbeat()
            return True
        written = _per_key(chunk)
        try:
            self._open().write(chunk, counters=self._counters(written))
        except EventRejected as exc:
            return self._quarantine(chunk, exc)
        except Exception as exc:  # StoreError, or a bug: either way the writer thread must live on
            self._failed(written, len(chunk), exc)
            return False
        self._committed(len(chunk))
        self._heard_from(chunk, written)
        self._heartbeat()  # a busy writer may be busy for other ranks only
        return True

    def _heartbeat(self) -> None:
        """Mark heard each live rank the store has not heard from for ``heartbeat_s`` seconds."""
        now = time.monotonic()
        quiet = sorted(key for key, heard in self._live.items() if now - heard >= self._heartbeat_s)
        if not quiet:
            return
        try:
            self._open().touch(quiet)
        except Exception:  # noqa: BLE001 - a failing store is reported by the next batch's write
            return
        self._live.update(dict.fromkeys(quiet, now))

    def _heard_from(self, events: Sequence[Event], keys: dict[Key, int]) -> None:
        """Track live ranks over committed ``events`` (``keys``: their ``_per_key`` counts); run
        ``on_run_end`` for each run a rank ended."""
        now = time.monotonic()
        self._live.update((key, now) for key in keys if key[0] is not None)
        ended: list[str] = []
        for event in events:
            if event.kind == "rank_status" and event.finished:
                self._live.pop((event.run_id, event.rank), None)
                ended.append(event.run_id)
        for run_id in dict.fromkeys(ended) if self._on_run_end is not None else ():
            try:
                self._on_run_end(self._open(), run_id)
            except Exception:  # noqa: BLE001 - the engine's events matter more than the verdict
                logger.exception("specscope collector: the run-end callback failed for run %s", run_id)

    def _quarantine(self, chunk: Sequence[Event], rejection: EventRejected) -> bool:
        """Write ``chunk`` in halves until every rejected event is alone; drop and count only those
        (about 2 log2(len(chunk)) extra transactions per bad event). False: something was dropped."""
        store = self._open()
        good: list[Event] = []
        bad: list[Event] = []
        # (events, the rejection they got, or None when not tried yet); popped left half first
        pending: list[tuple[Sequence[Event], EventRejected | None]] = [(chunk, rejection)]
        while pending:
            part, refused = pending.pop()
            if refused is None:
                try:
                    store.write(part)
                except EventRejected as exc:
                    refused = exc
                except Exception as exc:  # noqa: BLE001 - the store itself failed meanwhile
                    lost = [event for events, _ in ((part, None), *pending) for event in events]
                    self._failed(_per_key(lost), len(lost), exc)
                    break
                else:
                    good.extend(part)
                    continue
            if len(part) == 1:
                bad.append(part[0])
                self._rejected(part[0], refused)
            else:
                middle = len(part) // 2
                pending += [(part[middle:], None), (part[:middle], None)]
        with self._drop_lock:
            self.dropped += len(bad)
            self.rejected += len(bad)
        _add(self._pending_drops, _per_key(bad))
        self.written += len(good)
        self._heard_from(good, _per_key(good))
        try:  # the counters of what did commit, and of the rejected events
            self._write_counters(store, self._counters(_per_key(good)))
        except Exception as exc:  # noqa: BLE001 - kept pending: they go with the next batch
            _add(self._pending_written, _per_key(good))
            self._failed({}, 0, exc)
        else:
            self._pending_drops.clear()
            self._pending_written.clear()
        return False

    def _write_counters(self, store: Store, counters: dict[Key, tuple[int, int]]) -> None:
        """Write ``counters`` alone; a (run_id, rank) the database refuses (a NUL or a lone surrogate in
        the run id) is left out, so it cannot keep every later batch from committing."""
        try:
            store.write((), counters=counters)
        except EventRejected:
            for key, counts in counters.items():
                try:
                    store.write((), counters={key: counts})
                except EventRejected as exc:
                    self._rejected_counters(key, exc)

    def _rejected_counters(self, key: Key, exc: EventRejected) -> None:
        if not self._logged_rejection:
            self._logged_rejection = True
            logger.error("specscope collector: store %s refused the counters of run %r rank %r (%s); "
                         "they are not recorded", self._describe(), key[0], key[1], exc)

    def _lost(self, chunk: Sequence[Event], exc: Exception) -> None:
        with self._drop_lock:
            self.dropped += len(chunk)
        if not self._logged_bug:
            self._logged_bug = True
            logger.error("specscope collector: writing a batch failed unexpectedly (%s: %s); its %d "
                         "event(s) are dropped, the writer goes on", type(exc).__name__, exc, len(chunk),
                         exc_info=exc)

    def _rejected(self, event: Event, exc: Exception) -> None:
        if not self._logged_rejection:  # once per collector: a bad producer would flood the log
            self._logged_rejection = True
            logger.error("specscope collector: store %s rejected a %s event of run %s (%s); it is "
                         "dropped, the rest of its batch is written; later rejections are only counted",
                         self._describe(), event.kind, getattr(event, "run_id", None), exc)

    def _counters(self, written: dict[Key, int]) -> dict[Key, tuple[int, int]]:
        """run_ranks increments: ``written`` plus what earlier failed counter writes left pending."""
        totals = dict(self._pending_written)
        _add(totals, written)
        return {key: (totals.get(key, 0), self._pending_drops.get(key, 0))
                for key in totals.keys() | self._pending_drops.keys()}

    def _committed(self, count: int) -> None:
        self._pending_drops.clear()
        self._pending_written.clear()
        self.written += count
        self._backoff_s = FIRST_BACKOFF_S
        if self._failing:
            self._failing = False
            logger.info("specscope collector: store %s writable again", self._describe())

    def _failed(self, lost: dict[Key, int], count: int, exc: Exception) -> None:
        self.last_error = exc
        self.write_errors += 1
        with self._drop_lock:
            self.dropped += count
        _add(self._pending_drops, lost)
        if not self._failing:  # one error per outage, not one per batch
            self._failing = True
            logger.error("specscope collector: cannot write to store %s (%s); dropping events and "
                         "retrying with later batches, waiting up to %g s between attempts",
                         self._describe(), exc, MAX_BACKOFF_S)

    def _open(self) -> Store:
        if self._store is None:
            self._store = open_store(self._store_url)
        return self._store

    def _describe(self) -> str:
        return self._store.url if self._store is not None else str(self._store_url)


def _is_period(value: object) -> bool:
    """A finite number of seconds above 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _add(into: dict[Key, int], counts: dict[Key, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _per_key(events: Sequence[Event]) -> dict[Key, int]:
    counts: dict[Key, int] = {}
    for event in events:
        key = (getattr(event, "run_id", None), getattr(event, "rank", 0))
        counts[key] = counts.get(key, 0) + 1
    return counts


_LIVE: weakref.WeakSet[Collector] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for collector in list(_LIVE):
        collector._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
