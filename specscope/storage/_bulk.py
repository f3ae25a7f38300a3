"""Bulk-insert strategies of the write path: how one statement's rows of a plain insert
(``_rows.INSERT_COLUMNS``: verify steps, tensor events, provenance, load reports, findings) reach
the database inside the caller's transaction.

- ``executemany``: the driver cursor's executemany of one compiled INSERT (SQLite; PostgreSQL on request).
- ``copy``: PostgreSQL ``COPY table (columns) FROM STDIN (FORMAT BINARY)`` through psycopg 3's
  ``cursor.copy()``, rows written with ``write_row``; the binary column types come from the
  schema's column types (:data:`_PG_BINARY_TYPES`). A stream per statement instead of a bound
  statement per row; measured in ``benchmarks/pg_ingest.py`` against executemany on the same rows
  (binary was about 15% faster than the text format there).

:func:`bulk_strategy` picks one per dialect; the store calls it once and keeps the function.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope.errors import ConfigError
from specscope.storage import schema
from specscope.storage._rows import INSERT_COLUMNS

# schema.py column type -> PostgreSQL binary COPY type (Boolean before Integer: neither subclasses
# the other, but the order states the intent; String covers VARCHAR, whose binary form is text's).
_PG_BINARY_TYPES = ((sa.Boolean, "bool"), (sa.Integer, "int4"), (sa.Float, "float8"), (sa.Text, "text"),
                    (sa.String, "text"))

BulkInsert = Callable[[Connection, str, str, Sequence[tuple]], None]
"""``(connection, statement name, compiled INSERT, rows in INSERT_COLUMNS order) -> None``."""


def executemany(conn: Connection, name: str, insert_sql: str, rows: Sequence[tuple]) -> None:
    """The compiled INSERT of ``name``, executemany over ``rows`` on a cursor of the driver connection
    under ``conn``, so inside its transaction (SQLAlchemy's handling of a statement would add
    nothing to rows that are already driver parameters)."""
    cursor = conn.connection.driver_connection.cursor()
    try:
        cursor.executemany(insert_sql, rows)
    finally:
        cursor.close()


@functools.cache
def _binary_types(name: str) -> tuple[str, ...]:
    """PostgreSQL type names of ``INSERT_COLUMNS[name]`` for a binary COPY, from schema.py."""
    table = schema.metadata.tables[name]
    return tuple(next(pg for sa_type, pg in _PG_BINARY_TYPES if isinstance(table.c[column].type, sa_type))
                 for column in INSERT_COLUMNS[name])


def copy(conn: Connection, name: str, insert_sql: str, rows: Sequence[tuple]) -> None:
    """``COPY name (INSERT_COLUMNS[name]) FROM STDIN (FORMAT BINARY)`` with ``rows`` (PostgreSQL with
    psycopg 3 only; ``insert_sql`` is unused). Runs in the connection's open transaction: rolled back
    with it."""
    columns = ", ".join(INSERT_COLUMNS[name])
    with conn.connection.driver_connection.cursor() as cursor:
        with cursor.copy(f"COPY {name} ({columns}) FROM STDIN (FORMAT BINARY)") as stream:
            stream.set_types(_binary_types(name))
            for row in rows:
                stream.write_row(row)


STRATEGIES: dict[str, BulkInsert] = {"executemany": executemany, "copy": copy}


def bulk_strategy(dialect: str, bulk: str | None) -> BulkInsert:
    """The strategy named ``bulk``, or by default ``copy`` on PostgreSQL and ``executemany`` on SQLite.

    Raises:
        ConfigError: an unknown name, or ``copy`` on a database that is not PostgreSQL.
    """
    name = bulk or ("copy" if dialect == "postgresql" else "executemany")
    if name not in STRATEGIES:
        raise ConfigError(f"unknown bulk insert strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if name == "copy" and dialect != "postgresql":
        raise ConfigError(f"bulk insert 'copy' needs PostgreSQL, the store is {dialect}")
    return STRATEGIES[name]
