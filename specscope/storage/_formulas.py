"""SQL fragments every view and query shares: the acceptance figures, a BIGINT sum and a portable floor."""

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


def acceptance_columns(steps: str, proposed: str, accepted: str, first_wall: str, last_wall: str,
                       detail: str) -> str:
    """The acceptance columns (docs/design.md, "Acceptance figures") over one group, from the SQL
    aggregates of its verify steps (``steps``: how many, bonus excluded), proposed and accepted draft
    tokens, first / last wall time and step detail (1: some row is a per-step row). COALESCE makes a
    LEFT JOIN with no row give 0 steps and NULL ratios."""
    steps = f"COALESCE({steps}, 0)"
    return f"""
    {steps} AS verify_steps,
    {proposed} AS proposed,
    {accepted} AS accepted,
    {mean_acceptance_length(accepted, steps)} AS mean_acceptance_length,
    CASE WHEN {proposed} > 0 THEN CAST({accepted} AS DOUBLE PRECISION) / {proposed} END AS acceptance_rate,
    {accepted} + {steps} AS emitted_tokens,
    {first_wall} AS first_wall,
    {last_wall} AS last_wall,
    CASE WHEN {last_wall} > {first_wall}
         THEN CAST({accepted} + {steps} AS DOUBLE PRECISION) / ({last_wall} - {first_wall}) END
         AS tokens_per_s,
    {detail} AS step_detail"""


def total(expression: str) -> str:
    """SUM of a BIGINT counter as BIGINT: PostgreSQL sums BIGINT to NUMERIC, which its driver reads as
    Decimal (SQLite's sum is an integer already)."""
    return f"CAST(SUM({expression}) AS BIGINT)"


def summed(alias: str = "") -> str:
    """:func:`acceptance_columns` over summary rows (``acceptance_masks``, ``request_accepts``; ``alias``:
    its alias with the dot)."""
    return acceptance_columns(total(f"{alias}steps"), total(f"{alias}proposed"), total(f"{alias}accepted"),
                              f"MIN({alias}first_wall)", f"MAX({alias}last_wall)", f"MAX({alias}step_detail)")
