"""SQL fragments every view and query shares: the acceptance length and a portable floor."""

from __future__ import annotations


def mean_acceptance_length(accepted: str, steps: str) -> str:
    """SQL of AL = 1 + accepted / verify steps over the SQL expressions ``accepted`` and ``steps``
    (docs/design.md, "Acceptance figures"; :func:`specscope.metrics.mean_acceptance_length`); NULL
    without a verify step."""
    return f"CASE WHEN {steps} > 0 THEN 1.0 + CAST({accepted} AS DOUBLE PRECISION) / {steps} END"


def floor_sql(x: str) -> str:
    """SQL of floor(``x``) for x >= 0, portably: PostgreSQL's CAST to INTEGER rounds to nearest and
    SQLite's truncates (FLOOR is missing from some SQLite builds); one below a rounded-up CAST is floor."""
    return f"(CAST({x} AS INTEGER) - CASE WHEN CAST({x} AS INTEGER) > {x} THEN 1 ELSE 0 END)"
