"""The summary tables (``acceptance_masks``, ``request_accepts``, ``step_seconds``,
``draft_input_seconds``, ``tensor_shapes``): how a batch of verify-step and tensor-event rows updates
them, and how they are rebuilt from the raw rows.

A summary row aggregates the raw rows of one key: for ``acceptance_masks`` (run, rank, accepted mask)
the summed ``steps`` / ``proposed`` / ``accepted``, the first and last ``ts_wall`` and whether any row
is a per-step row; for ``request_accepts`` (run, request, accepted drafts per step: -1 for a row whose
steps' accepted drafts are not known) the same sums, bounds and detail flag, the steps whose first
draft was accepted and the most drafts one step proposed; for ``step_seconds`` (run, rank, wall-clock
second) the summed ``steps`` / ``accepted`` and the first and last ``ts_wall``; for
``draft_input_seconds`` (run, rank, draft hook point, width, expected width, second: the draft's
inputs with a width contract) the event count and the first and last ``ts_wall``; for
``tensor_shapes`` (run, rank, hook point, shape, dtype, device, expected shape, graph phase) the event
count, first / last call index and wall time and the summed non-finite elements. A :class:`Summary`
folds one write's rows per key in Python, then its upsert adds them to the stored rows (sums add,
first / last take the min / max), in the write's own transaction: a reader sees the raw rows and
their summary together, or neither. Every aggregate is associative, so any split into batches gives
the rows :func:`rebuild` computes from scratch (a test checks it).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope import points
from specscope.storage import schema

Row = dict[str, object]


@dataclass(frozen=True)
class Summary:
    """A summary table kept by writes: ``fold`` turns a batch of raw rows into one row per ``key``
    (sorted by key, so concurrent writers lock shared keys in one order); the upsert adds ``sums`` and
    widens the ``firsts`` (min) and ``lasts`` (max) of the stored row."""

    table: sa.Table
    key: tuple[str, ...]
    sums: tuple[str, ...]
    firsts: tuple[str, ...]
    lasts: tuple[str, ...]
    fold: Callable[[Sequence[tuple]], list[Row]]

    def upsert(self, insert: Callable[[sa.Table], sa.Insert]) -> sa.Executable:
        """INSERT ... ON CONFLICT DO UPDATE built with the dialect's ``insert``."""
        stmt = insert(self.table)
        new, table = stmt.excluded, self.table
        update = {name: table.c[name] + new[name] for name in self.sums}
        update |= {name: _pick(new[name], table.c[name], smaller=True) for name in self.firsts}
        update |= {name: _pick(new[name], table.c[name], smaller=False) for name in self.lasts}
        return stmt.on_conflict_do_update(index_elements=list(self.key), set_=update)


def _pick(new: sa.ColumnElement, old: sa.ColumnElement, smaller: bool) -> sa.ColumnElement:
    # CASE, not MIN(a, b) / LEAST(a, b): SQLite and PostgreSQL spell the scalar min / max differently
    return sa.case(((new < old) if smaller else (new > old), new), else_=old)


def _groups(rows: Sequence[tuple], keys: Iterable[tuple]) -> dict[tuple, list[tuple]]:
    """``rows`` by their ``keys`` (one per row), in order, grouped in C: the defaultdict's lookup makes
    a missing group, ``list.append`` adds the row, an empty deque drains the map (a loop in Python was
    a third of the folds' time). The per-group sums and bounds run in C too (map, sum, min, max)."""
    groups: defaultdict[tuple, list[tuple]] = defaultdict(list)
    deque(map(list.append, map(groups.__getitem__, keys), rows), maxlen=0)
    return groups


def _getter(columns: tuple[str, ...], *names: str) -> Callable[[tuple], object]:
    return itemgetter(*(columns.index(name) for name in names))


_MASK_KEY = ("run_id", "rank", "accepted_mask")


def acceptance_masks(columns: tuple[str, ...]) -> Summary:
    """The summary of ``verify_steps`` rows (tuples in ``columns`` order): one row per accepted mask."""
    mask_of = _getter(columns, *_MASK_KEY)
    step, proposed, accepted, wall, steps = (_getter(columns, c) for c in
                                             ("step", "proposed", "accepted", "ts_wall", "steps"))

    def fold(rows: Sequence[tuple]) -> list[Row]:
        return [{"run_id": run_id, "rank": rank, "accepted_mask": mask, "steps": sum(map(steps, group)),
                 "proposed": sum(map(proposed, group)), "accepted": sum(map(accepted, group)),
                 "first_wall": min(map(wall, group)), "last_wall": max(map(wall, group)),
                 "step_detail": 1 if max(map(step, group)) >= 0 else 0}
                for (run_id, rank, mask), group in sorted(_groups(rows, map(mask_of, rows)).items())]

    return Summary(schema.acceptance_masks, _MASK_KEY, ("steps", "proposed", "accepted"), ("first_wall",),
                   ("last_wall", "step_detail"), fold)


_REQUEST_KEY = ("run_id", "request_id", "accepted_drafts")
UNKNOWN_DRAFTS = -1
"""``request_accepts.accepted_drafts`` of rows whose steps' accepted drafts are not known: totals without
an accepted mask for drafts proposed (a recorded plain response, a watched window), or no step."""


def request_accepts(columns: tuple[str, ...]) -> Summary:
    """The per-request summary of ``verify_steps`` rows (tuples in ``columns`` order): one row per
    request and accepted drafts per step (``v_acceptance_histogram``'s unit; :data:`UNKNOWN_DRAFTS`
    where not known)."""
    run, request, step, proposed, accepted, mask, wall, steps = (_getter(columns, c) for c in (
        "run_id", "request_id", "step", "proposed", "accepted", "accepted_mask", "ts_wall", "steps"))

    def drafts_key(row: tuple) -> tuple:
        n = steps(row)
        known = n > 0 and (mask(row) != "" or proposed(row) == 0)
        return run(row), request(row), accepted(row) // n if known else UNKNOWN_DRAFTS

    def fold(rows: Sequence[tuple]) -> list[Row]:
        return [{"run_id": run_id, "request_id": request_id, "accepted_drafts": drafts,
                 "steps": sum(map(steps, group)), "proposed": sum(map(proposed, group)),
                 "accepted": sum(map(accepted, group)),
                 "position0_steps": sum(steps(r) for r in group if mask(r)[:1] == "1"),
                 "drafts": max(proposed(r) // steps(r) for r in group) if drafts >= 0 else 0,
                 "first_wall": min(map(wall, group)), "last_wall": max(map(wall, group)),
                 "step_detail": 1 if max(map(step, group)) >= 0 else 0}
                for (run_id, request_id, drafts), group in sorted(_groups(rows, map(drafts_key, rows)).items())]

    return Summary(schema.request_accepts, _REQUEST_KEY, ("steps", "proposed", "accepted", "position0_steps"),
                   ("first_wall",), ("last_wall", "step_detail", "drafts"), fold)


def _second(wall: sa.ColumnElement) -> sa.ColumnElement:
    """SQL of floor(``wall``), the wall-clock second (math.floor in a fold): PostgreSQL's CAST rounds,
    SQLite's truncates; one below a rounded-up CAST is the floor on both."""
    whole = sa.cast(wall, sa.BigInteger)
    return sa.case((whole > wall, whole - 1), else_=whole)


def step_seconds(columns: tuple[str, ...]) -> Summary:
    """The summary of ``verify_steps`` rows by wall-clock second: one row per run, rank and second."""
    run, rank, wall, steps, accepted = (_getter(columns, c) for c in
                                        ("run_id", "rank", "ts_wall", "steps", "accepted"))

    def fold(rows: Sequence[tuple]) -> list[Row]:
        groups = _groups(rows, zip(map(run, rows), map(rank, rows), map(math.floor, map(wall, rows))))
        return [{"run_id": run_id, "rank": r, "wall_second": second, "steps": sum(map(steps, group)),
                 "accepted": sum(map(accepted, group)), "first_wall": min(map(wall, group)),
                 "last_wall": max(map(wall, group))}
                for (run_id, r, second), group in sorted(groups.items())]

    return Summary(schema.step_seconds, ("run_id", "rank", "wall_second"), ("steps", "accepted"), ("first_wall",),
                   ("last_wall",), fold)


NO_WIDTH = -1
"""``draft_input_seconds.width`` of a tensor without one (a scalar): NULL in ``tensor_events``, and a NULL
in a key would never conflict."""

_DRAFT_INPUT_KEY = ("run_id", "rank", "hook_point", "width", "expected_width", "wall_second")


def draft_input_seconds(columns: tuple[str, ...]) -> Summary:
    """The summary of ``tensor_events`` rows at a draft hook point with a width contract by wall-clock
    second: one row per run, rank, hook point, observed and expected width and second."""
    run, rank, point, width, expected, wall = (_getter(columns, c) for c in
                                               ("run_id", "rank", "hook_point", "width", "expected_width", "ts_wall"))

    def fold(rows: Sequence[tuple]) -> list[Row]:
        # grouped in C, first by hook point (one value, no key tuple), then the draft points' rows by
        # their key, keeping the groups with a width contract: cheaper than choosing rows in Python
        by_point = _groups(rows, map(point, rows))
        drafts = list(chain.from_iterable(group for p, group in by_point.items() if p.startswith(points.DRAFT_PREFIX)))
        widths = [NO_WIDTH if observed is None else observed for observed in map(width, drafts)]
        keys = zip(map(run, drafts), map(rank, drafts), map(point, drafts), widths, map(expected, drafts),
                   map(math.floor, map(wall, drafts)))
        groups = _groups(drafts, keys)
        return [dict(zip(_DRAFT_INPUT_KEY, k), events=len(groups[k]), first_wall=min(map(wall, groups[k])),
                     last_wall=max(map(wall, groups[k])))
                for k in sorted(k for k in groups if k[4] is not None)]

    return Summary(schema.draft_input_seconds, _DRAFT_INPUT_KEY, ("events",), ("first_wall",), ("last_wall",), fold)


_SHAPE_KEY = ("run_id", "rank", "hook_point", "shape", "dtype", "device", "expected_shape", "graph_phase")
_SHAPE_ROW = itemgetter(*_SHAPE_KEY)


def tensor_shapes(columns: tuple[str, ...]) -> Summary:
    """The summary of ``tensor_events`` rows (tuples in ``columns`` order): one row per shape seen."""
    shape_of = _getter(columns, *_SHAPE_KEY)
    call, width, expected_width, nonfinite, wall = (_getter(columns, c) for c in
                                                    ("call_index", "width", "expected_width", "nonfinite", "ts_wall"))

    def fold(rows: Sequence[tuple]) -> list[Row]:
        out = []
        for key, group in _groups(rows, map(shape_of, rows)).items():
            run_id, rank, point, shape, dtype, device, expected, phase = key
            calls, walls = list(map(call, group)), list(map(wall, group))
            out.append({"run_id": run_id, "rank": rank, "hook_point": point, "shape": shape, "dtype": dtype,
                        "device": device, "expected_shape": expected or "", "graph_phase": phase,
                        "width": width(group[0]), "expected_width": expected_width(group[0]),
                        "events": len(group), "first_call": min(calls), "last_call": max(calls),
                        "first_wall": min(walls), "last_wall": max(walls),
                        "nonfinite": sum(filter(None, map(nonfinite, group)))})
        return sorted(out, key=_SHAPE_ROW)

    return Summary(schema.tensor_shapes, _SHAPE_KEY, ("events", "nonfinite"), ("first_call", "first_wall"),
                   ("last_call", "last_wall"), fold)


def _request_accepts_select() -> sa.Select:
    steps = schema.verify_steps.c
    known = sa.and_(steps.steps > 0, sa.or_(steps.accepted_mask != "", steps.proposed == 0))
    drafts = sa.case((known, steps.accepted // steps.steps), else_=UNKNOWN_DRAFTS)
    return sa.select(
        steps.run_id, steps.request_id, drafts, sa.func.sum(steps.steps), sa.func.sum(steps.proposed),
        sa.func.sum(steps.accepted),
        sa.func.sum(sa.case((sa.func.substr(steps.accepted_mask, 1, 1) == "1", steps.steps), else_=0)),
        sa.func.max(sa.case((known, steps.proposed // steps.steps), else_=0)),
        sa.func.min(steps.ts_wall), sa.func.max(steps.ts_wall), sa.func.max(sa.case((steps.step >= 0, 1), else_=0)),
    ).group_by(steps.run_id, steps.request_id, drafts)


def rebuild(conn: Connection, tables: Sequence[sa.Table] | None = None) -> None:
    """Recompute the summary tables (``tables``, default all) from every row of ``verify_steps`` and
    ``tensor_events`` (the upgrades that add a table to a store with rows, and rows written around the
    Store)."""
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
    step_second = _second(steps.ts_wall)
    by_second = sa.select(
        steps.run_id, steps.rank, step_second, sa.func.sum(steps.steps), sa.func.sum(steps.accepted),
        sa.func.min(steps.ts_wall), sa.func.max(steps.ts_wall),
    ).group_by(steps.run_id, steps.rank, step_second)
    width, event_second = sa.func.coalesce(events.width, NO_WIDTH), _second(events.ts_wall)
    draft_inputs = sa.select(
        events.run_id, events.rank, events.hook_point, width, events.expected_width, event_second, sa.func.count(),
        sa.func.min(events.ts_wall), sa.func.max(events.ts_wall),
    ).where(sa.func.substr(events.hook_point, 1, len(points.DRAFT_PREFIX)) == points.DRAFT_PREFIX,
            events.expected_width.is_not(None),
            ).group_by(events.run_id, events.rank, events.hook_point, width, events.expected_width, event_second)
    selects = {schema.acceptance_masks: masks, schema.request_accepts: _request_accepts_select(),
               schema.step_seconds: by_second, schema.draft_input_seconds: draft_inputs,
               schema.tensor_shapes: shapes}
    for table in selects if tables is None else tables:
        select = selects[table]
        conn.execute(table.delete())
        conn.execute(table.insert().from_select([c.name for c in table.columns], select))
