"""Findings stored with a run: the doctor's (saved), and the checkpoint's (``specscope demo`` stores
the inspection of the draft it serves) read in the light of what the run observed.

AUX_LAYER_IDS_CONVENTION warns that explicit aux ids name different target layers per engine: a
question about the serving engine that a run answers. When every rank's provenance samples show the
draft received exactly the configured capture layers, the ids were read in the convention the draft
needs, so the finding drops to info and says why; any other observation leaves it a warning.
"""

from __future__ import annotations

from specscope.doctor._causes import as_inspected, settled
from specscope.doctor._context import parse_json
from specscope.doctor._diagnose import run_context
from specscope.doctor._report import DoctorReport
from specscope.doctor._rules_capture import provenance_verdicts
from specscope.errors import InvalidEvent, StoreError
from specscope.events import Finding, by_severity
from specscope.storage import Store
from specscope.storage import queries as q

SETTLED_BY_PROVENANCE = ("AUX_LAYER_IDS_CONVENTION",)
"""Checkpoint codes that a run's fingerprint evidence settles."""


def checkpoint_findings(store: Store, run_id: str) -> list[Finding]:
    """The checkpoint findings stored with ``run_id`` (``source="inspect"``), errors first, each code
    of :data:`SETTLED_BY_PROVENANCE` downgraded to info (its message saying so, its evidence holding
    ``verified_by_provenance``: samples) when the run's provenance verified the received layers on
    every rank. Read-only.

    Raises:
        ConfigError: ``run_id`` is not in the store.
        StoreError: the store cannot be read, or holds a malformed finding (evidence JSON, severity).
    """
    with store.connect() as conn:
        ctx = run_context(conn, run_id, store.url)
        stored = [_stored_finding(row, ctx.run_id) for row in ctx.rows(q.RUN_FINDINGS_FROM, source="inspect")]
        provenance_settles = any(f.code in SETTLED_BY_PROVENANCE for f in stored)
        verdicts = provenance_verdicts(ctx) if provenance_settles else {}
    stored = [as_inspected(f) for f in stored]
    if set(verdicts) != {"match"}:
        return by_severity(stored)
    samples = verdicts["match"]["samples"]
    return by_severity([settled(f, f"this run's draft received the configured layers (verified by fingerprint "
                                   f"in {samples} samples)", verified_by_provenance=samples)
                        if f.code in SETTLED_BY_PROVENANCE else f for f in stored])


def _stored_finding(row, run_id: str) -> Finding:
    """A ``findings`` row of ``run_id`` as a Finding; StoreError when it is not one (a severity the
    doctor does not know, evidence that is not a dict: written around :meth:`Store.write`)."""
    try:
        return Finding(row.code, row.severity, row.message, parse_json(row.evidence, "findings.evidence", run_id),
                       row.fix, run_id=run_id, source="inspect", ts_wall=row.ts_wall)
    except InvalidEvent as exc:
        raise StoreError(f"run {run_id}: malformed stored finding: {exc}") from exc


def save_findings(store: Store, report: DoctorReport) -> None:
    """Store ``report``'s findings (``source="doctor"``), replacing the doctor findings stored
    earlier for the runs of ``report``, then store those runs' checkpoint findings as
    :func:`checkpoint_findings` reads them, so counts read from the ``findings`` table (the
    dashboard's run picker) agree with what the doctor reports. One transaction per source.

    Raises:
        ReadOnlyViolation: ``store`` was opened read-only.
        StoreError: the write failed (nothing of that source changed).
    """
    run_ids = [run.run_id for run in report.runs]
    runtime = [f for f in report.findings if f.source != "inspect"]
    related = DoctorReport(report.runs, runtime).with_checkpoint(
        [f for run_id in run_ids for f in checkpoint_findings(store, run_id)]).findings
    store.replace_findings("doctor", run_ids, [f for f in related if f.source != "inspect"])
    store.replace_findings("inspect", run_ids, [f for f in related if f.source == "inspect"])
