"""Run the rules over a store's runs, and save their findings."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from specscope.doctor._context import RunContext, parse_json
from specscope.doctor._report import DoctorReport
from specscope.doctor._rules_accept import check_collapse, check_late_collapse, check_position0, check_saturated
from specscope.doctor._rules_capture import (
    check_capture_partial,
    check_capture_silent,
    check_layer_mismatch,
    check_not_fused,
)
from specscope.doctor._rules_drift import check_drift
from specscope.doctor._rules_health import (
    check_events_dropped,
    check_graph_mode,
    check_hook_errors,
    check_nonfinite,
    check_weights_dropped,
)
from specscope.doctor._rules_lossless import check_lossless, check_sampled_collapse
from specscope.doctor._rules_observed import check_not_observed, check_run_start, check_runner, check_skipped
from specscope.doctor._rules_outlier import check_request_outliers
from specscope.doctor._rules_ranks import check_rank_acceptance, check_rank_shapes
from specscope.doctor._rules_replay import check_replay
from specscope.doctor._summary import RunSummary
from specscope.errors import StoreError
from specscope.events import Finding, by_severity
from specscope.run_config import stored_config_problem
from specscope.storage import Store
from specscope.storage import queries as q
from specscope.storage.queries import fetch
from specscope.storage.runs import resolve_run_id
from specscope.storage.views import UNKNOWN_ENGINE

Rule = Callable[[RunContext], list[Finding]]

RULES: tuple[Rule, ...] = (
    check_run_start, check_lossless, check_replay, check_not_fused, check_capture_silent, check_capture_partial, check_layer_mismatch,
    check_collapse, check_late_collapse, check_saturated, check_sampled_collapse, check_position0, check_drift, check_request_outliers,
    check_nonfinite, check_rank_acceptance,
    check_rank_shapes, check_weights_dropped, check_events_dropped, check_hook_errors,
    check_graph_mode, check_runner, check_not_observed, check_skipped,
)
"""Every runtime rule, in report order within a severity. Each reads one :class:`RunContext`."""


def diagnose(store: Store, run_id: str | None = None, *, distributions: bool = False) -> DoctorReport:
    """Run every rule of :data:`RULES` over one run (``run_id``) or all runs of ``store``.

    Read-only (one read-only connection, nothing written); every aggregate is computed in SQL with
    per-run filters, so the cost grows with a run's recorded events, not with the store.

    ``run_id`` may be a unique prefix of a stored run id (as the dashboard shows them, 12 characters).
    The runs include those with stored rows but no stored RunStart (``queries.ORPHAN_RUN_IDS``), after
    the others: judged on what was stored, with RUN_START_MISSING.
    ``distributions``: each :class:`RunSummary` also carries the run's acceptance distributions (four
    more reads of its verify steps: ``doctor --json`` gives them, a verdict needs none).

    Raises:
        ConfigError: ``run_id`` is not in the store nor a prefix of a run id (the message names the
            known run ids), or a prefix of several (the message names them).
        StoreError: the store cannot be read, or holds malformed JSON in a run's columns, or a run
            config whose contract fields have the wrong type.
    """
    with store.connect() as conn:
        if run_id is None:
            contexts = [*(_context(conn, row) for row in fetch(conn, q.ALL_RUN_META)),
                        *(_orphan_context(conn, row["run_id"]) for row in fetch(conn, q.ORPHAN_RUN_IDS))]
        else:
            contexts = [run_context(conn, run_id, store.url)]
        runs, findings = [], []
        for ctx in contexts:
            runs.append(_summary(ctx, distributions))
            for rule in RULES:
                findings.extend(rule(ctx))
    return DoctorReport(runs, by_severity(findings))


def run_context(conn: sa.Connection, run_id: str, url: str) -> RunContext:
    """The :class:`RunContext` of ``run_id`` (or of the one run id it is a prefix of) over ``conn``,
    a run without a stored RunStart included.

    Raises:
        ConfigError: see :func:`specscope.storage.runs.resolve_run_id`.
        StoreError: malformed JSON in the run's config, or a contract field of the wrong type.
    """
    resolved = resolve_run_id(conn, run_id, url)
    rows = fetch(conn, q.RUN_META, run_id=resolved)
    return _context(conn, rows[0]) if rows else _orphan_context(conn, resolved)


def _context(conn: sa.Connection, row: dict) -> RunContext:
    config = parse_json(row["config"], "runs.config", row["run_id"])
    problem = stored_config_problem(config)
    if problem is not None:
        raise StoreError(f"run {row['run_id']}: runs.config {problem}")
    return RunContext(conn, row["run_id"], row["engine"], row["fault"], config)


def _orphan_context(conn: sa.Connection, run_id: str) -> RunContext:
    """A run with stored rows but no stored RunStart: its engine unknown and its config empty, so the
    rules that need the config report themselves unchecked; RUN_START_MISSING names the cause."""
    return RunContext(conn, run_id, UNKNOWN_ENGINE, None, {}, run_start=False)


def _summary(ctx: RunContext, distributions: bool) -> RunSummary:
    acc = ctx.acceptance
    return RunSummary(ctx.run_id, ctx.engine, ctx.fault, acc.requests, acc.verify_steps,
                      acc.mean_acceptance_length, acc.acceptance_rate, ctx.per_position,
                      [vars(g) for g in ctx.sampling_acceptance], [vars(g) for g in ctx.lossless_audit],
                      ctx.what_if_k, ctx.distributions if distributions else {})
