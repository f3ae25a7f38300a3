"""What ``Collector.emit`` accepts: a specscope event the store can count under its (run_id, rank).

Checked on the engine thread before queueing, so a few type checks and comparisons, never raising:
one malformed event must cost only itself (an unhashable or NaN run_id would otherwise break the
writer's per-rank counters for every event after it).
"""

from __future__ import annotations

import reprlib
from typing import get_args

from specscope.events import MAX_COUNT, Event, Finding, RankStart, RunStart

Key = tuple[str, int]  # (run_id, rank): a run_ranks row
_TYPES = frozenset(get_args(Event))
_SIZED = (RunStart, RankStart)  # events that carry the run's world_size
_PLAIN = _TYPES - {*_SIZED, Finding}  # events with a run_id, a rank and a time and nothing else to check
_TIMES = (float, int)


def key_of(event: object) -> Key | None:
    """``event``'s (run_id, rank), or None when it is no specscope event or they cannot name a
    run_ranks row."""
    if type(event) not in _TYPES or not (_run_id_ok(event) and _count(event.rank, 0)):
        return None
    return event.run_id, event.rank


def refusal(event: object) -> str | None:
    """Why the collector cannot take ``event`` (one line), or None when it can."""
    if type(event) in _PLAIN:  # the hot path: exact types, about 100 ns
        run_id, rank = event.run_id, event.rank
        if type(run_id) is str and type(rank) is int and 0 <= rank <= MAX_COUNT and type(event.ts_wall) in _TIMES:
            return None
    return _refusal(event)


def _refusal(event: object) -> str | None:
    if type(event) not in _TYPES:
        return f"{type(event).__name__!r} is not a specscope event"
    if not _run_id_ok(event):
        return f"run_id {reprlib.repr(event.run_id)} is not a string"
    rank = event.rank
    if not _count(rank, 0):
        return f"rank {reprlib.repr(rank)} is not an int in 0..{MAX_COUNT}"
    if isinstance(event, _SIZED) and not _count(event.world_size, 1):
        return f"world_size {reprlib.repr(event.world_size)} is not an int in 1..{MAX_COUNT}"
    if not isinstance(event.ts_wall, _TIMES) or isinstance(event.ts_wall, bool):
        # every reader does arithmetic on it (run start, per-second acceptance); SQLite would store text
        return f"ts_wall {reprlib.repr(event.ts_wall)} is not a number (seconds since the epoch)"
    return None


def _run_id_ok(event: Event) -> bool:
    """A string; None only on a Finding about no run (a standalone inspection)."""
    return isinstance(event.run_id, str) or (event.run_id is None and type(event) is Finding)


def _count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_COUNT
