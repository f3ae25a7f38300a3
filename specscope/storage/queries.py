"""Every statement specscope runs to read a store: named queries with their parameters, over the views
of :mod:`specscope.storage.views` (where the acceptance formulas live) and the summary tables. The
dashboard (``app/queries.py``), the doctor, the Prometheus exporter and the CLI run these through
:func:`fetch` / :meth:`Store.fetch <specscope.storage.Store.fetch>`; no other module holds SQL.

Each query filters on ``run_id`` (or a list of run ids) so it reads one run's rows through an index
or the summary tables; results are small. Time columns are wall-clock seconds since the Unix epoch
(``*_wall``) or durations in seconds (``*_s``); widths are elements.
"""

from __future__ import annotations

from specscope import points
from specscope.events import PIT_BINS, SEVERITIES
from specscope.storage._distribution_views import OUTPUT_POSITION_BUCKETS as OUTPUT_POSITION_BUCKETS  # the dashboard's
from specscope.storage._distribution_views import REQUEST_AL_BUCKETS as REQUEST_AL_BUCKETS  # the exporter's
from specscope.storage._distribution_views import (
    by_output_position_sql,
    histogram_sql,
    request_al_buckets_sql,
    request_distribution_sql,
    windows_sql,
)
from specscope.storage._fetch import Query as Query
from specscope.storage._fetch import fetch as fetch
from specscope.storage._fetch import records as records
from specscope.storage._formulas import floor_sql, mean_acceptance_length
from specscope.storage._summaries import NO_WIDTH

# -- runs ----------------------------------------------------------------------------------------

RUNS = Query("runs", "SELECT * FROM v_run_summary ORDER BY started_wall DESC NULLS LAST, run_id")
"""Every run, newest first: the columns of ``v_run_summary`` (metadata, JSON ``config``, status,
counters, acceptance, stored error / warning findings). Reads the summary tables only."""

RUN = Query("run", "SELECT * FROM v_run_summary WHERE run_id = :run_id")
"""One run as in :data:`RUNS` (no row when it does not exist)."""

RUN_META = Query("run_meta", "SELECT run_id, engine, fault, config FROM runs WHERE run_id = :run_id")
"""What the doctor needs to open one run: id, engine, fault label and JSON config."""

ALL_RUN_META = Query("all_run_meta", "SELECT run_id, engine, fault, config FROM runs "
                                     "ORDER BY started_wall DESC, run_id")
""":data:`RUN_META` of every run, newest first."""

RUN_ID = Query("run_id", "SELECT run_id FROM v_run_ids WHERE run_id = :run_id")
"""``run_id`` when the store holds rows of it (a RunStart or others: ``v_run_ids``)."""

KNOWN_RUN_IDS = Query("known_run_ids", "SELECT i.run_id FROM v_run_ids i LEFT JOIN runs r ON r.run_id = i.run_id "
                                       "ORDER BY r.started_wall DESC NULLS LAST, i.run_id")
"""Every run id of ``v_run_ids``, newest RunStart first, those without one last."""

RUN_IDS_STARTING = Query("run_ids_starting", "SELECT run_id FROM v_run_ids WHERE substr(run_id, 1, length(:prefix)) "
                                             "= :prefix ORDER BY run_id LIMIT :limit")
"""Run ids starting with ``prefix``, at most ``limit``. Compared as text, case and all: SQLite's LIKE
ignores the case of ASCII letters, so ``b`` named run ``Baseline-7`` there and no run on PostgreSQL."""

ORPHAN_RUN_IDS = Query("orphan_run_ids", "SELECT run_id FROM v_run_ids WHERE run_start = 0 ORDER BY run_id")
"""Run ids with stored rows (ranks, verify steps, tensor events, requests) but no ``runs`` row: runs whose
RunStart never reached the store (the collector dropped its batch, or the database refused it)."""

RUN_ACCEPTANCE = Query("run_acceptance", """SELECT q.requests, COALESCE(a.verify_steps, 0) AS verify_steps, a.proposed,
    a.accepted, a.mean_acceptance_length, a.acceptance_rate FROM (SELECT COUNT(*) AS requests FROM requests WHERE run_id = :run_id) q
    LEFT JOIN (SELECT * FROM v_run_acceptance WHERE run_id = :run_id) a ON 1 = 1""")
"""``requests`` and ``v_run_acceptance`` of a run id, ``runs`` row or not: one row (0 verify steps before the first)."""

ROLLING_STEPS = 10
"""Slices in :data:`ACCEPTANCE_OVER_TIME`'s rolling acceptance length (this one and 9 before)."""

# The run's lifetime (first rank start to last time a rank was heard from) cut into :buckets slices.
def _slice(wall: str) -> str:
    """SQL of the slice of the run's lifetime that wall time ``wall`` falls in, over ``t0`` / ``dt`` (a
    row of the CTE ``bounds``); times outside the lifetime go to the nearest end. Never decreases as
    ``wall`` grows: rows between two of one slice are in it."""
    return f"""CASE WHEN dt IS NULL OR dt <= 0 OR {wall} <= t0 THEN 0
                     WHEN {wall} - t0 >= dt * :buckets THEN :buckets - 1
                     ELSE {floor_sql(f"({wall} - t0) / dt")} END"""


def _sliced(summary: str, table: str, keys: dict[str, str], sums: dict[str, str], where: str = "") -> str:
    """The CTEs ``bounds``, ``seconds`` and ``sliced``: the rows of ``table`` (alias ``v``) of run
    ``:run_id`` (and ``where``) with their ``slice`` of the run's lifetime, its length ``dt``, the
    ``keys`` and the ``sums`` (name: SQL over ``v``), counted per second from ``summary`` (its rows of
    the run: the keys, the sums, ``first_wall`` and ``last_wall`` of one wall-clock second): a second
    whose first and last row fall in one slice counts there at once; the rows of one that straddles a
    slice boundary (at most ``buckets`` - 1 per key) are read one by one, between its first and last
    wall time (CROSS JOIN: SQLite then looks them up per straddling second, instead of scanning the
    run's rows for a second each)."""
    names = ", ".join([*keys, *sums])
    match = "".join(f" AND {raw} = s.{name}" for name, raw in keys.items())
    raw = ", ".join([*(f"s.{name}" for name in keys), *sums.values()])
    return f"""
    WITH bounds AS (SELECT MIN(started_wall) AS t0,
                           (MAX(last_seen_wall) - MIN(started_wall)) / :buckets AS dt
                    FROM run_ranks WHERE run_id = :run_id),
    seconds AS (SELECT s.*, b.t0, b.dt, {_slice("s.first_wall")} AS first_slice,
                       {_slice("s.last_wall")} AS last_slice
                FROM {summary} s CROSS JOIN bounds b WHERE s.run_id = :run_id),
    sliced AS (SELECT first_slice AS slice, dt, {names} FROM seconds WHERE first_slice = last_slice
               UNION ALL
               SELECT {_slice("v.ts_wall")}, dt, {raw}
               FROM seconds s CROSS JOIN {table} v
               WHERE s.first_slice <> s.last_slice AND v.run_id = :run_id{match}
                     AND v.ts_wall >= s.first_wall AND v.ts_wall <= s.last_wall{where})"""


ACCEPTANCE_OVER_TIME = Query("acceptance_over_time", f"""{_sliced(
    "step_seconds", "verify_steps", {"rank": "v.rank"}, {"accepted": "v.accepted", "steps": "v.steps"})},
    per_slice AS (SELECT slice, slice * MAX(COALESCE(dt, 0)) AS t_s, SUM(steps) AS verify_steps,
                         SUM(accepted) AS accepted FROM sliced GROUP BY slice)
    SELECT t_s, verify_steps, accepted,
           {mean_acceptance_length("accepted", "verify_steps")} AS mean_acceptance_length,
           {mean_acceptance_length("SUM(accepted) OVER w", "SUM(verify_steps) OVER w")}
               AS rolling_acceptance_length
    FROM per_slice WINDOW w AS (ORDER BY slice ROWS BETWEEN {ROLLING_STEPS - 1} PRECEDING AND CURRENT ROW)
    ORDER BY slice""")
"""Acceptance length over wall time: per slice of the run's lifetime (``buckets`` slices) with verify
steps: ``t_s`` (slice start, s since the run started), ``verify_steps``, ``accepted``,
``mean_acceptance_length`` and ``rolling_acceptance_length`` (over this and the
:data:`ROLLING_STEPS` - 1 previous slices with steps, weighted by steps). Steps outside the lifetime
go to the nearest end."""

DRAFT_INPUTS_OVER_TIME = Query("draft_inputs_over_time", f"""{_sliced(
    "draft_input_seconds", "tensor_events",
    {"rank": "v.rank", "hook_point": "v.hook_point", "width": f"COALESCE(v.width, {NO_WIDTH})",
     "expected_width": "v.expected_width"}, {"events": "1"})}
    SELECT rank, hook_point, NULLIF(width, {NO_WIDTH}) AS width, expected_width, slice,
           slice * MAX(COALESCE(dt, 0)) AS t_s, SUM(events) AS events
    FROM sliced GROUP BY rank, hook_point, width, expected_width, slice
    ORDER BY rank, hook_point, expected_width, width, slice""")
"""The draft's recorded inputs that carry a width contract, per slice of the run's lifetime
(``buckets`` slices, as :data:`ACCEPTANCE_OVER_TIME`): ``rank``, ``hook_point``, ``width``,
``expected_width``, ``slice``, ``t_s`` (slice start, s since the run started) and ``events``
(recorded events: hooks record a sample of the calls, so a slice without a row is a slice where no
call was sampled, not one without calls). Reads the summary ``draft_input_seconds``, and the raw
``tensor_events`` of the seconds that straddle a slice boundary through ``ix_tensor_events_run``."""

POSITION_ACCEPTANCE = Query("position_acceptance", """
    SELECT position, accepted_steps, verify_steps, acceptance FROM v_position_acceptance
    WHERE run_id = :run_id ORDER BY position""")
"""Per-position acceptance p_i of a run: ``position`` (0 = first draft token), ``accepted_steps``,
``verify_steps``, ``acceptance``."""

# -- requests --------------------------------------------------------------------------------------

REQUEST_ORDERS = ("start", "acceptance length", "duration", "verify steps")
"""Orders of :data:`REQUESTS`: start ascending; the others worst first (lowest AL, longest, most steps)."""

REQUESTS = Query("requests", """
    SELECT v.request_id, v.rank, v.prompt_tokens, v.output_tokens, v.verify_steps, v.proposed, v.accepted,
           v.mean_acceptance_length, v.acceptance_rate, v.started_wall, v.finished_wall, v.duration_s,
           v.step_detail, r.sampling, r.text
    FROM v_request_acceptance v JOIN requests r ON r.run_id = v.run_id AND r.request_id = v.request_id
    WHERE v.run_id = :run_id
    ORDER BY CASE WHEN :order = 'start' THEN v.started_wall END,
             CASE WHEN :order = 'acceptance length' THEN v.mean_acceptance_length END,
             CASE WHEN :order = 'duration' THEN v.duration_s END DESC,
             CASE WHEN :order = 'verify steps' THEN v.verify_steps END DESC,
             v.request_id
    LIMIT :limit""")
"""Requests of a run (``v_request_acceptance``) in ``order`` (one of :data:`REQUEST_ORDERS`), at most
``limit``: tokens, verify steps, AL, rate, start / finish, ``duration_s``, ``step_detail``, the
request's ``sampling`` label (NULL: not reported) and generated ``text`` (NULL: not recorded)."""

REQUEST_STEPS = Query("request_steps", """
    SELECT step, proposed, accepted, accepted_mask, draft_s, verify_s, emitted, ts_wall
    FROM verify_steps WHERE run_id = :run_id AND request_id = :request_id AND step >= 0
    ORDER BY step LIMIT :limit""")
"""Per-step rows of one request in order (aggregate rows, ``step`` -1, are not steps); ``emitted``
is JSON text."""

REQUEST_POSITIONS = Query("request_positions", """
    SELECT position, accepted_steps, verify_steps, acceptance FROM v_request_position_acceptance
    WHERE run_id = :run_id AND request_id = :request_id ORDER BY position""")
"""Per-position acceptance p_i of one request (denominator: its verify steps)."""

REQUEST_SERIES = Query("request_series", """
    SELECT v.request_id, COALESCE(r.sampling, 'unknown') AS sampling, r.prompt_key, v.prompt_tokens, v.started_wall,
           v.verify_steps, v.proposed, v.accepted, v.mean_acceptance_length, v.acceptance_rate
    FROM v_request_acceptance v JOIN requests r ON r.run_id = v.run_id AND r.request_id = v.request_id
    WHERE v.run_id = :run_id AND v.verify_steps > 0 ORDER BY v.started_wall, v.request_id""")
"""The requests of a run with verify steps, oldest first, without their text: the units the drift and
outlier rules judge (``sampling``: the group label, ``'unknown'`` when not reported; ``prompt_key``:
None when not recorded)."""

REQUEST_TEXTS = Query("request_texts", "SELECT request_id, text FROM requests WHERE run_id = :run_id "
                                       "AND request_id IN :request_ids", expanding=("request_ids",))
"""The generated text of some requests of a run (NULL: not recorded)."""

# -- acceptance as a distribution (storage/_distribution_views.py, one run) -----------------------

ACCEPTANCE_HISTOGRAM = Query("acceptance_histogram", histogram_sql(":run_id") + "ORDER BY sampling, accepted_drafts")
"""``v_acceptance_histogram`` of a run: per sampling group and accepted drafts 0..k, verify steps, share."""
REQUEST_DISTRIBUTION = Query("request_distribution", request_distribution_sql(":run_id") + "\nORDER BY sampling")
"""``v_request_acceptance_distribution`` of a run: per sampling group and ``'all'``, per-request AL percentiles."""
ACCEPTANCE_WINDOWS = Query("acceptance_windows", windows_sql(":run_id") + "ORDER BY rank, window_index")
"""``v_acceptance_windows`` of a run: per rank and window with verify steps, its start, steps and AL."""
OUTPUT_POSITION_ACCEPTANCE = Query("output_position_acceptance",
                                   by_output_position_sql(":run_id") + "ORDER BY output_position")
"""``v_acceptance_by_output_position`` of a run: AL per bucket of tokens generated before the step."""
DISTRIBUTIONS = {"acceptance_histogram": ACCEPTANCE_HISTOGRAM, "request_acceptance": REQUEST_DISTRIBUTION,
                 "acceptance_windows": ACCEPTANCE_WINDOWS, "acceptance_by_output_position": OUTPUT_POSITION_ACCEPTANCE}
"""A run's acceptance distributions by the name readers give them (``doctor --json``, the dashboard)."""

# -- ranks ---------------------------------------------------------------------------------------

RANKS = Query("ranks", """
    SELECT k.rank, k.device, k.host, k.pid, k.graph_mode, k.hook_calls, k.hook_errors,
           k.events_written, k.events_dropped, k.last_seen_wall, k.ended_wall,
           COALESCE(a.verify_steps, 0) AS verify_steps, a.mean_acceptance_length,
           a.acceptance_rate, a.tokens_per_s
    FROM run_ranks k
    LEFT JOIN (SELECT * FROM v_rank_acceptance WHERE run_id = :run_id) a ON a.rank = k.rank
    WHERE k.run_id = :run_id ORDER BY k.rank""")
"""One row per rank of a run (``run_ranks``): device, host, pid, graph mode, hook and event counters,
and its acceptance from ``v_rank_acceptance``."""

RANK_ACCEPTANCE = Query("rank_acceptance", """
    SELECT rank, verify_steps, mean_acceptance_length FROM v_rank_acceptance
    WHERE run_id = :run_id ORDER BY rank""")
"""Acceptance per rank with verify steps (whether or not the rank reported a status)."""

# -- tensors -------------------------------------------------------------------------------------

TENSOR_CONTRACT = Query("tensor_contract", """
    SELECT hook_point, rank, shape, expected_shape, dtype, graph_phase, SUM(calls) AS events,
           MAX(width) AS width, MAX(expected_width) AS expected_width,
           MAX(width_mismatch) AS width_mismatch, MIN(first_wall) AS first_wall, MAX(last_wall) AS last_wall
    FROM v_tensor_contract WHERE run_id = :run_id
    GROUP BY hook_point, rank, shape, expected_shape, dtype, graph_phase
    ORDER BY hook_point, rank, first_wall""")
"""The shape contract of a run: per hook point, rank, shape, expected shape, dtype and graph phase,
``events`` (recorded, a sample of the hook calls), ``width`` / ``expected_width`` (last dimension;
expected NULL where no contract is known), ``width_mismatch`` (1/0), first / last wall time."""

NONFINITE = Query("nonfinite", """
    SELECT hook_point, SUM(nonfinite) AS elements, COUNT(*) AS events, MIN(ts_wall) AS first_wall
    FROM tensor_events WHERE run_id = :run_id AND nonfinite > 0
    GROUP BY hook_point ORDER BY first_wall, hook_point""")
"""Tensor events with inf / nan elements per hook point (value statistics on): ``elements`` summed,
``events``, first wall time. Served by the partial index ``ix_tensor_events_nonfinite``."""

PROVENANCE = Query("provenance", """
    SELECT rank, configured, received, matches, width, COUNT(*) AS checks,
           MIN(ts_wall) AS first_wall, MAX(ts_wall) AS last_wall
    FROM provenance WHERE run_id = :run_id
    GROUP BY rank, configured, received, matches, width ORDER BY rank, checks DESC, received""")
"""Which target layers the draft received, grouped: ``rank``, ``configured`` / ``received`` (JSON
lists; null = no layer matched, ``num_target_layers`` = the final norm), ``matches``, ``width``,
``checks`` (sampled draft calls), first / last wall time."""

# -- sampling groups and the losslessness audit ------------------------------------------------------

SAMPLING_ACCEPTANCE = Query("sampling_acceptance", """
    SELECT sampling, requests, verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate,
           position0_acceptance
    FROM v_sampling_acceptance WHERE run_id = :run_id ORDER BY sampling""")
"""Acceptance per sampling group of a run (``'greedy'``, ``'T=0.8'``, ..., ``'unknown'``)."""

_SURPRISE = ("mean_surprise_emitted, mean_surprise_expected, surprise_excess, surprise_threshold_below, "
            "surprise_threshold_above, detectable_surprise_shift")
"""The surprise test's columns of ``v_lossless_audit`` and ``v_replay_audit``."""

LOSSLESS_AUDIT = Query("lossless_audit", f"""
    SELECT sampling, requests, tokens_audited, greedy_mismatches, rare_observed, rare_expected,
           rare_threshold, mean_p_emitted, mean_p_expected, epsilon, scored_tokens, p_excess,
           p_excess_threshold, detectable_p_shift, {", ".join(f"pit_{b}" for b in range(PIT_BINS))},
           pit_threshold, pit_worst_bin, detectable_pit_excess, {_SURPRISE}, recovered_audited, recovered_as_draft,
           recovered_p_expected, detectable_recovered_from_p, junk_failed, mean_failed, pit_failed,
           surprise_failed, recovered_failed, verdict
    FROM v_lossless_audit WHERE run_id = :run_id ORDER BY sampling""")
"""The losslessness audit of a run per sampling group, with its verdict."""

AUDIT_EXAMPLES = Query("audit_examples", """
    SELECT sampling, request_id, example FROM lossless_audit
    WHERE run_id = :run_id AND example IS NOT NULL ORDER BY ts_wall, id LIMIT :limit""")
"""The first violating tokens of a run's audit (``example`` JSON: position, tokens, probability)."""

REPLAY_AUDIT = Query("replay_audit", f"""
    SELECT sampling, requests, tokens_audited, greedy_mismatches, departures, near_ties, departed_requests,
           near_tie_requests, max_margin, near_tie_margin, source, rare_observed, rare_expected, rare_threshold,
           mean_p_emitted, mean_p_expected, epsilon, scored_tokens, p_excess, p_excess_threshold,
           detectable_p_shift, {", ".join(f"pit_{b}" for b in range(PIT_BINS))}, pit_threshold, pit_worst_bin,
           detectable_pit_excess, {_SURPRISE}, junk_failed, mean_failed, pit_failed, surprise_failed, verdict
    FROM v_replay_audit WHERE run_id = :run_id ORDER BY sampling""")
"""The replay against the target alone of a run per sampling group (``v_replay_audit``), with the
audit's verdict over the replayed figures."""

REPLAY_DEPARTURES = Query("replay_departures", """
    SELECT request_id, sampling, departures, near_ties, first_departure, first_margin, max_margin, example
    FROM replay_requests WHERE run_id = :run_id AND departures > 0
    ORDER BY mismatches DESC, max_margin DESC, request_id LIMIT :limit""")
"""A run's replayed requests that departed from the target's greedy choice, bugs (margins beyond a
near-tie) first."""

REPLAY_STAMP = Query("replay_stamp", """
    SELECT COUNT(*) AS replayed, MAX(ts_wall) AS last_wall FROM replay_requests WHERE run_id = :run_id""")
"""How many of a run's requests were replayed, and when last: an ended run's verdict changes with it."""

REPLAY_INPUTS = Query("replay_inputs", """
    SELECT t.request_id, t.prompt_ids, t.output_ids, t.output_truncated, q.sampling, q.temperature, q.top_p,
           q.top_k
    FROM request_tokens t JOIN requests q ON q.run_id = t.run_id AND q.request_id = t.request_id
    WHERE t.run_id = :run_id ORDER BY t.ts_wall, t.request_id""")
"""A run's requests whose token ids were kept, with their sampling settings: what a replay scores."""

# -- findings and checkpoint loading -------------------------------------------------------------

# events.SEVERITIES order (errors first), as events.by_severity sorts in Python
_SEVERITY_ORDER = f"CASE severity {' '.join(f'WHEN {s!r} THEN {i}' for i, s in enumerate(SEVERITIES))} END"

RUN_FINDINGS_FROM = Query("run_findings_from", f"""
    SELECT run_id, source, code, severity, message, evidence, fix, ts_wall FROM findings
    WHERE run_id = :run_id AND source = :source ORDER BY {_SEVERITY_ORDER}, ts_wall, code""")
"""Stored findings of a run from one ``source`` (``'doctor'`` / ``'inspect'``), errors first;
``evidence`` is JSON text."""

LOAD_REPORTS = Query("load_reports", """
    SELECT rank, module, source, strict, loaded, missing, unexpected, renamed, ts_wall
    FROM load_reports WHERE run_id = :run_id ORDER BY rank, ts_wall, id""")
"""Checkpoint load reports of a run; ``missing`` / ``unexpected`` / ``renamed`` are JSON lists."""

# -- comparing runs, what-if k -----------------------------------------------------------------

COMPARE_REQUESTS = Query("compare_requests", """
    SELECT a.request_id, r.prompt_key, COALESCE(r.sampling, 'unknown') AS sampling, a.verify_steps, a.accepted
    FROM v_request_acceptance a JOIN requests r ON r.run_id = a.run_id AND r.request_id = a.request_id
    WHERE a.run_id = :run_id AND a.verify_steps > 0
    ORDER BY a.started_wall, a.request_id""")
"""The requests of a run with verify steps, as ``specscope compare`` resamples them: ``prompt_key``
(pairs a request with one of another run that served the same prompt; NULL: the engine did not say),
``sampling`` (the sampling group label, ``'unknown'`` when not reported), ``verify_steps``,
``accepted`` draft tokens; oldest first."""

RUN_MASKS = Query("run_masks", """
    SELECT accepted_mask, SUM(steps) AS steps FROM acceptance_masks
    WHERE run_id = :run_id AND (accepted_mask <> '' OR proposed = 0)
    GROUP BY accepted_mask ORDER BY accepted_mask""")
"""Verify steps per accepted mask of a run, over its ranks (the what-if-k acceptance lengths): steps
whose positions are known, as ``v_position_acceptance`` counts them (totals without a mask left out)."""

TIMED_STEPS = 20_000
"""Verify steps :data:`RUN_STEP_TIMES` averages over at most: a mean time settles long before, and a
page's cost must not grow with a run's size."""

RUN_STEP_TIMES = Query("run_step_times", """
    SELECT COUNT(*) AS steps, SUM(proposed) AS proposed, SUM(draft_s) AS draft_s, SUM(verify_s) AS verify_s
    FROM (SELECT proposed, draft_s, verify_s FROM verify_steps
          WHERE run_id = :run_id AND step >= 0 AND draft_s IS NOT NULL AND verify_s IS NOT NULL
          LIMIT :limit) timed""")
"""Draft and verify time (s) summed over up to ``limit`` (:data:`TIMED_STEPS`) per-step rows of a run
that carry both, with their verify steps and proposed drafts (the what-if-k throughput model);
``steps`` 0 when no step was timed."""

# -- many runs at once (the Prometheus exporter) --------------------------------------------------

NEWEST_RUNS = Query("newest_runs", "SELECT run_id, engine, target_model, status FROM v_run_summary "
                                   "ORDER BY started_wall DESC NULLS LAST, run_id LIMIT :limit")
RUNS_ACCEPTANCE = Query("runs_acceptance", "SELECT run_id, verify_steps, proposed, accepted, "
                        "mean_acceptance_length, acceptance_rate FROM v_run_acceptance WHERE run_id IN :runs",
                        expanding=("runs",))
RUNS_RANK_ACCEPTANCE = Query("runs_rank_acceptance", "SELECT run_id, rank, verify_steps, proposed, accepted, "
                             "mean_acceptance_length, acceptance_rate FROM v_rank_acceptance "
                             "WHERE run_id IN :runs", expanding=("runs",))
RUNS_POSITIONS = Query("runs_positions", "SELECT run_id, position, acceptance FROM v_position_acceptance "
                       "WHERE run_id IN :runs", expanding=("runs",))
RUNS_RANK_HEALTH = Query("runs_rank_health", "SELECT run_id, rank, events_dropped, hook_errors FROM run_ranks "
                         "WHERE run_id IN :runs", expanding=("runs",))
RUNS_REQUEST_AL = Query("runs_request_al", request_al_buckets_sql(":runs"), expanding=("runs",))
"""Per run, its requests' AL as cumulative histogram buckets (``storage/_distribution_views.py``)."""
# every draft input with a width contract (vLLM: the fc input), as a range: '/' sorts right after '.'
RUNS_DRAFT_CONTRACT = Query("runs_draft_contract", "SELECT run_id, rank, hook_point, expected_width, width, "
                            "calls FROM v_tensor_contract WHERE run_id IN :runs "
                            f"AND hook_point >= '{points.DRAFT_PREFIX}' AND hook_point < '{points.DRAFT_PREFIX[:-1]}/' "
                            "AND expected_width IS NOT NULL", expanding=("runs",))

QUERIES: tuple[Query, ...] = tuple(value for value in dict(globals()).values() if isinstance(value, Query))
"""Every named query of this module (a test runs each on SQLite and PostgreSQL)."""

EXAMPLES = {
    "Runs, newest first": "SELECT run_id, engine, fault, status, verify_steps, mean_acceptance_length,\n"
                          "       acceptance_rate, error_findings\nFROM v_run_summary ORDER BY started_wall DESC",
    "Worst requests of the selected run": "SELECT request_id, verify_steps, mean_acceptance_length, duration_s\n"
                                          "FROM v_request_acceptance WHERE run_id = '{run_id}'\n"
                                          "ORDER BY mean_acceptance_length LIMIT 20",
    "Draft input widths vs contract": "SELECT rank, shape, expected_shape, graph_phase, calls, width_mismatch\n"
                                      "FROM v_tensor_contract WHERE run_id = '{run_id}'\n"
                                      "  AND hook_point = 'draft.forward:hidden_states'",
    "Per-position acceptance": "SELECT position, acceptance, verify_steps FROM v_position_acceptance\n"
                               "WHERE run_id = '{run_id}' ORDER BY position",
    "Acceptance per rank": "SELECT rank, verify_steps, mean_acceptance_length, tokens_per_s\n"
                           "FROM v_rank_acceptance WHERE run_id = '{run_id}' ORDER BY rank",
    "Losslessness audit": "SELECT sampling, tokens_audited, greedy_mismatches, rare_observed, rare_threshold,\n"
                          "       mean_p_emitted, mean_p_expected, detectable_p_shift, verdict\n"
                          "FROM v_lossless_audit WHERE run_id = '{run_id}'",
    "Acceptance per sampling group": "SELECT sampling, requests, verify_steps, mean_acceptance_length\n"
                                     "FROM v_sampling_acceptance WHERE run_id = '{run_id}'",
    "Findings": "SELECT source, code, severity, message FROM findings WHERE run_id = '{run_id}'",
}
"""Starting points for users' own SQL (the dashboard's SQL page; ``{run_id}``: the selected run)."""
