"""The in-process sink: the engine thread appends events, a background thread writes them in batches.

Design (DESIGN.md sections 2 and 9; the prometheus ``collect()`` habit of copying under the lock and
working outside it): ``emit`` appends to a list under a lock held for a few instructions and never
waits on the database; the writer thread swaps the list out under the lock and writes each batch in
ONE store transaction together with the per-(run, rank) written / dropped counters. ``capacity`` bounds
every event held, queued or being written; beyond it ``emit`` drops and counts. A failing store (locked,
unwritable, unreachable) costs the failed batch, counted as dropped, and one logged error per outage;
the writer retries with the next batch, so it recovers when the store does.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Sequence

from specscope.errors import ConfigError
from specscope.events import Event
from specscope.storage import Store, open_store

logger = logging.getLogger("specscope")

Key = tuple[str, int]  # (run_id, rank)


class Collector:
    """The sink instrumentation emits into: ``emit(event)``, ``flush()``, ``close()``.

    Args:
        store: an open :class:`~specscope.storage.Store` (left open by :meth:`close`), or a path / URL
            that the writer thread opens (creating the store) and closes; opening it never raises
            here: a store that cannot be opened is handled like one that cannot be written.
        capacity: most events held in memory (queued plus the batch being written).
        batch_size: most events per write transaction.
        flush_interval_s: longest time (seconds) an event waits before the writer picks it up.

    Raises:
        ConfigError: capacity or batch_size below 1, or flush_interval_s not positive.

    Attributes (read at any time, from any thread):
        written: events committed to the store.
        dropped: events lost: refused by a full buffer, emitted after close, or in a failed batch.
        write_errors: failed write attempts (a failed batch counts once).

    Usable as a context manager; also flushed at interpreter exit until closed.
    """

    def __init__(self, store: Store | str, *, capacity: int = 100_000, batch_size: int = 5_000,
                 flush_interval_s: float = 0.2) -> None:
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
        # Guarded by _cond: the buffer, events held, sequence numbers, drops not yet recorded.
        self._cond = threading.Condition(threading.Lock())
        self._buffer: list[Event] = []
        self._held = 0
        self._accepted = 0  # sequence number of the last event emit() accepted
        self._processed = 0  # sequence number of the last event the writer committed or dropped
        self._lost: list[list[int]] = []  # [first, last] sequence ranges lost to failed writes
        self._acknowledged = 0  # every flush before this sequence number has returned
        self._emit_drops: dict[Key, int] = {}
        self._wake = False
        self._closing = False
        self._closed = False
        # Owned by the writer thread: drops not yet committed to run_ranks.events_dropped.
        self._pending_drops: dict[Key, int] = {}
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="specscope-collector", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def emit(self, event: Event) -> None:
        """Queue one event for writing. Never blocks on the store and never raises; when
        ``capacity`` events are held, the event is dropped and counted for its (run_id, rank)."""
        with self._cond:
            if self._held < self._capacity and not self._closed:
                self._buffer.append(event)
                self._held += 1
                self._accepted += 1
                if len(self._buffer) == self._batch_size:
                    self._cond.notify_all()
                return
            self.dropped += 1
            key = _key(event)
            self._emit_drops[key] = self._emit_drops.get(key, 0) + 1

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every event accepted before this call has been written or dropped.

        Returns:
            True when all of them were committed (the store holds them, durably); False when the
            timeout (seconds) expired first or a write of any of them failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            target, since = self._accepted, self._acknowledged
            self._wake = True
            self._cond.notify_all()
            while self._processed < target:
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining)
            committed = not any(first <= target and last > since for first, last in self._lost)
            self._acknowledged = max(self._acknowledged, target)
            self._lost = [r for r in self._lost if r[1] > self._acknowledged]
            return committed

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the writer thread and close a store this collector opened. Idempotent;
        events emitted afterwards are dropped and counted."""
        atexit.unregister(self.close)
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._store_url is not None and self._store is not None and not self._thread.is_alive():
            self._store.close()

    # --- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._buffer and not self._closing and not self._wake:
                    self._cond.wait(self._interval)
                self._wake = False
                batch, self._buffer = self._buffer, []
                drops, self._emit_drops = self._emit_drops, {}
                first = self._processed + 1
                closing = self._closing
            _add(self._pending_drops, drops)
            for start in range(0, max(len(batch), 1), self._batch_size):
                chunk = batch[start:start + self._batch_size]
                ok = self._write(chunk)
                with self._cond:
                    if not ok and chunk:
                        self._record_loss(first + start, first + start + len(chunk) - 1)
                    self._held -= len(chunk)
                    self._processed += len(chunk)
                    self._cond.notify_all()
            if closing:
                with self._cond:
                    if not self._buffer:
                        self._closed = True  # from now on emit() drops: nobody would write it
                        return

    def _record_loss(self, first: int, last: int) -> None:
        if self._lost and self._lost[-1][1] == first - 1:
            self._lost[-1][1] = last  # consecutive failed batches: one range per outage
        else:
            self._lost.append([first, last])

    def _write(self, chunk: Sequence[Event]) -> bool:
        """Write one batch with the pending counters in one transaction; False when it failed."""
        written: dict[Key, int] = {}
        for event in chunk:
            key = _key(event)
            written[key] = written.get(key, 0) + 1
        if not chunk and not self._pending_drops:
            return True
        counters = {key: (written.get(key, 0), self._pending_drops.get(key, 0))
                    for key in written.keys() | self._pending_drops.keys()}
        try:
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
        with self._cond:
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


def _key(event: Event) -> Key:
    return (getattr(event, "run_id", None), getattr(event, "rank", 0))


def _add(into: dict[Key, int], counts: dict[Key, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count
