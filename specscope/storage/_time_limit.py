"""A time limit on specscope's own reads: :func:`read_time_limit` bounds every ``Store.connect()``
the calling thread opens inside it, the doctor's included, so a reader that must answer (the
exporter's scrape) never hangs on a store whose views were replaced by a slow or endless one.

SQLite: a progress handler interrupts a statement past the deadline; PostgreSQL:
``SET LOCAL statement_timeout`` to the time left (undone when the connection's transaction ends).
Either way the statement fails as a StoreError.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection

from specscope.errors import StoreError

_PROGRESS_STEPS = 1_000  # SQLite virtual-machine steps between two looks at the clock
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("specscope_read_deadline", default=None)


@contextmanager
def read_time_limit(timeout_s: float) -> Iterator[None]:
    """Inside the block, this thread's store reads stop ``timeout_s`` seconds after it began."""
    token = _DEADLINE.set(time.monotonic() + timeout_s)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def bounded(conn: Connection, dialect: str, url: str) -> Iterator[None]:
    """Apply the current :func:`read_time_limit` (if any) to ``conn`` for the block."""
    deadline = _DEADLINE.get()
    if deadline is None:
        yield
        return
    left_s = deadline - time.monotonic()
    if left_s <= 0:
        raise StoreError(f"reading {url}: the time limit expired")
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(left_s * 1000))}")
        yield
        return
    raw = conn.connection.dbapi_connection
    raw.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
    try:
        yield
    finally:
        raw.set_progress_handler(None, 0)
