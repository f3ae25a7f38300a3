"""What ``specscope watch`` remembers of each endpoint, run and series between scrapes, and one
series' window as the events that store it (:class:`Counted`). State changes that depend on a write
(:meth:`Endpoint.committed`) are applied only once the store took it."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specscope.adapters._watch_fetch import public_endpoint
from specscope.adapters.prometheus_metrics import (
    IncompleteReading,
    Reading,
    check_reading,
    window,
    window_groups,
)
from specscope.events import Event, RankStart, RankStatus, RunStart

logger = logging.getLogger("specscope.watch")

WATCH_REQUEST_ID = "watch"
"""``verify_steps.request_id`` of watched rows: a server's counters do not name requests."""


@dataclass
class Series:
    """One series of an endpoint (engine, model, rank labels): ``kept`` the reading its next window
    counts from; ``skipping`` while it gives no good window (said once); ``rebased`` once it was
    counted on from a later reading in that streak (said once)."""

    kept: Reading | None = None
    skipping: bool = False
    rebased: bool = False

    def skip(self, shown: str, why: Exception) -> None:
        """Skip the series this scrape: one warning until it gives a good window again."""
        if not self.skipping:
            logger.warning("watch: %s: skipping a series (%s)", shown, why)
            self.skipping = True


@dataclass
class Run:
    """A watched run: ``start`` its RunStart, ``ranks`` rank labels -> rank (numbered in order of
    appearance); ``stored`` True once its start is stored, ``stored_ranks`` the ranks whose start is."""

    start: RunStart
    ranks: dict[tuple, int] = field(default_factory=dict)
    stored: bool = False
    stored_ranks: set[int] = field(default_factory=set)

    @property
    def run_id(self) -> str:
        return self.start.run_id


@dataclass
class Counted:
    """One series' window at one scrape: ``events`` store it (with the run's and rank's start while
    those are not stored); once they are, ``reading`` is what the next window counts from. ``run``
    None: nothing to store, the series counts on from ``reading``."""

    series: Series
    reading: Reading
    run: Run | None = None
    rank: int = 0
    events: list[Event] = field(default_factory=list)
    steps: int = 0


@dataclass
class Endpoint:
    """One watched endpoint: ``answered`` once past its baseline (its first answer), ``down`` while in
    a gap (said once), ``dropping`` while its answers drop something (said once), ``error`` the last
    gap's error."""

    url: str
    session: str
    answered: bool = False
    down: bool = False
    dropping: bool = False
    error: str = ""
    series: dict[tuple, Series] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        return public_endpoint(self.url)

    def stored_ranks(self) -> list[tuple[str, int]]:
        """``(run_id, rank)`` of every rank stored so far."""
        return [(run.run_id, rank) for run in self.runs.values() for rank in sorted(run.stored_ranks)]

    def count(self, readings: list[Reading], now: float) -> list[Counted]:
        """The window of every series that gives one this scrape (the others are skipped, each with
        one warning)."""
        world = Counter((r.engine, r.model) for r in readings)  # rank label sets per run in this scrape
        counted = (self._count(r, world[(r.engine, r.model)], now) for r in readings)
        return [c for c in counted if c is not None]

    def committed(self, counted: Counted) -> bool:
        """Remember a stored window; True when it stored its run's start (a new run)."""
        counted.series.kept = counted.reading
        run = counted.run
        if run is None:
            return False
        counted.series.skipping = counted.series.rebased = False
        new, run.stored = not run.stored, True
        run.stored_ranks.add(counted.rank)
        return new

    def say_dropped(self, dropped: tuple[str, ...]) -> None:
        """One warning when answers start to drop series or lines."""
        if dropped and not self.dropping:
            logger.warning("watch: %s: dropped %s", self.shown, "; ".join(dropped))
        self.dropping = bool(dropped)

    def _count(self, reading: Reading, world_size: int, now: float) -> Counted | None:
        series = self.series.setdefault((reading.engine, reading.model, reading.labels), Series())
        previous = None if not self.answered else series.kept or Reading(reading.engine, reading.model,
                                                                          reading.labels)
        try:
            check_reading(reading)
        except ValueError as exc:
            series.skip(self.shown, exc)
            return None
        run_id = self._run_id(reading)
        run = self.runs.get(run_id)
        ranks = {} if run is None else run.ranks
        rank = ranks.get(reading.labels, len(ranks))
        try:
            groups = window_groups(window(previous, reading), run_id=run_id, request_id=WATCH_REQUEST_ID,
                                   rank=rank, ts_wall=now)
        except IncompleteReading as exc:
            series.skip(self.shown, exc)
            return None
        except ValueError as exc:  # a window no engine produces, or one no store row holds
            return self._impossible(series, reading, previous, exc)
        if run is None:
            run = self.runs[run_id] = Run(self._run_start(run_id, reading, world_size, now))
        run.ranks[reading.labels] = rank
        events: list[Event] = [] if run.stored else [run.start]
        if rank not in run.stored_ranks:
            events.append(RankStart(run_id, rank, world_size=world_size, host=urlsplit(self.shown).netloc,
                                    pid=0, device=",".join(f"{k}={v}" for k, v in reading.labels)[:64],
                                    ts_wall=now))
        events += groups
        events.append(RankStatus(run_id, rank, 0, 0, "eager", finished=False, ts_wall=now))
        return Counted(series, reading, run, rank, events, sum(g.steps for g in groups))

    def _impossible(self, series: Series, reading: Reading, previous: Reading | None,
                    exc: ValueError) -> Counted | None:
        """A window that is no engine's: skipped; twice in a row, the kept reading is what is off (a
        counter that vanished and came back), so the series counts on from this one."""
        again = series.skipping and previous is not None
        if again and not series.rebased:
            logger.warning("watch: %s: a series still gives windows no engine produces (%s); "
                           "counting it from its current reading", self.shown, exc)
            series.rebased = True
        series.skip(self.shown, exc)
        return Counted(series, reading) if again else None

    def _run_id(self, reading: Reading) -> str:
        digest = hashlib.sha1(f"{self.url}|{reading.engine}|{reading.model}|{self.session}".encode())
        return f"watch-{digest.hexdigest()[:12]}"

    def _run_start(self, run_id: str, reading: Reading, world_size: int, now: float) -> RunStart:
        shown = self.shown
        k = len(reading.positions.get("accepted_pos", {})) or None
        return RunStart(run_id, engine=reading.engine, engine_version="", target_model=reading.model or shown,
                        draft_model="", config={"source": "prometheus", "endpoint": shown, "k": k},
                        world_size=world_size, host=urlsplit(shown).netloc, ts_wall=now)
