"""Which ranks are alive, as the store sees it: while a rank the collector wrote for has not ended,
the writer marks it heard (``Store.touch``) whenever the store has not heard from it for
``heartbeat_s`` seconds, so a live engine with nothing to record never reads 'lost'
(``v_run_summary``); a batch that ends a rank runs the run-end callback."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from specscope.collector._boundary import Key
from specscope.events import Event, RankStatus
from specscope.storage import Store

logger = logging.getLogger("specscope")

RunEnd = Callable[[Store, str], None]


class Liveness:
    """Live ranks and when the store last heard from each (writer thread only)."""

    def __init__(self, open_store: Callable[[], Store], heartbeat_s: float, on_run_end: RunEnd | None) -> None:
        self._open = open_store
        self.heartbeat_s = heartbeat_s
        self._on_run_end = on_run_end
        self._live: dict[Key, float] = {}

    def beat(self) -> None:
        """Mark heard each live rank the store has not heard from for ``heartbeat_s`` seconds."""
        now = time.monotonic()
        quiet = sorted(key for key, heard in self._live.items() if now - heard >= self.heartbeat_s)
        if not quiet:
            return
        try:
            self._open().touch(quiet)
        except Exception:  # noqa: BLE001 - a failing store is reported by the next batch's write
            return
        self._live.update(dict.fromkeys(quiet, now))

    def heard_from(self, events: Sequence[Event], keys: dict[Key, int]) -> None:
        """Track live ranks over committed ``events`` (``keys``: their counts per rank); run
        ``on_run_end`` for each run a rank ended."""
        now = time.monotonic()
        self._live.update((key, now) for key in keys if key[0] is not None)
        if RankStatus not in map(type, events):  # searched in C: the writer runs this per batch
            return
        ended: list[str] = []
        for event in events:
            if isinstance(event, RankStatus) and event.finished:
                self._live.pop((event.run_id, event.rank), None)
                ended.append(event.run_id)
        for run_id in dict.fromkeys(ended) if self._on_run_end is not None else ():
            try:
                self._on_run_end(self._open(), run_id)
            except Exception:  # noqa: BLE001 - the engine's events matter more than the verdict
                logger.exception("specscope collector: the run-end callback failed for run %r", run_id)
