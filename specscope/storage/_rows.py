"""Events to table rows: the write path's one routing table (:data:`ROUTES`: event type -> statement
and row function), rows grouped by statement so each one is an executemany.

Conventions of the stored form (schema.py docstring): shapes as ``"1x5x1728"`` (``""`` for a 0-d
tensor) plus ``width`` = last dimension (NULL for 0-d); lists and dicts as JSON text; the per-position
mask of a verify step as ``VerifyStep.mask()``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from specscope import events as ev
from specscope.event_checks import RECOVERED_COLUMNS, SURPRISE_COLUMNS
from specscope.storage import _summaries, schema

Row = dict[str, Any]
Counters = Mapping[tuple[str, int], tuple[int, int]]
Insert = Callable[[sa.Table], Any]  # the dialect's insert(): sqlalchemy.dialects.{sqlite,postgresql}.insert


@dataclass(frozen=True)
class Statement:
    """One statement of a write transaction.

    - ``columns``: a plain insert's row tuple, in this column order (executemany or COPY); empty for
      a statement ``build`` makes with the dialect's ``insert`` (an upsert, an update), whose rows
      are dicts.
    - ``key`` / ``keep_last``: one row per key in a batch, the first event's or the last one's
      (PostgreSQL refuses an ON CONFLICT DO UPDATE that touches one row twice in a statement).
    - ``summaries``: the summary tables its rows also update, in the same transaction.
    """

    name: str
    table: sa.Table
    columns: tuple[str, ...] = ()
    build: Callable[[Insert], sa.Executable] | None = None
    key: tuple[str, ...] = ()
    keep_last: bool = False
    summaries: tuple[_summaries.Summary, ...] = ()


@dataclass(frozen=True)
class Route:
    """Where the events of one type go: their statement, and the row of one event."""

    statement: Statement
    row: Callable[[Any], Row | tuple]


def _plain(name: str, columns: tuple[str, ...], *summaries: Callable[[tuple[str, ...]], _summaries.Summary]) -> Statement:
    return Statement(name, schema.metadata.tables[name], columns, summaries=tuple(s(columns) for s in summaries))


def _json(value: Any) -> str:
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_dict"):  # RunConfig passed as the config itself
        return value.to_dict()
    if hasattr(value, "item"):  # numpy / torch scalars in finding evidence
        return value.item()
    return str(value)


_SHAPES: dict[tuple[int, ...], tuple[str, int | None]] = {}
_MAX_SHAPES = 4096  # a run sees few distinct shapes; past this many the cache starts again


def _shape_columns(shape: Iterable[int]) -> tuple[str, int | None]:
    """A shape's stored columns, text and width (last dimension, None for 0-d), kept in ``_SHAPES``.
    The cache is keyed by the shape as given, and ``(7, 4096.0)``, ``(7, numpy.int64(4096))`` and
    ``(7, 4096)`` are one key: each dimension is stored as the integer it equals, so whichever of them
    comes first, all of them store ``"7x4096"`` and width 4096 (a producer's float shape cached as
    given would have stored every later shape equal to it as ``"7x4096.0"``, or failed it on
    PostgreSQL)."""
    shape = tuple(shape)
    dims = tuple(map(_dimension, shape))
    columns = "x".join(map(str, dims)), dims[-1] if dims else None
    if len(_SHAPES) >= _MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES[shape] = columns
    return columns


def _dimension(size: object) -> int:
    """``size`` as the int it equals (a numpy integer, an integral float); ValueError otherwise."""
    whole = int(size)
    if whole != size:
        raise ValueError(f"shape dimension {size!r} is not an integer")
    return whole


def _run(e: ev.RunStart) -> Row:
    return {"run_id": e.run_id, "engine": e.engine, "engine_version": e.engine_version,
            "target_model": e.target_model, "draft_model": e.draft_model, "fault": e.fault,
            "config": _json(e.config), "world_size": e.world_size, "host": e.host,
            "started_wall": e.ts_wall}


# A rank row that counters or a RankStatus create before (or without) its RankStart: values the
# RankStart upsert overwrites when it arrives.
_UNKNOWN_RANK = {"world_size": 1, "host": "", "pid": 0, "device": ""}


def _rank_start(e: ev.RankStart) -> Row:
    return {"run_id": e.run_id, "rank": e.rank, "world_size": e.world_size, "host": e.host,
            "pid": e.pid, "device": e.device, "started_wall": e.ts_wall, "last_seen_wall": e.ts_wall}


def _rank_status(e: ev.RankStatus) -> Row:
    return {**_UNKNOWN_RANK, "run_id": e.run_id, "rank": e.rank, "started_wall": e.ts_wall,
            "hook_calls": e.hook_calls,
            "hook_errors": e.hook_errors, "graph_mode": e.graph_mode, "last_seen_wall": e.ts_wall,
            "ended_wall": e.ts_wall if e.finished else None, "error": e.error if e.finished else None}


def _request_start(e: ev.RequestStart) -> Row:
    return {"run_id": e.run_id, "request_id": e.request_id, "rank": e.rank,
            "prompt_tokens": e.prompt_tokens, "started_wall": e.ts_wall, "sampling": e.sampling,
            "temperature": e.temperature, "top_p": e.top_p, "top_k": e.top_k, "prompt_key": e.prompt_key}


def _request_end(e: ev.RequestEnd) -> Row:
    # b_ prefixes: bound names of an executemany UPDATE must differ from column names (SQLAlchemy)
    return {"b_run_id": e.run_id, "b_request_id": e.request_id, "output_tokens": e.output_tokens,
            "verify_steps": e.verify_steps, "text": e.text, "finished_wall": e.ts_wall}


_VERIFY_STEPS = _plain("verify_steps", ("run_id", "request_id", "rank", "step", "proposed", "accepted", "accepted_mask",
                                       "draft_s", "verify_s", "emitted", "ts_wall", "steps"), _summaries.acceptance_masks,
                       _summaries.request_accepts, _summaries.step_seconds)


def _verify_step(e: ev.VerifyStep) -> tuple:
    return (e.run_id, e.request_id, e.rank, e.step, e.proposed, e.accepted, e.mask(), e.draft_s,
            e.verify_s, None if e.emitted is None else _json(e.emitted), e.ts_wall, 1)


AGGREGATE_STEP = -1
"""``verify_steps.step`` of an aggregate row (a :class:`~specscope.events.VerifyGroup`)."""


def _verify_group(e: ev.VerifyGroup) -> tuple:
    return (e.run_id, e.request_id, e.rank, AGGREGATE_STEP, e.proposed, e.accepted, e.accepted_mask,
            None, None, None, e.ts_wall, e.steps)


_TENSOR_EVENTS = _plain("tensor_events", ("run_id", "rank", "hook_point", "call_index", "shape", "width", "dtype", "device",
                                         "expected_shape", "expected_width", "absmax", "mean", "nonfinite", "request_id",
                                         "step", "graph_phase", "ts_wall"), _summaries.tensor_shapes,
                        _summaries.draft_input_seconds)


def _tensor(e: ev.TensorEvent) -> tuple:
    # the shapes' columns by one dict lookup each (a list, unhashable, or a new shape takes the long way)
    try:
        shape, width = _SHAPES[e.shape]
    except (KeyError, TypeError):
        shape, width = _shape_columns(e.shape)
    expected = e.expected_shape
    if expected is None:
        expected_width = None
    else:
        try:
            expected, expected_width = _SHAPES[expected]
        except (KeyError, TypeError):
            expected, expected_width = _shape_columns(expected)
    return (e.run_id, e.rank, e.hook_point, e.call_index, shape, width, e.dtype, e.device, expected, expected_width,
            e.absmax, e.mean, e.nonfinite, e.request_id, e.step, e.graph_phase, e.ts_wall)


_PROVENANCE = _plain("provenance", ("run_id", "rank", "call_index", "configured", "received", "matches", "width",
                                   "request_id", "step", "ts_wall"))


def _provenance(e: ev.ProvenanceEvent) -> tuple:
    return (e.run_id, e.rank, e.call_index, _json(e.configured), _json(e.received),
            tuple(e.received) == tuple(e.configured), e.width, e.request_id, e.step, e.ts_wall)


_LOAD_REPORTS = _plain("load_reports", ("run_id", "rank", "module", "source", "strict", "loaded", "missing", "unexpected",
                                       "renamed", "ts_wall"))


def _load_report(e: ev.LoadReport) -> tuple:
    return (e.run_id, e.rank, e.module, e.source, e.strict, e.loaded, _json(e.missing),
            _json(e.unexpected), _json(e.renamed), e.ts_wall)


_LOSSLESS_AUDIT = _plain("lossless_audit", ("run_id", "rank", "request_id", "sampling", "tokens", "mismatches", "rare",
                                           "rare_expected", "p_sum", "p2_sum", "epsilon", "example", "ts_wall", "p_var_sum",
                                           *(f"pit_{b}" for b in range(ev.PIT_BINS)), *SURPRISE_COLUMNS,
                                           *RECOVERED_COLUMNS))


def _lossless_audit(e: ev.LosslessAudit) -> tuple:
    return (e.run_id, e.rank, e.request_id, e.sampling, e.tokens, e.mismatches, e.rare, e.rare_expected,
            e.p_sum, e.p2_sum, e.epsilon, None if e.example is None else _json(e.example), e.ts_wall,
            e.p_var_sum, *(e.pit or (0,) * ev.PIT_BINS), *_surprise(e).values(),
            *(getattr(e, name) for name in RECOVERED_COLUMNS))


def _surprise(a: ev.LosslessAudit) -> dict[str, float]:
    return {name: getattr(a, name) for name in SURPRISE_COLUMNS}


def _request_tokens(e: ev.RequestTokens) -> Row:
    return {"run_id": e.run_id, "request_id": e.request_id, "rank": e.rank, "prompt_ids": _json(e.prompt_ids),
            "output_ids": _json(e.output_ids), "output_truncated": e.output_truncated, "ts_wall": e.ts_wall}


def _replay_result(e: ev.ReplayResult) -> Row:
    a = e.audit  # the audit's figures of the replayed tokens, in lossless_audit's columns
    return {"run_id": e.run_id, "request_id": e.request_id, "rank": e.rank, "sampling": a.sampling,
            "source": e.source, "tokens": a.tokens, "departures": e.departures, "near_ties": e.near_ties,
            "mismatches": a.mismatches, "first_departure": e.first_departure, "first_margin": e.first_margin,
            "max_margin": e.max_margin, "near_tie_margin": e.near_tie_margin, "rare": a.rare,
            "rare_expected": a.rare_expected, "p_sum": a.p_sum, "p2_sum": a.p2_sum, "p_var_sum": a.p_var_sum,
            "epsilon": a.epsilon, **{f"pit_{b}": n for b, n in enumerate(a.pit or (0,) * ev.PIT_BINS)}, **_surprise(a),
            "example": None if a.example is None else _json(a.example), "ts_wall": e.ts_wall}


_FINDINGS = _plain("findings", ("run_id", "source", "code", "severity", "message", "evidence", "fix", "ts_wall"))


def _finding(e: ev.Finding) -> tuple:
    return (e.run_id, e.source, e.code, e.severity, e.message, _json(e.evidence), e.fix, e.ts_wall)


def _runs(insert: Insert) -> sa.Executable:
    return insert(schema.runs).on_conflict_do_nothing(index_elements=["run_id"])


def _rank_start_upsert(insert: Insert) -> sa.Executable:
    stmt = insert(schema.run_ranks)
    return stmt.on_conflict_do_update(index_elements=["run_id", "rank"], set_={
        name: stmt.excluded[name] for name in ("world_size", "host", "pid", "device", "started_wall", "last_seen_wall")})


def _rank_status_upsert(insert: Insert) -> sa.Executable:
    ranks = schema.run_ranks
    stmt = insert(ranks)
    return stmt.on_conflict_do_update(index_elements=["run_id", "rank"], set_={
        "hook_calls": stmt.excluded.hook_calls,
        "hook_errors": stmt.excluded.hook_errors,
        "graph_mode": stmt.excluded.graph_mode,
        "last_seen_wall": stmt.excluded.last_seen_wall,
        "ended_wall": sa.func.coalesce(stmt.excluded.ended_wall, ranks.c.ended_wall),
        "error": sa.func.coalesce(stmt.excluded.error, ranks.c.error)})


def _request_start_insert(insert: Insert) -> sa.Executable:
    return insert(schema.requests).on_conflict_do_nothing(index_elements=["run_id", "request_id"])


def _request_end_update(insert: Insert) -> sa.Executable:
    # the first RequestEnd of a request is the one kept: a second one (a producer finishing twice)
    # matches no row
    requests = schema.requests
    return sa.update(requests).where(requests.c.run_id == sa.bindparam("b_run_id"),
                                     requests.c.request_id == sa.bindparam("b_request_id"),
                                     requests.c.finished_wall.is_(None))


def _request_tokens_insert(insert: Insert) -> sa.Executable:
    # the first ids of a request are the ones kept (a producer finishing it twice stores nothing new)
    return insert(schema.request_tokens).on_conflict_do_nothing(index_elements=["run_id", "request_id"])


def _replay_upsert(insert: Insert) -> sa.Executable:
    # a request replayed again keeps the latest replay's figures only
    stmt = insert(schema.replay_requests)
    return stmt.on_conflict_do_update(index_elements=["run_id", "request_id"], set_={
        c.name: stmt.excluded[c.name] for c in schema.replay_requests.columns if c.name not in ("run_id", "request_id")})


def _counters_upsert(insert: Insert) -> sa.Executable:
    ranks = schema.run_ranks
    stmt = insert(ranks)
    return stmt.on_conflict_do_update(index_elements=["run_id", "rank"], set_={
        "events_written": ranks.c.events_written + stmt.excluded.events_written,
        "events_dropped": ranks.c.events_dropped + stmt.excluded.events_dropped,
        "last_seen_wall": stmt.excluded.last_seen_wall})


# In transaction order: parents (runs, ranks, request starts) first, so the updates of the same batch
# find their rows; the counters (no event of their own) come last.
ROUTES: Mapping[type, Route] = {
    ev.RunStart: Route(Statement("runs", schema.runs, build=_runs, key=("run_id",)), _run),  # first one wins
    ev.RankStart: Route(Statement("rank_start", schema.run_ranks, build=_rank_start_upsert, key=("run_id", "rank"),
                                  keep_last=True), _rank_start),
    ev.RankStatus: Route(Statement("rank_status", schema.run_ranks, build=_rank_status_upsert, key=("run_id", "rank"),
                                   keep_last=True), _rank_status),
    ev.RequestStart: Route(Statement("request_start", schema.requests, build=_request_start_insert,
                                     key=("run_id", "request_id")), _request_start),
    ev.RequestEnd: Route(Statement("request_end", schema.requests, build=_request_end_update), _request_end),
    ev.VerifyStep: Route(_VERIFY_STEPS, _verify_step),
    ev.VerifyGroup: Route(_VERIFY_STEPS, _verify_group),
    ev.TensorEvent: Route(_TENSOR_EVENTS, _tensor),
    ev.ProvenanceEvent: Route(_PROVENANCE, _provenance),
    ev.LoadReport: Route(_LOAD_REPORTS, _load_report),
    ev.LosslessAudit: Route(_LOSSLESS_AUDIT, _lossless_audit),
    ev.RequestTokens: Route(Statement("request_tokens", schema.request_tokens, build=_request_tokens_insert,
                                      key=("run_id", "request_id")), _request_tokens),
    ev.ReplayResult: Route(Statement("replay_requests", schema.replay_requests, build=_replay_upsert,
                                     key=("run_id", "request_id"), keep_last=True), _replay_result),
    ev.Finding: Route(_FINDINGS, _finding),
}

STATEMENTS: tuple[Statement, ...] = (*dict.fromkeys(route.statement for route in ROUTES.values()),
                                     Statement("counters", schema.run_ranks, build=_counters_upsert))
"""Every statement of a write, in the order one transaction runs them."""

INSERT_COLUMNS: dict[str, tuple[str, ...]] = {s.name: s.columns for s in STATEMENTS if s.columns}
"""The plain inserts (the high-volume tables): rows are tuples in these column orders, handed straight
to the driver's executemany (SQLAlchemy's per-row parameter processing would cost more than SQLite)."""

_BY_NAME = {s.name: s for s in STATEMENTS}


def group_rows(events: Iterable[ev.Event]) -> dict[str, list[Row | tuple]]:
    """Rows per statement name (statements without rows are absent): tuples in :data:`INSERT_COLUMNS`
    order for the plain inserts, dicts of column values for the others.

    Raises:
        KeyError: an object that is not an event of :mod:`specscope.events`;
        AttributeError / TypeError / ValueError / OverflowError / RecursionError: an event with fields
        of the wrong type or a value no database column can hold (``emitted`` nested past the
        recursion limit, a mask of 10**30 places).
    """
    grouped: dict[str, list[Row]] = {}
    for kind, run in itertools.groupby(events, type):  # runs of one type: their rows made in one C-level map
        route = ROUTES[kind]
        rows = grouped.get(route.statement.name)
        if rows is None:
            rows = grouped[route.statement.name] = []
        rows.extend(map(route.row, run))
    for name, rows in grouped.items():
        statement = _BY_NAME[name]
        if statement.key:
            grouped[name] = _dedupe(rows, statement.key, statement.keep_last)
    return grouped


def summary_rows(grouped: Mapping[str, list[Row | tuple]]) -> dict[str, list[Row]]:
    """The summary rows of a batch (:func:`group_rows`), per summary table that has some."""
    return {name: rows for s in STATEMENTS if grouped.get(s.name)
            for name, rows in _summaries.fold_all(s.summaries, grouped[s.name]).items()}


def write_statements(insert: Insert) -> dict[str, sa.Executable]:
    """The statements that are not plain inserts (upserts, the request-end update, the summary upserts),
    by name, built with the dialect's ``insert``."""
    built = {s.name: s.build(insert) for s in STATEMENTS if s.build is not None}
    return built | {summary.table.name: summary.upsert(insert) for s in STATEMENTS for summary in s.summaries}


def _dedupe(rows: list[Row], key: tuple[str, ...], keep_last: bool) -> list[Row]:
    chosen: dict[tuple, Row] = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if keep_last or k not in chosen:
            chosen[k] = row
    return list(chosen.values())


def counter_rows(counters: Counters, now_wall: float) -> list[Row]:
    """Rows of the counters upsert: increments of events written / dropped per (run_id, rank)."""
    return [{**_UNKNOWN_RANK, "run_id": run_id, "rank": rank, "started_wall": now_wall,
             "last_seen_wall": now_wall, "events_written": written, "events_dropped": dropped}
            for (run_id, rank), (written, dropped) in counters.items()
            if run_id is not None and (written or dropped)]
