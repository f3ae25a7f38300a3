"""Every SQL statement the dashboard runs: small functions of an open (read-only) Store that return
plain lists of dicts, already aggregated by the database.

The acceptance formulas come from the views of :mod:`specscope.storage.views` (AL = 1 + accepted /
verify steps, rate = accepted / proposed, p_i = steps with position i accepted / verify steps); the
functions here filter and shape those views. Aggregation happens in SQL, bounded by ``run_id`` (and
``request_id``) so the indexes of :mod:`specscope.storage.schema` pick the rows: every function stays
under a second on 1M verify steps and 5M tensor events (``python -m benchmarks.dashboard_queries``).
Time columns are wall-clock seconds since the Unix epoch (``*_wall``) or durations (``*_s``).
Every function raises :class:`~specscope.errors.StoreError` when the database refuses the query.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from specscope import points
from specscope.storage import Store
from specscope.storage.views import RUN_GRAPH_MODE

STALE_AFTER_S = 60.0  # a running run silent for longer than this is shown as 'stale'

Row = dict[str, Any]


def _rows(store: Store, sql: str, **params: Any) -> list[Row]:
    with store.connect() as conn:
        result = conn.execute(sa.text(sql), params)
        return [{key: float(value) if isinstance(value, Decimal) else value
                 for key, value in row.items()} for row in result.mappings()]


def _floor(store: Store, expr: str) -> str:
    """SQL truncating the non-negative ``expr`` to an integer: PostgreSQL's CAST rounds to nearest,
    SQLite's CAST truncates (and FLOOR is missing from some SQLite builds)."""
    return f"FLOOR({expr})" if store.dialect == "postgresql" else f"CAST({expr} AS INTEGER)"


def run_state(status: str, last_seen_wall: float | None, now: float | None = None) -> str:
    """``'finished'`` (every rank ended), ``'running'``, or ``'stale'``: running in ``v_run_summary``
    but not heard from for more than :data:`STALE_AFTER_S` seconds (a crashed or killed engine)."""
    if status == "finished":
        return "finished"
    now = time.time() if now is None else now
    if last_seen_wall is None or now - last_seen_wall > STALE_AFTER_S:
        return "stale"
    return "running"


_RUNS_SQL = """
    SELECT r.run_id, r.engine, r.engine_version, r.target_model, r.draft_model, r.fault, r.config,
           r.world_size, r.host, r.started_wall,
           CASE WHEN k.ranks_ended >= r.world_size THEN 'finished' ELSE 'running' END AS status,
           k.last_seen_wall, k.ended_wall, COALESCE(k.events_written, 0) AS events_written,
           COALESCE(k.events_dropped, 0) AS events_dropped, COALESCE(k.hook_errors, 0) AS hook_errors,
           k.graph_mode,
           (SELECT COUNT(*) FROM requests q WHERE q.run_id = r.run_id) AS requests,
           COALESCE(f.error_findings, 0) AS error_findings,
           COALESCE(f.warning_findings, 0) AS warning_findings
    FROM runs r
    LEFT JOIN (SELECT run_id, COUNT(ended_wall) AS ranks_ended, MAX(ended_wall) AS ended_wall,
                      MAX(last_seen_wall) AS last_seen_wall, SUM(events_written) AS events_written,
                      SUM(events_dropped) AS events_dropped, SUM(hook_errors) AS hook_errors,
                      {graph_mode} AS graph_mode
               FROM run_ranks {inner} GROUP BY run_id) k ON k.run_id = r.run_id
    LEFT JOIN (SELECT run_id, SUM(CASE WHEN severity = 'error' THEN 1 ELSE 0 END) AS error_findings,
                      SUM(CASE WHEN severity = 'warning' THEN 1 ELSE 0 END) AS warning_findings
               FROM findings {inner} GROUP BY run_id) f ON f.run_id = r.run_id
    {outer}"""  # the run columns of v_run_summary (views.py), without its whole-table acceptance scan


def _run_rows(store: Store, run_id: str | None, now: float | None) -> list[Row]:
    if run_id is None:
        rows = _rows(store, _RUNS_SQL.format(inner="", outer="ORDER BY r.started_wall DESC", graph_mode=RUN_GRAPH_MODE))
    else:
        rows = _rows(store, _RUNS_SQL.format(inner="WHERE run_id = :run_id", outer="WHERE r.run_id = :run_id",
                                         graph_mode=RUN_GRAPH_MODE),
                     run_id=run_id)
    for row in rows:
        row["state"] = run_state(row.pop("status"), row["last_seen_wall"], now)
        row["config"] = json.loads(row["config"])
    return rows


def runs(store: Store, now: float | None = None) -> list[Row]:
    """One row per run, newest first: the run columns of ``v_run_summary`` (engine, models, fault,
    start, counters, graph mode, requests, ``error_findings`` / ``warning_findings`` = stored error /
    warning findings of any source) plus ``state``
    (:func:`run_state`) and the parsed ``config`` (the RunConfig contract).

    Reads ``runs``, ``run_ranks``, ``requests`` and ``findings`` only (no verify-step scan), so the
    run picker costs the same on any store size.
    """
    return _run_rows(store, None, now)


def run_summary(store: Store, run_id: str, now: float | None = None) -> Row | None:
    """One run as in :func:`runs`, plus its acceptance from ``v_run_acceptance`` (verify steps,
    proposed, accepted, mean acceptance length, acceptance rate, emitted tokens, tokens/s);
    None when the run does not exist."""
    rows = _run_rows(store, run_id, now)
    if not rows:
        return None
    acceptance = _rows(store, "SELECT * FROM v_run_acceptance WHERE run_id = :run_id", run_id=run_id)
    row = rows[0]
    row.update(acceptance[0] if acceptance else {"verify_steps": 0, "proposed": None, "accepted": None,
                                                "mean_acceptance_length": None, "acceptance_rate": None,
                                                "emitted_tokens": None, "tokens_per_s": None})
    return row


def acceptance_over_time(store: Store, run_id: str, buckets: int = 120, window: int = 10) -> list[Row]:
    """Acceptance length over wall time: the run's lifetime (first rank start to last time a rank was
    heard from, ``run_ranks``) cut into ``buckets`` equal slices; per slice with verify steps: ``t_s``
    (slice start, seconds since the run started), ``verify_steps``, ``accepted``,
    ``mean_acceptance_length`` (1 + accepted / steps) and ``rolling_acceptance_length`` (the same over
    this and the ``window - 1`` previous slices with steps, weighted by steps: the trend). Steps
    outside the run's lifetime go to the nearest end."""
    return _rows(store, """
        WITH bounds AS (SELECT MIN(started_wall) AS t0,
                               (MAX(last_seen_wall) - MIN(started_wall)) / :buckets AS dt
                        FROM run_ranks WHERE run_id = :run_id),
        sliced AS (SELECT CASE WHEN b.dt IS NULL OR b.dt <= 0 OR v.ts_wall <= b.t0 THEN 0
                               WHEN v.ts_wall - b.t0 >= b.dt * :buckets THEN :buckets - 1
                               ELSE {slice} END AS slice,
                          b.dt, v.accepted, v.steps
                   FROM verify_steps v CROSS JOIN bounds b WHERE v.run_id = :run_id),
        per_slice AS (SELECT slice, slice * MAX(COALESCE(dt, 0)) AS t_s, SUM(steps) AS verify_steps,
                             SUM(accepted) AS accepted FROM sliced GROUP BY slice)
        SELECT t_s, verify_steps, accepted,
               1.0 + CAST(accepted AS DOUBLE PRECISION) / verify_steps AS mean_acceptance_length,
               1.0 + CAST(SUM(accepted) OVER w AS DOUBLE PRECISION) / SUM(verify_steps) OVER w
                   AS rolling_acceptance_length
        FROM per_slice WINDOW w AS (ORDER BY slice ROWS BETWEEN {preceding} PRECEDING AND CURRENT ROW)
        ORDER BY slice""".format(
            slice=_floor(store, "(v.ts_wall - b.t0) / b.dt"), preceding=max(0, int(window) - 1)),
        run_id=run_id, buckets=buckets)


def position_acceptance(store: Store, run_id: str) -> list[Row]:
    """Per-position acceptance of a run from ``v_position_acceptance``: ``position`` (0 = first draft
    token), ``accepted_steps``, ``verify_steps``, ``acceptance`` (p_i)."""
    return _rows(store, """
        SELECT position, accepted_steps, verify_steps, acceptance FROM v_position_acceptance
        WHERE run_id = :run_id ORDER BY position""", run_id=run_id)


# -- requests ------------------------------------------------------------------------------------

REQUEST_ORDER = {"start": "started_wall", "acceptance length": "mean_acceptance_length",
                 "duration": "duration_s", "verify steps": "verify_steps"}


def requests(store: Store, run_id: str, order: str = "start", limit: int = 500) -> list[Row]:
    """Requests of a run from ``v_request_acceptance``: tokens, verify steps, AL, rate, duration (s),
    ``step_detail`` (1: per-step rows kept; 0: sampled out, exact aggregates only).

    ``order``: a key of :data:`REQUEST_ORDER` (start ascending; the others worst first: lowest AL,
    longest duration, most steps). At most ``limit`` rows.

    Raises:
        ValueError: unknown ``order``.
    """
    if order not in REQUEST_ORDER:
        raise ValueError(f"unknown request order {order!r}; choose one of {', '.join(REQUEST_ORDER)}")
    column = REQUEST_ORDER[order]
    direction = "ASC" if order in ("start", "acceptance length") else "DESC"
    return _rows(store, f"""
        SELECT request_id, rank, prompt_tokens, output_tokens, verify_steps, proposed, accepted,
               mean_acceptance_length, acceptance_rate, started_wall, finished_wall, duration_s,
               step_detail
        FROM v_request_acceptance WHERE run_id = :run_id
        ORDER BY {column} {direction}, request_id LIMIT :limit""", run_id=run_id, limit=limit)


def request_steps(store: Store, run_id: str, request_id: str, limit: int = 5000) -> list[Row]:
    """Verify steps of one request in order: ``step``, ``proposed``, ``accepted``, ``accepted_mask``,
    ``draft_s``, ``verify_s`` (s), ``emitted`` (decoded tokens: accepted drafts, then the bonus
    token; None when not recorded). Empty for a request sampled out of step detail (its aggregate rows,
    ``step`` -1, are not steps)."""
    rows = _rows(store, """
        SELECT step, proposed, accepted, accepted_mask, draft_s, verify_s, emitted, ts_wall
        FROM verify_steps WHERE run_id = :run_id AND request_id = :request_id AND step >= 0
        ORDER BY step LIMIT :limit""", run_id=run_id, request_id=request_id, limit=limit)
    for row in rows:
        row["emitted"] = None if row["emitted"] is None else json.loads(row["emitted"])
    return rows


def request_positions(store: Store, run_id: str, request_id: str) -> list[Row]:
    """Per-position acceptance p_i of one request from ``v_request_position_acceptance``; same columns
    as :func:`position_acceptance` (denominator: the request's verify steps)."""
    return _rows(store, """
        SELECT position, accepted_steps, verify_steps, acceptance FROM v_request_position_acceptance
        WHERE run_id = :run_id AND request_id = :request_id ORDER BY position""",
        run_id=run_id, request_id=request_id)


def marked_tokens(steps: list[Row]) -> list[Row]:
    """The generated text token by token, from :func:`request_steps` rows: ``token``, ``step`` and
    ``source``: ``'draft'`` for an accepted draft token, ``'target'`` for the bonus token the target
    chose itself. The first ``accepted`` emitted tokens of a step are drafts, the last is the bonus
    (a step cut by the token budget or EOS may emit fewer)."""
    marked = []
    for row in steps:
        for index, token in enumerate(row["emitted"] or ()):
            source = "draft" if index < row["accepted"] else "target"
            marked.append({"token": token, "step": row["step"], "source": source})
    return marked


# -- ranks (GPUs) --------------------------------------------------------------------------------

def ranks(store: Store, run_id: str) -> list[Row]:
    """One row per rank of a run: device, host, pid, graph mode, hook calls / errors, events written /
    dropped, and the rank's acceptance from ``v_rank_acceptance`` (verify steps, AL, rate, tokens/s)."""
    return _rows(store, """
        SELECT k.rank, k.device, k.host, k.pid, k.graph_mode, k.hook_calls, k.hook_errors,
               k.events_written, k.events_dropped, k.last_seen_wall, k.ended_wall,
               COALESCE(a.verify_steps, 0) AS verify_steps, a.mean_acceptance_length,
               a.acceptance_rate, a.tokens_per_s
        FROM run_ranks k
        LEFT JOIN (SELECT * FROM v_rank_acceptance WHERE run_id = :run_id) a ON a.rank = k.rank
        WHERE k.run_id = :run_id ORDER BY k.rank""", run_id=run_id)


def rank_spread(rows: list[Row], key: str = "mean_acceptance_length") -> Row | None:
    """Min / max / spread of ``key`` over :func:`ranks` rows that have it; None with fewer than two."""
    values = [row[key] for row in rows if row.get(key) is not None]
    if len(values) < 2:
        return None
    return {"min": min(values), "max": max(values), "spread": max(values) - min(values)}


# -- tensors -------------------------------------------------------------------------------------

def tensor_contract(store: Store, run_id: str) -> list[Row]:
    """The shape contract of a run: one row per rank, hook point, shape, expected shape, dtype and
    graph phase, with ``events`` (recorded events, a sample of the hook calls), ``first_wall`` /
    ``last_wall`` (when that shape was seen first and last), ``width`` / ``expected_width`` (last
    dimension, elements; expected None where no contract is known) and ``width_mismatch``.

    The same groups as ``v_tensor_contract``, read from the covering index
    ``ix_tensor_events_contract`` alone (the view reads every row of the run: seconds on 1M events).
    """
    rows = _rows(store, """
        SELECT hook_point, rank, shape, expected_shape, dtype, graph_phase, COUNT(*) AS events,
               MIN(ts_wall) AS first_wall, MAX(ts_wall) AS last_wall
        FROM tensor_events WHERE run_id = :run_id
        GROUP BY hook_point, rank, shape, expected_shape, dtype, graph_phase
        ORDER BY hook_point, rank, first_wall""", run_id=run_id)
    for row in rows:
        row["width"], row["expected_width"] = _last_dim(row["shape"]), _last_dim(row["expected_shape"])
        row["width_mismatch"] = row["expected_width"] is not None and row["width"] != row["expected_width"]
    return rows


def _last_dim(shape: str | None) -> int | None:
    # Stored shapes are "1x5x1728" ("" for a 0-d tensor), see storage/_rows.py.
    return int(shape.rsplit("x", 1)[-1]) if shape else None


def draft_input_widths(contract: list[Row], fused_width: int | None) -> list[Row]:
    """The draft's hidden-state inputs from :func:`tensor_contract` rows: every draft hook point that
    carries a width expectation (``draft.forward:hidden_states``, whatever the argument is called, and
    ``draft.model.fc:input`` where the engine fuses before the draft forward, as vLLM does), merged
    over sequence lengths: one row per rank and point, ``call`` (``'target-fed'``: expected the fused
    width; ``'chained'``: expected the draft hidden size), ``hook_point``, ``width``,
    ``expected_width`` and dtype, with ``events``, ``first_wall`` / ``last_wall``,
    ``width_mismatch`` and ``shapes`` (the distinct shapes merged)."""
    merged: dict[tuple, Row] = {}
    for row in contract:
        if not row["hook_point"].startswith(points.DRAFT_PREFIX) or row["expected_width"] is None:
            continue
        call = "target-fed" if fused_width is not None and row["expected_width"] == fused_width else "chained"
        key = (row["rank"], row["hook_point"], call, row["width"], row["expected_width"], row["dtype"])
        if key not in merged:
            merged[key] = {"rank": row["rank"], "hook_point": row["hook_point"], "call": call, "width": row["width"],
                           "expected_width": row["expected_width"], "dtype": row["dtype"],
                           "width_mismatch": row["width_mismatch"], "events": 0, "shapes": 0,
                           "first_wall": row["first_wall"], "last_wall": row["last_wall"]}
        out = merged[key]
        out["events"] += row["events"]
        out["shapes"] += 1
        out["first_wall"] = min(out["first_wall"], row["first_wall"])
        out["last_wall"] = max(out["last_wall"], row["last_wall"])
    return list(merged.values())


def capture_layers(config: dict[str, Any], contract: list[Row]) -> list[Row]:
    """Configured capture layers (``config['aux_layer_ids_resolved']``) against the
    ``target.layers.{i}:input`` hook points that recorded events (:func:`tensor_contract` rows):
    ``layer``, ``configured``, ``events`` (summed over ranks and shapes), ``fired``."""
    events: dict[int, int] = {}
    for row in contract:
        index = points.capture_layer(row["hook_point"])
        if index is not None:
            events[index] = events.get(index, 0) + row["events"]
    configured = set(config.get("aux_layer_ids_resolved") or ())
    return [{"layer": layer, "configured": layer in configured, "events": events.get(layer, 0),
             "fired": events.get(layer, 0) > 0}
            for layer in sorted(configured | set(events))]


def provenance(store: Store, run_id: str) -> list[Row]:
    """Which target layers the draft received (fingerprints), grouped: ``rank``, ``configured`` and
    ``received`` (lists; None = no layer matched, ``num_target_layers`` = the final norm output),
    ``matches`` (bool), ``width``, ``checks`` (sampled draft calls), first / last wall time."""
    rows = _rows(store, """
        SELECT rank, configured, received, matches, width, COUNT(*) AS checks,
               MIN(ts_wall) AS first_wall, MAX(ts_wall) AS last_wall
        FROM provenance WHERE run_id = :run_id
        GROUP BY rank, configured, received, matches, width ORDER BY rank, checks DESC""", run_id=run_id)
    for row in rows:
        row["configured"], row["received"] = json.loads(row["configured"]), json.loads(row["received"])
        row["matches"] = bool(row["matches"])
    return rows


def graph_phases(contract: list[Row]) -> dict[str, int]:
    """Events recorded per graph phase (``'eager'`` / ``'capture'``) from :func:`tensor_contract`."""
    phases: dict[str, int] = {}
    for row in contract:
        phases[row["graph_phase"]] = phases.get(row["graph_phase"], 0) + row["events"]
    return phases


# -- findings and checkpoint loading -------------------------------------------------------------

def stored_findings(store: Store, run_id: str | None = None, source: str | None = None) -> list[Row]:
    """Rows of the ``findings`` table (errors first, then warnings, then info), optionally for one
    run and one ``source`` (``'doctor'`` / ``'inspect'``); ``evidence`` parsed from JSON."""
    conditions, params = ["1 = 1"], {}
    if run_id is not None:
        conditions.append("run_id = :run_id")
        params["run_id"] = run_id
    if source is not None:
        conditions.append("source = :source")
        params["source"] = source
    rows = _rows(store, f"""
        SELECT run_id, source, code, severity, message, evidence, fix, ts_wall FROM findings
        WHERE {' AND '.join(conditions)}
        ORDER BY CASE severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, ts_wall, code""",
        **params)
    for row in rows:
        row["evidence"] = json.loads(row["evidence"])
    return rows


def load_reports(store: Store, run_id: str) -> list[Row]:
    """Checkpoint load reports of a run: ``rank``, ``module``, ``source``, ``strict``, ``loaded`` and
    the key lists ``missing``, ``unexpected`` (dropped) and ``renamed`` (``[checkpoint key, name]``)."""
    rows = _rows(store, """
        SELECT rank, module, source, strict, loaded, missing, unexpected, renamed, ts_wall
        FROM load_reports WHERE run_id = :run_id ORDER BY rank, ts_wall""", run_id=run_id)
    for row in rows:
        for key in ("missing", "unexpected", "renamed"):
            row[key] = json.loads(row[key])
        row["strict"] = bool(row["strict"])
    return rows
