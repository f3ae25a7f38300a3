"""Opening a store: where it lives, checking it is a specscope store, and bringing its schema up to
date under a lock, before :class:`~specscope.storage.Store` is handed out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from specscope.errors import SchemaVersionError, StoreError
from specscope.storage import _bulk, migrations, schema
from specscope.storage._dialect import DIALECTS
from specscope.storage._engine import (
    DEFAULT_BUSY_TIMEOUT_S,
    Target,
    create_engine,
    parse_target,
    sqlite_untouched,
    tidy_sqlite,
    trace_statements,
)
from specscope.storage._errors import translate
from specscope.storage.store import Store

DEFAULT_LOCK_TIMEOUT_S = 120.0  # longest wait for PostgreSQL's migration lock (seconds)


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
            then StoreError): another process may be upgrading a large store.
        bulk: how plain inserts reach the database (``storage/_bulk.py``): ``"copy"`` (PostgreSQL
            COPY, the default there) or ``"executemany"`` (the default on SQLite).
        tracer: called as ``tracer(sql, parameters, seconds)`` after every statement the store runs
            (not PostgreSQL COPY loads), e.g.
            ``open_store(url, tracer=lambda sql, params, s: print(f"{s * 1000:.1f} ms  {sql}"))``.

    Raises:
        ConfigError: an unknown ``bulk`` strategy, or ``"copy"`` on SQLite.
        SchemaVersionError: the store's schema version is newer than ``schema.SCHEMA_VERSION``.
        StoreError: no store there (``create=False`` or ``read_only``), not a specscope store, an
            older store opened read-only, or the database is unreachable / unwritable / locked.
    """
    target = parse_target(url_or_path)
    _bulk.bulk_strategy(target.dialect, bulk)  # refuse a bad strategy before touching the database
    create = create and not read_only
    if target.sqlite_path is not None:
        _check_sqlite_path(target, create)
    # a read-only store on a clean SQLite file leaves it clean when it closes (SQLite would not)
    tidy = read_only and target.sqlite_path is not None and sqlite_untouched(target.sqlite_path)
    read_engine = create_engine(target, read_only=True, busy_timeout_s=busy_timeout_s)
    write_engine = None if read_only else create_engine(target, read_only=False,
                                                        busy_timeout_s=busy_timeout_s)
    if tracer is not None:
        for engine in (read_engine, write_engine):
            if engine is not None:
                trace_statements(engine, tracer)
    try:
        with translate("opening", target.display):
            if write_engine is None:
                version = _check_read_only(target, read_engine)
            else:
                if target.sqlite_path is not None and target.sqlite_path.exists():
                    # before the first writable connection, which switches the file to WAL: a file
                    # that is not a store is refused as it was found
                    _inspect(target, read_engine, create)
                version = _prepare(target, write_engine, create, lock_timeout_s)
    except BaseException:
        for engine in (read_engine, write_engine):
            if engine is not None:
                engine.dispose()
        if tidy:
            tidy_sqlite(target.sqlite_path)
        raise
    return Store(target, write_engine, read_engine, version, bulk, tracer, tidy=tidy)


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


def _inspect(target: Target, engine: Engine, create: bool) -> migrations.StoreState:
    """The store's state, read through ``engine``; raises as :func:`_validate`."""
    with engine.connect() as conn:
        state = migrations.inspect_state(conn)
    _validate(target, state, create)
    return state


def _check_read_only(target: Target, engine: Engine) -> int:
    state = _inspect(target, engine, create=False)
    if state.version < schema.SCHEMA_VERSION or state.missing_views:
        raise StoreError(f"store {target.display} has schema version {state.version} (current is "
                         f"{schema.SCHEMA_VERSION}); open it once writable to upgrade it")
    return state.version


def _prepare(target: Target, engine: Engine, create: bool, lock_timeout_s: float) -> int:
    """Validate the store and bring it to SCHEMA_VERSION in one locked transaction."""
    with engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, so concurrent openers queue here
        DIALECTS[target.dialect].lock_migration(target.display, conn, lock_timeout_s)
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
