"""The doctor's report: the data, its JSON form (docs/design.md, "Finding codes") and the human rendering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specscope.doctor._causes import relate
from specscope.doctor._summary import RunSummary
from specscope.events import Finding
from specscope.findings import finding_lines
from specscope.results import terminal_text


@dataclass(frozen=True)
class DoctorReport:
    """Result of :func:`specscope.doctor.diagnose`: runs newest first, findings errors first."""

    runs: list[RunSummary]
    findings: list[Finding]

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0 (docs/design.md, "Finding codes")."""
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def codes(self, run_id: str | None = None) -> list[str]:
        """Finding codes, of one run when ``run_id`` is given."""
        return [f.code for f in self.findings if run_id is None or f.run_id == run_id]

    def to_dict(self) -> dict[str, Any]:
        """``{"runs": [...], "findings": [FINDING + "run_id", ...]}`` (docs/design.md, "Finding codes")."""
        return {"runs": [r.to_dict() for r in self.runs],
                "findings": [f.to_dict() for f in self.findings]}

    def with_checkpoint(self, stored: list[Finding]) -> DoctorReport:
        """This report plus the checkpoint findings stored with its runs, each read in the light of
        the runs' acceptance (:func:`specscope.doctor._causes.relate`): errors first; within a
        severity the checkpoint's come first (a broken checkpoint is the cause of what runs show)."""
        return DoctorReport(self.runs, relate(self.runs, self.findings, stored))


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_text(report: DoctorReport) -> str:
    """Per run one summary line (with its own verdict where the report holds several runs), the
    totals, then the findings (errors first) with evidence and fix."""
    lines = []
    for run in report.runs:
        fault = f" fault={terminal_text(run.fault)}" if run.fault else ""
        positions = " ".join(f"{p:.2f}" for p in run.per_position_acceptance) or "n/a"
        verdict = ""
        if len(report.runs) > 1:
            verdict = f" -> {_counts([f for f in report.findings if f.run_id == run.run_id])}"
        lines.append(f"run {terminal_text(run.run_id)} [{terminal_text(run.engine)}{fault}]: {run.requests} request(s), "
                     f"{run.verify_steps} verify step(s), AL {_number(run.mean_acceptance_length, '.2f')}, "
                     f"rate {_number(run.acceptance_rate, '.1%')}, p_i {positions}{verdict}")
    if not report.runs:
        lines.append("no runs in this store")
    lines.append(_counts(report.findings))
    for f in report.findings:
        lines += finding_lines(f)
    return "\n".join(lines)


def _counts(findings: list[Finding]) -> str:
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    return f"{errors} error(s), {warnings} warning(s), {len(findings) - errors - warnings} info"
