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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import chain
from operator import itemgetter

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope import points
from specscope.storage import schema

Row = dict[str, object]


Groups = Mapping[tuple, list[tuple]]


@dataclass(frozen=True)
class Summary:
    """A summary table kept by writes: ``group`` splits a batch of raw rows by what the summary
    derives from them, ``fold`` turns those groups into one row per ``key`` (sorted by key, so
    concurrent writers lock shared keys in one order); the upsert adds ``sums`` and widens the
    ``firsts`` (min) and ``lasts`` (max) of the stored row. Summaries of one table whose ``group`` is
    the same function share one grouping of a batch (:func:`fold_all`)."""

    table: sa.Table
    key: tuple[str, ...]
    sums: tuple[str, ...]
    firsts: tuple[str, ...]
    lasts: tuple[str, ...]
    group: Callable[[Sequence[tuple]], Groups]
    fold: Callable[[Groups], list[Row]]

    def upsert(self, insert: Callable[[sa.Table], sa.Insert]) -> sa.Executable:
        """INSERT ... ON CONFLICT DO UPDATE built with the dialect's ``insert``."""
        stmt = insert(self.table)
        new, table = stmt.excluded, self.table
        update = {name: table.c[name] + new[name] for name in self.sums}
        update |= {name: _pick(new[name], table.c[name], smaller=True) for name in self.firsts}
        update |= {name: _pick(new[name], table.c[name], smaller=False) for name in self.lasts}
        return stmt.on_conflict_do_update(index_elements=list(self.key), set_=update)


def fold_all(summaries: Iterable[Summary], rows: Sequence[tuple]) -> dict[str, list[Row]]:
    """The summary rows of one table's batch ``rows``, per summary table that has some; each grouping
    made once."""
    groupings: dict[Callable, Groups] = {}
    out = {}
    for summary in summaries:
        groups = groupings.get(summary.group)
        if groups is None:
            groups = groupings[summary.group] = summary.group(rows)
        folded = summary.fold(groups)
        if folded:
            out[summary.table.name] = folded
    return out


def _pick(new: sa.ColumnElement, old: sa.ColumnElement, smaller: bool) -> sa.ColumnElement:
    # CASE, not MIN(a, b) / LEAST(a, b): SQLite and PostgreSQL spell the scalar min / max differently
    return sa.case(((new < old) if smaller else (new > old), new), else_=old)


def _groups(rows: Sequence[tuple], keys: Iterable[object]) -> dict[object, list[tuple]]:
    """``rows`` by their ``keys`` (one per row), in order, grouped in C: the defaultdict's lookup makes
    a missing group, ``list.append`` adds the row, an empty deque drains the map (a loop in Python was
    a third of the folds' time). The per-group sums and bounds run in C too (map, sum, min, max)."""
    groups: defaultdict[object, list[tuple]] = defaultdict(list)
    deque(map(list.append, map(groups.__getitem__, keys), rows), maxlen=0)
    return groups


def _getter(columns: tuple[str, ...], *names: str) -> Callable[[tuple], object]:
    return itemgetter(*(columns.index(name) for name in names))


@cache
def _grouping(columns: tuple[str, ...], *names: str) -> Callable[[Sequence[tuple]], Groups]:
    """Rows (tuples in ``columns`` order) grouped by the values of ``names``: one function per
    columns and names, so summaries grouping alike share it."""
    key_of = _getter(columns, *names)

    def group(rows: Sequence[tuple]) -> Groups:
        return _groups(rows, map(key_of, rows))

    return group


_MASK_KEY = ("run_id", "rank", "accepted_mask")


def acceptance_masks(columns: tuple[str, ...]) -> Summary:
    """The summary of ``verify_steps`` rows (tuples in ``columns`` order): one row per accepted mask."""
    step, proposed, accepted, wall, steps = (_getter(columns, c) for c in
                                             ("step", "proposed", "accepted", "ts_wall", "steps"))

    def fold(groups: Groups) -> list[Row]:
        return [{"run_id": run_id, "rank": rank, "accepted_mask": mask, "steps": sum(map(steps, group)),
                 "proposed": sum(map(proposed, group)), "accepted": sum(map(accepted, group)),
                 "first_wall": min(map(wall, group)), "last_wall": max(map(wall, group)),
                 "step_detail": 1 if max(map(step, group)) >= 0 else 0}
                for (run_id, rank, mask), group in sorted(groups.items())]

    return Summary(schema.acceptance_masks, _MASK_KEY, ("steps", "proposed", "accepted"), ("first_wall",),
                   ("last_wall", "step_detail"), _grouping(columns, *_MASK_KEY), fold)


_REQUEST_KEY = ("run_id", "request_id", "accepted_drafts")
UNKNOWN_DRAFTS = -1
"""``request_accepts.accepted_drafts`` of rows whose steps' accepted drafts are not known: totals without
an accepted mask for drafts proposed (a recorded plain response, a watched window), or no step."""


def request_accepts(columns: tuple[str, ...]) -> Summary:
    """The per-request summary of ``verify_steps`` rows (tuples in ``columns`` order): one row per
    request and accepted drafts per step (``v_acceptance_histogram``'s unit; :data:`UNKNOWN_DRAFTS`
    where not known)."""
    step, wall = _getter(columns, "step"), _getter(columns, "ts_wall")

    def fold(groups: Groups) -> list[Row]:
        # rows that agree on the grouping's columns agree on all the summary derives from them (the
        # key's accepted drafts, the sums, the first place of the mask): derived once per group
        by_key: defaultdict[tuple, list[tuple[tuple, list[tuple]]]] = defaultdict(list)
        for (run_id, request_id, n, proposed, accepted, mask), group in groups.items():
            known = n > 0 and (mask != "" or proposed == 0)
            by_key[run_id, request_id, accepted // n if known else UNKNOWN_DRAFTS].append(
                ((n, proposed, accepted, mask), group))
        out = []
        for (run_id, request_id, drafts), parts in sorted(by_key.items()):
            walls = list(chain.from_iterable(map(wall, group) for _, group in parts))
            out.append({"run_id": run_id, "request_id": request_id, "accepted_drafts": drafts,
                        "steps": sum(n * len(group) for (n, _, _, _), group in parts),
                        "proposed": sum(proposed * len(group) for (_, proposed, _, _), group in parts),
                        "accepted": sum(accepted * len(group) for (_, _, accepted, _), group in parts),
                        "position0_steps": sum(n * len(group) for (n, _, _, mask), group in parts if mask[:1] == "1"),
                        "drafts": max(proposed // n for (n, proposed, _, _), _ in parts) if drafts >= 0 else 0,
                        "first_wall": min(walls), "last_wall": max(walls),
                        "step_detail": 1 if max(max(map(step, group)) for _, group in parts) >= 0 else 0})
        return out

    return Summary(schema.request_accepts, _REQUEST_KEY, ("steps", "proposed", "accepted", "position0_steps"),
                   ("first_wall",), ("last_wall", "step_detail", "drafts"),
                   _grouping(columns, "run_id", "request_id", "steps", "proposed", "accepted", "accepted_mask"), fold)


def _seconds(walls: Iterable[object]) -> Iterable[int]:
    """The wall-clock second of each of ``walls`` as stored: a ``ts_wall`` column holds a double, so an
    integer past 2**53 (nanoseconds given for seconds) is floored as the double it is stored as, which
    is what :func:`rebuild` floors."""
    return map(math.floor, map(float, walls))


def _second(wall: sa.ColumnElement) -> sa.ColumnElement:
    """SQL of floor(``wall``), the wall-clock second (math.floor in a fold): PostgreSQL's CAST rounds,
    SQLite's truncates; one below a rounded-up CAST is the floor on both."""
    whole = sa.cast(wall, sa.BigInteger)
    return sa.case((whole > wall, whole - 1), else_=whole)


def step_seconds(columns: tuple[str, ...]) -> Summary:
    """The summary of ``verify_steps`` rows by wall-clock second: one row per run, rank and second."""
    run, rank, wall, steps, accepted = (_getter(columns, c) for c in
                                        ("run_id", "rank", "ts_wall", "steps", "accepted"))

    def group(rows: Sequence[tuple]) -> Groups:
        return _groups(rows, zip(map(run, rows), map(rank, rows), _seconds(map(wall, rows))))

    def fold(groups: Groups) -> list[Row]:
        return [{"run_id": run_id, "rank": r, "wall_second": second, "steps": sum(map(steps, group)),
                 "accepted": sum(map(accepted, group)), "first_wall": min(map(wall, group)),
                 "last_wall": max(map(wall, group))}
                for (run_id, r, second), group in sorted(groups.items())]

    return Summary(schema.step_seconds, ("run_id", "rank", "wall_second"), ("steps", "accepted"), ("first_wall",),
                   ("last_wall",), group, fold)


NO_WIDTH = -1
"""``draft_input_seconds.width`` of a tensor without one (a scalar): NULL in ``tensor_events``, and a NULL
in a key would never conflict."""

_DRAFT_INPUT_KEY = ("run_id", "rank", "hook_point", "width", "expected_width", "wall_second")
_SHAPE_KEY = ("run_id", "rank", "hook_point", "shape", "dtype", "device", "expected_shape", "graph_phase")
_SHAPE_ROW = itemgetter(*_SHAPE_KEY)


def draft_input_seconds(columns: tuple[str, ...]) -> Summary:
    """The summary of ``tensor_events`` rows at a draft hook point with a width contract by wall-clock
    second: one row per run, rank, hook point, observed and expected width and second."""
    width, expected, wall = (_getter(columns, c) for c in ("width", "expected_width", "ts_wall"))

    def fold(groups: Groups) -> list[Row]:
        # tensor_shapes' groups: a shape and an expected shape each, so one width and one expected
        # width each; only the draft points' groups with a width contract are split by second
        seconds: defaultdict[tuple, list[float]] = defaultdict(list)
        for (run_id, rank, point, *_), group in groups.items():
            contract = expected(group[0])
            if contract is None or not point.startswith(points.DRAFT_PREFIX):
                continue
            observed = width(group[0])
            walls = list(map(wall, group))
            for second, in_second in _groups(walls, _seconds(walls)).items():
                seconds[run_id, rank, point, NO_WIDTH if observed is None else observed, contract, second].extend(
                    in_second)
        return [dict(zip(_DRAFT_INPUT_KEY, k), events=len(walls), first_wall=min(walls), last_wall=max(walls))
                for k, walls in sorted(seconds.items())]

    return Summary(schema.draft_input_seconds, _DRAFT_INPUT_KEY, ("events",), ("first_wall",), ("last_wall",),
                   _grouping(columns, *_SHAPE_KEY), fold)


def tensor_shapes(columns: tuple[str, ...]) -> Summary:
    """The summary of ``tensor_events`` rows (tuples in ``columns`` order): one row per shape seen."""
    call, width, expected_width, nonfinite, wall = (_getter(columns, c) for c in
                                                    ("call_index", "width", "expected_width", "nonfinite", "ts_wall"))

    def fold(groups: Groups) -> list[Row]:
        out = []
        for key, group in groups.items():
            run_id, rank, point, shape, dtype, device, expected, phase = key
            out.append({"run_id": run_id, "rank": rank, "hook_point": point, "shape": shape, "dtype": dtype,
                        "device": device, "expected_shape": expected or "", "graph_phase": phase,
                        "width": width(group[0]), "expected_width": expected_width(group[0]),
                        "events": len(group), "first_call": min(map(call, group)), "last_call": max(map(call, group)),
                        "first_wall": min(map(wall, group)), "last_wall": max(map(wall, group)),
                        "nonfinite": sum(filter(None, map(nonfinite, group)))})
        return sorted(out, key=_SHAPE_ROW)

    return Summary(schema.tensor_shapes, _SHAPE_KEY, ("events", "nonfinite"), ("first_call", "first_wall"),
                   ("last_call", "last_wall"), _grouping(columns, *_SHAPE_KEY), fold)


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
