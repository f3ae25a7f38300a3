"""Views of acceptance as a distribution: over verify steps, over requests, over time and over the
position in the output (docs/design.md, "Acceptance across time and requests"). Same conventions as
:mod:`specscope.storage.views`: portable SQL, ratios as DOUBLE PRECISION, NULL for an empty
denominator, every sum weighted by ``verify_steps.steps``.

A verify step's *accepted drafts* (0..k) is only known for rows whose steps share one accepted mask
(``accepted_mask <> ''``, or nothing proposed): a row of totals without per-position data (a recorded
plain response, a watched window) is left out of the histogram, as ``v_position_acceptance`` leaves
it out of p_i (``request_accepts`` keeps it under accepted drafts -1, ``storage/_summaries.py``).
"""

from __future__ import annotations

from specscope.storage._formulas import floor_sql, mean_acceptance_length

ACCEPTANCE_WINDOWS = 32
"""Windows ``v_acceptance_windows`` cuts each run's span of verify steps into (first to last step)."""

OUTPUT_POSITION_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Lower bounds of ``v_acceptance_by_output_position``'s buckets (tokens generated before the verify
step): doubling, as acceptance moves most early in an answer and little over long tails."""

PERCENTILES = (10, 50, 90, 99)
"""Per-request AL percentiles of ``v_request_acceptance_distribution`` (nearest rank)."""

ALL_REQUESTS = "all"
"""The ``sampling`` label of ``v_request_acceptance_distribution``'s row over every request of a run."""

_SAMPLING = "COALESCE(q.sampling, 'unknown')"


def _run_filter(alias: str, run: str | None) -> str:
    return "" if run is None else f" AND {alias}.run_id = {run}"


def histogram_sql(run: str | None = None) -> str:
    """Per run, sampling group and accepted drafts 0..k (k: the most drafts a step of the group
    proposed): verify steps; zero buckets included. Read from the per-request summary
    ``request_accepts`` (its rows of known accepted drafts: a few per request) joined to the requests'
    sampling labels, the group totals by window functions over it, the buckets by the ``positions``
    table. ``run``: None for
    the view over every run, or the SQL of one run id (a named query's parameter), applied where it
    reaches the index (SQLite does not push a view's filter through window functions)."""
    return f"""
SELECT c.run_id, c.sampling, p.pos AS accepted_drafts, c.k,
       SUM(CASE WHEN c.accepted_drafts = p.pos THEN c.steps ELSE 0 END) AS verify_steps,
       CAST(SUM(CASE WHEN c.accepted_drafts = p.pos THEN c.steps ELSE 0 END) AS DOUBLE PRECISION)
           / MAX(c.group_steps) AS share
FROM (SELECT b.*, MAX(b.drafts) OVER g AS k, SUM(b.steps) OVER g AS group_steps
      FROM (SELECT r.run_id, {_SAMPLING} AS sampling, r.accepted_drafts, MAX(r.drafts) AS drafts,
                   SUM(r.steps) AS steps
            FROM (SELECT a.run_id, a.request_id, a.accepted_drafts, a.drafts, a.steps
                  FROM request_accepts a WHERE a.accepted_drafts >= 0{_run_filter('a', run)}) r
            JOIN requests q ON q.run_id = r.run_id AND q.request_id = r.request_id
            GROUP BY r.run_id, {_SAMPLING}, r.accepted_drafts) b
      WINDOW g AS (PARTITION BY b.run_id, b.sampling)) c
JOIN positions p ON p.pos <= c.k
GROUP BY c.run_id, c.sampling, p.pos, c.k
"""


def _request_distribution(sampling: str, run: str | None) -> str:
    """Per run and ``sampling`` (SQL over ``q``, the request): the per-request AL distribution of the
    requests with verify steps. Percentile p is the nearest rank: the smallest AL with at least p% of
    the requests at or below it. ``token_weighted_al`` weights each request's AL by its emitted tokens
    (a request that wrote more counts more); ``mean_request_al`` weights requests alike; the pooled AL
    (weighted by verify steps) is ``v_sampling_acceptance``'s."""
    percentiles = ",\n       ".join(f"MIN(CASE WHEN rn >= {p / 100!r} * n THEN al END) AS p{p}_al"
                                     for p in PERCENTILES)
    return f"""
SELECT run_id, sampling, COUNT(*) AS requests, AVG(al) AS mean_request_al,
       {percentiles},
       SUM(emitted * al) / SUM(emitted) AS token_weighted_al
FROM (SELECT a.run_id, {sampling} AS sampling, a.mean_acceptance_length AS al,
             CAST(a.emitted_tokens AS DOUBLE PRECISION) AS emitted,
             ROW_NUMBER() OVER (PARTITION BY a.run_id, {sampling}
                                ORDER BY a.mean_acceptance_length, a.request_id) AS rn,
             COUNT(*) OVER (PARTITION BY a.run_id, {sampling}) AS n
      FROM v_request_acceptance a JOIN requests q ON q.run_id = a.run_id AND q.request_id = a.request_id
      WHERE a.verify_steps > 0{_run_filter('a', run)}) x
GROUP BY run_id, sampling"""


def request_distribution_sql(run: str | None = None) -> str:
    """:func:`_request_distribution` per sampling group, then over all requests (``'all'``); ``run``
    as in :func:`histogram_sql`."""
    return (_request_distribution(_SAMPLING, run) + "\nUNION ALL"
            + _request_distribution(f"'{ALL_REQUESTS}'", run))


def _window(wall: str) -> str:
    """SQL of the window (0..:data:`ACCEPTANCE_WINDOWS` - 1) of the run's span ``b.t0`` / ``b.dt`` that
    wall time ``wall`` falls in; never decreases as ``wall`` grows."""
    return f"""CASE WHEN b.dt <= 0 OR {wall} <= b.t0 THEN 0
                  WHEN {wall} >= b.t0 + b.dt * {ACCEPTANCE_WINDOWS} THEN {ACCEPTANCE_WINDOWS - 1}
                  ELSE {floor_sql(f"({wall} - b.t0) / b.dt")} END"""


def windows_sql(run: str | None = None) -> str:
    """Per run, rank and window: the run's span of verify steps (first to last, from the summary
    table ``acceptance_masks``) cut into :data:`ACCEPTANCE_WINDOWS` windows of ``window_s`` seconds;
    ``run`` as in :func:`histogram_sql`. Counted per second (``step_seconds``): a second whose first
    and last step fall in one window counts there at once, the steps of one across a window boundary
    (at most 31 per rank) are read one by one (CROSS JOIN: looked up per such second, not a scan)."""
    bounds = f"""(SELECT run_id, MIN(first_wall) AS t0, (MAX(last_wall) - MIN(first_wall)) / {ACCEPTANCE_WINDOWS} AS dt
            FROM acceptance_masks m WHERE m.steps > 0{_run_filter('m', run)} GROUP BY run_id) b"""
    return f"""
SELECT run_id, rank, window_index, t0 + window_index * dt AS window_start_wall, dt AS window_s,
       SUM(steps) AS verify_steps, SUM(accepted) AS accepted,
       {mean_acceptance_length("SUM(accepted)", "SUM(steps)")} AS mean_acceptance_length
FROM (SELECT s.run_id, s.rank, s.steps, s.accepted, b.t0, b.dt, {_window("s.first_wall")} AS window_index
      FROM step_seconds s JOIN {bounds} ON b.run_id = s.run_id
      WHERE {_window("s.first_wall")} = {_window("s.last_wall")}{_run_filter('s', run)}
      UNION ALL
      SELECT v.run_id, v.rank, v.steps, v.accepted, b.t0, b.dt, {_window("v.ts_wall")}
      FROM step_seconds s JOIN {bounds} ON b.run_id = s.run_id
      CROSS JOIN verify_steps v
      WHERE {_window("s.first_wall")} <> {_window("s.last_wall")}{_run_filter('s', run)} AND v.run_id = s.run_id
            AND v.rank = s.rank AND v.ts_wall >= s.first_wall AND v.ts_wall <= s.last_wall AND v.steps > 0) w
GROUP BY run_id, rank, window_index, t0, dt
HAVING SUM(steps) > 0
"""


def by_output_position_sql(run: str | None = None) -> str:
    """Per run and bucket of the tokens a request had generated before the verify step
    (:data:`OUTPUT_POSITION_BUCKETS`): verify steps and AL. Only per-step rows (``step >= 0``) have
    an order within their request; aggregate rows are left out. ``run`` as in :func:`histogram_sql`;
    for one run the run id is not carried through the window and the grouping (a long string copied
    per verify step: about a third of the query's time on a 240k-step run)."""
    bounds = OUTPUT_POSITION_BUCKETS
    bucket = " ".join(f"WHEN generated < {hi} THEN {lo}" for lo, hi in zip(bounds, bounds[1:]))
    run_id, partition, outer = ("v.run_id, ", "v.run_id, ", "run_id, ") if run is None else ("", "", "")
    return f"""
SELECT {"run_id" if run is None else f"CAST({run} AS VARCHAR(64))"} AS run_id, output_position, COUNT(*) AS verify_steps,
       SUM(accepted) AS accepted,
       {mean_acceptance_length("SUM(accepted)", "COUNT(*)")} AS mean_acceptance_length
FROM (SELECT {outer}accepted, CASE {bucket} ELSE {bounds[-1]} END AS output_position
      FROM (SELECT {run_id}v.accepted,
                   SUM(v.accepted + 1) OVER (PARTITION BY {partition}v.request_id ORDER BY v.step
                                             ROWS UNBOUNDED PRECEDING) - v.accepted - 1 AS generated
            FROM verify_steps v WHERE v.step >= 0{_run_filter('v', run)}) s) b
GROUP BY {outer}output_position
"""


REQUEST_AL_BUCKETS = (1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)
"""Upper bounds of the per-request AL histogram the exporter serves (``le``; +Inf implied): fine near
1, where a collapsed request sits, coarser up to k + 1 of the usual k <= 7."""


def request_al_buckets_sql(runs: str) -> str:
    """Per run of ``runs`` (SQL of a list), its requests with verify steps: ``requests``, ``al_sum``
    and ``le_<i>``, the requests whose AL is at most :data:`REQUEST_AL_BUCKETS` [i] (cumulative, as
    Prometheus histograms count)."""
    buckets = ", ".join(f"SUM(CASE WHEN mean_acceptance_length <= {le!r} THEN 1 ELSE 0 END) AS le_{i}"
                        for i, le in enumerate(REQUEST_AL_BUCKETS))
    return f"""
SELECT run_id, COUNT(*) AS requests, SUM(mean_acceptance_length) AS al_sum, {buckets}
FROM v_request_acceptance WHERE run_id IN {runs} AND verify_steps > 0 GROUP BY run_id"""


DISTRIBUTION_VIEWS: dict[str, str] = {
    "v_acceptance_histogram": histogram_sql(),
    "v_request_acceptance_distribution": request_distribution_sql(),
    "v_acceptance_windows": windows_sql(),
    "v_acceptance_by_output_position": by_output_position_sql(),
}
"""The views of this module, by name (:data:`specscope.storage.views.VIEWS` holds them after the
views they read)."""
