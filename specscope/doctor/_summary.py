"""A run's acceptance as the doctor reports it: what its rules and the cause/effect reading share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunSummary:
    """One run's acceptance (docs/design.md, "Acceptance figures"; from the store's views). ``fault``
    is the reference engine's fault switch, shown only; AL (tokens per verify step) and rate are None
    without verify steps; ``per_position_acceptance`` holds p_0, p_1, ...; ``sampling`` the acceptance
    of each sampling group (``v_sampling_acceptance``) and ``lossless_audit`` the audit of each
    (``v_lossless_audit``; empty when the run was not audited); ``what_if_k``: per k' up to the run's
    k, the AL the same verify steps give when cut to k' drafts and the predicted tokens/s (None
    without draft / verify times; :func:`specscope.metrics.what_if_k`); ``distributions``: the run's
    acceptance histogram, per-request AL percentiles, windows over time and AL by output position
    (:data:`specscope.storage.queries.DISTRIBUTIONS`, by name)."""

    run_id: str
    engine: str
    fault: str | None
    requests: int
    verify_steps: int
    mean_acceptance_length: float | None
    acceptance_rate: float | None
    per_position_acceptance: list[float] = field(default_factory=list)
    sampling: list[dict[str, Any]] = field(default_factory=list)
    lossless_audit: list[dict[str, Any]] = field(default_factory=list)
    what_if_k: list[dict[str, Any]] = field(default_factory=list)
    distributions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "engine": self.engine, "fault": self.fault,
                "requests": self.requests, "verify_steps": self.verify_steps,
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate,
                "per_position_acceptance": list(self.per_position_acceptance),
                "sampling": list(self.sampling), "lossless_audit": list(self.lossless_audit),
                "what_if_k": [dict(row) for row in self.what_if_k],
                **{name: [dict(row) for row in rows] for name, rows in self.distributions.items()}}
