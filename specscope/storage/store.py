"""The trace store: events in (one transaction per batch), SQL out (through read-only connections).

Every database error leaving this module is a :class:`~specscope.errors.StoreError` (or a subclass);
see :mod:`specscope.storage._errors`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Connection, Engine

from specscope.errors import EventRejected, ReadOnlyViolation, SchemaVersionError, StoreError
from specscope.events import Event, Finding
from specscope.storage import _bulk, _summaries, migrations, schema
from specscope.storage._engine import (
    DEFAULT_BUSY_TIMEOUT_S,
    Target,
    create_engine,
    parse_target,
    trace_statements,
)
from specscope.storage._errors import translate
from specscope.storage._guard import DEFAULT_MAX_RESULT_BYTES, DEFAULT_QUERY_TIMEOUT_S
from specscope.storage._rows import (
    INSERT_COLUMNS,
    STATEMENTS,
    Counters,
    bad_value,
    counter_rows,
    group_rows,
    summary_rows,
    write_statements,
)
from specscope.storage._time_limit import bounded
from specscope.storage.queries import Query, fetch
from specscope.storage.user_query import QueryResult, run_query

_PG_MIGRATION_LOCK = 0x5EC5C09E  # pg_advisory_xact_lock key: one process migrates at a time
DEFAULT_LOCK_TIMEOUT_S = 120.0  # longest wait for it (seconds; open_store's lock_timeout_s)


class Store:
    """An open trace store (SQLite file or PostgreSQL database). Create it with :func:`open_store`.

    Attributes:
        url: where it lives, for messages (a path, or the URL without its password).
        location: the same store however it was spelt: a SQLite file's device and inode (links, hard
            links and relative parts alike), else the PostgreSQL server (port and start time), database
            and schema, however the URL names the host.
        dialect: ``"sqlite"`` or ``"postgresql"``.
        read_only: opened with ``read_only=True``; :meth:`write` raises ReadOnlyViolation.
        schema_version: the store's schema version (``schema.SCHEMA_VERSION`` once opened).

    Safe to share between threads (SQLAlchemy engines pool their connections).
    """

    def __init__(self, target: Target, write_engine: Engine | None, read_engine: Engine,
                 schema_version: int, bulk: str | None = None,
                 tracer: Callable[[str, Any, float], None] | None = None) -> None:
        self.url = target.display
        self.dialect = target.dialect
        self.read_only = write_engine is None
        self.schema_version = schema_version
        self._write_engine = write_engine
        self._read_engine = read_engine
        self._statements = _write_statements(self.dialect)
        self._inserts = insert_statements(self.dialect)
        self._bulk_insert = _bulk.bulk_strategy(self.dialect, bulk)
        # PostgreSQL user queries stream through a raw psycopg cursor the engine events do not see
        self._trace_query = tracer if self.dialect == "postgresql" else None
        self._sqlite_path = target.sqlite_path
        self._file_id = _file_id(target.sqlite_path) if target.sqlite_path is not None else None
        self._target = target

    @functools.cached_property
    def location(self) -> str:
        """The same store however it was spelt (see the class doc); read from the server on first use
        for PostgreSQL, so opening a store costs no query for it."""
        return _location(self._target, self._file_id, self._read_engine)

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({self.url!r}, {self.dialect}, {mode}, schema v{self.schema_version})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection (SQLite checkpoints its WAL when the last one closes)."""
        for engine in (self._write_engine, self._read_engine):
            if engine is not None:
                engine.dispose()

    def after_fork(self) -> None:
        """In a forked child process: forget the parent's pooled connections without closing them
        (they belong to the parent; SQLAlchemy ``Engine.dispose(close=False)``, "Using Connection
        Pools with Multiprocessing or os.fork()"). The child opens its own on next use."""
        for engine in (self._write_engine, self._read_engine):
            if engine is not None:
                engine.dispose(close=False)

    def write(self, events: Sequence[Event], *, counters: Counters | None = None) -> None:
        """Write ``events`` and add ``counters`` in ONE transaction: all of it is committed, or nothing.

        ``counters`` maps ``(run_id, rank)`` to ``(events_written, events_dropped)`` increments for
        ``run_ranks`` (the collector's own counts; a rank row is created if its RankStart is missing).
        Each event goes where its type's route says (``storage/_rows.py``, ``ROUTES``), summary tables
        included.

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            EventRejected: an object is not an event of :mod:`specscope.events`, or the database
                refused an event's values (too long for its column, out of range, a constraint).
            StoreError: the database refused the transaction (locked, unreachable, full, read-only).
        """
        self._check_writable()
        try:
            grouped = group_rows(events)
            summaries = summary_rows(grouped)
        except (KeyError, AttributeError, TypeError, ValueError, RecursionError) as exc:
            raise EventRejected(f"writing to {self.url}: not a specscope event or a malformed one: "
                                f"{type(exc).__name__}: {exc}") from exc
        if counters:
            rows = counter_rows(counters, time.time())
            if rows:
                grouped["counters"] = rows
        if not grouped:
            return
        try:
            with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
                for statement in STATEMENTS:
                    rows = grouped.get(statement.name)
                    if not rows:
                        continue
                    if statement.columns:
                        self._bulk_insert(conn, statement.name, self._inserts[statement.name], rows)
                    else:
                        conn.execute(self._statements[statement.name], rows)
                for name, rows in summaries.items():  # in the same transaction as the rows they sum up
                    conn.execute(self._statements[name], rows)
        except EventRejected:
            raise
        except (StoreError, UnicodeError, OverflowError, TypeError, ValueError) as exc:
            # A value no database can hold fails in the driver (a lone surrogate, an int past 64
            # bits, a list where a number goes) as something other than a value error: name it,
            # so that the collector sets that event aside instead of losing the batch.
            bad = bad_value(grouped)
            if bad is None and isinstance(exc, StoreError):
                raise
            raise EventRejected(f"writing to {self.url}: {bad or f'{type(exc).__name__}: {exc}'}") from exc

    def _check_writable(self) -> None:
        """Raise ReadOnlyViolation on a read-only store, and (SQLite) StoreError when the store's file
        was deleted or replaced since it was opened: the open connections would go on writing to the
        deleted file, every write reporting success and every event lost."""
        if self._write_engine is None:
            raise ReadOnlyViolation(f"store {self.url} was opened read-only")
        if self._sqlite_path is not None and _file_id(self._sqlite_path) != self._file_id:
            raise StoreError(f"writing to {self.url}: the store file was deleted or replaced while open; "
                             "nothing more is written to it (open the store again to start a new one)")

    def touch(self, ranks: Sequence[tuple[str, int]]) -> None:
        """Set ``last_seen_wall`` of these ``(run_id, rank)`` rows of ``run_ranks`` (those that exist)
        to now: the collector's heartbeat for a live rank with nothing to write, so the run does not
        read 'lost' (:data:`specscope.storage.views.LOST_AFTER_S`).

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            StoreError: as :meth:`write`.
        """
        self._check_writable()
        if not ranks:
            return
        table = schema.run_ranks
        statement = (sa.update(table).where(table.c.run_id == sa.bindparam("b_run_id"),
                                            table.c.rank == sa.bindparam("b_rank"))
                     .values(last_seen_wall=sa.bindparam("b_wall")))
        wall = time.time()
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            conn.execute(statement, [{"b_run_id": run_id, "b_rank": rank, "b_wall": wall}
                                     for run_id, rank in ranks])

    def end_open_ranks(self, run_id: str) -> list[int]:
        """End the ranks of ``run_id`` that have not ended (``ended_wall`` now) and return them: for a
        process that outlives the engine processes it stopped (vLLM's API server SIGKILLs its
        EngineCore and workers at shutdown, before they can write their end).

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            StoreError: as :meth:`write`.
        """
        self._check_writable()
        table = schema.run_ranks
        open_ranks = sa.and_(table.c.run_id == run_id, table.c.ended_wall.is_(None))
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            ranks = [row.rank for row in conn.execute(sa.select(table.c.rank).where(open_ranks))]
            conn.execute(sa.update(table).where(open_ranks).values(ended_wall=time.time()))
        return sorted(ranks)

    def replace_findings(self, source: str, run_ids: Sequence[str], findings: Sequence[Finding]) -> None:
        """Delete the ``source`` findings (``"doctor"`` / ``"inspect"``) of ``run_ids`` and write
        ``findings`` in ONE transaction, so a reader sees the old set or the new one, never a mix.

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            StoreError: as :meth:`write`.
        """
        self._check_writable()
        try:
            if any(f.kind != "finding" for f in findings):
                raise TypeError("only Finding events can replace findings")
            rows = group_rows(findings).get("findings", [])
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise StoreError(f"writing to {self.url}: not a specscope finding or a malformed one: "
                             f"{type(exc).__name__}: {exc}") from exc
        table = schema.findings
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            if self.dialect == "postgresql":
                # Two ranks' run-end verdicts replace one run's findings at once: at READ COMMITTED the
                # second DELETE would not see the first's new rows and both sets would stay. SQLite's
                # write transactions are serial already.
                for run_id in sorted(set(run_ids)):
                    conn.execute(_PG_RUN_LOCK, {"run_id": run_id})
            if run_ids:
                conn.execute(table.delete().where(table.c.source == source,
                                                  table.c.run_id.in_(list(run_ids))))
            if rows:
                conn.exec_driver_sql(self._inserts["findings"], rows)

    def rebuild_summaries(self) -> None:
        """Recompute the summary tables (``acceptance_masks``, ``tensor_shapes``) from every stored
        verify step and tensor event, in one transaction. Only needed after rows were loaded around
        :meth:`write` (raw SQL, a restored dump): :meth:`write` keeps them current itself.

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            StoreError: the database refused the transaction.
        """
        self._check_writable()
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            _summaries.rebuild(conn)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A read-only SQLAlchemy connection (the database refuses writes); errors become StoreError.

        Use it for the dashboard's and the doctor's own queries over the views.
        """
        with translate("reading", self.url), self._read_engine.connect() as conn, \
                bounded(conn, self.dialect, self.url):  # storage.read_time_limit
            yield conn

    def fetch(self, query: Query, **params: Any) -> list[dict[str, Any]]:
        """Rows of one named query of :mod:`specscope.storage.queries` as dicts (numbers as int /
        float on both databases), on a read-only connection.

        Raises:
            ValueError: ``params`` do not name exactly the query's parameters.
            StoreError: the database refused the query.
        """
        with self.connect() as conn:
            return fetch(conn, query, **params)

    def query(self, sql: str, params: Mapping[str, Any] | None = None, limit: int | None = None, *,
              timeout_s: float | None = DEFAULT_QUERY_TIMEOUT_S,
              max_bytes: int | None = DEFAULT_MAX_RESULT_BYTES) -> QueryResult:
        """Run ONE user SQL statement on a read-only connection, once; return ``(column names, rows)``.

        Without ``params`` the SQL is sent as written; with ``params`` it may name ``:param``
        placeholders (SQLAlchemy ``text()``). What the statement may do, and how it is bounded:
        :mod:`specscope.storage.user_query`. ``timeout_s`` (seconds, None = no limit; default 2 s, at
        most a day) bounds the statement, fetch included; ``limit`` (rows) and ``max_bytes`` (text as
        UTF-8; default 64 MiB) cap what is returned, and the result's ``truncated`` then names the cap;
        a single value larger than ``max_bytes`` stops the statement. A statement that returns no
        rows gives ``([], [])`` (SQLite only: on PostgreSQL such a statement is refused).

        Raises:
            ReadOnlyViolation: the statement tried to write, to reach outside the store or to call a
                function that is not a read-only built-in; nothing changed and no file was created.
            StoreError: the database rejected the SQL (its message), an argument of the wrong type or
                range, SQL that is empty, not one statement, not UTF-8 text or too large, a value over
                ``max_bytes``, a call over its budget, or the time limit expired.
        """
        return run_query(self._read_engine, self.dialect, self.url, sql, params, limit, timeout_s,
                         max_bytes, self._trace_query)


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``; None when it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def insert_statements(dialect: str) -> dict[str, str]:
    """Driver-level INSERT of each plain-insert table, positional parameters in ``INSERT_COLUMNS``
    order (compiled by SQLAlchemy from schema.py; psycopg's ``format`` paramstyle takes tuples)."""
    compiler_dialect = (PGDialect_psycopg(paramstyle="format") if dialect == "postgresql"
                        else SQLiteDialect_pysqlite())
    return {name: str(schema.metadata.tables[name].insert().compile(
                dialect=compiler_dialect, column_keys=list(columns), for_executemany=True))
            for name, columns in INSERT_COLUMNS.items()}


def _write_statements(dialect: str) -> dict[str, sa.Executable]:
    """The statements of :func:`specscope.storage._rows.write_statements` for ``dialect`` (INSERT ... ON
    CONFLICT has the same API in SQLAlchemy's sqlite and postgresql dialects)."""
    return write_statements(postgresql.insert if dialect == "postgresql" else sqlite.insert)


def open_store(url_or_path: str, *, create: bool = True, read_only: bool = False,
               busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
               bulk: str | None = None,
               tracer: Callable[[str, Any, float], None] | None = None) -> Store:
    """Open (and by default create) a trace store, applying pending schema migrations.

    Args:
        url_or_path: a SQLite file path, or a SQLAlchemy URL (``sqlite:///path``,
            ``postgresql+psycopg://user@host:5432/db``; ``postgresql://`` means psycopg 3).
        create: create the store (and the SQLite file's parent directories) when missing.
        read_only: every connection refuses writes; never creates nor upgrades (implies no create).
        busy_timeout_s: how long a SQLite writer waits for another writer's lock (seconds).
        lock_timeout_s: how long opening a PostgreSQL store waits for the migration lock (seconds;
            then StoreError): another process may be upgrading a large store (filling the summary
            tables takes about 30 s for 1M verify steps), or any session may hold the lock's key.
        bulk: how plain inserts reach the database (``storage/_bulk.py``): ``"copy"`` (PostgreSQL
            COPY, the default there) or ``"executemany"`` (the default on SQLite).
        tracer: called as ``tracer(sql, parameters, seconds)`` after every statement the store runs
            (reads and writes, not PostgreSQL COPY loads; the sqlite-utils ``tracer=`` idea), to
            explain a slow page: e.g.
            ``open_store(url, tracer=lambda sql, params, s: print(f"{s * 1000:.1f} ms  {sql}"))``.

    Raises:
        ConfigError: an unknown ``bulk`` strategy, or ``"copy"`` on SQLite.
        SchemaVersionError: the store's schema version is newer than ``schema.SCHEMA_VERSION``.
        StoreError: no store there (``create=False`` or ``read_only``), not a specscope store (a
            database holding other tables, a file that is not SQLite), an older store opened
            read-only, or the database is unreachable / unwritable / locked.
    """
    target = parse_target(url_or_path)
    _bulk.bulk_strategy(target.dialect, bulk)  # refuse a bad strategy before touching the database
    create = create and not read_only
    if target.sqlite_path is not None:
        _check_sqlite_path(target, create)
    read_engine = create_engine(target, read_only=True, busy_timeout_s=busy_timeout_s)
    write_engine = None if read_only else create_engine(target, read_only=False,
                                                        busy_timeout_s=busy_timeout_s)
    if tracer is not None:
        for engine in (read_engine, write_engine):
            if engine is not None:
                trace_statements(engine, tracer)
    try:
        with translate("opening", target.display):
            version = (_check_read_only(target, read_engine) if write_engine is None
                       else _prepare(target, write_engine, create, lock_timeout_s))
    except BaseException:
        for engine in (read_engine, write_engine):
            if engine is not None:
                engine.dispose()
        raise
    return Store(target, write_engine, read_engine, version, bulk, tracer)


def store_file(url_or_path: str) -> Path | None:
    """The SQLite file a store location names (a path or ``sqlite:///`` URL); None for PostgreSQL.

    Raises:
        StoreError: as :func:`open_store` for a location that is not a store URL or path.
    """
    return parse_target(url_or_path).sqlite_path


def _check_sqlite_path(target: Target, create: bool) -> None:
    path = target.sqlite_path
    with translate("opening", target.display):  # a name too long, a folder without permission
        is_dir, exists = path.is_dir(), path.exists()
    if is_dir:
        raise StoreError(f"{target.display} is a directory, not a specscope store")
    if exists:
        return
    if not create:
        raise StoreError(f"no specscope store at {target.display}")
    with translate("creating", target.display):
        path.parent.mkdir(parents=True, exist_ok=True)


def _check_read_only(target: Target, engine: Engine) -> int:
    with engine.connect() as conn:
        state = migrations.inspect_state(conn)
    _validate(target, state, create=False)
    if state.version < schema.SCHEMA_VERSION or state.missing_views:
        raise StoreError(f"store {target.display} has schema version {state.version} (current is "
                         f"{schema.SCHEMA_VERSION}); open it once writable to upgrade it")
    return state.version


def _migration_lock(target: Target, conn: Connection, lock_timeout_s: float) -> None:
    """Take the PostgreSQL migration lock, waiting at most ``lock_timeout_s``: any session can take
    an advisory lock of the same key (a reader's own tool, another program), and a writer must not
    wait on it forever (``SET LOCAL lock_timeout``, undone with the transaction)."""
    import psycopg

    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(lock_timeout_s * 1000))}")
    try:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
    except sa.exc.OperationalError as exc:
        if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
            raise
        raise StoreError(f"opening {target.display}: another session has held the store's migration lock "
                         f"(pg_advisory_xact_lock {_PG_MIGRATION_LOCK}) for over {lock_timeout_s:g} s; "
                         "find it in pg_locks (locktype 'advisory')") from exc
    conn.exec_driver_sql("SET LOCAL lock_timeout = DEFAULT")


def _prepare(target: Target, engine: Engine, create: bool, lock_timeout_s: float) -> int:
    """Validate the store and bring it to SCHEMA_VERSION in one locked transaction."""
    with engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, so concurrent openers queue here
        if target.dialect == "postgresql":
            _migration_lock(target, conn, lock_timeout_s)
        state = migrations.inspect_state(conn)
        _validate(target, state, create)
        if state.version < schema.SCHEMA_VERSION:
            migrations.upgrade(conn, state.version)
        elif state.missing_views:
            migrations.refresh_views(conn)
    return schema.SCHEMA_VERSION


def _validate(target: Target, state: migrations.StoreState, create: bool) -> None:
    if state.version is None:
        shown = ", ".join(state.tables[:5]) + (", ..." if len(state.tables) > 5 else "")
        raise StoreError(f"{target.display} is not a specscope store: it holds other tables ({shown}) "
                         "and no schema_migrations; use a new file, database or schema")
    if state.version > schema.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"store {target.display} has schema version {state.version}, newer than version "
            f"{schema.SCHEMA_VERSION} of this specscope; upgrade specscope to read it")
    if state.version == 0 and not create:
        raise StoreError(f"no specscope store at {target.display} (the database is empty)")


_PG_RUN_LOCK = sa.text("SELECT pg_advisory_xact_lock(hashtext(:run_id))")
"""Held to the end of the transaction that replaces a run's findings (:meth:`Store.replace_findings`)."""

_PG_IDENTITY = sa.text("SELECT current_setting('port'), pg_postmaster_start_time(), current_database(), "
                       "current_schema()")
"""One PostgreSQL store however its URL names the host (localhost, 127.0.0.1, a DNS name): the server
by its port and start time, the database and the schema the store's tables live in."""


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
