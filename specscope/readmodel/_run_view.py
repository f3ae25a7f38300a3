"""A run as every reader sees it: its summary row and state, its verdict and counts, and when a
verdict may be reused."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from specscope.doctor import DoctorReport, checkpoint_findings, diagnose, save_findings
from specscope.events import Finding
from specscope.storage import Store
from specscope.storage import queries as q

Row = dict[str, Any]

STALE_AFTER_S = 60.0
"""A running run not heard from for longer than this (seconds) reads ``'stale'``: maybe idle, maybe
gone; after :data:`~specscope.storage.views.LOST_AFTER_S` the store itself reads it ``'lost'``."""

ENDED = ("finished", "crashed")
"""States after which a run's verdict no longer changes (a lost run may still be heard from again)."""

STATES = ("running", "stale", "lost", "finished", "crashed")
"""Every :func:`run_state`."""

SEVERITIES = ("error", "warning")


def run_state(status: str, last_seen_wall: float | None, now: float | None = None) -> str:
    """A run's state from ``v_run_summary.status`` (``'finished'``, ``'crashed'``, ``'running'``, or
    ``'lost'`` after :data:`~specscope.storage.views.LOST_AFTER_S` s of silence): a running run not
    heard from for more than :data:`STALE_AFTER_S` seconds (by ``now``, default the local clock)
    is ``'stale'``."""
    if status != "running":
        return status
    now = time.time() if now is None else now
    if last_seen_wall is None or now - last_seen_wall > STALE_AFTER_S:
        return "stale"
    return "running"


def _shaped(rows: list[Row], now: float | None) -> list[Row]:
    for row in rows:
        row["state"] = run_state(row.pop("status"), row["last_seen_wall"], now)
        row["config"] = json.loads(row["config"])
    return rows


def summaries(store: Store, now: float | None = None) -> list[Row]:
    """One row per run, newest first (:data:`specscope.storage.queries.RUNS`: metadata, counters,
    graph mode, requests, acceptance, the stored ``error_findings`` / ``warning_findings``) with
    ``state`` (:func:`run_state`) instead of ``status`` and the parsed ``config`` (the RunConfig
    contract). Reads the summary tables: the cost does not grow with the runs' sizes."""
    return _shaped(store.fetch(q.RUNS), now)


def summary(store: Store, run_id: str, now: float | None = None) -> Row | None:
    """One run as in :func:`summaries` (verify steps, proposed, accepted, mean acceptance length,
    acceptance rate, emitted tokens, tokens/s included); None when the run does not exist."""
    rows = _shaped(store.fetch(q.RUN, run_id=run_id), now)
    return rows[0] if rows else None


def distributions(store: Store, run_id: str, names: tuple[str, ...] = tuple(q.DISTRIBUTIONS)) -> dict[str, list[Row]]:
    """A run's acceptance as distributions, by name (:data:`specscope.storage.queries.DISTRIBUTIONS`,
    as ``doctor --json`` gives them): ``acceptance_histogram`` (per sampling group, verify steps by
    accepted drafts 0..k), ``request_acceptance`` (per-request AL percentiles per group and ``'all'``),
    ``acceptance_windows`` (per rank and time window), ``acceptance_by_output_position``; only
    ``names`` (each reads the run's verify steps once, through an index: a page asks for what it
    shows). An unknown run gives empty lists."""
    with store.connect() as conn:
        return {name: q.fetch(conn, q.DISTRIBUTIONS[name], run_id=run_id) for name in names}


def report(store: Store, run_id: str | None = None, *, distributions: bool = False) -> DoctorReport:
    """The verdict on one run (``run_id``, or a unique prefix of it) or every run: the doctor's
    runtime findings plus each run's stored checkpoint findings as
    :func:`specscope.doctor.checkpoint_findings` reads them, errors first; ``distributions``: the run
    summaries carry the acceptance distributions (:func:`specscope.doctor.diagnose`).

    Raises:
        ConfigError: unknown or ambiguous ``run_id``.
        StoreError: the store cannot be read.
    """
    runtime = diagnose(store, run_id, distributions=distributions)
    return runtime.with_checkpoint([f for run in runtime.runs for f in checkpoint_findings(store, run.run_id)])


def store_verdict(store: Store, run_id: str) -> None:
    """Store the verdict on ``run_id`` in the ``findings`` table (:func:`specscope.doctor.save_findings`:
    the doctor's findings replace those stored before, the checkpoint's are stored as read), so
    ``v_run_summary``'s counts are :func:`report`'s. The collector's ``on_run_end``.

    Raises:
        ReadOnlyViolation: ``store`` was opened read-only.
        StoreError: the store cannot be read or written.
    """
    # Ranks of one run end in their own processes, each calling this: a verdict computed before
    # another rank's end was committed may be saved after that rank's own verdict. Whoever saves a
    # verdict read while the run was still open, and finds it ended afterwards, saves it again.
    for _ in range(2):
        was_ended = _ended(store, run_id)
        save_findings(store, diagnose(store, run_id))
        if was_ended or not _ended(store, run_id):
            return


def _ended(store: Store, run_id: str) -> bool:
    row = summary(store, run_id)
    return row is not None and row["state"] in ENDED


def counts(findings: list[Finding]) -> dict[str, int]:
    """``{"error": n, "warning": n}`` of ``findings``."""
    return {severity: sum(f.severity == severity for f in findings) for severity in SEVERITIES}


class RunReader:
    """Verdicts over one open store with the caching policy: a run whose state is in :data:`ENDED`
    gets its verdict computed once, again only after a replay against the target stored results for
    it (``specscope replay``: the one thing that changes an ended run's verdict; one indexed query to
    tell); any other run's at every call. Thread-safe (the dashboard's sessions and the exporter's
    scrapes share one)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ended: dict[str, tuple[tuple, list[Finding]]] = {}
        self._lock = threading.Lock()

    def findings(self, run_id: str, state: str | None = None) -> list[Finding]:
        """The verdict on ``run_id`` (:func:`report`'s findings); ``state`` as :func:`run_state`
        gives it (read from the store when None).

        Raises:
            ConfigError: ``run_id`` is not in the store.
            StoreError: the store cannot be read.
        """
        with self._lock:
            cached = self._ended.get(run_id)
        # read before the verdict: a replay stored while it is computed makes the next call recompute
        replayed = tuple(self.store.fetch(q.REPLAY_STAMP, run_id=run_id)[0].values())
        if cached is not None and cached[0] == replayed:
            return cached[1]
        if state is None:
            row = summary(self.store, run_id)
            state = None if row is None else row["state"]
        found = report(self.store, run_id).findings
        if state in ENDED:
            with self._lock:
                self._ended[run_id] = (replayed, found)
        return found

    def counts(self, run_id: str, state: str | None = None) -> dict[str, int]:
        """Error and warning findings of :meth:`findings`."""
        return counts(self.findings(run_id, state))
