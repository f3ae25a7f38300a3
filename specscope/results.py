"""Query results as text: an aligned table, CSV or JSON (``specscope query`` and the dashboard's SQL
page share them; neither imports the other)."""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from typing import Any, TextIO


def write_json(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """A JSON list with one object per row (NULL -> null, PostgreSQL numerics -> numbers)."""
    json.dump([dict(zip(columns, row)) for row in rows], out, default=_json_value, indent=1)
    out.write("\n")


def write_csv(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """CSV (``csv`` module, excel dialect) with a header row; NULL is an empty field."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)


def write_table(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    """An aligned text table (numbers right-aligned, NULL shown as ``NULL``) and a row count."""
    cells = [[_text(value) for value in row] for row in rows]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(columns)]
    numeric = [bool(rows) and all(isinstance(row[i], (int, float, Decimal)) or row[i] is None
                                  for row in rows) for i in range(len(columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    if columns:
        out.write(line(columns) + "\n")
        out.write("  ".join("-" * w for w in widths) + "\n")
        for row in cells:
            out.write(line(row) + "\n")
    out.write(f"({len(rows)} row{'' if len(rows) == 1 else 's'})\n")


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    return str(value)
