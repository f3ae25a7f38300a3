"""``specscope watch``: observe a serving engine through its Prometheus endpoint, with no hooks in it
(a producer like the other adapters: it writes through a :class:`~specscope.collector.Collector`).

Design (the one chosen over a separate table of scraped samples): each scrape's counter increases are
written as ordinary runs, ranks and :class:`~specscope.events.VerifyGroup` rows of ``verify_steps``
(one row per scrape interval, rank and accepted mask, ``steps`` = the verify steps it stands for). The
acceptance formulas stay defined once, in the store's views, and the Overview and GPUs pages,
``specscope query`` and the doctor's acceptance rules (ACCEPT_COLLAPSE, POSITION0_LOW,
RANK_DIVERGENCE, ACCEPT_SATURATED) read a watched server exactly as an instrumented one, unchanged.

- One run per endpoint, engine and model label, per watch session (``run_id`` derived from them and
  the session's start); one rank per distinct rank label set (vLLM ``engine``, SGLang ``tp_rank`` /
  ``pp_rank`` / ``dp_rank``), numbered in order of appearance; its labels are the rank's ``device``.
- An endpoint's first answer is its baseline (no rows), as Prometheus ``rate()`` needs two samples; a
  series or a per-position counter that appears after it was created since, at 0 (llama.cpp creates
  its per-position counters at the first draft), so its first window counts whole. A counter below
  its previous value, or a per-position counter that vanished, is a reset (server restart): the series
  counts from 0. A reading that lacks one of the series' steps / proposed / accepted counters without
  a reset (a cut-off answer) is skipped: the next complete one counts the whole increase. A series
  whose window from the kept reading is no engine's twice in a row counts on from its current reading.
- An endpoint that is down or answers garbage is a gap: one warning line when the gap starts, no rows
  while it lasts, a counter increase spanning the gap once it answers again (cumulative counters lose
  nothing unless the server also restarted during the gap).
- What a server sends is untrusted: endpoints are fetched concurrently, each within ``timeout_s`` in
  all (connect, headers and body: a server trickling bytes cannot hold a scrape), with its body capped
  at ``max_bytes`` as sent and as decompressed (the decoder inflates one network read at a time, so
  a compressed bomb costs at most one read's inflation before it is refused). A series with a value
  that is not a count (:func:`~specscope.adapters.prometheus_metrics.check_reading`) or a window no engine produces is
  skipped alone (one warning line per series), the endpoint's other series are stored.
- Writes go through a collector (its heartbeat keeps a watched run from reading 'lost' while an
  endpoint is down, and its run end stores the doctor's verdict: docs/design.md, "Reading a run"),
  one transaction per endpoint and scrape: the collector's writer wakes only for the scrape's flush,
  which hands it every event of the scrape as one batch, so a refused write stores nothing of it
  and the watch keeps its state, and the next scrape stores the whole increase.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from specscope.adapters.prometheus_metrics import (
    IncompleteReading,
    Reading,
    check_reading,
    parse_exposition,
    window,
    window_groups,
)
from specscope.collector import Collector
from specscope.errors import StoreError
from specscope.events import Event, RankStart, RankStatus, RunStart
from specscope.readmodel import store_verdict
from specscope.storage import Store

logger = logging.getLogger("specscope.watch")

MAX_BYTES = 16 << 20
"""Default cap of one scrape's body (bytes, as sent and as decompressed); vLLM's exposition with its
histograms is a few hundred KB."""

MAX_EVENTS = 1_000_000
"""Most events one endpoint's scrape may write (one collector batch; a series gives at most a few)."""

HOLD_S = 3600.0
"""The collector's own flush period: longer than any scrape interval, so that only a scrape's flush
wakes its writer (and one scrape is never split over two transactions)."""

STOP_POLL_S = 0.1
"""How often a scrape waiting on endpoints checks whether the watch was stopped (seconds)."""

_STOPPED = asyncio.CancelledError("stopped")
"""The body of an endpoint whose fetch a stopped watch cut short."""

WATCH_REQUEST_ID = "watch"
"""``verify_steps.request_id`` of watched rows: a server's counters do not name requests."""


def normalize_endpoint(endpoint: str) -> str:
    """``host:port`` -> ``http://host:port/metrics``; a URL with a path is kept as given.

    Raises:
        ValueError: no host, a scheme other than http / https, or a port that is not one.
    """
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    shown = public_endpoint(url)
    if not parts.hostname:
        raise ValueError(f"endpoint {shown!r} names no host")
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {shown!r}: Prometheus endpoints are http:// or https://, not {parts.scheme}://")
    try:
        parts.port  # noqa: B018 - urllib checks the port only when it is read
    except ValueError as exc:
        raise ValueError(f"endpoint {shown!r}: {exc}") from None
    return url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def public_endpoint(endpoint: str) -> str:
    """``endpoint`` as stored with a run: without user, password and query (tokens stay out of the
    store, where every reader of it would see them)."""
    parts = urlsplit(endpoint)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


@dataclass(frozen=True)
class ScrapeResult:
    """One endpoint at one scrape: ``ok`` False for a gap (``error`` says why), ``verify_steps`` the
    steps stored from it, ``runs`` the run ids its series belong to."""

    endpoint: str
    ok: bool
    verify_steps: int = 0
    runs: tuple[str, ...] = ()
    error: str | None = None


class Watcher:
    """Scrapes Prometheus endpoints and stores their acceptance as runs of ``store``.

    Call :meth:`scrape` once per interval (the first call is the baseline) and :meth:`close` at the
    end (marks every watched rank finished, stores each run's verdict and stops the collector). ``timeout_s`` bounds one endpoint's whole scrape;
    ``max_bytes`` caps its body. The lead's real-vLLM check: scrape, serve requests, scrape, compare
    ``v_run_acceptance`` of :attr:`run_ids` with vLLM's own counter increases.

    Raises (constructor): ValueError for an endpoint without a host, or limits that are not positive.
    """

    def __init__(self, store: Store, endpoints: Sequence[str], *, timeout_s: float = 5.0,
                 max_bytes: int = MAX_BYTES) -> None:
        if not (timeout_s > 0 and max_bytes > 0):
            raise ValueError(f"watch needs timeout > 0 and max_bytes > 0, got {timeout_s}, {max_bytes}")
        self.store = store
        self.endpoints = [normalize_endpoint(e) for e in endpoints]
        self._sink = Collector(store, capacity=MAX_EVENTS, batch_size=MAX_EVENTS, flush_interval_s=HOLD_S,
                               on_run_end=store_verdict)
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._session = f"{time.time():.6f}"
        self._previous: dict[tuple, Reading] = {}
        self._answered: set[str] = set()  # endpoints past their baseline
        self._ranks: dict[str, dict[tuple, int]] = {}  # run id -> rank labels -> rank
        self._down: set[str] = set()
        self._bad_series: set[tuple] = set()  # series skipped since their last good window
        self._rebased: set[tuple] = set()  # of those, series counted on from a reading since (said once)
        self._closed = False
        self.run_ids: list[str] = []

    def scrape(self, stop: threading.Event | None = None) -> list[ScrapeResult]:
        """Scrape every endpoint once (concurrently) and write what changed since the previous scrape
        (one store transaction per endpoint). Never raises for an endpoint that is down, slow or
        answers garbage. Runs its own event loop: call it from synchronous code. ``stop`` set while
        it waits cuts the fetches still running short (a service manager's grace period is shorter
        than a slow endpoint's timeout): those endpoints store nothing this scrape (error "stopped").

        Raises:
            StoreError: the store refused the write; nothing of that endpoint's scrape is stored or
                remembered, so the next call stores the whole increase.
        """
        bodies = asyncio.run(self._fetch_all(stop))
        return [self._scrape(endpoint, body) for endpoint, body in zip(self.endpoints, bodies)]

    def close(self) -> None:
        """Mark every watched rank finished and stop the collector (idempotent).

        Raises:
            StoreError: the store refused the write.
        """
        if self._closed:
            return
        self._closed = True
        events: list[Event] = [RankStatus(run_id, rank, 0, 0, "eager", finished=True)
                               for run_id, ranks in self._ranks.items() for rank in ranks.values()]
        try:
            self._write(events)
        finally:
            self._sink.close()

    def _write(self, events: list[Event]) -> None:
        """Write ``events`` in one transaction through the collector.

        Raises:
            StoreError: nothing of them was stored (the collector's error), or too many to hold.
        """
        if len(events) > MAX_EVENTS:
            raise StoreError(f"a scrape gave {len(events)} events, over the {MAX_EVENTS} one write holds")
        failures, rejected = self._sink.write_errors, self._sink.rejected
        for event in events:
            self._sink.emit(event)
        if self._sink.flush():
            return
        if self._sink.write_errors > failures:
            raise StoreError(str(self._sink.last_error)) from self._sink.last_error
        # the store refused single events (set aside by the collector): the rest is stored
        logger.warning("watch: the store refused %d event(s) of a scrape; the rest is stored",
                       self._sink.rejected - rejected)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _fetch_all(self, stop: threading.Event | None) -> list[str | BaseException]:
        async with httpx.AsyncClient(timeout=self._timeout_s) as client:
            tasks = [asyncio.ensure_future(asyncio.wait_for(self._fetch(client, e), self._timeout_s))
                     for e in self.endpoints]
            pending = set(tasks)
            while pending and not (stop is not None and stop.is_set()):
                _, pending = await asyncio.wait(pending, timeout=None if stop is None else STOP_POLL_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return [_STOPPED if task.cancelled() else task.exception() or task.result() for task in tasks]

    async def _fetch(self, client: httpx.AsyncClient, endpoint: str) -> str:
        """One endpoint's body as text, within ``max_bytes`` (the caller bounds its time).

        Raises:
            httpx.HTTPError, ValueError: no usable answer (a gap).
        """
        async with client.stream("GET", endpoint) as response:
            response.raise_for_status()
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise ValueError(f"body of {declared} bytes is over the {self._max_bytes}-byte cap")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self._max_bytes or response.num_bytes_downloaded > self._max_bytes:
                    raise ValueError(f"body over the {self._max_bytes}-byte cap")
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _gap(self, endpoint: str, exc: BaseException) -> ScrapeResult:
        detail = str(exc).splitlines()[0] if str(exc) else "no answer within the timeout"
        detail = detail.replace(endpoint, public_endpoint(endpoint))  # httpx names the URL it fetched
        error = f"{type(exc).__name__}: {detail}"
        if endpoint not in self._down:
            logger.warning("watch: %s gives no metrics (%s); recording a gap until it answers",
                           public_endpoint(endpoint), error)
            self._down.add(endpoint)
        self._sink.flush()  # wakes the collector's writer for its heartbeat: the run is still watched
        return ScrapeResult(endpoint, False, error=error)

    def _scrape(self, endpoint: str, body: str | BaseException) -> ScrapeResult:
        if body is _STOPPED:
            return ScrapeResult(endpoint, False, error="stopped")
        if isinstance(body, BaseException):
            return self._gap(endpoint, body)
        try:
            readings = parse_exposition(body)
        except Exception as exc:  # noqa: BLE001 - a crafted body may trip the parser any way: a gap
            return self._gap(endpoint, exc)
        self._down.discard(endpoint)
        baseline = endpoint not in self._answered
        now = time.time()
        known = ({run_id: dict(ranks) for run_id, ranks in self._ranks.items()}, list(self.run_ids))
        events: list[Event] = []
        updates: dict[tuple, Reading] = {}
        steps, runs = 0, []
        world = Counter((r.engine, r.model) for r in readings)  # rank label sets per run in this scrape
        for reading in readings:
            key = (endpoint, reading.engine, reading.model, reading.labels)
            previous = None if baseline else self._previous.get(key, Reading(reading.engine, reading.model,
                                                                              reading.labels))
            try:
                check_reading(reading)
            except ValueError as exc:
                self._skip(endpoint, key, exc)
                continue
            try:
                counted = window(previous, reading)
            except IncompleteReading as exc:
                self._skip(endpoint, key, exc)
                continue
            except ValueError as exc:
                if key in self._bad_series and previous is not None:
                    # Twice in a row no engine's window from the kept reading: that reading is what is
                    # off (a counter that vanished and came back), so the series counts on from this one.
                    if key not in self._rebased:
                        logger.warning("watch: %s: a series still gives windows no engine produces (%s); "
                                       "counting it from its current reading", public_endpoint(endpoint), exc)
                        self._rebased.add(key)
                    updates[key] = reading
                self._skip(endpoint, key, exc)
                continue
            self._bad_series.discard(key)
            self._rebased.discard(key)
            size = world[(reading.engine, reading.model)]
            run_id = self._run(endpoint, reading, size, events, now)
            rank = self._rank(run_id, endpoint, reading, size, events, now)
            groups = window_groups(counted, run_id=run_id, request_id=WATCH_REQUEST_ID, rank=rank, ts_wall=now)
            updates[key] = reading
            events.extend(groups)
            events.append(RankStatus(run_id, rank, 0, 0, "eager", finished=False, ts_wall=now))
            steps += sum(g.steps for g in groups)
            if run_id not in runs:
                runs.append(run_id)
        try:
            self._write(events)
        except StoreError:  # nothing of this scrape is stored: keep the state, the next scrape retries
            self._ranks, self.run_ids = known
            raise
        self._previous.update(updates)
        self._answered.add(endpoint)
        return ScrapeResult(endpoint, True, steps, tuple(runs))

    def _skip(self, endpoint: str, key: tuple, exc: ValueError) -> None:
        """Skip a series this scrape: one warning until it gives a good window again."""
        if key not in self._bad_series:
            logger.warning("watch: %s: skipping a series (%s)", public_endpoint(endpoint), exc)
            self._bad_series.add(key)

    def _run(self, endpoint: str, reading: Reading, world_size: int, events: list[Event], now: float) -> str:
        digest = hashlib.sha1(f"{endpoint}|{reading.engine}|{reading.model}|{self._session}".encode())
        run_id = f"watch-{digest.hexdigest()[:12]}"
        if run_id not in self._ranks:
            self._ranks[run_id] = {}
            self.run_ids.append(run_id)
            k = len(reading.positions.get("accepted_pos", {})) or None
            events.append(RunStart(run_id, engine=reading.engine, engine_version="",
                                   target_model=reading.model or public_endpoint(endpoint), draft_model="",
                                   config={"source": "prometheus", "endpoint": public_endpoint(endpoint), "k": k},
                                   world_size=world_size, host=urlsplit(public_endpoint(endpoint)).netloc,
                                   ts_wall=now))
        return run_id

    def _rank(self, run_id: str, endpoint: str, reading: Reading, world_size: int, events: list[Event],
              now: float) -> int:
        ranks = self._ranks[run_id]
        if reading.labels not in ranks:
            ranks[reading.labels] = rank = len(ranks)
            device = ",".join(f"{k}={v}" for k, v in reading.labels)[:64]
            events.append(RankStart(run_id, rank, world_size=world_size, host=urlsplit(public_endpoint(endpoint)).netloc,
                                    pid=0,
                                    device=device, ts_wall=now))
        return ranks[reading.labels]


def watch(store: Store, endpoints: Sequence[str], *, interval_s: float = 5.0, count: int | None = None,
          duration_s: float | None = None, timeout_s: float = 5.0,
          stop: threading.Event | None = None) -> list[str]:
    """Scrape ``endpoints`` every ``interval_s`` seconds into ``store`` until ``count`` scrapes or
    ``duration_s`` seconds have passed, or ``stop`` is set (neither: until Ctrl-C or ``stop``, which
    end the watch normally: every rank marked finished); return the watched run ids.
    ``timeout_s``: time limit of one endpoint's scrape (seconds).

    Raises:
        ValueError: a bad endpoint, or ``interval_s`` / ``count`` / ``duration_s`` not positive.
        StoreError: the store refused a write.
    """
    if interval_s <= 0 or (count is not None and count < 1) or (duration_s is not None and duration_s <= 0):
        raise ValueError(f"watch needs interval > 0 and count / duration >= 1 / > 0, got interval "
                         f"{interval_s}, count {count}, duration {duration_s}")
    stop = stop or threading.Event()
    deadline = None if duration_s is None else time.monotonic() + duration_s
    with Watcher(store, endpoints, timeout_s=timeout_s) as watcher:
        done = 0
        try:
            while not stop.is_set():
                started = time.monotonic()
                watcher.scrape(stop)
                done += 1
                if (count is not None and done >= count) or (
                        deadline is not None and time.monotonic() + interval_s > deadline):
                    break
                stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
        except KeyboardInterrupt:  # Ctrl-C ends an open-ended watch; what was scraped is stored
            pass
        return list(watcher.run_ids)
