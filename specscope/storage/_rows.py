"""Events to table rows: the write path's routing, grouped by statement so each one is an executemany.

Conventions of the stored form (schema.py docstring): shapes as ``"1x5x1728"`` (``""`` for a 0-d
tensor) plus ``width`` = last dimension (NULL for 0-d); lists and dicts as JSON text; the per-position
mask of a verify step as ``VerifyStep.mask()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from specscope import events as ev

Row = dict[str, Any]
Counters = Mapping[tuple[str, int], tuple[int, int]]

# Statements in the order one transaction runs them: parents (runs, ranks, request starts) first, so
# the updates of the same batch find their rows.
STATEMENTS = ("runs", "rank_start", "rank_status", "request_start", "request_end", "verify_steps",
              "tensor_events", "provenance", "load_reports", "findings", "counters")


def _json(value: Any) -> str:
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_dict"):  # RunConfig passed as the config itself
        return value.to_dict()
    if hasattr(value, "item"):  # numpy / torch scalars in finding evidence
        return value.item()
    return str(value)


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
            "ended_wall": e.ts_wall if e.finished else None}


def _request_start(e: ev.RequestStart) -> Row:
    return {"run_id": e.run_id, "request_id": e.request_id, "rank": e.rank,
            "prompt_tokens": e.prompt_tokens, "started_wall": e.ts_wall}


def _request_end(e: ev.RequestEnd) -> Row:
    # b_ prefixes: bound names of an executemany UPDATE must differ from column names (SQLAlchemy)
    return {"b_run_id": e.run_id, "b_request_id": e.request_id, "output_tokens": e.output_tokens,
            "verify_steps": e.verify_steps, "text": e.text, "finished_wall": e.ts_wall}


def _verify_step(e: ev.VerifyStep) -> Row:
    return {"run_id": e.run_id, "request_id": e.request_id, "rank": e.rank, "step": e.step,
            "proposed": e.proposed, "accepted": e.accepted, "accepted_mask": e.mask(),
            "draft_s": e.draft_s, "verify_s": e.verify_s,
            "emitted": None if e.emitted is None else _json(e.emitted), "ts_wall": e.ts_wall}


def _tensor(e: ev.TensorEvent) -> Row:
    shape, expected = e.shape, e.expected_shape
    return {"run_id": e.run_id, "rank": e.rank, "hook_point": e.hook_point,
            "call_index": e.call_index, "shape": "x".join(map(str, shape)),
            "width": shape[-1] if shape else None, "dtype": e.dtype, "device": e.device,
            "expected_shape": _shape(expected), "expected_width": _width(expected),
            "absmax": e.absmax, "mean": e.mean, "nonfinite": e.nonfinite, "request_id": e.request_id,
            "step": e.step, "graph_phase": e.graph_phase, "ts_wall": e.ts_wall}


def _provenance(e: ev.ProvenanceEvent) -> Row:
    return {"run_id": e.run_id, "rank": e.rank, "call_index": e.call_index,
            "configured": _json(e.configured), "received": _json(e.received),
            "matches": tuple(e.received) == tuple(e.configured), "width": e.width,
            "request_id": e.request_id, "step": e.step, "ts_wall": e.ts_wall}


def _load_report(e: ev.LoadReport) -> Row:
    return {"run_id": e.run_id, "rank": e.rank, "module": e.module, "source": e.source,
            "strict": e.strict, "loaded": e.loaded, "missing": _json(e.missing),
            "unexpected": _json(e.unexpected), "renamed": _json(e.renamed), "ts_wall": e.ts_wall}


def _finding(e: ev.Finding) -> Row:
    return {"run_id": e.run_id, "source": e.source, "code": e.code, "severity": e.severity,
            "message": e.message, "evidence": _json(e.evidence), "fix": e.fix, "ts_wall": e.ts_wall}


ROUTES: dict[str, tuple[str, Callable[[Any], Row]]] = {
    ev.RunStart.kind: ("runs", _run),
    ev.RankStart.kind: ("rank_start", _rank_start),
    ev.RankStatus.kind: ("rank_status", _rank_status),
    ev.RequestStart.kind: ("request_start", _request_start),
    ev.RequestEnd.kind: ("request_end", _request_end),
    ev.VerifyStep.kind: ("verify_steps", _verify_step),
    ev.TensorEvent.kind: ("tensor_events", _tensor),
    ev.ProvenanceEvent.kind: ("provenance", _provenance),
    ev.LoadReport.kind: ("load_reports", _load_report),
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


def group_rows(events: Iterable[ev.Event]) -> dict[str, list[Row]]:
    """Rows per statement name of :data:`STATEMENTS` (statements without rows are absent).

    Raises:
        KeyError: an object whose ``kind`` is not an event kind of :mod:`specscope.events`.
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
