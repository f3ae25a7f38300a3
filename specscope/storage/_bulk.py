"""Bulk-insert strategies of the write path: how one statement's rows of a plain insert
(``_rows.INSERT_COLUMNS``: verify steps, tensor events, provenance, load reports, findings) reach
the database inside the caller's transaction.

- ``executemany``: the driver's executemany of one compiled INSERT (SQLite; PostgreSQL on request).
- ``copy``: PostgreSQL ``COPY table (columns) FROM STDIN`` through psycopg 3's ``cursor.copy()``, rows
  written with ``write_row`` (text format: psycopg adapts each Python value as the INSERT would).
  One round trip per statement instead of one per row batch; measured in
  ``benchmarks/pg_ingest.py`` against executemany on the same rows.

:func:`choose` picks one per dialect; the store calls it once and keeps the function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection

from specscope.errors import ConfigError
from specscope.storage._rows import INSERT_COLUMNS

BulkInsert = Callable[[Connection, str, str, Sequence[tuple]], None]
"""``(connection, statement name, compiled INSERT, rows in INSERT_COLUMNS order) -> None``."""


def executemany(conn: Connection, name: str, insert_sql: str, rows: Sequence[tuple]) -> None:
    """The compiled INSERT of ``name``, executemany over ``rows``."""
    conn.exec_driver_sql(insert_sql, rows)


def copy(conn: Connection, name: str, insert_sql: str, rows: Sequence[tuple]) -> None:
    """``COPY name (INSERT_COLUMNS[name]) FROM STDIN`` with ``rows`` (PostgreSQL with psycopg 3 only;
    ``insert_sql`` is unused). Runs in the connection's open transaction: rolled back with it."""
    columns = ", ".join(INSERT_COLUMNS[name])
    with conn.connection.driver_connection.cursor() as cursor:
        with cursor.copy(f"COPY {name} ({columns}) FROM STDIN") as stream:
            for row in rows:
                stream.write_row(row)


STRATEGIES: dict[str, BulkInsert] = {"executemany": executemany, "copy": copy}


def choose(dialect: str, bulk: str | None) -> BulkInsert:
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
