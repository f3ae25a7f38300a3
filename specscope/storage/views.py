"""SQL views over the trace store: the one place the dashboard, the doctor and users get aggregates.

Formulas (docs/design.md, "Acceptance figures", also in :mod:`specscope.storage.schema`'s docstring):
``mean_acceptance_length = 1 + accepted / verify_steps``, ``acceptance_rate = accepted / proposed``,
``p_i = steps with position i accepted / verify_steps``. Every division is guarded: a run or request
with no verify step, or nothing proposed, gets NULL, never a division error. The SQL is portable
between SQLite and PostgreSQL (no engine-specific functions); ratios are cast to DOUBLE PRECISION so
PostgreSQL returns floats, not NUMERIC. Every view is written so that ``WHERE run_id = ...`` reaches
the verify-step indexes on SQLite too (it pushes such a filter into one grouping level, not through a
join with a grouped subquery): filtering a view costs that run's rows, not the whole table.

| view | one row per | what |
|---|---|---|
| ``v_run_acceptance`` | run | verify steps, proposed, accepted, AL, rate, emitted tokens, tokens/s |
| ``v_rank_acceptance`` | run, rank | the same per rank (per GPU) |
| ``v_request_acceptance`` | run, request | tokens, steps, AL, rate, tokens/s, duration |
| ``v_position_acceptance`` | run, position | per-position acceptance p_i |
| ``v_request_position_acceptance`` | run, request, position | p_i of one request |
| ``v_tensor_contract`` | run, rank, hook point, shape | calls, observed vs expected width |
| ``v_run_summary`` | run | run metadata, status, counters, acceptance, error findings |
"""

from __future__ import annotations

def _acceptance_columns(alias: str = "") -> str:
    """The docs/design.md, "Acceptance figures" acceptance columns over grouped verify steps (``alias``: the
    verify_steps table's alias with its dot, or ""). Verify steps are the SUM of ``steps`` (a row
    stands for one step, or for n steps of an aggregate row); COALESCE makes a LEFT JOIN with no row
    give 0 steps and NULL ratios. ``step_detail`` is 1 when some row is a per-step row (``step`` >= 0):
    that group has step-by-step detail, not only aggregates."""
    step, proposed, accepted, ts_wall, weight = (
        f"{alias}{c}" for c in ("step", "proposed", "accepted", "ts_wall", "steps"))
    steps = f"COALESCE(SUM({weight}), 0)"
    return f"""
    {steps} AS verify_steps,
    SUM({proposed}) AS proposed,
    SUM({accepted}) AS accepted,
    CASE WHEN {steps} > 0 THEN 1.0 + CAST(SUM({accepted}) AS DOUBLE PRECISION) / {steps} END
        AS mean_acceptance_length,
    CASE WHEN SUM({proposed}) > 0 THEN CAST(SUM({accepted}) AS DOUBLE PRECISION) / SUM({proposed}) END
        AS acceptance_rate,
    SUM({accepted}) + {steps} AS emitted_tokens,
    MIN({ts_wall}) AS first_wall,
    MAX({ts_wall}) AS last_wall,
    CASE WHEN MAX({ts_wall}) > MIN({ts_wall})
         THEN CAST(SUM({accepted}) + {steps} AS DOUBLE PRECISION) / (MAX({ts_wall}) - MIN({ts_wall})) END
         AS tokens_per_s,
    MAX(CASE WHEN {step} >= 0 THEN 1 ELSE 0 END) AS step_detail"""


def _positions(keys: str) -> str:
    """Per-position acceptance p_i grouped by ``keys`` (``run_id`` or ``run_id, request_id``).

    One row per group and position below the group's longest ``accepted_mask`` (the draft positions
    verified; an aggregate row without per-position data has an empty mask and adds no position).
    Counts are sums of ``steps``, so aggregate rows weigh as the steps they stand for. The numerator is a
    correlated count over the group's steps, so a filter on the keys reaches an index instead of
    grouping every run's steps first. A run's masks are grouped before the per-position test (a run
    has a few dozen distinct masks, served by ix_verify_steps_masks); a request's few steps are read
    directly through ix_verify_steps_run_req. DISTINCT keeps SQLite from flattening ``x`` and so
    evaluating that count twice.
    """
    columns = keys.split(", ")
    match = " AND ".join(f"g.{k} = t.{k}" for k in columns)
    hit = "SUBSTR({}.accepted_mask, p.pos + 1, 1) = '1'"
    if columns == ["run_id"]:
        accepted = (f"SELECT SUM(CASE WHEN {hit.format('m')} THEN m.steps ELSE 0 END) "
                    f"FROM (SELECT accepted_mask, SUM(steps) AS steps FROM verify_steps g "
                    f"WHERE {match} GROUP BY accepted_mask) m")
    else:
        accepted = (f"SELECT SUM(CASE WHEN {hit.format('g')} THEN g.steps ELSE 0 END) "
                    f"FROM verify_steps g WHERE {match}")
    return f"""
SELECT {keys}, position, accepted_steps, verify_steps,
       CAST(accepted_steps AS DOUBLE PRECISION) / verify_steps AS acceptance
FROM (SELECT DISTINCT {", ".join(f"t.{k}" for k in columns)}, p.pos AS position, t.verify_steps,
             ({accepted}) AS accepted_steps
      FROM (SELECT {keys}, SUM(steps) AS verify_steps, MAX(LENGTH(accepted_mask)) AS max_proposed
            FROM verify_steps GROUP BY {keys}) t
      JOIN positions p ON p.pos < t.max_proposed) x
"""


RUN_GRAPH_MODE = "CASE WHEN COUNT(DISTINCT graph_mode) > 1 THEN 'mixed' ELSE MAX(graph_mode) END"
"""A run's graph mode over its ``run_ranks`` rows: ranks that saw different modes make it ``'mixed'``
(a lexical MAX would call an eager + capture_only run ``'eager'``, telling the user hooks saw every
call)."""

VIEWS: dict[str, str] = {
    "v_run_acceptance": f"""
SELECT run_id, {_acceptance_columns()}
FROM verify_steps GROUP BY run_id
""",
    "v_rank_acceptance": f"""
SELECT run_id, rank, {_acceptance_columns()}
FROM verify_steps GROUP BY run_id, rank
""",
    # Requests joined to their steps and grouped by the request's own columns: a filter on run_id (or
    # request_id) is pushed into the grouping and reaches ix_verify_steps_run_req, so one run's
    # requests cost one index range, not an aggregate over every run's steps.
    "v_request_acceptance": f"""
SELECT r.run_id, r.request_id, r.rank, r.prompt_tokens, r.output_tokens,
       {_acceptance_columns("v.")},
       r.started_wall, r.finished_wall,
       r.finished_wall - r.started_wall AS duration_s
FROM requests r
LEFT JOIN verify_steps v ON v.run_id = r.run_id AND v.request_id = r.request_id
GROUP BY r.run_id, r.request_id, r.rank, r.prompt_tokens, r.output_tokens, r.started_wall, r.finished_wall
""",
    "v_position_acceptance": _positions("run_id"),
    "v_request_position_acceptance": _positions("run_id, request_id"),
    "v_tensor_contract": """
SELECT run_id, rank, hook_point, shape, width, dtype, device, expected_shape, expected_width,
       graph_phase,
       COUNT(*) AS calls, MIN(call_index) AS first_call, MAX(call_index) AS last_call,
       MIN(ts_wall) AS first_wall, MAX(ts_wall) AS last_wall,
       CASE WHEN expected_width IS NOT NULL AND width <> expected_width THEN 1 ELSE 0 END AS width_mismatch,
       SUM(COALESCE(nonfinite, 0)) AS nonfinite
FROM tensor_events
GROUP BY run_id, rank, hook_point, shape, width, dtype, device, expected_shape, expected_width, graph_phase
""",
    # Same shape as v_request_acceptance: runs joined to their steps, grouped by the run's columns, so
    # ``WHERE run_id = ...`` reads that run's steps only (no joined aggregate over every run).
    "v_run_summary": f"""
SELECT r.run_id, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.world_size,
       r.host, r.started_wall, k.ended_wall,
       CASE WHEN k.ranks_ended >= r.world_size THEN 'finished' ELSE 'running' END AS status,
       k.last_seen_wall,
       (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.run_id) AS requests,
       {_acceptance_columns("v.")},
       COALESCE(k.events_written, 0) AS events_written, COALESCE(k.events_dropped, 0) AS events_dropped,
       COALESCE(k.hook_errors, 0) AS hook_errors, k.graph_mode,
       (SELECT COUNT(*) FROM findings f WHERE f.run_id = r.run_id AND f.severity = 'error')
           AS error_findings
FROM runs r
LEFT JOIN verify_steps v ON v.run_id = r.run_id
LEFT JOIN (SELECT run_id, COUNT(ended_wall) AS ranks_ended, MAX(ended_wall) AS ended_wall,
                  MAX(last_seen_wall) AS last_seen_wall, SUM(events_written) AS events_written,
                  SUM(events_dropped) AS events_dropped, SUM(hook_errors) AS hook_errors,
                  {RUN_GRAPH_MODE} AS graph_mode
           FROM run_ranks GROUP BY run_id) k ON k.run_id = r.run_id
GROUP BY r.run_id, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.world_size,
         r.host, r.started_wall, k.ended_wall, k.ranks_ended, k.last_seen_wall, k.events_written,
         k.events_dropped, k.hook_errors, k.graph_mode
""",
}
