"""Why a batch could not be written: the first value a database could not store as it is (run after a
write failed, to tell a batch that holds a bad value from a store that cannot be written)."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from specscope.errors import InvalidEvent
from specscope.event_checks import check_names
from specscope.storage._rows import INSERT_COLUMNS, STATEMENTS, Row

_TABLE_NAMES = {s.name: s.table.name for s in STATEMENTS}
_INT64 = 2**63
_TYPES = {s.name: {column.name: column.type.python_type for column in s.table.columns} for s in STATEMENTS}
_TUPLE_TYPES = {s.name: tuple(_TYPES[s.name][c] for c in s.columns) for s in STATEMENTS if s.columns}
_RUN_ID = attrgetter("run_id")


def run_id_refusal(events: Iterable[Any], counted: Iterable[str]) -> str | None:
    """Why a run id of ``events`` or of the ranks ``counted`` cannot be stored (one line), or None.

    Checked before every write, unlike :func:`bad_value`: SQLite keeps a bytes run id, an empty one,
    one holding NUL or one longer than :func:`~specscope.event_checks.check_names` allows, and every
    reader orders and compares run ids as text (a bytes one broke every dashboard page and the
    doctor for the whole store), takes an empty one for none given, and PostgreSQL refuses the other
    two. A batch holds a few run ids, so
    the check costs one attribute read per event. None is left to the columns: a finding about no
    run has it, any other row is refused as NOT NULL.
    """
    for run_id in set(map(_RUN_ID, events)).union(counted):
        if run_id is None:
            continue
        if not isinstance(run_id, str):
            return f"run_id {reprlib.repr(run_id)} is {type(run_id).__name__}, not text"
        if not run_id:  # every reader takes it for "no run given"
            return "an empty run_id"
        if "\x00" in run_id:
            return f"run_id {reprlib.repr(run_id)} holds a NUL character"
        try:
            check_names("run", run_id=run_id)
        except InvalidEvent as exc:
            return str(exc)
    return None


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
                    return (f"{_TABLE_NAMES[statement]}.{name.removeprefix('b_')}: {reason} "
                            f"({shown[:60] + '...' if len(shown) > 60 else shown})")
    return None
