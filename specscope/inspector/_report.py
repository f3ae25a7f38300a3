"""The inspection report: the data, its JSON form (DESIGN.md section 6) and the human rendering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specscope.conventions import LoadPlan
from specscope.events import Finding


@dataclass(frozen=True)
class InspectionReport:
    """Result of :func:`specscope.inspector.inspect_checkpoint`.

    ``format``: ``"eagle3"``, ``"speculators"`` or ``"unknown"``; ``findings`` errors first; ``plan``:
    what ``engine``'s loader does with every checkpoint key.
    """

    path: str
    format: str
    engine: str
    findings: tuple[Finding, ...]
    plan: LoadPlan

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0 (DESIGN.md section 6)."""
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """``{"path", "format", "engine", "findings": [...], "keys": {...}}``; ``keys`` is the load plan."""
        p = self.plan
        return {"path": self.path, "format": self.format, "engine": self.engine,
                "findings": [f.to_dict() for f in self.findings],
                "keys": {"loaded": list(p.loaded), "renamed": [list(r) for r in p.renamed],
                         "dropped": list(p.dropped), "consumed": list(p.consumed),
                         "missing": list(p.missing), "strict": p.strict}}


def _evidence_line(evidence: dict[str, Any]) -> str:
    """Scalars and short lists of numbers; key lists and per-tensor maps stay in ``--json``."""
    def shown(v: Any) -> bool:
        return not isinstance(v, (dict, list)) or (
            isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (int, float)) for x in v))
    return ", ".join(f"{k}={v}" for k, v in evidence.items() if shown(v))


def render_text(report: InspectionReport) -> str:
    """A short human report: a verdict line, the findings (errors first) with evidence and fix, and
    what the loader does with the keys."""
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    lines = [f"{report.path} [{report.format}] for {report.engine}: {errors} error(s), {warnings} warning(s)"]
    for f in report.findings:
        lines.append(f"{f.severity.upper():7} {f.code}: {f.message}")
        if ev := _evidence_line(f.evidence):
            lines.append(f"        evidence: {ev}")
        lines.append(f"        fix: {f.fix}")
    p = report.plan
    lines.append(f"keys ({report.engine} loader): {len(p.loaded)} loaded, {len(p.renamed)} renamed, "
                 f"{len(p.dropped)} dropped, {len(p.consumed)} consumed, {len(p.missing)} missing")
    lines += [f"  renamed  {a} -> {b}" for a, b in p.renamed]
    lines += [f"  dropped  {k}" for k in p.dropped]
    lines += [f"  consumed {k}" for k in p.consumed]
    lines += [f"  missing  {k}" for k in p.missing]
    return "\n".join(lines)
