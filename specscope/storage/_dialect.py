"""What differs between SQLite and PostgreSQL in the store's own statements, chosen once when a store
opens (:data:`DIALECTS`): how a row is upserted and a plain insert compiled, and the locks PostgreSQL
needs where SQLite's serial write transactions need none."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Connection

from specscope.errors import StoreError
from specscope.storage import _steps, schema
from specscope.storage._rows import INSERT_COLUMNS, Insert, write_statements

PG_MIGRATION_LOCK = 0x5EC5C09E  # pg_advisory_xact_lock key: one process migrates at a time
_PG_RUN_LOCK = sa.text("SELECT pg_advisory_xact_lock(hashtext(:run_id))")


def _no_lock(*_: object) -> None:
    """SQLite: write transactions are serial already (BEGIN IMMEDIATE)."""


def _lock_runs(conn: Connection, run_ids: list[str]) -> None:
    # Two ranks' run-end verdicts may replace one run's findings at once: at READ COMMITTED the second
    # DELETE would not see the first's new rows and both sets would stay.
    for run_id in sorted(set(run_ids)):
        conn.execute(_PG_RUN_LOCK, {"run_id": run_id})


def _lock_migration(display: str, conn: Connection, lock_timeout_s: float) -> None:
    """Take the migration lock, waiting at most ``lock_timeout_s``: any session can hold an advisory
    lock of the same key, and a writer must not wait on it forever (undone with the transaction)."""
    import psycopg

    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(lock_timeout_s * 1000))}")
    try:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(PG_MIGRATION_LOCK)))
    except sa.exc.OperationalError as exc:
        if not isinstance(exc.orig, psycopg.errors.LockNotAvailable):
            raise
        raise StoreError(f"opening {display}: another session has held the store's migration lock "
                         f"(pg_advisory_xact_lock {PG_MIGRATION_LOCK}) for over {lock_timeout_s:g} s; "
                         "find it in pg_locks (locktype 'advisory')") from exc
    conn.exec_driver_sql("SET LOCAL lock_timeout = DEFAULT")


@dataclass(frozen=True)
class Dialect:
    """One database's ways. ``traces_user_queries``: user SQL streams through a raw driver cursor the
    engine's statement events do not see, so the store calls its tracer itself (PostgreSQL)."""

    name: str
    insert: Insert
    compiler: sa.engine.Dialect  # compiles the driver-level plain inserts (psycopg's paramstyle takes tuples)
    lock_runs: Callable[[Connection, list[str]], None]  # while a run's findings are replaced
    lock_migration: Callable[[str, Connection, float], None]
    traces_user_queries: bool

    @functools.cached_property
    def statements(self) -> dict[str, sa.Executable]:
        """The upserts and updates, by statement name."""
        return write_statements(self.insert)

    @functools.cached_property
    def inserts(self) -> dict[str, str]:
        """The plain inserts, positional parameters in ``INSERT_COLUMNS`` order."""
        return {name: str(schema.metadata.tables[name].insert().compile(
                    dialect=self.compiler, column_keys=list(columns), for_executemany=True))
                for name, columns in INSERT_COLUMNS.items()}

    @functools.cache  # noqa: B019 - a few statements per dialect, and DIALECTS lives as long as the process
    def driver_upsert(self, name: str, columns: tuple[str, ...]) -> tuple[str, Callable[[dict], tuple]]:
        """The upsert ``name`` (a summary's) for rows of ``columns``, compiled once to positional driver
        SQL, and the getter of a row's values in parameter order: run with ``exec_driver_sql``, which
        skips what ``execute`` does per call (the statement's cache key, per-row parameter processing)
        and still fires the statement events (the tracer sees it)."""
        compiled = self.statements[name].compile(dialect=self.compiler, column_keys=list(columns))
        return str(compiled), itemgetter(*compiled.positiontup)

    @functools.cache  # noqa: B019 - as driver_upsert: a few sizes (_steps.PROBE_SIZES) per dialect
    def step_probe(self, spans: int) -> str:
        """``_steps.probe(spans)`` with positional parameters: the write path's probe for verify steps
        stored again."""
        return str(_steps.probe(spans).compile(dialect=self.compiler))


DIALECTS = {
    "sqlite": Dialect("sqlite", sqlite.insert, SQLiteDialect_pysqlite(), _no_lock, _no_lock, False),
    "postgresql": Dialect("postgresql", postgresql.insert, PGDialect_psycopg(paramstyle="format"), _lock_runs,
                          _lock_migration, True),
}


def insert_statements(dialect: str) -> dict[str, str]:
    """Driver-level INSERT of each plain-insert table, positional parameters in ``INSERT_COLUMNS`` order."""
    return dict(DIALECTS[dialect].inserts)
