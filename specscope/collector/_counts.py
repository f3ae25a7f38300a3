"""What the collector wrote and lost, per (run_id, rank), until the store holds the counts
(``run_ranks.events_written`` / ``events_dropped``)."""

from __future__ import annotations

import operator
import threading
from collections import Counter
from collections.abc import Sequence

from specscope.collector._boundary import Key
from specscope.events import Event

Counters = dict[Key, tuple[int, int]]  # (run_id, rank) -> (written, dropped) increments


class Tally:
    """The collector's totals, read from any thread, and the drops the writer has not taken yet.

    Any thread drops (``emit`` on a full buffer, after close or for a refused event; the writer for a
    failed or rejected batch), so ``dropped``, ``rejected`` and the drops per rank change under one
    lock; ``written``, ``write_errors`` and ``last_error`` only the writer changes."""

    def __init__(self) -> None:
        self.written = 0
        self.dropped = 0
        self.rejected = 0
        self.write_errors = 0
        self.last_error: Exception | None = None
        self._lock = threading.Lock()
        self._drops: dict[Key, int] = {}
        self._reported = 0  # `dropped` as the last new_drops() saw it

    def drop(self, count: int, per_key: dict[Key, int] | None = None, *, rejected: bool = False) -> None:
        """Count ``count`` events lost; ``per_key``: those of them the store can count per rank."""
        with self._lock:
            self.dropped += count
            if rejected:
                self.rejected += count
            add(self._drops, per_key or {})

    def take_drops(self) -> dict[Key, int]:
        """The drops per rank counted since the previous call."""
        with self._lock:
            drops, self._drops = self._drops, {}
        return drops

    def new_drops(self) -> bool:
        """Whether events were dropped since the previous call."""
        with self._lock:
            seen, self._reported = self._reported, self.dropped
        return self.dropped != seen


class Pending:
    """Counts not yet committed to run_ranks (writer thread only): they go with the next batch."""

    def __init__(self) -> None:
        self.written: dict[Key, int] = {}
        self.dropped: dict[Key, int] = {}

    def collect(self, tally: Tally) -> None:
        add(self.dropped, tally.take_drops())

    def counters(self, written: dict[Key, int]) -> Counters:
        """The run_ranks increments: ``written`` plus what is pending."""
        totals = dict(self.written)
        add(totals, written)
        return {key: (totals.get(key, 0), self.dropped.get(key, 0)) for key in totals.keys() | self.dropped.keys()}

    def clear(self) -> None:
        self.written.clear()
        self.dropped.clear()


def add(into: dict[Key, int], counts: dict[Key, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


_KEY = operator.attrgetter("run_id", "rank")


def per_key(events: Sequence[Event]) -> dict[Key, int]:
    """Events per (run_id, rank), counted in C (Counter over attrgetter): the writer runs it per batch."""
    return dict(Counter(map(_KEY, events)))
