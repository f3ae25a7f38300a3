"""SQLAlchemy engines behind a Store: one that writes, one whose connections cannot write.

SQLite (a bare path or ``sqlite:///path``): WAL journal (readers never block the writer, and a batch is
durable once its transaction commits, even if the writer process is killed; https://sqlite.org/wal.html),
``synchronous=NORMAL`` (safe with WAL against process crashes), a busy timeout, and explicit
``BEGIN IMMEDIATE`` for write transactions (the recipe of the SQLAlchemy SQLite dialect docs,
"Serializable isolation / Savepoints / Transactional DDL"): the writer takes the lock up front instead
of failing with SQLITE_BUSY when upgrading a read lock. Read connections open the file with
``mode=ro`` and ``PRAGMA query_only``, so the database itself refuses writes.

PostgreSQL (``postgresql+psycopg://...``): read connections run ``SET SESSION CHARACTERISTICS AS
TRANSACTION READ ONLY`` when they connect and begin every transaction ``READ ONLY``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from specscope.errors import StoreError

DEFAULT_BUSY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Target:
    """Where a store lives: a SQLite file (``sqlite_path``) or a PostgreSQL URL (``url``)."""

    display: str  # for messages: the path, or the URL without its password
    sqlite_path: Path | None = None
    url: sa.URL | None = None

    @property
    def dialect(self) -> str:
        return "sqlite" if self.sqlite_path is not None else "postgresql"


def parse_target(url_or_path: str) -> Target:
    """A bare path means a SQLite file; otherwise a SQLAlchemy URL of SQLite or PostgreSQL (psycopg 3).

    Raises:
        StoreError: malformed URL, in-memory SQLite (the collector thread and readers need a file),
            or a database/driver other than SQLite and PostgreSQL through psycopg.
    """
    if "://" not in url_or_path:
        return Target(display=url_or_path, sqlite_path=_expand_home(url_or_path))
    try:
        url = sa.make_url(url_or_path)
    except (sa.exc.ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise StoreError(f"not a database URL: {url_or_path!r} ({exc})") from exc
    backend = url.get_backend_name()  # the driver name loads the dialect: unknown schemes raise there
    if backend == "sqlite":
        if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
            raise StoreError("in-memory SQLite cannot hold a store (the collector writes from its own "
                             "thread): give a file path")
        return Target(display=url.database, sqlite_path=_expand_home(url.database))
    if backend == "postgresql":
        if "+" not in url.drivername:  # no driver named: psycopg 3, not SQLAlchemy's default psycopg2
            url = url.set(drivername="postgresql+psycopg")
        elif (driver := url.get_driver_name()) != "psycopg":
            raise StoreError(f"PostgreSQL stores need the psycopg (3) driver, not {driver}: "
                             "use postgresql+psycopg://...")
        return Target(display=url.render_as_string(hide_password=True), url=url)
    raise StoreError(f"unsupported database {backend!r} in {url_or_path!r}: use a SQLite path or "
                     "postgresql+psycopg://...")


def _expand_home(path: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded. Raises StoreError for a user without a home."""
    try:
        return Path(path).expanduser()
    except RuntimeError as exc:  # pathlib's "Could not determine home directory."
        raise StoreError(f"cannot expand {path.split('/')[0]!r} in {path}: no such user's home directory") from exc


def create_engine(target: Target, *, read_only: bool, busy_timeout_s: float) -> Engine:
    """An engine for ``target`` whose connections write, or (``read_only``) cannot write."""
    if target.sqlite_path is not None:
        return _sqlite_engine(target.sqlite_path, read_only=read_only, busy_timeout_s=busy_timeout_s)
    return _postgres_engine(target.url, read_only=read_only)


def _sqlite_engine(path: Path, *, read_only: bool, busy_timeout_s: float) -> Engine:
    def connect() -> sqlite3.Connection:
        # isolation_level=None: the driver leaves transactions to us (BEGIN below), so DDL is
        # transactional and writes take the lock at BEGIN.
        if read_only:
            return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_s,
                                   check_same_thread=False, isolation_level=None)
        return sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False,
                               isolation_level=None)

    engine = sa.create_engine("sqlite://", creator=connect, poolclass=sa.pool.QueuePool)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:
        if read_only:
            dbapi_connection.execute("PRAGMA query_only = ON")
        else:
            _set_wal(dbapi_connection, busy_timeout_s)
            dbapi_connection.execute("PRAGMA synchronous = NORMAL")

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def _set_wal(connection: sqlite3.Connection, busy_timeout_s: float) -> None:
    """``PRAGMA journal_mode = WAL``, retried until ``busy_timeout_s``: while another connection
    creates the file (concurrent first opens), the switch can fail with "database is locked" at once,
    without SQLite waiting out the busy timeout as it does for ordinary locks (seen under load)."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def sqlite_side_files(path: Path) -> tuple[Path, Path]:
    """The ``-wal`` and ``-shm`` files SQLite keeps beside a WAL database while a connection has it open."""
    return path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")


def sqlite_untouched(path: Path) -> bool:
    """No ``-wal`` nor ``-shm`` beside ``path``: the last connection to it closed, it is clean."""
    return not any(side.exists() for side in sqlite_side_files(path))


def tidy_sqlite(path: Path) -> None:
    """Remove the ``-wal`` / ``-shm`` files a read-only store's connections created beside a clean file.

    SQLite creates both for any reader of a WAL database, and only a connection that may write
    removes them, when it closes as the last connection to the file (a checkpoint first); a ``mode=ro``
    connection leaves them behind. So one plain connection reads the schema version and closes: SQLite's
    own last-connection check decides, and a store another connection still has open keeps its files.
    Only when the WAL is empty (nothing was written since), so that close writes no page.
    """
    wal, _ = sqlite_side_files(path)
    try:
        if not wal.exists() or wal.stat().st_size:
            return
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        pass  # the files are harmless and the next writer reuses them: tidying must not fail a read


def checkpoint_sqlite(engine: Engine) -> None:
    """Copy the WAL's pages into the SQLite file with a passive checkpoint, which never waits for a
    reader, so that a store whose writers have closed is whole in its one file.

    SQLite checkpoints by itself only when the last connection to the file closes, and a read-only
    one cannot: a writer that closed while the dashboard or the doctor had the store open left its
    last transactions in the ``-wal`` file alone, and a copy of the store file lost them. Best
    effort: a store that cannot be checkpointed now keeps its WAL, which every reader reads.
    """
    try:
        conn = engine.raw_connection()  # the driver's own: SQLAlchemy's would BEGIN, and SQLite refuses
        try:                            # a checkpoint inside a transaction
            conn.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            conn.close()
    except (sa.exc.SQLAlchemyError, sqlite3.Error):
        pass


def _postgres_engine(url: sa.URL, *, read_only: bool) -> Engine:
    connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": 5}
    if not read_only:
        return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    engine = sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args,
                              execution_options={"postgresql_readonly": True})

    @event.listens_for(engine, "connect")
    def _read_only_session(dbapi_connection, _record) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        dbapi_connection.commit()

    return engine


def trace_statements(engine: Engine, tracer: Callable[[str, Any, float], None]) -> None:
    """Call ``tracer(sql, parameters, seconds)`` after each statement ``engine`` executes (timed with
    ``time.perf_counter`` around the DBAPI cursor call, SQLAlchemy's cursor-execute events)."""
    @event.listens_for(engine, "before_cursor_execute")
    def _start(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001 - SQLAlchemy's
        conn.info.setdefault("specscope_started", []).append(time.perf_counter())

    @event.listens_for(engine, "after_cursor_execute")
    def _end(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        started = conn.info["specscope_started"].pop()
        tracer(statement, parameters, time.perf_counter() - started)
