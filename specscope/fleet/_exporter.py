"""``specscope exporter``: the store as a Prometheus target (a prometheus_client custom collector).

Every scrape reads the store's views (the one definition of AL, rate and p_i) for the newest
``max_runs`` runs and yields, per Prometheus naming rules (``specscope_`` prefix, ``_total`` for
counters, base units), with vLLM's label names where they mean the same thing (``model_name`` = the
target model, ``position`` = the draft position, 0 first):

| metric | type | labels |
|---|---|---|
| ``specscope_finding`` | gauge (1 per open finding) | code, severity, run_id, rank |
| ``specscope_draft_input_width`` / ``..._expected_width`` | gauge (elements) | run_id, rank, hook_point, expected_width |
| ``specscope_draft_input_width_mismatch_calls`` | gauge | run_id, rank, hook_point, expected_width |
| ``specscope_mean_acceptance_length`` | gauge (tokens per verify step) | run_id, rank, model_name, engine_name |
| ``specscope_acceptance_rate`` | gauge (ratio) | run_id, rank, model_name, engine_name |
| ``specscope_verify_steps_total`` / ``_draft_tokens_total`` / ``_accepted_tokens_total`` | counter | run_id, rank, model_name, engine_name |
| ``specscope_position_acceptance`` | gauge (ratio p_i) | run_id, position, model_name |
| ``specscope_events_dropped_total`` / ``specscope_hook_errors_total`` | counter | run_id, rank |
| ``specscope_run_running`` | gauge (1 running, 0 finished) | run_id, model_name, engine_name |

``rank`` is the torch.distributed rank, ``"all"`` for a run-wide figure; a finding's rank is its
evidence's ``rank`` when it names one, else ``"all"``. Findings are the doctor's verdicts (computed
at scrape time; a finished run's verdict is cached, it cannot change) plus stored checkpoint
(``inspect``) findings of those runs: "open" means the run's current verdict, so a fixed and rerun
engine clears its alert with the new run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from specscope.doctor import diagnose
from specscope.events import Finding
from specscope.storage import Store

ALL = "all"
_RUN = ["run_id", "rank", "model_name", "engine_name"]
_CONTRACT = ["run_id", "rank", "hook_point", "expected_width"]

_SQL = {
    "runs": "SELECT run_id, engine, target_model, status FROM v_run_summary ORDER BY started_wall DESC "
            "LIMIT :limit",
    "run_acceptance": "SELECT run_id, verify_steps, proposed, accepted, mean_acceptance_length, "
                      "acceptance_rate FROM v_run_acceptance WHERE run_id IN :runs",
    "rank_acceptance": "SELECT run_id, rank, verify_steps, proposed, accepted, mean_acceptance_length, "
                       "acceptance_rate FROM v_rank_acceptance WHERE run_id IN :runs",
    "positions": "SELECT run_id, position, acceptance FROM v_position_acceptance WHERE run_id IN :runs",
    "ranks": "SELECT run_id, rank, events_dropped, hook_errors FROM run_ranks WHERE run_id IN :runs",
    # draft-input contract: per expectation, the width seen in most calls, and calls off the contract
    "contract": "SELECT run_id, rank, hook_point, expected_width, width, calls FROM v_tensor_contract "
                "WHERE run_id IN :runs AND hook_point >= 'draft.' AND hook_point < 'draft/' "
                "AND expected_width IS NOT NULL",  # every draft input with a width contract (vLLM: fc)
    "inspect_findings": "SELECT run_id, code, severity, evidence FROM findings "
                        "WHERE source = 'inspect' AND run_id IN :runs",
}
_STATEMENTS = {name: sa.text(sql).bindparams(sa.bindparam("runs", expanding=True)) if ":runs" in sql
               else sa.text(sql) for name, sql in _SQL.items()}


class StoreCollector(Collector):
    """A prometheus_client collector over a (read-only) store: register it in a ``CollectorRegistry``.

    ``max_runs``: newest runs exported (each scrape costs their per-run view queries). Errors reading
    the store propagate as StoreError (prometheus_client answers that scrape with HTTP 500).
    """

    def __init__(self, store: Store, *, max_runs: int = 50) -> None:
        self.store = store
        self.max_runs = max_runs
        self._finished_findings: dict[str, list[Finding]] = {}

    def collect(self) -> Iterator[Metric]:
        with self.store.connect() as conn:
            runs = {r.run_id: r for r in conn.execute(_STATEMENTS["runs"], {"limit": self.max_runs})}
            if not runs:
                return
            ids = {"runs": list(runs)}
            rows = {name: list(conn.execute(_STATEMENTS[name], ids)) for name in _SQL if name != "runs"}
        yield from self._acceptance(runs, rows)
        yield from self._contract(rows["contract"])
        yield from self._counters(rows["ranks"])
        yield self._findings(runs, rows["inspect_findings"])

    def _acceptance(self, runs: dict[str, Any], rows: dict[str, list]) -> Iterator[Metric]:
        def meta(run_id: str) -> list[str]:
            return [runs[run_id].target_model, runs[run_id].engine]

        running = GaugeMetricFamily("specscope_run_running", "1 while a run is being written, 0 once "
                                    "every rank finished.", labels=["run_id", "model_name", "engine_name"])
        for run_id, run in runs.items():
            running.add_metric([run_id, *meta(run_id)], 1.0 if run.status == "running" else 0.0)
        yield running
        al = GaugeMetricFamily("specscope_mean_acceptance_length", "Mean acceptance length: tokens per "
                               "verify step, bonus included (1 + accepted / verify steps).", labels=_RUN)
        rate = GaugeMetricFamily("specscope_acceptance_rate", "Accepted / proposed draft tokens.",
                                 labels=_RUN)
        steps = CounterMetricFamily("specscope_verify_steps", "Verify steps recorded.", labels=_RUN)
        proposed = CounterMetricFamily("specscope_draft_tokens", "Draft tokens proposed.", labels=_RUN)
        accepted = CounterMetricFamily("specscope_accepted_tokens", "Draft tokens accepted.", labels=_RUN)
        for row in [*rows["run_acceptance"], *rows["rank_acceptance"]]:
            labels = [row.run_id, str(getattr(row, "rank", ALL)), *meta(row.run_id)]
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
            positions.add_metric([row.run_id, str(row.position), runs[row.run_id].target_model],
                                 float(row.acceptance))
        yield positions

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
            key = (row.run_id, str(row.rank), row.hook_point, str(row.expected_width))
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
            dropped.add_metric([row.run_id, str(row.rank)], float(row.events_dropped))
            errors.add_metric([row.run_id, str(row.rank)], float(row.hook_errors))
        yield from (dropped, errors)

    def _findings(self, runs: dict[str, Any], inspect_rows: list) -> Metric:
        family = GaugeMetricFamily("specscope_finding", "1 per open finding: the doctor's current verdict "
                                   "on the run, and its stored checkpoint findings.",
                                   labels=["code", "severity", "run_id", "rank"])
        seen = set()
        for run_id, run in runs.items():
            for f in self._verdict(run_id, run.status):
                seen.add(_finding_labels(f.code, f.severity, run_id, f.evidence))
        for row in inspect_rows:
            seen.add(_finding_labels(row.code, row.severity, row.run_id, json.loads(row.evidence or "{}")))
        for labels in sorted(seen):
            family.add_metric(list(labels), 1.0)
        return family

    def _verdict(self, run_id: str, status: str) -> list[Finding]:
        if run_id in self._finished_findings:
            return self._finished_findings[run_id]
        found = diagnose(self.store, run_id).findings
        if status == "finished":
            self._finished_findings[run_id] = found
        return found


def _finding_labels(code: str, severity: str, run_id: str, evidence: Any) -> tuple[str, str, str, str]:
    rank = evidence.get("rank") if isinstance(evidence, dict) else None
    return (code, severity, run_id, ALL if rank is None else str(rank))


def serve_exporter(store: Store, *, host: str = "127.0.0.1", port: int = 9464,
                   max_runs: int = 50) -> tuple[Any, Any, CollectorRegistry]:
    """Serve ``/metrics`` of a :class:`StoreCollector` over ``store`` on ``host:port`` in a daemon thread
    (prometheus_client's ``start_http_server``; port 0 picks a free one). Returns ``(server, thread,
    registry)``; ``server.server_address`` holds the bound port, ``server.shutdown()`` stops it.

    Raises:
        OSError: the address cannot be bound.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, max_runs=max_runs))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread, registry
