"""A time limit on specscope's own reads: :func:`read_time_limit` bounds every ``Store.connect()``
the calling thread opens inside it, the doctor's included, so a reader that must answer (the
exporter's scrape) never hangs on a store whose views were replaced by a slow or endless one.

SQLite: :class:`SqliteDeadline` interrupts a statement past the deadline; PostgreSQL:
``SET LOCAL statement_timeout`` to the time left (undone when the connection's transaction ends).
Either way the statement fails as a StoreError.
"""

from __future__ import annotations

import contextvars
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection

from specscope.errors import StoreError

_REPEAT_S = 0.001  # past the deadline, the interrupt is sent again this often until the statement ends
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
    interrupter = SqliteDeadline(conn.connection.dbapi_connection, left_s)
    try:
        yield
    finally:
        interrupter.stop()


class SqliteDeadline:
    """Interrupts whatever statement ``connection`` runs once ``seconds`` have passed, until
    :meth:`stop`: ``sqlite3_interrupt`` from a thread of its own (https://sqlite.org/c3ref/interrupt.html),
    again every :data:`_REPEAT_S` past the deadline, since an interrupt with no statement running is
    lost. SQLite looks at it wherever it would call a progress handler and also inside the loops that
    call none (``count(*)`` counting a table's pages, a sort); the statement then fails with
    "interrupted", and ``fired`` says the deadline did it."""

    def __init__(self, connection: sqlite3.Connection, seconds: float) -> None:
        self.fired = False
        self._connection = connection
        self._lock = threading.Lock()
        self._stopped = False
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(seconds,), name="specscope-sqlite-deadline", daemon=True).start()

    def stop(self) -> None:
        """No interrupt after this returns: the connection goes back to the pool for other SQL."""
        with self._lock:
            self._stopped = True
        self._stop.set()

    def _run(self, seconds: float) -> None:
        wait = seconds
        while not self._stop.wait(wait):
            with self._lock:
                if self._stopped:
                    return
                self.fired = True
                self._connection.interrupt()
            wait = _REPEAT_S
