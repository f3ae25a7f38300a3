"""Query results as text: an aligned table, CSV or JSON (``specscope query`` and the dashboard's SQL
page share them; neither imports the other), and the one JSON writer of every ``--json`` output.

JSON is strict (RFC 8259): a non-finite number (NaN, +/-Infinity; a float column of SQLite, a
PostgreSQL ``'NaN'::float``) is written as ``null``, never as the ``NaN`` / ``Infinity`` tokens that
``json.dumps`` emits by default and other parsers refuse. The aligned table escapes control
characters of stored text (``\x1b`` as the four characters ``\x1b``), so a value cannot move the
cursor, recolour or retitle the terminal that shows it. A binary value (SQLite BLOB, PostgreSQL
``bytea``) reads the same in the table, CSV, JSON and the dashboard: PostgreSQL's own hex text,
``\x00ff41``.

Stored text shown as Markdown (the dashboard's pages, a fix that quotes a checkpoint's key) is made
literal the same way: whoever can write a store or a checkpoint writes its names, and in Streamlit's
Markdown an image in one made every viewer's browser fetch its URL, a colour directive
(``:green[no finding]``) drew a verdict of its own, and a line break started a heading ("ALL RUNS
HEALTHY") inside the line of runs.
"""

from __future__ import annotations

import csv
import json
import math
import re
from decimal import Decimal
from typing import Any, TextIO

_LINE_BREAKS = "\n\r\x0b\x0c\x85\u2028\u2029"
# every C0 control (tab and newline too: one row stays one line), DEL and C1 (ECMA-48 introducers),
# and the bidirectional controls, which reorder what a terminal shows after them (Unicode TR 9)
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))} | {
    code: f"\\u{code:04x}" for code in _BIDI}
# A line break would let stored text start a block of its own (a heading, a list, a rule) inside the
# page's line; ``*`` / ``~`` draw emphasis, ``$`` opens Streamlit's LaTeX, ``#`` a heading.
_MARKUP = str.maketrans({**{c: "\\" + c for c in "\\`[]<>:*~$#"}, **dict.fromkeys(_LINE_BREAKS, " ")})
_SPACED = str.maketrans(dict.fromkeys(_LINE_BREAKS, " "))
_BACKTICKS = re.compile("`+")
_BINARY = (bytes, bytearray, memoryview)
_INT64 = 2**63  # the dashboard's Arrow tables hold whole numbers up to int64


def to_json(value: Any, indent: int | None = 2) -> str:
    """Strict JSON of ``value``: non-finite floats as null, Decimals as numbers, bytes as hex text."""
    return json.dumps(portable(value), default=_json_value, indent=indent, allow_nan=False)


def write_json(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """A JSON list with one object per row (NULL -> null, PostgreSQL numerics -> numbers); a column
    name seen before gets a suffix (``a``, ``a_2``), so no column is lost to another of its name."""
    keys = distinct_names(columns)
    out.write(to_json([dict(zip(keys, row)) for row in rows], indent=1))
    out.write("\n")


def distinct_names(names: list[str]) -> list[str]:
    """``names`` with a suffix on each one seen before (``a``, ``a_2``), for a result's columns where
    a name is a key (JSON objects, the dashboard's tables): no column is lost to another of its name."""
    seen: set[str] = set()
    out = []
    for name in names:
        key, n = name, 1
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        out.append(key)
    return out


def write_csv(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """CSV (``csv`` module, excel dialect) with a header row; NULL is an empty field."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([bytes_text(value) if isinstance(value, _BINARY) else value for value in row]
                     for row in rows)


def write_table(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """An aligned text table (numbers right-aligned, NULL shown as ``NULL``) and a row count."""
    names = [terminal_text(name) for name in columns]  # a column's name is stored text too (a view's)
    cells = [[_text(value) for value in row] for row in rows]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(names)]
    numeric = [bool(rows) and all(isinstance(row[i], (int, float, Decimal)) or row[i] is None
                                  for row in rows) for i in range(len(columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    if columns:
        out.write(line(names) + "\n")
        out.write("  ".join("-" * w for w in widths) + "\n")
        for row in cells:
            out.write(line(row) + "\n")
    out.write(f"({len(rows)} row{'' if len(rows) == 1 else 's'})\n")


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    return bytes_text(value) if isinstance(value, _BINARY) else terminal_text(str(value))


def bytes_text(value: bytes | memoryview) -> str:
    """A binary value as PostgreSQL writes ``bytea`` (its hex format): ``\\x`` and two hex digits a
    byte."""
    return "\\x" + bytes(value).hex()


def terminal_text(text: object) -> str:
    """``text`` with its control characters escaped (``\\x1b`` as the four characters ``\\x1b``, a
    newline as ``\\x0a``, a right-to-left override as ``\\u202e``): one line that cannot move the
    cursor, recolour, retitle or reorder a terminal. For each stored value put into a report's line."""
    return str(text).translate(_CONTROLS)


def terminal_lines(text: str) -> str:
    """``text`` line by line (``\n``) through :func:`terminal_text`: a report whose stored values
    (run ids, model names, messages) cannot move the cursor, recolour or retitle a terminal."""
    return "\n".join(map(terminal_text, text.split("\n")))


def markdown_prose(text: object) -> str:
    """``text`` as literal Markdown prose on the line it is put in: line breaks as spaces, and the
    characters that open a code span, an image, a link, an autolink (``<...>``), emphasis, LaTeX, a
    heading or one of Streamlit's ``:name[...]`` directives and ``:icon:`` shortcodes escaped
    (CommonMark escapes ASCII punctuation with a backslash). A bare ``http://`` URL is still made a
    link (GFM): shown and fetched only when clicked."""
    return str(text).translate(_MARKUP)


def markdown_code(text: object) -> str:
    """``text`` as one literal Markdown inline code span (nothing inside a code span is Markdown),
    fenced by one backtick more than its longest run of them (CommonMark), padded when it starts or
    ends with one; line breaks as spaces (a blank line would end the span's paragraph)."""
    text = str(text).translate(_SPACED)
    fence = "`" * (max(map(len, _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def portable(value: Any) -> Any:
    """``value`` with non-finite floats as None, Decimals as ints when whole (their digits as text
    beyond int64) and floats otherwise (their digits as text beyond a float's range), and binary
    values as their hex text, through dicts, lists and tuples: what strict JSON and Arrow tables (the
    dashboard's dataframes: Decimal precision at most 76) can hold. A whole ``numeric`` read as a
    float lost its digits past 2**53 (9007199254740993 became ...992, an attack trial)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):  # NaN -> null; beyond a float's range -> its digits as text
        if not value.is_finite():
            return None
        if value == value.to_integral_value():  # a whole number exactly, as a bigint column reads
            return int(value) if -_INT64 <= value < _INT64 else str(value)
        return float(value) if math.isfinite(float(value)) else str(value)
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(item) for item in value]
    if isinstance(value, _BINARY):
        return bytes_text(value)
    return value


def _json_value(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars in evidence
        return portable(value.item())
    return str(value)
