"""The inspection report: the data, its JSON form (docs/design.md) and the human rendering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specscope.conventions import LoadPlan, draft_key_fact
from specscope.events import Finding
from specscope.findings import finding_lines
from specscope.inspector._config import DraftConfig
from specscope.results import terminal_text


def draft_key_rows(engine: str, config: DraftConfig) -> list[dict[str, Any]]:
    """The behaviour keys the draft config sets: ``{"key", "value", "read_from", "source", "note"}``
    (``read_from`` ``"ignored"``: the engine runs the draft as if the key were absent)."""
    rows = []
    for key, value in config.behaviour:
        fact = draft_key_fact(engine, key)
        rows.append({"key": key, "value": value, "read_from": fact.read_from, "source": fact.source,
                     "note": fact.note})
    return rows


@dataclass(frozen=True)
class InspectionReport:
    """Result of :func:`specscope.inspector.inspect_checkpoint`.

    ``format``: ``"eagle3"``, ``"speculators"`` or ``"unknown"``; ``findings`` errors first; ``plan``:
    what ``engine``'s loader does with every checkpoint key; ``contract``: ``{"target", "settings",
    "draft_keys", "shared_tensors"}`` (the draft-target contract for ``engine``); ``compare``: the
    ``--compare`` diff, ``None`` without it.
    """

    path: str
    format: str
    engine: str
    findings: tuple[Finding, ...]
    plan: LoadPlan
    contract: dict[str, Any] | None = None
    compare: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0 (docs/design.md)."""
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """``{"path", "format", "engine", "findings": [...], "keys": {...}, "contract": {...}}`` (+
        ``"compare"`` with ``--compare``); ``keys`` is the load plan."""
        p = self.plan
        out = {"path": self.path, "format": self.format, "engine": self.engine,
                "findings": [f.to_dict() for f in self.findings],
                "keys": {"loaded": list(p.loaded), "renamed": [list(r) for r in p.renamed],
                         "dropped": list(p.dropped), "consumed": list(p.consumed),
                         "missing": list(p.missing), "strict": p.strict},
               "contract": self.contract}
        if self.compare is not None:
            out["compare"] = self.compare
        return out


def render_text(report: InspectionReport) -> str:
    """A short human report: a verdict line, the findings (errors first) with evidence and fix, and
    what the loader does with the keys; control characters escaped (:func:`~specscope.results.terminal_text`)."""
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    lines = [f"{report.path} [{report.format}] for {report.engine}: {errors} error(s), {warnings} warning(s)"]
    for f in report.findings:
        lines += finding_lines(f)
    p = report.plan
    lines.append(f"keys ({report.engine} loader): {len(p.loaded)} loaded, {len(p.renamed)} renamed, "
                 f"{len(p.dropped)} dropped, {len(p.consumed)} consumed, {len(p.missing)} missing")
    lines += [f"  renamed  {a} -> {b}" for a, b in p.renamed]
    lines += [f"  dropped  {k}" for k in p.dropped]
    lines += [f"  consumed {k}" for k in p.consumed]
    lines += [f"  missing  {k}" for k in p.missing]
    # tensor names and config values are the checkpoint's text: escaped, each line stays one line
    return "\n".join(terminal_text(line) for line in lines + _contract_lines(report))


def _contract_lines(report: InspectionReport) -> list[str]:
    """The contract table (settings where a side says something), ignored keys, shared tensors, diff."""
    c = report.contract or {}
    target = c.get("target")
    where = f"{target['path']} [{target['kind']}]" if target else "none"
    lines = [f"contract ({report.engine}; target: {where}):"]
    for r in c.get("settings", []):
        if r["draft"] is None and r["target"] is None:
            continue
        verdict = {True: "ok", False: "DIFFERS", None: "-"}[r["agree"]]
        lines.append(f"  {r['setting']:24} draft={r['draft']} target={r['target']} {verdict}; "
                     f"engine reads: {r['read_from']}")
    lines += [f"  key {r['key']} = {r['value']}: {r['read_from']}" for r in c.get("draft_keys", [])]
    for r in c.get("shared_tensors", []):
        same = "not compared" if r["identical_rows"] is None else f"{r['identical_rows']}/{r['rows']} rows identical"
        lines.append(f"  {r['tensor']}: draft {r['draft_key'] or 'none'}, target {r['target_key'] or 'none'}, "
                     f"{same}; served from: {r['served_from']}")
    if report.compare:
        t = report.compare["tensors"]
        lines.append(f"compare with {report.compare['old']}: {len(t['added'])} added, {len(t['removed'])} removed, "
                     f"{len(t['reshaped'])} reshaped, {len(report.compare['config'])} config change(s)")
    return lines
