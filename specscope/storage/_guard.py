"""What a user's SQL may do (``specscope query``, the dashboard's SQL page, :meth:`Store.query`).

Read-only is enforced by the database on the connection, for every statement class, not by parsing
the SQL:

- SQLite: an authorizer (``sqlite3.Connection.set_authorizer``,
  https://sqlite.org/c3ref/set_authorizer.html) that allows reading tables, calling functions other
  than ``load_extension`` and ``fts3_tokenizer``, recursive CTEs and the schema-reading PRAGMAs of
  :data:`READ_PRAGMAS`, and denies everything else: ATTACH / DETACH (also how ``VACUUM INTO`` opens
  its target file; a ``mode=ro`` connection would still create the file), writes, temp tables,
  transactions, state-changing PRAGMAs. A progress handler (``set_progress_handler``) interrupts a
  statement that runs past its time limit.
- PostgreSQL: the read-only transaction of the read engine plus ``SET LOCAL statement_timeout``.

Results are capped in rows and in bytes (:class:`ResultCap`). Time limit default:
:data:`DEFAULT_QUERY_TIMEOUT_S` (Datasette uses 1 s for the same job; each of the dashboard's own
queries takes under 0.4 s on the 1M-verify-step benchmark store, README "Performance", and a user's
ad-hoc aggregate gets five times that).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DEFAULT_QUERY_TIMEOUT_S = 2.0
DEFAULT_MAX_RESULT_BYTES = 64 * 1024 * 1024
_PROGRESS_STEPS = 10_000  # SQLite VM instructions between two deadline checks (about a millisecond)

READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "collation_list", "function_list", "pragma_list", "module_list",
    "integrity_check", "quick_check", "foreign_key_check",
})
# load_extension runs native code; fts3_tokenizer hands out (and with two arguments takes) raw pointers.
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
# Action codes of https://sqlite.org/c3ref/c_alter_table.html, for the denial message.
_ACTION_NAMES = {
    sqlite3.SQLITE_ATTACH: "ATTACH (or VACUUM INTO)", sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_TRANSACTION: "a transaction statement", sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT",
    sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE", sqlite3.SQLITE_REINDEX: "REINDEX",
    sqlite3.SQLITE_ANALYZE: "ANALYZE", sqlite3.SQLITE_CREATE_VTABLE: "CREATE VIRTUAL TABLE",
    sqlite3.SQLITE_DROP_VTABLE: "DROP VIRTUAL TABLE",
}
_TABLE_WRITES = {sqlite3.SQLITE_INSERT: "INSERT", sqlite3.SQLITE_UPDATE: "UPDATE",
                 sqlite3.SQLITE_DELETE: "DELETE"}
# SQLite authorizes CREATE / DROP as a write on its schema table before the CREATE / DROP action itself
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})


@dataclass
class SqliteGuard:
    """Authorizer and time limit installed on one sqlite3 connection for one user statement.

    ``denied`` names the first action refused (for the error message); ``timed_out`` is True once
    the progress handler interrupted the statement.
    """

    timeout_s: float | None
    denied: str | None = None
    timed_out: bool = False
    _deadline: float = 0.0

    def install(self, connection: sqlite3.Connection) -> None:
        """Start the clock and install the authorizer and, with a time limit, the progress handler."""
        connection.set_authorizer(self._authorize)
        if self.timeout_s is not None:
            self._deadline = time.monotonic() + self.timeout_s
            connection.set_progress_handler(self._progress, _PROGRESS_STEPS)

    @staticmethod
    def remove(connection: sqlite3.Connection) -> None:
        """Take both off (the connection returns to the pool and runs specscope's own SQL next)."""
        connection.set_authorizer(None)
        connection.set_progress_handler(None, 0)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, _db: str | None,
                   _trigger: str | None) -> int:
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and arg2 not in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and arg1 in READ_PRAGMAS:
            return sqlite3.SQLITE_OK
        if self.denied is None:
            if action == sqlite3.SQLITE_PRAGMA:
                self.denied = f"PRAGMA {arg1}"
            elif action == sqlite3.SQLITE_FUNCTION:
                self.denied = f"function {arg2}()"
            elif action in _TABLE_WRITES and arg1 in _SCHEMA_TABLES:
                self.denied = "changing the schema (CREATE / DROP)"
            elif action in _TABLE_WRITES:
                self.denied = f"{_TABLE_WRITES[action]} on {arg1}"
            else:
                self.denied = _ACTION_NAMES.get(action, "creating or dropping objects")
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        if time.monotonic() > self._deadline:
            self.timed_out = True
            return 1  # non-zero: SQLite interrupts the statement
        return 0


def postgres_timeout_sql(timeout_s: float | None) -> str | None:
    """``SET LOCAL statement_timeout`` for the user's transaction (undone by its rollback)."""
    if timeout_s is None:
        return None
    return f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}"


@dataclass
class ResultCap:
    """Fetches rows until ``max_rows`` or ``max_bytes`` (sizes of the values as text, bytes as is);
    ``truncated`` then says which limit cut the result."""

    max_rows: int | None
    max_bytes: int | None
    truncated: str | None = None

    def take(self, rows: Iterable[tuple]) -> list[tuple]:
        """The rows within the caps, as tuples; sets ``truncated`` when a cap stopped the fetch."""
        out: list[tuple] = []
        size = 0
        for row in self._bounded(rows):
            size += sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in row)
            if self.max_bytes is not None and size > self.max_bytes:
                self.truncated = f"{self.max_bytes:,} bytes"
                break
            out.append(tuple(row))
        return out

    def _bounded(self, rows: Iterable[tuple]) -> Iterator[tuple]:
        for index, row in enumerate(rows):
            if self.max_rows is not None and index >= self.max_rows:
                self.truncated = f"{self.max_rows:,} rows"
                return
            yield row
