"""The summary tables (``acceptance_masks``, ``tensor_shapes``; schema version 8): how a batch of
verify-step and tensor-event rows updates them, and how they are rebuilt from the raw rows.

A summary row aggregates the raw rows of one key: for ``acceptance_masks`` (run, rank, accepted mask)
the summed ``steps`` / ``proposed`` / ``accepted``, the first and last ``ts_wall`` and whether any row
is a per-step row; for ``tensor_shapes`` (run, rank, hook point, shape, dtype, device, expected shape,
graph phase) the event count, first / last call index and wall time and the summed non-finite
elements. :func:`batch_rows` folds one write's rows per key in Python, then one upsert per table adds
them to the stored rows (sums add, first / last take the min / max), in the write's own transaction:
a reader sees the raw rows and their summary together, or neither. Both aggregates are associative,
so any split into batches gives the rows :func:`rebuild` computes from scratch (a test checks it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from specscope.storage import schema

Row = dict[str, object]

_MASK_KEY = ("run_id", "rank", "accepted_mask")
_SHAPE_KEY = ("run_id", "rank", "hook_point", "shape", "dtype", "device", "expected_shape", "graph_phase")


def batch_rows(verify_steps: Sequence[tuple], tensor_events: Sequence[tuple]) -> dict[str, list[Row]]:
    """Summary rows of one batch, per summary table (absent when the batch has no such rows).

    ``verify_steps`` / ``tensor_events``: rows in ``_rows.INSERT_COLUMNS`` order (the tuples the
    store inserts). Returns dicts of column values, one per key, sorted by key (concurrent writers
    then lock shared keys in one order).
    """
    out: dict[str, list[Row]] = {}
    if verify_steps:
        masks: dict[tuple, list] = {}
        # (run_id, request_id, rank, step, proposed, accepted, accepted_mask, draft_s, verify_s,
        #  emitted, ts_wall, steps)
        for run_id, _, rank, step, proposed, accepted, mask, _, _, _, ts_wall, steps in verify_steps:
            acc = masks.get((run_id, rank, mask))
            detail = 1 if step >= 0 else 0
            if acc is None:
                masks[(run_id, rank, mask)] = [steps, proposed, accepted, ts_wall, ts_wall, detail]
            else:
                acc[0] += steps
                acc[1] += proposed
                acc[2] += accepted
                acc[3] = min(acc[3], ts_wall)
                acc[4] = max(acc[4], ts_wall)
                acc[5] = max(acc[5], detail)
        out["acceptance_masks"] = [
            dict(zip(_MASK_KEY + ("steps", "proposed", "accepted", "first_wall", "last_wall", "step_detail"),
                     key + tuple(acc)))
            for key, acc in sorted(masks.items())]
    if tensor_events:
        shapes: dict[tuple, list] = {}
        # (run_id, rank, hook_point, call_index, shape, width, dtype, device, expected_shape,
        #  expected_width, absmax, mean, nonfinite, request_id, step, graph_phase, ts_wall)
        for (run_id, rank, point, call, shape, width, dtype, device, expected, expected_width,
             _, _, nonfinite, _, _, phase, ts_wall) in tensor_events:
            key = (run_id, rank, point, shape, dtype, device, expected or "", phase)
            acc = shapes.get(key)
            if acc is None:
                shapes[key] = [width, expected_width, 1, call, call, ts_wall, ts_wall, nonfinite or 0]
            else:
                acc[2] += 1
                acc[3] = min(acc[3], call)
                acc[4] = max(acc[4], call)
                acc[5] = min(acc[5], ts_wall)
                acc[6] = max(acc[6], ts_wall)
                acc[7] += nonfinite or 0
        out["tensor_shapes"] = [
            dict(zip(_SHAPE_KEY + ("width", "expected_width", "events", "first_call", "last_call",
                                   "first_wall", "last_wall", "nonfinite"), key + tuple(acc)))
            for key, acc in sorted(shapes.items())]
    return out


def _pick(new: sa.ColumnElement, old: sa.ColumnElement, smaller: bool) -> sa.ColumnElement:
    # CASE, not MIN(a, b) / LEAST(a, b): SQLite and PostgreSQL spell the scalar min / max differently
    return sa.case(((new < old) if smaller else (new > old), new), else_=old)


def upserts(dialect: str) -> dict[str, sa.Executable]:
    """The INSERT ... ON CONFLICT DO UPDATE of each summary table for ``dialect``: a batch row adds
    its sums to the stored row of its key and widens its first / last bounds."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statements: dict[str, sa.Executable] = {}
    for table, key, sums, firsts, lasts in (
            (schema.acceptance_masks, _MASK_KEY, ("steps", "proposed", "accepted"), ("first_wall",),
             ("last_wall", "step_detail")),
            (schema.tensor_shapes, _SHAPE_KEY, ("events", "nonfinite"), ("first_call", "first_wall"),
             ("last_call", "last_wall"))):
        stmt = insert(table)
        new = stmt.excluded
        update = {name: table.c[name] + new[name] for name in sums}
        update |= {name: _pick(new[name], table.c[name], smaller=True) for name in firsts}
        update |= {name: _pick(new[name], table.c[name], smaller=False) for name in lasts}
        statements[table.name] = stmt.on_conflict_do_update(index_elements=list(key), set_=update)
    return statements


def rebuild(conn: Connection) -> None:
    """Recompute both summary tables from every row of ``verify_steps`` and ``tensor_events`` (the
    schema version 8 upgrade, and rows written around the Store)."""
    steps, events = schema.verify_steps.c, schema.tensor_events.c
    masks = sa.select(
        steps.run_id, steps.rank, steps.accepted_mask, sa.func.sum(steps.steps), sa.func.sum(steps.proposed),
        sa.func.sum(steps.accepted), sa.func.min(steps.ts_wall), sa.func.max(steps.ts_wall),
        sa.func.max(sa.case((steps.step >= 0, 1), else_=0)),
    ).group_by(steps.run_id, steps.rank, steps.accepted_mask)
    expected = sa.func.coalesce(events.expected_shape, "")
    shapes = sa.select(
        events.run_id, events.rank, events.hook_point, events.shape, events.dtype, events.device, expected,
        events.graph_phase, sa.func.max(events.width), sa.func.max(events.expected_width), sa.func.count(),
        sa.func.min(events.call_index), sa.func.max(events.call_index), sa.func.min(events.ts_wall),
        sa.func.max(events.ts_wall), sa.func.sum(sa.func.coalesce(events.nonfinite, 0)),
    ).group_by(events.run_id, events.rank, events.hook_point, events.shape, events.dtype, events.device,
               expected, events.graph_phase)
    for table, select in ((schema.acceptance_masks, masks), (schema.tensor_shapes, shapes)):
        conn.execute(table.delete())
        conn.execute(table.insert().from_select([c.name for c in table.columns], select))
