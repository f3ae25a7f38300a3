"""What a user's SQL may do on SQLite (``specscope query``, the dashboard's SQL page,
:meth:`Store.query`), and the result caps of both databases; PostgreSQL's check: :mod:`._pg_guard`.

Read-only is enforced by the database on the connection, for every statement class: an authorizer
(``sqlite3.Connection.set_authorizer``, https://sqlite.org/c3ref/set_authorizer.html) allows reading
tables, calling functions other than ``load_extension`` and ``fts3_tokenizer``, recursive CTEs and
the schema-reading PRAGMAs of :data:`READ_PRAGMAS`, and denies everything else: ATTACH / DETACH (also
how ``VACUUM INTO`` opens its target file; a ``mode=ro`` connection would still create the file),
writes, temp tables, transactions, state-changing PRAGMAs. ``sqlite3_interrupt`` from a timer
(:class:`~._time_limit.SqliteDeadline`) stops a statement that runs past its time limit.

SQLite looks at the interrupt where its program jumps (between rows, in loops) and in its own long
loops (counting a table, sorting), never inside one function call, so the work of one row is bounded
instead: ``SQLITE_LIMIT_LENGTH`` caps every value while it is computed
(:data:`SQLITE_MAX_VALUE_BYTES`, or the byte cap when smaller), the authorizer refuses a statement
naming more than :data:`MAX_FUNCTION_CALLS` functions, and the built-ins whose time grows faster
than their arguments (``instr``, ``replace``, the trims, ``json_patch``, ``LIKE``, ``GLOB``,
``printf``) are replaced on the connection by checks that refuse an over-budget call and run the
others on SQLite's own built-in (:mod:`._builtins`). One row then costs at most that many calls of
about 12 ms.

Results are capped in rows and in bytes (:class:`ResultCap`). Time limit default:
:data:`DEFAULT_QUERY_TIMEOUT_S` (Datasette uses 1 s for the same job; each of the dashboard's own
queries takes under 0.4 s on the 1M-verify-step benchmark store, docs/performance.md, "Dashboard
pages", and a user's ad-hoc aggregate gets five times that).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from specscope.storage._builtins import Builtins
from specscope.storage._time_limit import SqliteDeadline

DEFAULT_QUERY_TIMEOUT_S = 2.0
MAX_QUERY_TIMEOUT_S = 24 * 3600.0  # PostgreSQL's statement_timeout holds at most 2**31 - 1 ms (24.8 days)
DEFAULT_MAX_RESULT_BYTES = 64 * 1024 * 1024
SQLITE_MAX_VALUE_BYTES = 4 * 2**20  # largest value a SQLite user statement may compute
MAX_FUNCTION_CALLS = 256  # function references one SQLite user statement may hold

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
_MAIN_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})
# Virtual tables that read past the statement: the pooled connection is shared by the dashboard's viewers
_PRIVATE_TABLES = {"sqlite_stmt": "the SQL of other statements prepared on this connection"}


@dataclass
class SqliteGuard:
    """Authorizer and time limit installed on one sqlite3 connection for one user statement.

    ``denied`` names the first action refused (for the error message); ``timed_out`` is True once
    the time limit interrupted the statement; ``builtins`` says which bounded call failed.
    """

    timeout_s: float | None
    max_value_bytes: int | None = None
    denied: str | None = None
    _deadline: SqliteDeadline | None = None
    _length_limit: int | None = None
    builtins: Builtins = field(init=False)
    _functions: int = 0

    def install(self, connection: sqlite3.Connection) -> None:
        """Install the authorizer, the value-length limit and the bounded built-ins, and start the
        clock of the time limit, if any."""
        connection.set_authorizer(self._authorize)
        self.builtins = Builtins(self.value_limit)
        self.builtins.install(connection)
        self._length_limit = connection.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_limit)
        if self.timeout_s is not None:
            self._deadline = SqliteDeadline(connection, self.timeout_s)

    def remove(self, connection: sqlite3.Connection) -> None:
        """Take them off (the connection returns to the pool and runs specscope's own SQL next)."""
        if self._deadline is not None:
            self._deadline.stop()
        connection.set_authorizer(None)
        if self._length_limit is not None:
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self._length_limit)

    @property
    def value_limit(self) -> int:
        """Bytes one value may reach while the statement computes it."""
        if self.max_value_bytes is None:
            return SQLITE_MAX_VALUE_BYTES
        return max(1, min(self.max_value_bytes, SQLITE_MAX_VALUE_BYTES))

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None,
                   _trigger: str | None) -> int:
        if action == sqlite3.SQLITE_READ and (arg1 or "").lower() in _PRIVATE_TABLES:
            if self.denied is None:
                self.denied = f"reading {arg1} ({_PRIVATE_TABLES[arg1.lower()]})"
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and arg2 not in _DENIED_FUNCTIONS:
            self._functions += 1  # one call per reference, authorized as the statement is prepared
            if self._functions <= MAX_FUNCTION_CALLS:
                return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_PRAGMAS:  # as SQLite reads names
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_UPDATE and arg1 in _MAIN_SCHEMA_TABLES and db == "main":
            # A connection's first use of a table-valued function (json_each, pragma_table_info) is
            # authorized as an UPDATE of main's schema table's columns; a statement of the user's that
            # does update it never prepares: SQLite refuses it while writable_schema is off, and that
            # PRAGMA is denied (and the connection is query_only). A table of a crafted file named
            # like a temp schema table gets no such pass.
            return sqlite3.SQLITE_OK
        if self.denied is None:
            if action == sqlite3.SQLITE_PRAGMA:
                self.denied = f"PRAGMA {arg1}"
            elif action == sqlite3.SQLITE_FUNCTION and arg2 not in _DENIED_FUNCTIONS:
                self.denied = f"a statement calling more than {MAX_FUNCTION_CALLS} functions"
            elif action == sqlite3.SQLITE_FUNCTION:
                self.denied = f"function {arg2}()"
            elif action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_DELETE) and arg1 in _SCHEMA_TABLES:
                self.denied = "changing the schema (CREATE / DROP)"
            elif action in _TABLE_WRITES:
                self.denied = f"{_TABLE_WRITES[action]} on {arg1}"
            else:
                self.denied = _ACTION_NAMES.get(action, "creating or dropping objects")
        return sqlite3.SQLITE_DENY

    @property
    def timed_out(self) -> bool:
        return self._deadline is not None and self._deadline.fired


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
            size += row_bytes(row)
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


ROW_OVERHEAD_BYTES = 64
"""What a row counts against the byte cap besides its values: about what its tuple and its place in
the result cost this process, so that a result of many tiny rows (millions of NULLs or empty strings,
which count nothing as text) is bounded by the cap too."""


def row_bytes(row: tuple) -> int:
    """What a row counts against the byte cap: :data:`ROW_OVERHEAD_BYTES`, 8 per value (a reference),
    and the values' contents: text as UTF-8 (PostgreSQL's arrays, JSON and records arrive as their
    text, :mod:`._pg_values`), bytes as they are, numerics by their digits, 8 for any other value."""
    size = ROW_OVERHEAD_BYTES + 8 * len(row)
    for value in row:
        if isinstance(value, str):
            size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bytes):
            size += len(value)
        elif isinstance(value, Decimal):  # PostgreSQL's numeric: up to 16,383 digits after the point
            size += 8 + len(value.as_tuple().digits)
        else:
            size += 8
    return size
