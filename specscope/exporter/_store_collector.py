"""``specscope exporter``: the store as a Prometheus target (a prometheus_client custom collector).

Every scrape reads the store's views (the one definition of AL, rate and p_i) for the newest
``max_runs`` runs and yields, per Prometheus naming rules (``specscope_`` prefix, ``_total`` for
counters, base units), with vLLM's label names where they mean the same thing (``model_name`` = the
target model, ``position`` = the draft position, 0 first):

| metric | type | labels |
|---|---|---|
| ``specscope_finding`` | gauge (1 per open finding) | code, severity, run_id, rank, sampling |
| ``specscope_run_findings`` | gauge (findings of the run's verdict) | run_id, severity |
| ``specscope_draft_input_width`` / ``..._expected_width`` | gauge (elements) | run_id, rank, hook_point, expected_width |
| ``specscope_draft_input_width_mismatch_calls`` | gauge | run_id, rank, hook_point, expected_width |
| ``specscope_mean_acceptance_length`` | gauge (tokens per verify step) | run_id, rank, model_name, engine_name |
| ``specscope_acceptance_rate`` | gauge (ratio) | run_id, rank, model_name, engine_name |
| ``specscope_verify_steps_total`` / ``_draft_tokens_total`` / ``_accepted_tokens_total`` | counter | run_id, rank, model_name, engine_name |
| ``specscope_position_acceptance`` | gauge (ratio p_i) | run_id, position, model_name |
| ``specscope_request_acceptance_length`` | histogram (per-request AL, tokens per verify step) | run_id, model_name, engine_name |
| ``specscope_events_dropped_total`` / ``specscope_hook_errors_total`` | counter | run_id, rank |
| ``specscope_run_running`` | gauge (1 running, 0 ended or lost) | run_id, model_name, engine_name |
| ``specscope_exporter_read_errors`` | gauge (reads of this scrape that failed) | part |

``rank`` is the torch.distributed rank, ``"all"`` for a run-wide figure; a finding that names ranks
(:func:`specscope.doctor.named_ranks`: the rank of a load, the low rank of a divergence, the ranks a
contract failure was seen on) has one series per named rank, else one with ``rank="all"``;
``sampling`` is the sampling group a finding judged (a LOSSLESS_VIOLATION per failed group), empty
for the others, so each finding ``specscope_run_findings`` counts has its own series. Findings
are each run's verdict as :class:`specscope.readmodel.RunReader` gives it (the doctor's findings
plus the stored checkpoint findings as the doctor reads them; computed at scrape time, an ended run's
once): "open" means the run's current verdict, so a fixed and rerun engine clears its alert with the
new run. ``specscope_run_findings`` counts them per severity, as ``specscope doctor`` and the
dashboard do.

A scrape answers what it can: each of its reads (the runs, six per-run view queries, the verdicts)
stops after ``timeout_s`` (:func:`specscope.storage.read_time_limit`); one that fails (a corrupt
page, a view that never ends, a value the views do not expect) is left out and counted in
``specscope_exporter_read_errors`` (logged once per part), never an HTTP 500 or a hang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from specscope.doctor import named_ranks
from specscope.readmodel import RunReader, counts
from specscope.storage import Store, read_time_limit
from specscope.storage import queries as q

logger = logging.getLogger("specscope")
T = TypeVar("T")
READ_TIMEOUT_S = 1.2  # each of a scrape's 8 reads: together under Prometheus' default scrape_timeout, 10 s

ALL = "all"
_RUN = ["run_id", "rank", "model_name", "engine_name"]
_CONTRACT = ["run_id", "rank", "hook_point", "expected_width"]

_PER_RUNS = {"run_acceptance": q.RUNS_ACCEPTANCE, "rank_acceptance": q.RUNS_RANK_ACCEPTANCE,
             "positions": q.RUNS_POSITIONS, "ranks": q.RUNS_RANK_HEALTH, "contract": q.RUNS_DRAFT_CONTRACT,
             "request_al": q.RUNS_REQUEST_AL}


class StoreCollector(Collector):
    """A prometheus_client collector over a (read-only) store: register it in a ``CollectorRegistry``.

    ``max_runs``: newest runs exported (each scrape costs their per-run view queries); ``timeout_s``:
    the longest each of a scrape's reads may take (seconds; the verdicts of all runs are one read).
    """

    def __init__(self, store: Store, *, max_runs: int = 50, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.store = store
        self.max_runs = max_runs
        self.timeout_s = timeout_s
        self.reader = RunReader(store)
        self._logged: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        errors: dict[str, int] = {}
        newest = self._read(errors, "runs", lambda: self._records(q.NEWEST_RUNS, limit=self.max_runs))
        runs = {r.run_id: r for r in newest or ()}
        if runs:
            rows = {name: self._read(errors, name, lambda query=query: self._records(query, runs=list(runs)))
                    or [] for name, query in _PER_RUNS.items()}
            with read_time_limit(self.timeout_s):  # one limit for every run's verdict
                verdicts = {run_id: self._guarded(errors, "findings", lambda run_id=run_id, run=run:
                                                  self.reader.findings(run_id, run.status))
                            for run_id, run in runs.items()}
            yield from self._acceptance(runs, rows)
            yield from self._contract(rows["contract"])
            yield from self._counters(rows["ranks"])
            yield from self._findings(verdicts)
        failed = GaugeMetricFamily("specscope_exporter_read_errors", "Reads of this scrape that failed "
                                   "(what they would have given is left out).", labels=["part"])
        for part, n in sorted(errors.items()):
            failed.add_metric([part], float(n))
        yield failed

    def _records(self, query: q.Query, **params: Any) -> list[SimpleNamespace]:
        with self.store.connect() as conn:
            return q.records(conn, query, **params)

    def _read(self, errors: dict[str, int], part: str, read: Callable[[], T]) -> T | None:
        """:meth:`_guarded` under the time limit."""
        with read_time_limit(self.timeout_s):
            return self._guarded(errors, part, read)

    def _guarded(self, errors: dict[str, int], part: str, read: Callable[[], T]) -> T | None:
        """``read()``, or None when it failed: counted in ``errors`` and logged once per part."""
        try:
            return read()
        except Exception as exc:  # noqa: BLE001 - one unreadable part must not cost the scrape
            errors[part] = errors.get(part, 0) + 1
            if part not in self._logged:
                self._logged.add(part)
                logger.warning("specscope exporter: cannot read %s from %s (%s: %s); left out of the "
                               "scrape, later failures there are only counted", part, self.store.url,
                               type(exc).__name__, exc)
            return None

    def _acceptance(self, runs: dict[str, Any], rows: dict[str, list]) -> Iterator[Metric]:
        def meta(run_id: Any) -> list[str]:
            return [_label(runs[run_id].target_model), _label(runs[run_id].engine)]

        running = GaugeMetricFamily("specscope_run_running", "1 while a run is being written, 0 once "
                                    "it ended or was lost.", labels=["run_id", "model_name", "engine_name"])
        for run_id, run in runs.items():
            running.add_metric([_label(run_id), *meta(run_id)], 1.0 if run.status == "running" else 0.0)
        yield running
        al = GaugeMetricFamily("specscope_mean_acceptance_length", "Mean acceptance length: tokens per "
                               "verify step, bonus included (1 + accepted / verify steps).", labels=_RUN)
        rate = GaugeMetricFamily("specscope_acceptance_rate", "Accepted / proposed draft tokens.",
                                 labels=_RUN)
        steps = CounterMetricFamily("specscope_verify_steps", "Verify steps recorded.", labels=_RUN)
        proposed = CounterMetricFamily("specscope_draft_tokens", "Draft tokens proposed.", labels=_RUN)
        accepted = CounterMetricFamily("specscope_accepted_tokens", "Draft tokens accepted.", labels=_RUN)
        for row in [*rows["run_acceptance"], *rows["rank_acceptance"]]:
            labels = [_label(row.run_id), _label(getattr(row, "rank", ALL)), *meta(row.run_id)]
            steps.add_metric(labels, float(row.verify_steps))
            proposed.add_metric(labels, float(row.proposed or 0))
            accepted.add_metric(labels, float(row.accepted or 0))
            if row.mean_acceptance_length is not None:
                al.add_metric(labels, float(row.mean_acceptance_length))
            if row.acceptance_rate is not None:
                rate.add_metric(labels, float(row.acceptance_rate))
        yield from (al, rate, steps, proposed, accepted)
        positions = GaugeMetricFamily("specscope_position_acceptance", "Per-position acceptance p_i: "
                                      "verify steps whose draft at position i was accepted / verify steps.",
                                      labels=["run_id", "position", "model_name"])
        for row in rows["positions"]:
            positions.add_metric([_label(row.run_id), _label(row.position), meta(row.run_id)[0]],
                                 float(row.acceptance))
        yield positions
        requests = HistogramMetricFamily("specscope_request_acceptance_length", "Mean acceptance length of "
                                         "each request with verify steps (tokens per verify step).",
                                         labels=["run_id", "model_name", "engine_name"])
        for row in rows["request_al"]:
            buckets = [(repr(le), float(getattr(row, f"le_{i}"))) for i, le in enumerate(q.REQUEST_AL_BUCKETS)]
            requests.add_metric([_label(row.run_id), *meta(row.run_id)], [*buckets, ("+Inf", float(row.requests))],
                                float(row.al_sum))
        yield requests

    @staticmethod
    def _contract(rows: list) -> Iterator[Metric]:
        observed = GaugeMetricFamily("specscope_draft_input_width", "Width (elements) of the draft's input "
                                     "seen in most calls with this expectation.", labels=_CONTRACT)
        expected = GaugeMetricFamily("specscope_draft_input_expected_width", "Width (elements) the "
                                     "contract expects (fused: n_aux x target hidden).", labels=_CONTRACT)
        mismatch = GaugeMetricFamily("specscope_draft_input_width_mismatch_calls", "Recorded draft calls "
                                     "whose input width differs from the expected width.", labels=_CONTRACT)
        groups: dict[tuple, dict[int, int]] = {}
        for row in rows:
            key = (_label(row.run_id), _label(row.rank), _label(row.hook_point), _label(row.expected_width))
            widths = groups.setdefault(key, {})
            widths[row.width] = widths.get(row.width, 0) + int(row.calls)
        for key, widths in groups.items():
            expected_width = int(key[3])
            observed.add_metric(list(key), float(max(widths, key=lambda w: (widths[w], w))))
            expected.add_metric(list(key), float(expected_width))
            mismatch.add_metric(list(key), float(sum(n for w, n in widths.items() if w != expected_width)))
        yield from (observed, expected, mismatch)

    @staticmethod
    def _counters(rows: list) -> Iterator[Metric]:
        dropped = CounterMetricFamily("specscope_events_dropped", "Events the collector dropped (queue "
                                      "full or store unwritable).", labels=["run_id", "rank"])
        errors = CounterMetricFamily("specscope_hook_errors", "Exceptions caught inside hooks.",
                                     labels=["run_id", "rank"])
        for row in rows:
            dropped.add_metric([_label(row.run_id), _label(row.rank)], float(row.events_dropped))
            errors.add_metric([_label(row.run_id), _label(row.rank)], float(row.hook_errors))
        yield from (dropped, errors)

    @staticmethod
    def _findings(verdicts: dict[Any, list | None]) -> Iterator[Metric]:
        family = GaugeMetricFamily("specscope_finding", "1 per open finding: the run's current verdict "
                                   "(the doctor's findings and its stored checkpoint findings).",
                                   labels=["code", "severity", "run_id", "rank", "sampling"])
        totals = GaugeMetricFamily("specscope_run_findings", "Findings of the run's current verdict per "
                                   "severity (as specscope doctor counts them).", labels=["run_id", "severity"])
        seen = set()
        for run_id, found in verdicts.items():
            for f in found or ():
                seen.update(_finding_labels(f.code, f.severity, _label(run_id), f.evidence))
            for severity, n in counts(found).items() if found is not None else ():
                totals.add_metric([_label(run_id), severity], float(n))
        for labels in sorted(seen):
            family.add_metric(list(labels), 1.0)
        yield from (family, totals)


def _finding_labels(code: str, severity: str, run_id: str, evidence: Any) -> list[tuple[str, ...]]:
    ranks = [_label(rank) for rank in named_ranks(code, evidence)] or [ALL]
    sampling = evidence.get("sampling") if isinstance(evidence, dict) else None
    return [(code, severity, run_id, rank, _label(sampling)) for rank in ranks]


def _label(value: Any) -> str:
    """A label value as text: what the store holds may be bytes (a BLOB run id) or NULL."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def serve_exporter(store: Store, *, host: str = "127.0.0.1", port: int = 9464, max_runs: int = 50,
                   timeout_s: float = READ_TIMEOUT_S) -> tuple[Any, Any, CollectorRegistry]:
    """Serve ``/metrics`` of a :class:`StoreCollector` over ``store`` on ``host:port`` in a daemon thread
    (prometheus_client's ``start_http_server``; port 0 picks a free one). Returns ``(server, thread,
    registry)``; ``server.server_address`` holds the bound port, ``server.shutdown()`` stops it.

    Raises:
        OSError: the address cannot be bound.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, max_runs=max_runs, timeout_s=timeout_s))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread, registry
