"""The trace store's reads and lifetime; its writes are :class:`~specscope.storage._writes.StoreWrites`.
Every database error leaving it is a :class:`~specscope.errors.StoreError` (``storage/_errors.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from specscope.storage import _bulk
from specscope.storage._dialect import DIALECTS
from specscope.storage._engine import Target, checkpoint_sqlite, tidy_sqlite
from specscope.storage._errors import translate
from specscope.storage._guard import DEFAULT_MAX_RESULT_BYTES, DEFAULT_QUERY_TIMEOUT_S
from specscope.storage._time_limit import bounded
from specscope.storage._writes import StoreWrites, file_id
from specscope.storage.queries import Query, fetch
from specscope.storage.user_query import QueryResult, run_query

__all__ = ["QueryResult", "Store"]


class Store(StoreWrites):
    """An open trace store (SQLite file or PostgreSQL database); safe to share between threads.

    Attributes:
        url: where it lives, for messages (a path, or the URL without its password).
        dialect: ``"sqlite"`` or ``"postgresql"``.
        read_only: opened with ``read_only=True``; writes raise ReadOnlyViolation.
        schema_version: the store's schema version (``schema.SCHEMA_VERSION`` once opened).
    """

    def __init__(self, target: Target, write_engine: Engine | None, read_engine: Engine,
                 schema_version: int, bulk: str | None = None,
                 tracer: Callable[[str, Any, float], None] | None = None, *, tidy: bool = False) -> None:
        self.url = target.display
        self.dialect = target.dialect
        self.read_only = write_engine is None
        self.schema_version = schema_version
        self._write_engine = write_engine
        self._read_engine = read_engine
        self._dialect = DIALECTS[self.dialect]
        self._bulk_insert = _bulk.bulk_strategy(self.dialect, bulk)
        self._trace_query = tracer if self._dialect.traces_user_queries else None
        self._sqlite_path = target.sqlite_path
        self._file_id = file_id(target.sqlite_path) if target.sqlite_path is not None else None
        self._target = target
        self._tidy = tidy  # read-only on a clean SQLite file: remove the -wal / -shm its reads created

    @functools.cached_property
    def location(self) -> str:
        """A SQLite file's device and inode (links and relative parts alike), else the PostgreSQL server
        (port and start time), database and schema, however the URL names the host. Read on first use,
        so opening a PostgreSQL store costs no query for it."""
        return _location(self._target, self._file_id, self._read_engine)

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({self.url!r}, {self.dialect}, {mode}, schema v{self.schema_version})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection. A SQLite writer first checkpoints its WAL into the file
        (``_engine.checkpoint_sqlite``: SQLite does so only when the last connection closes, and a
        reader may still be open); a read-only store opened on a clean file leaves it clean
        (``_engine.tidy_sqlite``)."""
        if self._write_engine is not None and self._sqlite_path is not None \
                and file_id(self._sqlite_path) == self._file_id:  # not into a file replaced meanwhile
            checkpoint_sqlite(self._write_engine)
        for engine in (self._write_engine, self._read_engine):
            if engine is not None:
                engine.dispose()
        if self._tidy:
            tidy_sqlite(self._sqlite_path)

    def after_fork(self) -> None:
        """In a forked child: forget the parent's pooled connections without closing them (SQLAlchemy
        ``Engine.dispose(close=False)``); the child opens its own on next use."""
        for engine in (self._write_engine, self._read_engine):
            if engine is not None:
                engine.dispose(close=False)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A read-only SQLAlchemy connection (the database refuses writes) under the thread's
        :func:`~specscope.storage.read_time_limit`; errors become StoreError."""
        with translate("reading", self.url), self._read_engine.connect() as conn, \
                bounded(conn, self.dialect, self.url):
            yield conn

    def fetch(self, query: Query, **params: Any) -> list[dict[str, Any]]:
        """Rows of one named query of :mod:`specscope.storage.queries` as dicts, read-only.

        Raises:
            ValueError: ``params`` do not name exactly the query's parameters.
            StoreError: the database refused the query.
        """
        with self.connect() as conn:
            return fetch(conn, query, **params)

    def query(self, sql: str, params: Mapping[str, Any] | None = None, limit: int | None = None, *,
              timeout_s: float | None = DEFAULT_QUERY_TIMEOUT_S,
              max_bytes: int | None = DEFAULT_MAX_RESULT_BYTES) -> QueryResult:
        """Run ONE user SQL statement read-only, once; ``(column names, rows)``.

        ``params`` fill ``:param`` placeholders (else the SQL is sent as written). ``timeout_s``
        (seconds, None = no limit) bounds it, fetch included; ``limit`` (rows) and ``max_bytes`` (text
        as UTF-8) cap what is returned, named by the result's ``truncated``. What a statement may do
        and how it is bounded: :mod:`specscope.storage.user_query`.

        Raises:
            ReadOnlyViolation: the statement tried to write, reach outside the store or call a
                function that is not a read-only built-in; nothing changed.
            StoreError: the database rejected the SQL, a bad argument, SQL that is not one statement
                of UTF-8 text within bounds, a value over ``max_bytes``, or the time limit expired.
        """
        return run_query(self._read_engine, self.dialect, self.url, sql, params, limit, timeout_s,
                         max_bytes, self._trace_query)


_PG_IDENTITY = sa.text("SELECT current_setting('port'), pg_postmaster_start_time(), current_database(), "
                       "current_schema()")


def _location(target: Target, file_id: tuple[int, int] | None, engine: Engine) -> str:
    if target.sqlite_path is not None:
        return f"sqlite:{file_id[0]}:{file_id[1]}" if file_id else str(target.sqlite_path.resolve())
    try:
        with engine.connect() as conn:
            port, started, database, schema_name = conn.execute(_PG_IDENTITY).one()
        return f"postgresql:{port}:{started.isoformat()}:{database}:{schema_name}"
    except sa.exc.SQLAlchemyError:  # the URL then: a store that cannot be read fails its first query anyway
        url = target.url.set(password=None, port=target.url.port or 5432, host=(target.url.host or "").lower())
        return url.render_as_string(hide_password=False)
