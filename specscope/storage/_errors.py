"""Where SQLAlchemy and driver errors enter specscope: converted to :class:`StoreError` (or a subclass).

Read-only detection follows each driver's own code: SQLite result code ``SQLITE_READONLY`` (8, also in
its extended forms, https://sqlite.org/rescode.html) and PostgreSQL SQLSTATE ``25006``
``read_only_sql_transaction`` (https://www.postgresql.org/docs/current/errcodes-appendix.html).
Refused values (an event the store cannot hold, rather than a store that cannot be written) are the
DB-API ``DataError`` / ``IntegrityError`` of either driver: PostgreSQL SQLSTATE classes 22 and 23,
SQLite ``SQLITE_CONSTRAINT`` / ``SQLITE_MISMATCH`` / ``SQLITE_TOOBIG``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from specscope.errors import EventRejected, ReadOnlyViolation, SpecscopeError, StoreError

_PG_READ_ONLY_SQLSTATE = "25006"

try:  # psycopg is the optional PostgreSQL driver (extra "postgres"); Store.query uses its cursor directly
    from psycopg import DataError as _PgDataError
    from psycopg import Error as _PsycopgError
    from psycopg import IntegrityError as _PgIntegrityError
except ImportError:  # pragma: no cover - PostgreSQL support not installed
    _PsycopgError = _PgDataError = _PgIntegrityError = sqlite3.Error

_VALUE_ERRORS = (sa_exc.DataError, sa_exc.IntegrityError, sqlite3.DataError, sqlite3.IntegrityError,
                 _PgDataError, _PgIntegrityError)

_DATABASE_ERRORS = (sa_exc.SQLAlchemyError, sqlite3.Error, _PsycopgError, OSError)


def driver_message(exc: BaseException) -> str:
    """The database's own message, first line only (SQLAlchemy appends SQL and a help link)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip() or type(orig).__name__
    return text.splitlines()[0]


def is_read_only_error(exc: BaseException) -> bool:
    """True when the database refused a write because the connection or database is read-only."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, sqlite3.Error):
        return (getattr(orig, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_READONLY
    return getattr(orig, "sqlstate", None) == _PG_READ_ONLY_SQLSTATE


def is_value_error(exc: BaseException) -> bool:
    """True when the database refused the values written, not the store (see the module notes)."""
    return isinstance(exc, _VALUE_ERRORS) or isinstance(getattr(exc, "orig", None), _VALUE_ERRORS)


@contextmanager
def translate(action: str, target: str, *, writing: bool = False) -> Iterator[None]:
    """Re-raise database errors from the block as StoreError ``"<action> <target>: <db message>"``.

    Raises:
        ReadOnlyViolation: the database refused a write on a read-only connection.
        EventRejected: (``writing``) the database refused the values written (see
            :func:`is_value_error`).
        StoreError: any other SQLAlchemy, driver or file-system error.
    """
    try:
        yield
    except SpecscopeError:
        raise
    except _DATABASE_ERRORS as exc:
        message = f"{action} {target}: {driver_message(exc)}"
        if is_read_only_error(exc):
            raise ReadOnlyViolation(f"{message} (the connection is read-only)") from exc
        if writing and is_value_error(exc):
            raise EventRejected(message) from exc
        raise StoreError(message) from exc
