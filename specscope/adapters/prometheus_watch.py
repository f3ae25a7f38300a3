"""``specscope watch``: observe a serving engine through its Prometheus endpoint, with no hooks in it
(a producer like the other adapters, writing through the store's :meth:`~specscope.storage.Store.write`).

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
- What a server sends is untrusted (:mod:`._watch_fetch`): endpoints are fetched concurrently, each
  fetched and read within ``timeout_s`` in all (connect, headers, body and parse: a server trickling
  bytes or sending text slow to parse cannot hold a scrape, nor a stop), with its body capped at
  ``max_bytes`` as sent and as decompressed (the decoder inflates one network read at a time, so a
  compressed bomb costs at most one read's inflation before it is refused) and at ``max_series``
  series (what is dropped is said once). A series with a value that is not a count
  (:func:`~specscope.adapters.prometheus_metrics.check_reading`), a window no engine produces or no
  store row holds (a jump past 2**31-1 steps, more than 64 draft positions), or values the store
  refuses is skipped alone (one warning line per series), the endpoint's other series are stored.
- Each endpoint's scrape is one store transaction (a write refused for one series' values is retried
  series by series); a store that refuses the write as a whole stores nothing of it and the watch
  keeps its state, so the next scrape stores the whole increase. Ranks with nothing to write this
  scrape (a gap, a skipped series) are marked heard, so a watched run does not read 'lost' while
  its endpoint is down; the watch's end stores each run's verdict (docs/design.md, "Reading a run").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specscope.adapters._watch_fetch import STOPPED, Limits, fetch_all, normalize_endpoint, public_endpoint
from specscope.adapters._watch_state import Counted, Endpoint
from specscope.adapters.prometheus_metrics import MAX_SERIES, Exposition
from specscope.errors import ConfigError, EventRejected, StoreError
from specscope.events import RankStatus
from specscope.readmodel import store_verdict
from specscope.storage import Store

__all__ = ["MAX_BYTES", "MAX_SERIES", "ScrapeResult", "Watcher", "normalize_endpoint", "public_endpoint", "watch"]

logger = logging.getLogger("specscope.watch")

MAX_BYTES = 16 << 20
"""Default cap of one scrape's body (bytes, as sent and as decompressed); vLLM's exposition with its
histograms is a few hundred KB."""


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
    end (marks every watched rank finished and stores each run's verdict). ``timeout_s`` bounds one
    endpoint's whole scrape, ``max_bytes`` its body, ``max_series`` its series. The lead's real-vLLM
    check: scrape, serve requests, scrape, compare ``v_run_acceptance`` of :attr:`run_ids` with vLLM's
    own counter increases.

    Raises (constructor): ValueError for an endpoint without a host, or limits that are not positive.
    """

    def __init__(self, store: Store, endpoints: Sequence[str], *, timeout_s: float = 5.0,
                 max_bytes: int = MAX_BYTES, max_series: int = MAX_SERIES) -> None:
        if not (timeout_s > 0 and max_bytes > 0 and max_series > 0):
            raise ValueError(f"watch needs timeout, max_bytes and max_series > 0, got {timeout_s}, {max_bytes}, "
                             f"{max_series}")
        self.store = store
        self.endpoints = [normalize_endpoint(e) for e in endpoints]
        self.run_ids: list[str] = []  # stored runs, in the order they were
        session = f"{time.time():.6f}"
        self._state = [Endpoint(url, session) for url in self.endpoints]
        self._limits = Limits(timeout_s, max_bytes, max_series)
        self._closed = False

    def scrape(self, stop: threading.Event | None = None) -> list[ScrapeResult]:
        """Scrape every endpoint once (concurrently) and write what changed since the previous scrape
        (one store transaction per endpoint). Never raises for an endpoint that is down, slow or
        answers garbage. Runs its own event loop: call it from synchronous code. ``stop`` set while
        it waits cuts the scrapes still running short (a service manager's grace period is shorter
        than a slow endpoint's timeout): those endpoints store nothing this scrape (error "stopped").

        Raises:
            StoreError: the store refused the write; nothing of that endpoint's scrape is stored or
                remembered, so the next call stores the whole increase.
        """
        answers = fetch_all(self.endpoints, self._limits, stop)
        return [self._store(endpoint, answer) for endpoint, answer in zip(self._state, answers)]

    def unanswered(self) -> list[tuple[str, str]]:
        """``(endpoint, last error)`` of each endpoint that has given no metrics yet (credentials
        left out; the error is empty when its scrapes were all stopped)."""
        return [(e.shown, e.error) for e in self._state if not e.answered]

    def close(self) -> None:
        """Mark every watched rank finished and store each run's verdict (idempotent).

        Raises:
            StoreError: the store refused the write.
        """
        if self._closed:
            return
        self._closed = True
        self.store.write([RankStatus(run_id, rank, 0, 0, "eager", finished=True)
                          for endpoint in self._state for run_id, rank in endpoint.stored_ranks()])
        for run_id in self.run_ids:
            try:
                store_verdict(self.store, run_id)
            except StoreError as exc:  # the run itself is stored: only its verdict is missing
                logger.warning("watch: run %s: its verdict was not stored (%s)", run_id, exc)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _store(self, endpoint: Endpoint, answer: Exposition | BaseException) -> ScrapeResult:
        if answer is STOPPED:
            return ScrapeResult(endpoint.url, False, error="stopped")
        if isinstance(answer, BaseException):
            return self._gap(endpoint, answer)
        endpoint.down = False
        endpoint.say_dropped(answer.dropped)
        stored = self._commit(endpoint, endpoint.count(answer.readings, time.time()))
        endpoint.answered = True
        heard = {(c.run.run_id, c.rank) for c in stored if c.run is not None}
        self._touch([key for key in endpoint.stored_ranks() if key not in heard])
        runs = tuple(dict.fromkeys(c.run.run_id for c in stored if c.run is not None))
        return ScrapeResult(endpoint.url, True, sum(c.steps for c in stored), runs)

    def _commit(self, endpoint: Endpoint, counted: list[Counted]) -> list[Counted]:
        """Store ``counted`` in one transaction and remember it; when the store refuses values of it,
        each series alone (a refused one is skipped). Returns what was stored.

        Raises:
            StoreError: the store refused the write as a whole: nothing of it is stored or remembered.
        """
        try:
            self.store.write([event for c in counted for event in c.events])
        except EventRejected as exc:
            if len(counted) == 1:
                counted[0].series.skip(endpoint.shown, exc)
                return []
            return [c for one in counted for c in self._commit(endpoint, [one])]
        for c in counted:
            if endpoint.committed(c):
                self.run_ids.append(c.run.run_id)
        return counted

    def _gap(self, endpoint: Endpoint, exc: BaseException) -> ScrapeResult:
        detail = str(exc).splitlines()[0] if str(exc) else "no answer within the timeout"
        detail = detail.replace(endpoint.url, endpoint.shown)  # httpx names the URL it fetched
        endpoint.error = error = f"{type(exc).__name__}: {detail}"
        if not endpoint.down:
            logger.warning("watch: %s gives no metrics (%s); recording a gap until it answers",
                           endpoint.shown, error)
            endpoint.down = True
        self._touch(endpoint.stored_ranks())  # its runs are still watched
        return ScrapeResult(endpoint.url, False, error=error)

    def _touch(self, ranks: list[tuple[str, int]]) -> None:
        """Mark ranks with nothing to write heard, so that their run does not read 'lost'."""
        try:
            self.store.touch(ranks)
        except StoreError:  # a failing store is reported by the next scrape's write
            pass


def watch(store: Store, endpoints: Sequence[str], *, interval_s: float = 5.0, count: int | None = None,
          duration_s: float | None = None, timeout_s: float = 5.0,
          stop: threading.Event | None = None) -> list[str]:
    """Scrape ``endpoints`` every ``interval_s`` seconds into ``store`` until ``count`` scrapes or
    ``duration_s`` seconds have passed, or ``stop`` is set (neither: until Ctrl-C or ``stop``, which
    end the watch normally: every rank marked finished); return the watched run ids.
    ``timeout_s``: time limit of one endpoint's scrape (seconds). Logs one line per scrape, and at the
    end one per endpoint that never gave metrics.

    Raises:
        ValueError: a bad endpoint, or ``interval_s`` / ``count`` / ``duration_s`` not positive.
        ConfigError: no endpoint gave metrics in the whole watch (nothing stored).
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
                results = watcher.scrape(stop)
                done += 1
                logger.info("watch: scrape %d%s: %d of %d endpoint(s) answered, %d verify step(s) stored", done,
                            " (the baseline)" if done == 1 else "", sum(r.ok for r in results), len(results),
                            sum(r.verify_steps for r in results))
                if (count is not None and done >= count) or (
                        deadline is not None and time.monotonic() + interval_s > deadline):
                    break
                stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
        except KeyboardInterrupt:  # Ctrl-C ends an open-ended watch; what was scraped is stored
            pass
    silent = [(shown, error) for shown, error in watcher.unanswered() if error]
    if silent and len(silent) == len(watcher.endpoints):
        raise ConfigError(f"no endpoint gave speculative-decoding metrics in {done} scrape(s), nothing stored: "
                          + "; ".join(f"{shown} ({error})" for shown, error in silent))
    for shown, error in silent:
        logger.warning("watch: %s gave no metrics in the whole watch (last: %s)", shown, error)
    return list(watcher.run_ids)
