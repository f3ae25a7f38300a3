"""Events to table rows: the write path's routing, grouped by statement so each one is an executemany.

Conventions of the stored form (schema.py docstring): shapes as ``"1x5x1728"`` (``""`` for a 0-d
tensor) plus ``width`` = last dimension (NULL for 0-d); lists and dicts as JSON text; the per-position
mask of a verify step as ``VerifyStep.mask()``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from specscope import events as ev
from specscope.storage import schema

Row = dict[str, Any]
Counters = Mapping[tuple[str, int], tuple[int, int]]

# Statements in the order one transaction runs them: parents (runs, ranks, request starts) first, so
# the updates of the same batch find their rows.
STATEMENTS = ("runs", "rank_start", "rank_status", "request_start", "request_end", "verify_steps",
              "tensor_events", "provenance", "load_reports", "lossless_audit", "findings", "counters")


def _json(value: Any) -> str:
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_dict"):  # RunConfig passed as the config itself
        return value.to_dict()
    if hasattr(value, "item"):  # numpy / torch scalars in finding evidence
        return value.item()
    return str(value)


@functools.lru_cache(maxsize=4096)  # a run sees few distinct shapes; the join is the row's main cost
def _shape(shape: tuple[int, ...] | None) -> str | None:
    return None if shape is None else "x".join(map(str, shape))


def _width(shape: tuple[int, ...] | None) -> int | None:
    return shape[-1] if shape else None


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


# Plain inserts (the high-volume tables): rows are tuples in these column orders, handed straight to
# the driver's executemany (SQLAlchemy's per-row parameter processing would cost more than SQLite).
INSERT_COLUMNS: dict[str, tuple[str, ...]] = {
    "verify_steps": ("run_id", "request_id", "rank", "step", "proposed", "accepted", "accepted_mask",
                     "draft_s", "verify_s", "emitted", "ts_wall", "steps"),
    "tensor_events": ("run_id", "rank", "hook_point", "call_index", "shape", "width", "dtype", "device",
                      "expected_shape", "expected_width", "absmax", "mean", "nonfinite", "request_id",
                      "step", "graph_phase", "ts_wall"),
    "provenance": ("run_id", "rank", "call_index", "configured", "received", "matches", "width",
                   "request_id", "step", "ts_wall"),
    "load_reports": ("run_id", "rank", "module", "source", "strict", "loaded", "missing", "unexpected",
                     "renamed", "ts_wall"),
    "lossless_audit": ("run_id", "rank", "request_id", "sampling", "tokens", "mismatches", "rare",
                       "rare_expected", "p_sum", "p2_sum", "epsilon", "example", "ts_wall"),
    "findings": ("run_id", "source", "code", "severity", "message", "evidence", "fix", "ts_wall"),
}


def _verify_step(e: ev.VerifyStep) -> tuple:
    return (e.run_id, e.request_id, e.rank, e.step, e.proposed, e.accepted, e.mask(), e.draft_s,
            e.verify_s, None if e.emitted is None else _json(e.emitted), e.ts_wall, 1)


AGGREGATE_STEP = -1
"""``verify_steps.step`` of an aggregate row (a :class:`~specscope.events.VerifyGroup`)."""


def _verify_group(e: ev.VerifyGroup) -> tuple:
    return (e.run_id, e.request_id, e.rank, AGGREGATE_STEP, e.proposed, e.accepted, e.accepted_mask,
            None, None, None, e.ts_wall, e.steps)


def _tensor(e: ev.TensorEvent) -> tuple:
    shape, expected = e.shape, e.expected_shape
    return (e.run_id, e.rank, e.hook_point, e.call_index, _shape(tuple(shape)),
            shape[-1] if shape else None, e.dtype, e.device,
            None if expected is None else _shape(tuple(expected)), _width(expected),
            e.absmax, e.mean, e.nonfinite, e.request_id, e.step, e.graph_phase, e.ts_wall)


def _provenance(e: ev.ProvenanceEvent) -> tuple:
    return (e.run_id, e.rank, e.call_index, _json(e.configured), _json(e.received),
            tuple(e.received) == tuple(e.configured), e.width, e.request_id, e.step, e.ts_wall)


def _load_report(e: ev.LoadReport) -> tuple:
    return (e.run_id, e.rank, e.module, e.source, e.strict, e.loaded, _json(e.missing),
            _json(e.unexpected), _json(e.renamed), e.ts_wall)


def _lossless_audit(e: ev.LosslessAudit) -> tuple:
    return (e.run_id, e.rank, e.request_id, e.sampling, e.tokens, e.mismatches, e.rare, e.rare_expected,
            e.p_sum, e.p2_sum, e.epsilon, None if e.example is None else _json(e.example), e.ts_wall)


def _finding(e: ev.Finding) -> tuple:
    return (e.run_id, e.source, e.code, e.severity, e.message, _json(e.evidence), e.fix, e.ts_wall)


ROUTES: dict[str, tuple[str, Callable[[Any], Row | tuple]]] = {
    ev.RunStart.kind: ("runs", _run),
    ev.RankStart.kind: ("rank_start", _rank_start),
    ev.RankStatus.kind: ("rank_status", _rank_status),
    ev.RequestStart.kind: ("request_start", _request_start),
    ev.RequestEnd.kind: ("request_end", _request_end),
    ev.VerifyStep.kind: ("verify_steps", _verify_step),
    ev.VerifyGroup.kind: ("verify_steps", _verify_group),
    ev.TensorEvent.kind: ("tensor_events", _tensor),
    ev.ProvenanceEvent.kind: ("provenance", _provenance),
    ev.LoadReport.kind: ("load_reports", _load_report),
    ev.LosslessAudit.kind: ("lossless_audit", _lossless_audit),
    ev.Finding.kind: ("findings", _finding),
}

# Keyed statements get one row per key (first or last event wins): PostgreSQL refuses an
# ON CONFLICT DO UPDATE that touches one row twice in a statement.
_KEYS: dict[str, tuple[tuple[str, ...], bool]] = {  # statement -> (key columns, keep the last event)
    "runs": (("run_id",), False),  # "first one wins" (RunStart docstring)
    "rank_start": (("run_id", "rank"), True),
    "rank_status": (("run_id", "rank"), True),
    "request_start": (("run_id", "request_id"), False),
}


# Where each statement writes: the columns whose types check_row compares values with.
# (a plain insert is named after its table)
_TABLES = {"runs": schema.runs, "rank_start": schema.run_ranks, "rank_status": schema.run_ranks,
           "request_start": schema.requests, "request_end": schema.requests,
           **{name: schema.metadata.tables[name] for name in INSERT_COLUMNS}}
_INT64 = 2**63


def _column_types(statement: str) -> dict[str, type]:
    table = _TABLES[statement]
    return {column.name: column.type.python_type for column in table.columns}


_TYPES = {statement: _column_types(statement) for statement in _TABLES}
_TUPLE_TYPES = {statement: tuple(_TYPES[statement][c] for c in columns)
                for statement, columns in INSERT_COLUMNS.items()}


def _bad_value(expected: type, value: Any) -> str | None:
    """Why ``value`` cannot be stored in a column of Python type ``expected`` on both databases
    (None when it can): an int outside 64 bits, text that is not UTF-8-encodable or holds NUL
    (PostgreSQL refuses it), or a value of another type (a list where a number goes)."""
    if value is None:
        return None
    if expected is str:
        if not isinstance(value, str):
            return f"{type(value).__name__} where text goes"
        if "\x00" in value:
            return "text with a NUL character"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "text that is not valid Unicode (a lone surrogate)"
        return None
    if expected is float:
        return None if isinstance(value, (int, float)) else f"{type(value).__name__} where a number goes"
    if not isinstance(value, int):  # int and bool columns
        return f"{type(value).__name__} where an integer goes"
    return None if -_INT64 <= value < _INT64 else "an integer outside 64 bits"


def bad_value(grouped: Mapping[str, list[Row | tuple]]) -> str | None:
    """The first value of ``grouped`` (:func:`group_rows`) that a database could not store as it is,
    named with its column and why; None when every value fits its column.

    Run after a write failed (never before: a clean batch pays nothing), to tell a batch that holds
    a bad value from a store that cannot be written."""
    for statement, rows in grouped.items():
        if statement not in _TABLES:
            continue
        for row in rows:
            if isinstance(row, tuple):
                names, types, values = INSERT_COLUMNS[statement], _TUPLE_TYPES[statement], row
            else:
                names, values = tuple(row), tuple(row.values())
                types = tuple(_TYPES[statement][name.removeprefix("b_")] for name in names)
            for name, expected, value in zip(names, types, values):
                reason = _bad_value(expected, value)
                if reason is not None:
                    shown = repr(value)
                    return (f"{_TABLES[statement].name}.{name.removeprefix('b_')}: {reason} "
                            f"({shown[:60] + '...' if len(shown) > 60 else shown})")
    return None


def group_rows(events: Iterable[ev.Event]) -> dict[str, list[Row | tuple]]:
    """Rows per statement name of :data:`STATEMENTS` (statements without rows are absent): tuples in
    :data:`INSERT_COLUMNS` order for the plain inserts, dicts of column values for the others.

    Raises:
        KeyError: an object whose ``kind`` is not an event kind of :mod:`specscope.events`;
        AttributeError / TypeError / ValueError / RecursionError: an event with fields of the wrong
        type or a value no database column can hold (``emitted`` nested past the recursion limit).
    """
    grouped: dict[str, list[Row]] = {}
    for event in events:
        statement, to_row = ROUTES[event.kind]
        rows = grouped.get(statement)
        if rows is None:
            rows = grouped[statement] = []
        rows.append(to_row(event))
    for statement, (key, keep_last) in _KEYS.items():
        if statement in grouped:
            grouped[statement] = _dedupe(grouped[statement], key, keep_last)
    return grouped


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
