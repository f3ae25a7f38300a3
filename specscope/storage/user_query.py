"""The user-SQL sandbox behind :meth:`Store.query` (``specscope query``, the dashboard's SQL page): one
statement of a user's, run once on a read-only connection, under a time limit and result caps.

What the statement may do: :mod:`._guard` (SQLite, and the caps) and :mod:`._pg_guard` (PostgreSQL).
Before either database sees it, a statement is at most :data:`MAX_SQL_CHARS` characters long.
"""

from __future__ import annotations

import numbers
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Connection, Engine

from specscope.errors import ReadOnlyViolation, StoreError
from specscope.storage._errors import translate
from specscope.storage._guard import MAX_QUERY_TIMEOUT_S, ResultCap, SqliteGuard, row_bytes
from specscope.storage._pg_guard import (
    ROW_OVER_CAP,
    CheckedQuery,
    capped_select,
    check_postgres,
    postgres_timeout_sql,
    refuse_unlisted,
)
from specscope.storage._pg_values import register_value_readers

MAX_SQL_CHARS = 1_000_000  # far above any query a person writes; PostgreSQL's parser is bounded again
_PG_QUERY_CANCELED = "57014"  # SQLSTATE query_canceled: statement_timeout expired
_FETCH_BYTES = 2**20  # a server-side cursor's fetch brings about this much (at least one row)
_FETCH_ROWS = 1000  # and at most this many rows


class QueryResult(tuple):
    """``(columns, rows)`` of :meth:`Store.query`; ``truncated`` names the cap that cut the rows
    (``"10,000 rows"``, ``"67,108,864 bytes"``) or is None when every row is there."""

    truncated: str | None

    def __new__(cls, columns: list[str], rows: list[tuple], truncated: str | None = None) -> QueryResult:
        result = super().__new__(cls, (columns, rows))
        result.truncated = truncated
        return result

    @property
    def columns(self) -> list[str]:
        return self[0]

    @property
    def rows(self) -> list[tuple]:
        return self[1]


def run_query(engine: Engine, dialect: str, url: str, sql: str, params: Mapping[str, Any] | None,
              limit: int | None, timeout_s: float | None, max_bytes: int | None,
              trace: Callable[[str, Any, float], None] | None = None) -> QueryResult:
    """:meth:`Store.query` on the store's read ``engine``; ``trace`` is the store's tracer (PostgreSQL:
    the statement streams through a raw cursor the engine's events do not see)."""
    _check_arguments(sql, params, limit, timeout_s, max_bytes)
    cap = ResultCap(limit, max_bytes)
    if dialect == "postgresql":
        sent, sent_params = sql, params
        if params is not None:  # :name placeholders -> psycopg's, before the check parses it
            compiled = sa.text(sql).compile(dialect=PGDialect_psycopg())
            sent, sent_params = compiled.string, compiled.construct_params(dict(params))
        checked = check_postgres(sent, url)
        if checked.select is not None and max_bytes is not None:
            sent = capped_select(checked.select, max_bytes)
    with translate("query on", url), engine.connect() as conn:
        conn.begin()  # the BEGIN of the read engine runs before the guard denies transactions
        if dialect == "postgresql":
            started = time.perf_counter()
            try:
                columns, rows = _query_postgres(conn, sent, sent_params, cap, timeout_s, url, checked)
            finally:
                # closing the connection ends its session: an advisory lock or setting the
                # statement took (a role's own function) dies with it
                conn.invalidate()
            if trace is not None:
                trace(sql, params, time.perf_counter() - started)
        else:
            try:
                columns, rows = _query_sqlite(conn, sql, params, cap, timeout_s, url)
            finally:
                conn.rollback()
    return QueryResult(columns, rows, cap.truncated)


def _check_arguments(sql: Any, params: Any, limit: Any, timeout_s: Any, max_bytes: Any) -> None:
    """Refuse arguments of the wrong type or range with one line (StoreError), before any database
    sees them."""
    if not isinstance(sql, str):
        raise StoreError(f"the query must be SQL text (str), not {type(sql).__name__}")
    if not sql.strip():
        raise StoreError("the query is empty: give one SQL statement")
    if len(sql) > MAX_SQL_CHARS:
        raise StoreError(f"the query is {len(sql):,} characters long, over the {MAX_SQL_CHARS:,} a "
                         "statement may hold")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:  # a non-UTF-8 byte from argv arrives as a lone surrogate
        raise StoreError(f"the query is not UTF-8 text (character {exc.start + 1} is not valid)") from None
    if params is not None and not isinstance(params, Mapping):
        raise StoreError(f"query parameters must be a mapping of names to values, not {type(params).__name__}")
    for name, value in (("limit", limit), ("max_bytes", max_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise StoreError(f"query {name} must be a whole number or None, not {type(value).__name__}")
    if limit is not None and limit < 0:
        raise StoreError(f"query limit must be >= 0, got {limit}")
    if max_bytes is not None and max_bytes < 0:
        raise StoreError(f"query max_bytes must be >= 0, got {max_bytes}")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
                                  or not 0 < timeout_s <= MAX_QUERY_TIMEOUT_S):
        raise StoreError(f"query time limit must be > 0 and at most {MAX_QUERY_TIMEOUT_S:g} seconds, "
                         f"got {timeout_s!r}")


def _timed_out(url: str, timeout_s: float | None) -> StoreError:
    return StoreError(f"query on {url}: stopped after the time limit of {timeout_s:g} s; narrow the "
                      "query or raise the limit (specscope query --timeout, the SQL page's Time limit)")


def _too_big(url: str, max_bytes: int, what: str = "a row is larger than the result cap") -> StoreError:
    return StoreError(f"query on {url}: {what} of {max_bytes:,} bytes; select less of it (substr, length)")


def _query_sqlite(conn: Connection, sql: str, params: Mapping[str, Any] | None, cap: ResultCap,
                  timeout_s: float | None, url: str) -> tuple[list[str], list[tuple]]:
    # sqlite3 itself refuses a second statement ("You can only execute one statement at a time").
    raw = conn.connection.dbapi_connection
    guard = SqliteGuard(timeout_s, cap.max_bytes)
    guard.install(raw)
    try:
        result = conn.exec_driver_sql(sql) if params is None else conn.execute(sa.text(sql), dict(params))
        try:
            if not result.returns_rows:
                return [], []
            return list(result.keys()), cap.take(result)
        finally:
            result.close()  # a cut result's statement would stay active on the pooled connection
    except sa.exc.DBAPIError as exc:
        if guard.denied is not None:
            raise ReadOnlyViolation(f"query on {url}: {guard.denied} is not allowed (the SQL surface is "
                                    "read-only: SELECT, WITH and schema PRAGMAs only)") from exc
        if guard.timed_out:
            raise _timed_out(url, timeout_s) from exc
        if (getattr(exc.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG
                or guard.builtins.too_big):
            raise _too_big(url, guard.value_limit, "a value is larger than the per-value limit") from exc
        if guard.builtins.error is not None:
            raise StoreError(f"query on {url}: {guard.builtins.error}") from exc
        raise
    finally:
        guard.remove(raw)


def _query_postgres(conn: Connection, sql: str, params: Mapping[str, Any] | None, cap: ResultCap,
                    timeout_s: float | None, url: str, checked: CheckedQuery) -> tuple[list[str], list[tuple]]:
    # A SELECT runs through a server-side cursor (DECLARE, then FETCH of about _FETCH_BYTES at a
    # time): its columns are known without a row and nothing is run twice; SHOW, whose result is
    # one row, streams. Both send the statement in the extended protocol (one statement only) and
    # take results as text: psycopg reads every type from text, where a type without a binary
    # loader (regclass, xml, point, ...) would come back as its wire bytes.
    import psycopg  # the PostgreSQL driver is optional (extra "postgres"); this store needs it

    raw = conn.connection.dbapi_connection
    register_value_readers(raw)  # the connection ends with this query (invalidated by the caller)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def limit_time() -> None:  # before each round trip: the statement gets the time that is left
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timed_out(url, timeout_s)
            raw.execute(postgres_timeout_sql(left))

    try:
        limit_time()
        with raw.cursor() as cursor:
            refuse_unlisted(cursor, checked, url)
        if checked.select is not None:
            with raw.cursor(name="specscope_user_query") as cursor:
                cursor.execute(sql, params)
                columns = [column.name for column in cursor.description]
                return columns, cap.take(_fetched(cursor, limit_time))
        with raw.cursor() as cursor:
            # stream(): rows arrive one by one (a plain cursor would hold the whole result in memory
            # before the caps apply); leaving it early cancels the statement.
            stream = cursor.stream(sql, params)
            try:
                rows = cap.take(stream)
            finally:
                stream.close()
            return [column.name for column in cursor.description or ()], rows
    except psycopg.Error as exc:
        if exc.sqlstate == _PG_QUERY_CANCELED:
            raise _timed_out(url, timeout_s) from exc
        if ROW_OVER_CAP in str(exc) and cap.max_bytes is not None:
            raise _too_big(url, cap.max_bytes) from exc
        raise


def _fetched(cursor: Any, limit_time: Callable[[], None]) -> Iterator[tuple]:
    """The rows of a server-side cursor, fetched in batches sized to about ``_FETCH_BYTES`` by the
    rows seen so far (one row at first), so that large rows come one at a time."""
    size = 1
    while True:
        limit_time()
        batch = cursor.fetchmany(size)
        yield from batch
        if len(batch) < size:
            return
        per_row = max(1, sum(row_bytes(row) for row in batch) // len(batch))
        size = max(1, min(_FETCH_ROWS, _FETCH_BYTES // per_row))
