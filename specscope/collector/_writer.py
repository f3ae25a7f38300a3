"""The collector's writer thread: batches off the queue, each written with the per-rank counters in
ONE store transaction; bounded backoff while the store fails; what the database refuses set aside
(:mod:`._quarantine`); live ranks kept heard (:mod:`._liveness`)."""

from __future__ import annotations

import logging
import operator
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice, repeat, starmap

from specscope.collector._boundary import Key
from specscope.collector._counts import Pending, Tally, add, per_key
from specscope.collector._liveness import Liveness, RunEnd
from specscope.collector._quarantine import bisect, write_counters
from specscope.errors import EventRejected
from specscope.events import Event, RankStart, RunStart
from specscope.storage import Store, open_store

logger = logging.getLogger("specscope")

KEPT_ON_FAILURE = (RunStart, RankStart)
"""Events of a failed batch kept for the next attempt instead of dropped: each is sent once, at the
start (a store down or locked when the engine starts costs the first batch), and holds what the doctor
reads a run's contract and ranks from; a few per run, so keeping them costs no memory to speak of."""

FIRST_BACKOFF_S = 0.05  # wait after the first failed write; doubled per failure in a row
MAX_BACKOFF_S = 2.0  # longest wait between two write attempts on a failing store (seconds)


LIVE_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()
"""Every writer whose thread may still run, whatever became of its collector: a collector closed with
a timeout and dropped leaves its writer finishing a write, which a fork must still wait for (the
thread holds its writer)."""


class FlushMarker:
    """Placed in the queue by flush(); the writer sets ``done`` once everything before it is handled."""

    __slots__ = ("done", "committed")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.committed = True


class StoreHandle:
    """The store written to: given open (left open), or a path / URL opened on first write (and closed)."""

    def __init__(self, store: Store | str) -> None:
        self.store = store if isinstance(store, Store) else None
        self._url = None if isinstance(store, Store) else str(store)

    def open(self) -> Store:
        if self.store is None:
            self.store = open_store(self._url)
        return self.store

    def describe(self) -> str:
        return self.store.url if self.store is not None else str(self._url)

    def after_fork(self) -> None:
        """In a forked child: the parent's pooled connections must not be used here."""
        if self._url is not None:
            self.store = None
        elif self.store is not None:
            self.store.after_fork()

    def close(self) -> None:
        if self._url is not None and self.store is not None:
            self.store.close()


class Writer:
    """One writer thread over ``queue`` (events and :class:`FlushMarker`); started at construction.

    Shared with the emitting threads: ``queue``, ``wake``, ``stop``, ``closing`` (no more writing
    once set), ``closed`` (set under ``lock`` when the thread ends), ``lossy`` (events were lost at
    or after close). A batch stays at the head of ``queue`` until it is handled, so the queue's length
    is every event held (what ``emit`` checks against the capacity) and only this thread pops it.

    Only this thread uses the store (it closes a store it opened as it ends), always holding
    ``in_store``: ``os.fork`` holds it over the fork, so a child never inherits the database's state
    halfway through an operation (``_collector``'s fork hooks). With ``usable=False`` (a forked child
    that must not touch the store) the writer is closed from the start and runs no thread: what is
    emitted is dropped and counted."""

    def __init__(self, handle: StoreHandle, tally: Tally, *, batch_size: int, interval_s: float,
                 heartbeat_s: float, decode: Callable[[Event], Event] | None, on_run_end: RunEnd | None,
                 usable: bool = True) -> None:
        self.queue: deque[Event | FlushMarker] = deque()
        self.wake = threading.Event()
        self.stop = threading.Event()  # set by close(): cuts a backoff wait short
        self.lock = threading.Lock()  # serialises flush()'s marker with the writer's shutdown
        self.in_store = threading.Lock()  # held by this thread while it uses the store, and over a fork
        self.closing = self.closed = not usable
        self.lossy = False
        self._handle = handle
        self._tally = tally
        self._batch_size = batch_size
        self._interval = interval_s
        self._decode = decode
        self._liveness = Liveness(handle.open, heartbeat_s, on_run_end)
        self._pending = Pending()
        self._kept: list[Event] = []  # KEPT_ON_FAILURE events of failed batches, written before the next
        self._failed_since_marker = False
        self._failing = False
        self._backoff_s = FIRST_BACKOFF_S
        self._logged_rejection = False
        self._logged_bug = False
        self.thread = threading.Thread(target=self._run, name="specscope-collector", daemon=True)
        if usable:
            LIVE_WRITERS.add(self)
            self.thread.start()

    def mark(self) -> FlushMarker | None:
        """Queue a flush marker; None when the thread has ended (nothing more can be written)."""
        with self.lock:
            if self.closed:
                return None
            marker = FlushMarker()
            self.queue.append(marker)
        self.wake.set()
        return marker

    def join(self, timeout_s: float | None) -> None:
        """Wait for the thread to end (at once when it never started)."""
        if self.thread.is_alive():
            self.thread.join(timeout_s)

    def unwritten(self) -> int:
        """Events queued or being written."""
        return sum(not isinstance(item, FlushMarker) for item in list(self.queue))

    def abandon(self) -> None:
        """Count what is still queued as dropped and answer its markers (nothing will write them)."""
        lost, self._kept = len(self._kept), []
        while self.queue:
            item = self.queue.popleft()
            if isinstance(item, FlushMarker):
                item.committed = False
                item.done.set()
            else:
                lost += 1
        self._tally.drop(lost)
        if lost:
            self.lossy = True

    def _run(self) -> None:
        try:
            self._loop()
        finally:  # also when the loop died of a bug: no flush may wait forever
            with self.lock:
                self.closing = self.closed = True  # emit() drops from now on: nobody would write it
            self.abandon()
            with self.in_store:  # by its last user: close() may stop waiting for this thread
                self._handle.close()

    def _loop(self) -> None:
        queue = self.queue
        while True:
            self.wake.clear()
            if not queue and not self.closing:
                # A flush period longer than the heartbeat (watch holds a scrape's events until its
                # flush) still marks live ranks heard while it waits, and writes nothing early.
                until = time.monotonic() + self._interval
                while not self.wake.wait(max(0.0, min(self._liveness.heartbeat_s, until - time.monotonic()))):
                    if time.monotonic() >= until:
                        break
                    self._beat()
            chunk, marker = self._head()
            try:
                committed = self._handle_batch(chunk)
            finally:  # popped in C, as _head copies them
                deque(starmap(queue.popleft, repeat((), len(chunk) + (marker is not None))), maxlen=0)
            if not committed and chunk:
                self._failed_since_marker = True
            if marker is not None:
                marker.committed = not self._failed_since_marker
                self._failed_since_marker = False
                marker.done.set()
            if self.closing and (not queue or self._failing):
                if self._failed_since_marker:
                    self.lossy = True
                return  # a failing store at close: do not hold the process up per batch
            if self._failing:  # bounded backoff: no retry storm against a store that is down
                self.stop.wait(self._backoff_s)
                self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)

    def _head(self) -> tuple[list[Event], FlushMarker | None]:
        """The next batch, left queued: up to ``batch_size`` events from the head of the queue, and
        the flush marker that ends it early, if any. Copied and searched in C (``islice``,
        ``indexOf``): a loop in Python per event cost the writer a tenth of its time."""
        chunk = list(islice(self.queue, self._batch_size))
        try:
            end = operator.indexOf(map(type, chunk), FlushMarker)
        except ValueError:
            return chunk, None
        return chunk[:end], chunk[end]

    def _handle_batch(self, chunk: list[Event]) -> bool:
        """Decode and write ``chunk`` (after what failed batches kept); False when any of it failed."""
        if self._kept:
            chunk, self._kept = [*self._kept, *chunk], []
        try:
            if self._decode is not None:
                chunk = [self._decode(event) for event in chunk]
            with self.in_store:  # not around the decoding: a fork need not wait for the tokenizer
                return self._write(chunk)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost this batch, not the writer
            self._lost(chunk, exc)
            return False

    def _beat(self) -> None:
        with self.in_store:
            self._liveness.beat()

    def _write(self, chunk: Sequence[Event]) -> bool:
        """Write one batch with the pending counters in one transaction; False when any of it failed."""
        self._pending.collect(self._tally)
        if not chunk and not self._pending.dropped:
            self._liveness.beat()
            return True
        written = per_key(chunk)
        try:
            self._handle.open().write(chunk, counters=self._pending.counters(written))
        except EventRejected as exc:
            return self._quarantine(chunk, exc)
        except Exception as exc:  # StoreError, or a bug: either way the writer thread must live on
            self._kept = [event for event in chunk if isinstance(event, KEPT_ON_FAILURE)]
            lost = [event for event in chunk if not isinstance(event, KEPT_ON_FAILURE)] if self._kept else chunk
            self._failed(per_key(lost), len(lost), exc)
            return False
        self._committed(len(chunk))
        self._liveness.heard_from(chunk, written)
        self._liveness.beat()  # a busy writer may be busy for other ranks only
        return True

    def _quarantine(self, chunk: Sequence[Event], rejection: EventRejected) -> bool:
        """Drop and count only the events the database refuses; False: something was dropped."""
        store = self._handle.open()
        good, bad, failure = bisect(store, chunk, rejection)
        for event, exc in bad:
            self._rejected(event, exc)
        if failure is not None:
            lost, exc = failure
            self._failed(per_key(lost), len(lost), exc)
        self._tally.drop(len(bad), per_key([event for event, _ in bad]), rejected=True)
        self._tally.written += len(good)
        written = per_key(good)
        self._liveness.heard_from(good, written)
        self._pending.collect(self._tally)
        try:  # the counters of what did commit, and of the rejected events
            write_counters(store, self._pending.counters(written), self._rejected_counters)
        except Exception as exc:  # noqa: BLE001 - kept pending: they go with the next batch
            add(self._pending.written, written)
            self._failed({}, 0, exc)
        else:
            self._pending.clear()
        return False

    def _committed(self, count: int) -> None:
        self._pending.clear()
        self._tally.written += count
        self._backoff_s = FIRST_BACKOFF_S
        if self._failing:
            self._failing = False
            logger.info("specscope collector: store %s writable again", self._handle.describe())

    def _failed(self, lost: dict[Key, int], count: int, exc: Exception) -> None:
        self._tally.last_error = exc
        self._tally.write_errors += 1
        self._tally.drop(count, lost)
        if not self._failing:  # one error per outage, not one per batch
            self._failing = True
            logger.error("specscope collector: cannot write to store %s (%s); dropping events and "
                         "retrying with later batches, waiting up to %g s between attempts",
                         self._handle.describe(), exc, MAX_BACKOFF_S)

    def _rejected(self, event: Event, exc: Exception) -> None:
        if not self._logged_rejection:  # once per collector: a bad producer would flood the log
            self._logged_rejection = True
            logger.error("specscope collector: store %s rejected a %s event of run %r (%s); it is "
                         "dropped, the rest of its batch is written; later rejections are only counted",
                         self._handle.describe(), event.kind, event.run_id, exc)

    def _rejected_counters(self, key: Key, exc: EventRejected) -> None:
        if not self._logged_rejection:
            self._logged_rejection = True
            logger.error("specscope collector: store %s refused the counters of run %r rank %r (%s); "
                         "they are not recorded", self._handle.describe(), key[0], key[1], exc)

    def _lost(self, chunk: Sequence[Event], exc: Exception) -> None:
        self._tally.drop(len(chunk))
        if not self._logged_bug:
            self._logged_bug = True
            logger.error("specscope collector: writing a batch failed unexpectedly (%s: %s); its %d "
                         "event(s) are dropped, the writer goes on", type(exc).__name__, exc, len(chunk),
                         exc_info=exc)
