"""The in-process sink: the engine thread appends events, a background thread writes them in batches.

Design (DESIGN.md sections 2 and 9): ``emit`` is a bounds check and a ``deque.append`` (atomic in
CPython, no lock, never waits on the database); the writer thread takes up to ``batch_size`` events
off the deque and writes them in ONE store transaction together with the per-(run, rank) written /
dropped counters. ``flush`` enqueues a marker and waits for the writer to reach it, so FIFO order is
the whole synchronisation. ``capacity`` bounds the events held, queued or being written (checked
without a lock: concurrent emitters can overshoot it by at most one event each); beyond it ``emit``
drops and counts. A failing store (locked, unwritable, unreachable) costs the failed batch, counted as
dropped, and one logged error per outage; the writer goes on with the next batch, so it recovers
when the store does.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import deque
from collections.abc import Sequence

from specscope.errors import ConfigError
from specscope.events import Event
from specscope.storage import Store, open_store

logger = logging.getLogger("specscope")

Key = tuple[str, int]  # (run_id, rank)


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

    Raises:
        ConfigError: capacity or batch_size below 1, or flush_interval_s not positive.

    Attributes (read at any time, from any thread):
        written: events committed to the store.
        dropped: events lost: refused by a full buffer, emitted after close, or in a failed batch.
        write_errors: failed write attempts (a failed batch counts once).

    Usable as a context manager; also flushed and closed at interpreter exit (``atexit``) until closed.
    """

    def __init__(self, store: Store | str, *, capacity: int = 100_000, batch_size: int = 5_000,
                 flush_interval_s: float = 1.0) -> None:
        if capacity < 1 or batch_size < 1 or flush_interval_s <= 0:
            raise ConfigError(f"collector needs capacity >= 1, batch_size >= 1 and flush_interval_s > 0"
                              f", got {capacity}, {batch_size}, {flush_interval_s}")
        self._store = store if isinstance(store, Store) else None
        self._store_url = None if isinstance(store, Store) else str(store)
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self.written = 0
        self.dropped = 0
        self.write_errors = 0
        self._queue: deque[Event | _FlushMarker] = deque()
        self._in_flight = 0  # events taken off the queue and not yet handled (writer thread only)
        self._wake = threading.Event()
        self._closing = False
        self._closed = False
        self._drop_lock = threading.Lock()  # guards dropped and _emit_drops (the rare path)
        self._emit_drops: dict[Key, int] = {}
        # Writer thread only: drops not yet committed to run_ranks, failures since the last marker.
        self._pending_drops: dict[Key, int] = {}
        self._failed_since_marker = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="specscope-collector", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def emit(self, event: Event) -> None:
        """Queue one event for writing (about a microsecond). Never blocks on the store and never
        raises; when ``capacity`` events are held, or after close, the event is dropped and counted
        for its (run_id, rank)."""
        queue = self._queue
        if self._closed or len(queue) + self._in_flight >= self._capacity:
            self._drop(event)
            return
        queue.append(event)
        if len(queue) == self._batch_size:
            self._wake.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every event emitted before this call has been written or dropped.

        Returns:
            True when all of them were committed (the store holds them, durably); False when the
            timeout (seconds) expired first, the collector is closed with events left, or a write of
            any event emitted since the previous flush failed.
        """
        if not self._thread.is_alive():  # closed: nothing can be written any more
            return all(isinstance(item, _FlushMarker) for item in self._queue)
        marker = _FlushMarker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout_s) and marker.committed

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the writer thread and close a store this collector opened. Idempotent;
        events emitted afterwards are dropped and counted."""
        atexit.unregister(self.close)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._store_url is not None and self._store is not None and not self._thread.is_alive():
            self._store.close()

    def _drop(self, event: Event) -> None:
        key = (getattr(event, "run_id", None), getattr(event, "rank", 0))
        with self._drop_lock:
            self.dropped += 1
            self._emit_drops[key] = self._emit_drops.get(key, 0) + 1

    # --- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        queue = self._queue
        while True:
            self._wake.clear()
            if not queue and not self._closing:
                self._wake.wait(self._interval)
            chunk: list[Event] = []
            marker = None
            while queue and len(chunk) < self._batch_size:
                item = queue.popleft()
                if isinstance(item, _FlushMarker):
                    marker = item
                    break
                chunk.append(item)
                self._in_flight += 1
            if not self._write(chunk) and chunk:
                self._failed_since_marker = True
            self._in_flight = 0
            if marker is not None:
                marker.committed = not self._failed_since_marker
                self._failed_since_marker = False
                marker.done.set()
            if self._closing and (not queue or self._failing):
                self._closed = True  # emit() drops from now on: nobody would write it
                self._abandon()  # a failing store at close: do not hold the process up per batch
                return

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

    def _write(self, chunk: Sequence[Event]) -> bool:
        """Write one batch with the pending counters in one transaction; False when it failed."""
        with self._drop_lock:
            emit_drops, self._emit_drops = self._emit_drops, {}
        _add(self._pending_drops, emit_drops)
        if not chunk and not self._pending_drops:
            return True
        written: dict[Key, int] = {}
        try:
            for event in chunk:
                key = (event.run_id, event.rank)
                written[key] = written.get(key, 0) + 1
            counters = {key: (written.get(key, 0), self._pending_drops.get(key, 0))
                        for key in written.keys() | self._pending_drops.keys()}
            self._open().write(chunk, counters=counters)
        except Exception as exc:  # StoreError, or a bug: either way the writer thread must live on
            self._failed(written, len(chunk), exc)
            return False
        self._pending_drops.clear()
        self.written += len(chunk)
        if self._failing:
            self._failing = False
            logger.info("specscope collector: store %s writable again", self._describe())
        return True

    def _failed(self, lost: dict[Key, int], count: int, exc: Exception) -> None:
        self.write_errors += 1
        with self._drop_lock:
            self.dropped += count
        _add(self._pending_drops, lost)
        if not self._failing:  # one error per outage, not one per batch
            self._failing = True
            logger.error("specscope collector: cannot write to store %s (%s); dropping events and "
                         "retrying with later batches", self._describe(), exc)

    def _open(self) -> Store:
        if self._store is None:
            self._store = open_store(self._store_url)
        return self._store

    def _describe(self) -> str:
        return self._store.url if self._store is not None else str(self._store_url)


def _add(into: dict[Key, int], counts: dict[Key, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count
