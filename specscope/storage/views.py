"""SQL views over the trace store: the one place the dashboard, the doctor and users get aggregates.

Formulas (DESIGN.md section 4, also in :mod:`specscope.storage.schema`'s docstring):
``mean_acceptance_length = 1 + accepted / verify_steps``, ``acceptance_rate = accepted / proposed``,
``p_i = steps with position i accepted / verify_steps``. Every division is guarded: a run or request
with no verify step, or nothing proposed, gets NULL, never a division error. The SQL is portable
between SQLite and PostgreSQL (no engine-specific functions); ratios are cast to DOUBLE PRECISION so
PostgreSQL returns floats, not NUMERIC.

| view | one row per | what |
|---|---|---|
| ``v_run_acceptance`` | run | verify steps, proposed, accepted, AL, rate, emitted tokens, tokens/s |
| ``v_rank_acceptance`` | run, rank | the same per rank (per GPU) |
| ``v_request_acceptance`` | run, request | tokens, steps, AL, rate, duration |
| ``v_position_acceptance`` | run, position | per-position acceptance p_i |
| ``v_tensor_contract`` | run, rank, hook point, shape | calls, observed vs expected width |
| ``v_run_summary`` | run | run metadata, status, counters, acceptance, error findings |
"""

from __future__ import annotations

_ACCEPTANCE_COLUMNS = """
    COUNT(*) AS verify_steps,
    SUM(proposed) AS proposed,
    SUM(accepted) AS accepted,
    1.0 + CAST(SUM(accepted) AS DOUBLE PRECISION) / COUNT(*) AS mean_acceptance_length,
    CASE WHEN SUM(proposed) > 0 THEN CAST(SUM(accepted) AS DOUBLE PRECISION) / SUM(proposed) END AS acceptance_rate,
    SUM(accepted) + COUNT(*) AS emitted_tokens,
    MIN(ts_wall) AS first_wall,
    MAX(ts_wall) AS last_wall,
    CASE WHEN MAX(ts_wall) > MIN(ts_wall)
         THEN CAST(SUM(accepted) + COUNT(*) AS DOUBLE PRECISION) / (MAX(ts_wall) - MIN(ts_wall)) END AS tokens_per_s
"""

VIEWS: dict[str, str] = {
    "v_run_acceptance": f"""
SELECT run_id, {_ACCEPTANCE_COLUMNS}
FROM verify_steps GROUP BY run_id
""",
    "v_rank_acceptance": f"""
SELECT run_id, rank, {_ACCEPTANCE_COLUMNS}
FROM verify_steps GROUP BY run_id, rank
""",
    "v_request_acceptance": """
SELECT r.run_id, r.request_id, r.rank, r.prompt_tokens, r.output_tokens,
       COALESCE(s.verify_steps, 0) AS verify_steps, s.proposed, s.accepted,
       CASE WHEN s.verify_steps > 0 THEN 1.0 + CAST(s.accepted AS DOUBLE PRECISION) / s.verify_steps END
           AS mean_acceptance_length,
       CASE WHEN s.proposed > 0 THEN CAST(s.accepted AS DOUBLE PRECISION) / s.proposed END AS acceptance_rate,
       r.started_wall, r.finished_wall,
       r.finished_wall - r.started_wall AS duration_s
FROM requests r
LEFT JOIN (SELECT run_id, request_id, COUNT(*) AS verify_steps, SUM(proposed) AS proposed,
                  SUM(accepted) AS accepted
           FROM verify_steps GROUP BY run_id, request_id) s
  ON s.run_id = r.run_id AND s.request_id = r.request_id
""",
    # Grouped by mask first: a run has at most a few dozen distinct masks, so the per-position
    # expansion joins those few rows, not every verify step (a covering index serves the grouping).
    "v_position_acceptance": """
SELECT m.run_id, p.pos AS position,
       SUM(CASE WHEN SUBSTR(m.accepted_mask, p.pos + 1, 1) = '1' THEN m.steps ELSE 0 END) AS accepted_steps,
       t.verify_steps,
       CAST(SUM(CASE WHEN SUBSTR(m.accepted_mask, p.pos + 1, 1) = '1' THEN m.steps ELSE 0 END)
            AS DOUBLE PRECISION) / t.verify_steps AS acceptance
FROM (SELECT run_id, accepted_mask, COUNT(*) AS steps FROM verify_steps
      GROUP BY run_id, accepted_mask) m
JOIN (SELECT run_id, COUNT(*) AS verify_steps, MAX(proposed) AS max_proposed FROM verify_steps
      GROUP BY run_id) t ON t.run_id = m.run_id
JOIN positions p ON p.pos < t.max_proposed
GROUP BY m.run_id, p.pos, t.verify_steps
""",
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
    "v_run_summary": """
SELECT r.run_id, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.world_size,
       r.host, r.started_wall, k.ended_wall,
       CASE WHEN k.ranks_ended >= r.world_size THEN 'finished' ELSE 'running' END AS status,
       k.last_seen_wall,
       (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.run_id) AS requests,
       COALESCE(a.verify_steps, 0) AS verify_steps, a.proposed, a.accepted,
       a.mean_acceptance_length, a.acceptance_rate, a.emitted_tokens, a.tokens_per_s,
       COALESCE(k.events_written, 0) AS events_written, COALESCE(k.events_dropped, 0) AS events_dropped,
       COALESCE(k.hook_errors, 0) AS hook_errors, k.graph_mode,
       (SELECT COUNT(*) FROM findings f WHERE f.run_id = r.run_id AND f.severity = 'error')
           AS error_findings
FROM runs r
LEFT JOIN v_run_acceptance a ON a.run_id = r.run_id
LEFT JOIN (SELECT run_id, COUNT(ended_wall) AS ranks_ended, MAX(ended_wall) AS ended_wall,
                  MAX(last_seen_wall) AS last_seen_wall, SUM(events_written) AS events_written,
                  SUM(events_dropped) AS events_dropped, SUM(hook_errors) AS hook_errors,
                  MAX(graph_mode) AS graph_mode
           FROM run_ranks GROUP BY run_id) k ON k.run_id = r.run_id
""",
}
