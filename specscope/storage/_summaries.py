"""The summary tables (``acceptance_masks``, ``tensor_shapes``): how a batch of
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

from collections.abc import Callable, Sequence
from operator import itemgetter

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from specscope.storage import schema

Row = dict[str, object]

_MASK_KEY = ("run_id", "rank", "accepted_mask")
_SHAPE_KEY = ("run_id", "rank", "hook_point", "shape", "dtype", "device", "expected_shape", "graph_phase")


# Positions in the ``_rows.INSERT_COLUMNS`` tuples.
_MASK_OF = itemgetter(0, 2, 6)  # verify_steps: run_id, rank, accepted_mask
_STEP, _PROPOSED, _ACCEPTED, _STEP_WALL, _STEPS = (itemgetter(i) for i in (3, 4, 5, 10, 11))
_SHAPE_OF = itemgetter(0, 1, 2, 4, 6, 7, 8, 15)  # tensor_events: the _SHAPE_KEY columns
_CALL, _WIDTH, _EXPECTED_WIDTH, _NONFINITE, _EVENT_WALL = (itemgetter(i) for i in (3, 5, 9, 12, 16))


def _groups(rows: Sequence[tuple], key: Callable[[tuple], tuple]) -> dict[tuple, list[tuple]]:
    # one dict lookup per row; the per-group sums and bounds below run in C (map, sum, min, max)
    groups: dict[tuple, list[tuple]] = {}
    for k, row in zip(map(key, rows), rows):
        group = groups.get(k)
        if group is None:
            groups[k] = [row]
        else:
            group.append(row)
    return groups


def batch_rows(verify_steps: Sequence[tuple], tensor_events: Sequence[tuple]) -> dict[str, list[Row]]:
    """Summary rows of one batch, per summary table (absent when the batch has no such rows).

    ``verify_steps`` / ``tensor_events``: rows in ``_rows.INSERT_COLUMNS`` order (the tuples the
    store inserts). Returns dicts of column values, one per key, sorted by key (concurrent writers
    then lock shared keys in one order).
    """
    out: dict[str, list[Row]] = {}
    if verify_steps:
        out["acceptance_masks"] = [
            {"run_id": run_id, "rank": rank, "accepted_mask": mask, "steps": sum(map(_STEPS, group)),
             "proposed": sum(map(_PROPOSED, group)), "accepted": sum(map(_ACCEPTED, group)),
             "first_wall": min(map(_STEP_WALL, group)), "last_wall": max(map(_STEP_WALL, group)),
             "step_detail": 1 if max(map(_STEP, group)) >= 0 else 0}
            for (run_id, rank, mask), group in sorted(_groups(verify_steps, _MASK_OF).items())]
    if tensor_events:
        rows = []
        for key, group in _groups(tensor_events, _SHAPE_OF).items():
            run_id, rank, point, shape, dtype, device, expected, phase = key
            calls, walls = list(map(_CALL, group)), list(map(_EVENT_WALL, group))
            rows.append({"run_id": run_id, "rank": rank, "hook_point": point, "shape": shape, "dtype": dtype,
                         "device": device, "expected_shape": expected or "", "graph_phase": phase,
                         "width": _WIDTH(group[0]), "expected_width": _EXPECTED_WIDTH(group[0]),
                         "events": len(group), "first_call": min(calls), "last_call": max(calls),
                         "first_wall": min(walls), "last_wall": max(walls),
                         "nonfinite": sum(filter(None, map(_NONFINITE, group)))})
        out["tensor_shapes"] = sorted(rows, key=_SHAPE_ROW)
    return out


_SHAPE_ROW = itemgetter(*_SHAPE_KEY)


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
    upgrade that adds the tables to a store with rows, and rows written around the Store)."""
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
