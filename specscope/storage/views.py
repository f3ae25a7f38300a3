"""SQL views over the trace store: the one place the dashboard, the doctor and users get aggregates.

Formulas (docs/design.md, "Acceptance figures", also in :mod:`specscope.storage.schema`'s docstring):
``mean_acceptance_length = 1 + accepted / verify_steps``, ``acceptance_rate = accepted / proposed``,
``p_i = steps with position i accepted / verify_steps``. Every division is guarded: a run or request
with no verify step, or nothing proposed, gets NULL, never a division error. The SQL is portable
between SQLite and PostgreSQL (no engine-specific functions); ratios are cast to DOUBLE PRECISION so
PostgreSQL returns floats, not NUMERIC. Run- and rank-level figures and the shape contract read the
summary tables (``acceptance_masks``, ``tensor_shapes``: a few rows per run, kept by the store's
writes, ``storage/_summaries.py``); per-request and per-sampling-group figures read the per-request
summary ``request_accepts`` (a few rows per request), written so that ``WHERE run_id = ...`` (and
``request_id``) reaches its primary key on SQLite too (the filter is pushed into one grouping level,
not through a join with a grouped subquery); per-position figures of one request read its
``verify_steps``.

| view | one row per | what |
|---|---|---|
| ``v_run_acceptance`` | run | verify steps, proposed, accepted, AL, rate, emitted tokens, tokens/s |
| ``v_rank_acceptance`` | run, rank | the same per rank (per GPU) |
| ``v_request_acceptance`` | run, request | tokens, steps, AL, rate, tokens/s, duration |
| ``v_position_acceptance`` | run, position | per-position acceptance p_i |
| ``v_request_position_acceptance`` | run, request, position | p_i of one request |
| ``v_tensor_contract`` | run, rank, hook point, shape | calls, observed vs expected width |
| ``v_run_ids`` | run | every run id with stored rows, and ``run_start`` (1: its RunStart is stored) |
| ``v_run_summary`` | run | run metadata and config, status, counters, acceptance, stored findings |

``v_run_summary.status`` is ``'crashed'`` (a rank stopped on an error), ``'finished'`` (every rank
ended), ``'running'``, or ``'lost'``: not ended and no rank heard from for more than
:data:`LOST_AFTER_S` seconds by the database's clock (its processes vanished without a word: killed,
host gone). A lost run that is heard from again reads ``'running'`` again. Its ``error_findings`` /
``warning_findings`` count the findings last stored with the run (the collector's run-end callback
stores the doctor's verdict when a rank ends: docs/design.md, "Reading a run"); a live run's current
verdict is computed by :mod:`specscope.readmodel`. A run whose RunStart never reached the store but
whose ranks did (``run_start`` 0: the collector writes rank rows with every batch) is listed too:
engine :data:`UNKNOWN_ENGINE`, config ``'{}'``, models, version and fault NULL, and world size (at
least the ranks seen), host and start from its ``run_ranks`` rows. ``v_run_ids`` also lists the runs
with neither (rows written around the collector), for the doctor; it reads every run id of four
tables, one index seek per run, so the per-run views do not build on it.
| ``v_sampling_acceptance`` | run, sampling group | requests, steps, AL, rate, p_0 of each sampling group |
| ``v_lossless_audit`` | run, sampling group | greedy mismatches; sampled tests (junk, mean p, PIT, surprise), recovered tokens, power, verdict |
| ``v_replay_audit`` | run, sampling group | the same over a replay against the target alone, with departures, near-ties, margins |

Acceptance as a distribution (:mod:`specscope.storage._distribution_views`):

| view | one row per | what |
|---|---|---|
| ``v_acceptance_histogram`` | run, sampling group, accepted drafts 0..k | verify steps, share |
| ``v_request_acceptance_distribution`` | run, sampling group (and ``'all'``) | per-request AL p10/p50/p90/p99, mean, token-weighted |
| ``v_acceptance_windows`` | run, rank, window | window start, verify steps, AL |
| ``v_acceptance_by_output_position`` | run, bucket of generated tokens | verify steps, AL |
"""

from __future__ import annotations

import math

from specscope.events import PIT_BINS
from specscope.storage._distribution_views import DISTRIBUTION_VIEWS
from specscope.storage._formulas import summed, total

LOSSLESS_ALPHA = 1e-3
"""False-alarm bound of the sampled losslessness audit, per run and sampling group, shared equally by
its four tests (docs/design.md, "Losslessness audit")."""
_TEST_ALPHA = LOSSLESS_ALPHA / 4
DETECTABLE_Z = 1.2816
"""Normal quantile of 90%: a shift is called detectable when it is caught with about 90% power."""
MAX_JUDGED_SHIFT = 0.1
"""A sampled group whose audit could not detect a shift of the mean emitted probability this large is
"too few tokens to judge", not passed."""
EXP_SATURATED = 40.0
"""Past this, 1 - exp(-x) is 1 in double precision; PostgreSQL's EXP raises on underflow (from about
x = 745) where SQLite returns 0, so a long run's power reads 1 on both."""


def bernstein_threshold(variance: str, log_inverse_alpha: float, bound: str = "1") -> str:
    """SQL of the t that a sum of martingale differences each at most ``bound`` (SQL), with
    predictable variance ``variance`` (SQL), exceeds with probability at most exp(-L): Freedman's
    inequality P(S >= t) <= exp(-t^2 / (2 (V + b t / 3))) solved for t,
    t = b L/3 + sqrt((b L/3)^2 + 2 L V)."""
    third = log_inverse_alpha / 3
    return f"({bound} * {third!r} + SQRT(({bound} * {third!r}) * ({bound} * {third!r}) + {6 * third!r} * ABS({variance})))"


def rare_threshold(expected: str) -> str:
    """SQL of the count of rare emitted tokens (target probability below epsilon) a lossless engine
    reaches with probability at most a third of :data:`LOSSLESS_ALPHA`, given ``expected`` (the SQL sum
    of the target's mass below epsilon at the audited positions, also the count's variance bound)."""
    return f"({expected} + {bernstein_threshold(expected, math.log(1 / _TEST_ALPHA))})"


def _mean_threshold(variance: str) -> str:
    """The two-sided bound of the emitted probability's excess over its expectation."""
    return bernstein_threshold(variance, math.log(2 / _TEST_ALPHA))


def _surprise_thresholds() -> tuple[str, str]:
    """The bounds of the summed surprise off its expectation, each tail at half the test's share: below
    (a sharpened distribution), one token's surprise falls short of its row's entropy by at most that
    entropy (``entropy_max``); above (a flattened one), it exceeds it by at most the cap -ln epsilon.
    Both bounds are raised to at least 1 nat (a larger bound stays a bound): the float32 noise of rows
    all but deterministic stays far below the thresholds."""
    log_inverse_alpha = math.log(2 / _TEST_ALPHA)
    return (bernstein_threshold("surprise_variance", log_inverse_alpha,
                                "(CASE WHEN entropy_max > 1 THEN entropy_max ELSE 1 END)"),
            bernstein_threshold("surprise_variance", log_inverse_alpha,
                                "(CASE WHEN epsilon <= 0 THEN 1 WHEN -LN(epsilon) > 1 THEN -LN(epsilon) ELSE 1 END)"))


def _pit_threshold(scored: str) -> str:
    """The two-sided bound of one PIT bin's count off its expectation, Bonferroni over the bins: each
    bin's indicator has variance (1/B)(1 - 1/B) per scored token."""
    share = 1 / PIT_BINS
    return bernstein_threshold(f"{scored} * {share * (1 - share)!r}", math.log(2 * PIT_BINS / _TEST_ALPHA))


def _audit_verdict(table: str, extra: str = "", recovered: bool = False) -> str:
    """Per run and sampling group of ``table`` (``lossless_audit`` or ``replay_requests``: the same
    columns ``tokens``, ``mismatches``, ``rare``, ``rare_expected``, ``p_sum``, ``p2_sum``,
    ``p_var_sum``, ``epsilon``, ``pit_0..9``, the surprise columns), the greedy check and the sampled
    tests' figures,
    thresholds, power and verdict (docs/design.md, "Losslessness audit"); ``extra``: more aggregate
    columns of ``table`` for the innermost grouping; ``recovered``: ``table`` has the recovered-token
    check's columns (the live audit, which sees the drafts; a replay does not)."""
    bins = [f"pit_{b}" for b in range(PIT_BINS)]
    row_scored = "(" + " + ".join(bins) + ")"
    pit_off = " OR ".join(f"ABS({b} - scored_tokens * {1 / PIT_BINS!r}) >= pit_threshold" for b in bins)
    below, above = _surprise_thresholds()
    worst_bin = " ".join(f"WHEN ABS({b} - scored_tokens * {1 / PIT_BINS!r}) >= pit_threshold THEN {i}"
                         for i, b in enumerate(bins))
    recovered_failed, recovered_flag, recovered_sums = "", "", ""
    if recovered:
        recovered_failed = " OR recovered_failed = 1"
        recovered_flag = f"""
             CASE WHEN recovered_as_draft > 0 THEN 1 ELSE 0 END AS recovered_failed,
             CASE WHEN recovered_p_expected > {EXP_SATURATED!r} THEN 1.0
                  ELSE 1 - EXP(-recovered_p_expected) END AS detectable_recovered_from_p,"""
        recovered_sums = """,
                         SUM(recovered) AS recovered_audited, SUM(recovered_as_draft) AS recovered_as_draft,
                         SUM(recovered_p_sum) AS recovered_p_expected"""
    return f"""
SELECT t.*,
       CASE WHEN greedy_mismatches > 0 OR junk_failed = 1 OR mean_failed = 1 OR pit_failed = 1
                 OR surprise_failed = 1{recovered_failed} THEN 'violation'
            WHEN sampling <> 'greedy' AND (scored_tokens = 0 OR detectable_p_shift > {MAX_JUDGED_SHIFT!r})
            THEN 'too few tokens' ELSE 'passed' END AS verdict
FROM (SELECT s.*,{recovered_flag}
             CASE WHEN rare_observed >= rare_threshold THEN 1 ELSE 0 END AS junk_failed,
             CASE WHEN scored_tokens > 0 AND ABS(p_excess) >= p_excess_threshold THEN 1 ELSE 0 END AS mean_failed,
             CASE WHEN scored_tokens > 0 AND ({pit_off}) THEN 1 ELSE 0 END AS pit_failed,
             CASE WHEN scored_tokens > 0 AND (surprise_excess <= -surprise_threshold_below
                                             OR surprise_excess >= surprise_threshold_above)
                  THEN 1 ELSE 0 END AS surprise_failed,
             CASE WHEN scored_tokens > 0
                  THEN (surprise_threshold_below + {DETECTABLE_Z!r} * SQRT(surprise_variance)) / scored_tokens END
                  AS detectable_surprise_shift,
             CASE {worst_bin} END AS pit_worst_bin,
             CASE WHEN scored_tokens > 0
                  THEN (p_excess_threshold + {DETECTABLE_Z!r} * SQRT(p_variance)) / scored_tokens END
                  AS detectable_p_shift,
             CASE WHEN scored_tokens > 0
                  THEN (pit_threshold + {DETECTABLE_Z!r} * SQRT(scored_tokens * {(1 / PIT_BINS) * (1 - 1 / PIT_BINS)!r}))
                       / scored_tokens END AS detectable_pit_excess
      FROM (SELECT a.*, {rare_threshold("rare_expected")} AS rare_threshold,
                   {_mean_threshold("p_variance")} AS p_excess_threshold,
                   {_pit_threshold("scored_tokens")} AS pit_threshold,
                   {below} AS surprise_threshold_below, {above} AS surprise_threshold_above
            FROM (SELECT run_id, sampling, COUNT(DISTINCT request_id) AS requests, SUM(tokens) AS tokens_audited,
                         SUM(mismatches) AS greedy_mismatches, SUM(rare) AS rare_observed,
                         SUM(rare_expected) AS rare_expected,
                         CASE WHEN SUM(tokens) > 0 THEN CAST(SUM(p_sum) AS DOUBLE PRECISION) / SUM(tokens) END
                              AS mean_p_emitted,
                         CASE WHEN SUM(tokens) > 0 THEN CAST(SUM(p2_sum) AS DOUBLE PRECISION) / SUM(tokens) END
                              AS mean_p_expected,
                         MAX(epsilon) AS epsilon,
                         SUM({row_scored}) AS scored_tokens,
                         SUM(CASE WHEN {row_scored} > 0 THEN p_sum - p2_sum ELSE 0 END) AS p_excess,
                         SUM(p_var_sum) AS p_variance,
                         CASE WHEN SUM({row_scored}) > 0
                              THEN CAST(SUM(surprise_sum) AS DOUBLE PRECISION) / SUM({row_scored}) END
                              AS mean_surprise_emitted,
                         CASE WHEN SUM({row_scored}) > 0
                              THEN CAST(SUM(entropy_sum) AS DOUBLE PRECISION) / SUM({row_scored}) END
                              AS mean_surprise_expected,
                         SUM(surprise_sum) - SUM(entropy_sum) AS surprise_excess,
                         SUM(surprise_var_sum) AS surprise_variance, MAX(entropy_max) AS entropy_max,
                         {", ".join(f"SUM({b}) AS {b}" for b in bins)}{recovered_sums}{extra}
                  FROM {table}
                  GROUP BY run_id, sampling) a) s) t
"""


_REPLAY_COLUMNS = """,
                         SUM(departures) AS departures, SUM(near_ties) AS near_ties,
                         SUM(CASE WHEN departures > 0 THEN 1 ELSE 0 END) AS departed_requests,
                         SUM(CASE WHEN departures > 0 AND mismatches = 0 THEN 1 ELSE 0 END) AS near_tie_requests,
                         MAX(max_margin) AS max_margin, MAX(near_tie_margin) AS near_tie_margin,
                         MAX(source) AS source"""
"""``v_replay_audit``'s own figures: departures from the target's greedy choice, those within a
near-tie, the requests with any / only near-tie departures, the largest margin."""


_POSITION_HIT = "SUBSTR({alias}.accepted_mask, {position} + 1, 1) = '1'"
"""Per-position acceptance (docs/design.md, "Acceptance figures"; :func:`specscope.metrics.per_position_acceptance`):
draft position i (0-based) of a verify step was accepted when character i of its mask is '1'."""


def _positions(source: str, keys: str) -> str:
    """Per-position acceptance p_i grouped by ``keys`` over ``source`` (``acceptance_masks`` per run,
    ``verify_steps`` per request): one row per group and position below the group's longest
    ``accepted_mask``. Counts are sums of ``steps``; the denominator counts only steps whose positions
    are known: a row that proposed drafts under an empty mask (totals without per-position data: a
    recorded plain response, a watched window without per-position counters) adds no position and no
    step, so a run mixing such rows with per-step ones reads p_i of the latter, not diluted by the
    former. The numerator is a correlated sum over the group's rows,
    so a filter on the keys reaches an index; DISTINCT keeps SQLite from flattening ``x`` and so
    evaluating that sum twice.
    """
    columns = keys.split(", ")
    match = " AND ".join(f"g.{k} = t.{k}" for k in columns)
    return f"""
SELECT {keys}, position, accepted_steps, verify_steps,
       CASE WHEN verify_steps > 0 THEN CAST(accepted_steps AS DOUBLE PRECISION) / verify_steps END AS acceptance
FROM (SELECT DISTINCT {", ".join(f"t.{k}" for k in columns)}, p.pos AS position, t.verify_steps,
             (SELECT {total(f"CASE WHEN {_POSITION_HIT.format(alias='g', position='p.pos')} THEN g.steps ELSE 0 END")}
              FROM {source} g WHERE {match}) AS accepted_steps
      FROM (SELECT {keys}, {total("CASE WHEN accepted_mask <> '' OR proposed = 0 THEN steps ELSE 0 END")} AS verify_steps,
                   MAX(LENGTH(accepted_mask)) AS max_proposed
            FROM {source} GROUP BY {keys}) t
      JOIN positions p ON p.pos < t.max_proposed) x
"""


LOST_AFTER_S = 300.0
"""A run that has not ended and from which no rank was heard (an event written, or the collector's
heartbeat) for longer than this many seconds is ``'lost'`` (docs/design.md, "Reading a run"). Five
minutes: many heartbeats (:data:`specscope.collector.HEARTBEAT_S`) long, and longer than a clock
skew between an engine host and the database host is likely to be."""

NOW_WALL = "__now_wall__"
"""Placeholder for the database's wall clock (seconds since the epoch) in :data:`VIEWS`, replaced
per dialect by :func:`create_view_sql` (SQLite and PostgreSQL share no expression for it)."""

_NOW_WALL_SQL = {
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
    "postgresql": "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS DOUBLE PRECISION)",
}


def create_view_sql(name: str, dialect: str) -> str:
    """``CREATE VIEW name AS ...`` of one view of :data:`VIEWS` for ``dialect``
    (``'sqlite'`` / ``'postgresql'``)."""
    return f"CREATE VIEW {name} AS {VIEWS[name].replace(NOW_WALL, _NOW_WALL_SQL[dialect])}"


UNKNOWN_ENGINE = "unknown"
"""The engine of a run without a stored RunStart (``v_run_summary``, the doctor)."""

# Tables whose rows make a run (run_ranks: every run the collector's counters saw), each run id found by
# a loose index scan over the index run_id leads: one seek past each run id, where DISTINCT would read
# every verify step and tensor event of the store.
_RUN_ID_SCANS = ", ".join(f"""{table}_ids(run_id) AS (
    SELECT (SELECT run_id FROM {table} ORDER BY run_id LIMIT 1) UNION ALL
    SELECT (SELECT t.run_id FROM {table} t WHERE t.run_id > s.run_id ORDER BY t.run_id LIMIT 1)
    FROM {table}_ids s WHERE s.run_id IS NOT NULL)""" for table in ("run_ranks", "verify_steps", "tensor_events", "requests"))

RUN_GRAPH_MODE = "CASE WHEN COUNT(DISTINCT graph_mode) > 1 THEN 'mixed' ELSE MAX(graph_mode) END"
"""A run's graph mode over its ``run_ranks`` rows: ranks that saw different modes make it ``'mixed'``
(a lexical MAX would call an eager + capture_only run ``'eager'``, telling the user hooks saw every
call)."""


def _stored_findings(severity: str, run: str) -> str:
    return f"(SELECT COUNT(*) FROM findings f WHERE f.run_id = {run}.run_id AND f.severity = '{severity}')"


# A run's rank rows, one row per run (v_run_summary's ``k``): ended, crashed, last heard, counters.
_RANKS = f"""(SELECT run_id, COUNT(*) AS ranks, COUNT(ended_wall) AS ranks_ended, MAX(ended_wall) AS ended_wall,
                  COUNT(error) AS ranks_crashed, MAX(error) AS error, MAX(world_size) AS world_size,
                  MIN(host) AS host, MIN(started_wall) AS started_wall,
                  MAX(last_seen_wall) AS last_seen_wall, {total("events_written")} AS events_written,
                  {total("events_dropped")} AS events_dropped, {total("hook_errors")} AS hook_errors,
                  {RUN_GRAPH_MODE} AS graph_mode
           FROM run_ranks GROUP BY run_id)"""
_RANK_COLUMNS = ("k.run_id, k.ended_wall, k.ranks_ended, k.ranks_crashed, k.error, k.last_seen_wall, "
                 "k.events_written, k.events_dropped, k.hook_errors, k.graph_mode")
# Without a RunStart a run's world size is what its rank rows say, and at least the ranks seen: a rank
# row made from counters alone says 1.
_SEEN_WORLD = "CASE WHEN k.world_size >= k.ranks THEN k.world_size ELSE k.ranks END"


def _run_status(world_size: str, last_heard: str) -> str:
    return f"""CASE WHEN k.ranks_crashed > 0 THEN 'crashed'
            WHEN k.ranks_ended >= {world_size} THEN 'finished'
            WHEN {NOW_WALL} - {last_heard} > {LOST_AFTER_S!r} THEN 'lost'
            ELSE 'running' END"""


def _run_columns(run: str) -> str:
    """v_run_summary's columns after the status, the run's id read from table alias ``run``."""
    return f"""k.last_seen_wall, k.error,
       (SELECT COUNT(*) FROM requests q WHERE q.run_id = {run}.run_id) AS requests,
       {summed("m.")},
       COALESCE(k.events_written, 0) AS events_written, COALESCE(k.events_dropped, 0) AS events_dropped,
       COALESCE(k.hook_errors, 0) AS hook_errors, k.graph_mode,
       {_stored_findings("error", run)} AS error_findings,
       {_stored_findings("warning", run)} AS warning_findings"""


VIEWS: dict[str, str] = {
    "v_run_acceptance": f"""
SELECT run_id, {summed()}
FROM acceptance_masks GROUP BY run_id
""",
    "v_rank_acceptance": f"""
SELECT run_id, rank, {summed()}
FROM acceptance_masks GROUP BY run_id, rank
""",
    # Requests joined to their summary rows (a few per request) and grouped by the request's own
    # columns: a filter on run_id (or request_id) is pushed into the grouping and reaches the summary's
    # primary key, so one run's requests cost one index range, not an aggregate over every run's.
    "v_request_acceptance": f"""
SELECT r.run_id, r.request_id, r.rank, r.prompt_tokens, r.output_tokens,
       {summed("a.")},
       r.started_wall, r.finished_wall,
       r.finished_wall - r.started_wall AS duration_s
FROM requests r
LEFT JOIN request_accepts a ON a.run_id = r.run_id AND a.request_id = r.request_id
GROUP BY r.run_id, r.request_id, r.rank, r.prompt_tokens, r.output_tokens, r.started_wall, r.finished_wall
""",
    "v_position_acceptance": _positions("acceptance_masks", "run_id"),
    "v_request_position_acceptance": _positions("verify_steps", "run_id, request_id"),
    "v_tensor_contract": """
SELECT run_id, rank, hook_point, shape, width, dtype, device, NULLIF(expected_shape, '') AS expected_shape,
       expected_width, graph_phase, events AS calls, first_call, last_call, first_wall, last_wall,
       CASE WHEN expected_width IS NOT NULL AND width <> expected_width THEN 1 ELSE 0 END AS width_mismatch,
       nonfinite
FROM tensor_shapes
""",
    # Acceptance per sampling group: the requests' summary rows grouped by the requests' label
    # (``position0_steps``: the steps whose mask has position 0 accepted, _POSITION_HIT at 0).
    "v_sampling_acceptance": f"""
SELECT a.run_id, COALESCE(q.sampling, 'unknown') AS sampling, COUNT(DISTINCT a.request_id) AS requests,
       {summed("a.")},
       CASE WHEN SUM(a.steps) > 0
            THEN CAST(SUM(a.position0_steps) AS DOUBLE PRECISION) / SUM(a.steps) END AS position0_acceptance
FROM request_accepts a
JOIN requests q ON q.run_id = a.run_id AND q.request_id = a.request_id
GROUP BY a.run_id, COALESCE(q.sampling, 'unknown')
""",
    "v_lossless_audit": _audit_verdict("lossless_audit", recovered=True),
    # the same tests over the replay against the target alone (docs/design.md, "Replay against the target")
    "v_replay_audit": _audit_verdict("replay_requests", _REPLAY_COLUMNS),
    # Every run id: those with a stored RunStart, and those with other rows only (the collector lost the
    # RunStart's batch, or the database refused its values).
    "v_run_ids": f"""
WITH RECURSIVE {_RUN_ID_SCANS}
SELECT run_id, 1 AS run_start FROM runs
UNION ALL
SELECT s.run_id, 0 AS run_start
FROM (SELECT run_id FROM run_ranks_ids UNION SELECT run_id FROM verify_steps_ids
      UNION SELECT run_id FROM tensor_events_ids UNION SELECT run_id FROM requests_ids) s
WHERE s.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = s.run_id)
""",
    # Runs with their RunStart, then (UNION ALL) runs with rank rows but no RunStart: each arm groups
    # by a plain table's run_id, so a filter on one run reaches its rows on SQLite too.
    "v_run_summary": f"""
SELECT r.run_id, 1 AS run_start, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.config,
       r.world_size, r.host, r.started_wall, k.ended_wall,
       {_run_status("r.world_size", "COALESCE(k.last_seen_wall, r.started_wall)")} AS status,
       {_run_columns("r")}
FROM runs r
LEFT JOIN acceptance_masks m ON m.run_id = r.run_id
LEFT JOIN {_RANKS} k ON k.run_id = r.run_id
GROUP BY r.run_id, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.config,
         r.world_size, r.host, r.started_wall, {_RANK_COLUMNS}
UNION ALL
SELECT k.run_id, 0 AS run_start, '{UNKNOWN_ENGINE}' AS engine, NULL AS engine_version, NULL AS target_model,
       NULL AS draft_model, NULL AS fault, '{{}}' AS config, {_SEEN_WORLD} AS world_size, k.host, k.started_wall,
       k.ended_wall, {_run_status(_SEEN_WORLD, "k.last_seen_wall")} AS status,
       {_run_columns("k")}
FROM {_RANKS} k
LEFT JOIN acceptance_masks m ON m.run_id = k.run_id
WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = k.run_id)
GROUP BY k.world_size, k.ranks, k.host, k.started_wall, {_RANK_COLUMNS}
""",
    **DISTRIBUTION_VIEWS,
}
