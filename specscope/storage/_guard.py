"""What a user's SQL may do (``specscope query``, the dashboard's SQL page, :meth:`Store.query`).

Read-only is enforced by the database on the connection, for every statement class; on PostgreSQL the
statement is also parsed first (PostgreSQL's own parser, ``pglast``) and refused before it runs when
it is not one query or calls a function of a refused class:

- SQLite: an authorizer (``sqlite3.Connection.set_authorizer``,
  https://sqlite.org/c3ref/set_authorizer.html) that allows reading tables, calling functions other
  than ``load_extension`` and ``fts3_tokenizer``, recursive CTEs and the schema-reading PRAGMAs of
  :data:`READ_PRAGMAS`, and denies everything else: ATTACH / DETACH (also how ``VACUUM INTO`` opens
  its target file; a ``mode=ro`` connection would still create the file), writes, temp tables,
  transactions, state-changing PRAGMAs. A progress handler (``set_progress_handler``) interrupts a
  statement that runs past its time limit.
  SQLite checks the progress handler only where its program jumps (between rows, in loops), not
  between the function calls that compute one row, so the work of one row is bounded instead:
  ``SQLITE_LIMIT_LENGTH`` caps every value while it is computed (:data:`SQLITE_MAX_VALUE_BYTES`, or
  the byte cap when smaller: a ``zeroblob`` or a ``replace`` cannot grow past it) and the authorizer
  refuses a statement naming more than :data:`MAX_FUNCTION_CALLS` functions, so one row costs at
  most that many calls on values of that size (about 12 ms per 4 MiB call measured here; without
  these bounds nested ``replace`` runs 7.4 s under a 1 s limit).
- PostgreSQL (:func:`check_postgres`): exactly one SELECT / WITH / VALUES / TABLE, EXPLAIN of one, or
  SHOW; no data-modifying CTE, SELECT INTO or row-locking clause; no call to a function of
  :data:`DENIED_POSTGRES_FUNCTIONS` (advisory locks, sessions and settings, server files, programs and
  logs, large objects, SQL run from a string) nor a read of ``pg_largeobject``. It then runs in the
  read engine's read-only transaction with ``SET LOCAL statement_timeout`` before every round trip
  (the time left), on a connection that is closed afterwards: nothing the statement did to its
  session (a lock, a setting) outlives it, whatever the role. The least-privilege role for the
  dashboard and ``specscope query`` is docs/robustness.md, "PostgreSQL: the reader's role".

Results are capped in rows and in bytes (:class:`ResultCap`). Time limit default:
:data:`DEFAULT_QUERY_TIMEOUT_S` (Datasette uses 1 s for the same job; each of the dashboard's own
queries takes under 0.4 s on the 1M-verify-step benchmark store, docs/performance.md, "Dashboard
pages", and a user's ad-hoc aggregate gets five times that).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from specscope.errors import ReadOnlyViolation, StoreError

DEFAULT_QUERY_TIMEOUT_S = 2.0
MAX_QUERY_TIMEOUT_S = 24 * 3600.0  # PostgreSQL's statement_timeout holds at most 2**31 - 1 ms (24.8 days)
DEFAULT_MAX_RESULT_BYTES = 64 * 1024 * 1024
_PROGRESS_STEPS = 10_000  # SQLite VM instructions between two deadline checks (about a millisecond)
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


@dataclass
class SqliteGuard:
    """Authorizer and time limit installed on one sqlite3 connection for one user statement.

    ``denied`` names the first action refused (for the error message); ``timed_out`` is True once
    the progress handler interrupted the statement.
    """

    timeout_s: float | None
    max_value_bytes: int | None = None
    denied: str | None = None
    timed_out: bool = False
    _deadline: float = 0.0
    _length_limit: int | None = None
    _functions: int = 0

    def install(self, connection: sqlite3.Connection) -> None:
        """Start the clock and install the authorizer, the value-length limit and, with a time
        limit, the progress handler."""
        connection.set_authorizer(self._authorize)
        self._length_limit = connection.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_limit)
        if self.timeout_s is not None:
            self._deadline = time.monotonic() + self.timeout_s
            connection.set_progress_handler(self._progress, _PROGRESS_STEPS)

    def remove(self, connection: sqlite3.Connection) -> None:
        """Take them off (the connection returns to the pool and runs specscope's own SQL next)."""
        connection.set_authorizer(None)
        connection.set_progress_handler(None, 0)
        if self._length_limit is not None:
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self._length_limit)

    @property
    def value_limit(self) -> int:
        """Bytes one value may reach while the statement computes it."""
        if self.max_value_bytes is None:
            return SQLITE_MAX_VALUE_BYTES
        return max(1, min(self.max_value_bytes, SQLITE_MAX_VALUE_BYTES))

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, _db: str | None,
                   _trigger: str | None) -> int:
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and arg2 not in _DENIED_FUNCTIONS:
            self._functions += 1  # one call per reference, authorized as the statement is prepared
            if self._functions <= MAX_FUNCTION_CALLS:
                return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and arg1 in READ_PRAGMAS:
            return sqlite3.SQLITE_OK
        if self.denied is None:
            if action == sqlite3.SQLITE_PRAGMA:
                self.denied = f"PRAGMA {arg1}"
            elif action == sqlite3.SQLITE_FUNCTION and arg2 not in _DENIED_FUNCTIONS:
                self.denied = f"a statement calling more than {MAX_FUNCTION_CALLS} functions"
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


def postgres_timeout_sql(timeout_s: float) -> str:
    """``SET LOCAL statement_timeout`` for the user's transaction (undone by its rollback)."""
    return f"SET LOCAL statement_timeout = {max(1, min(int(timeout_s * 1000), 2**31 - 1))}"


# Function name prefixes refused in user SQL on PostgreSQL, by what they reach (the connection is
# closed after the statement anyway: these are refused so they never run at all).
DENIED_POSTGRES_FUNCTIONS = {
    "advisory locks": ("pg_advisory_", "pg_try_advisory_"),
    "sessions and settings": ("set_config", "pg_terminate_backend", "pg_cancel_backend",
                              "pg_signal_backend", "pg_reload_conf", "pg_notify", "pg_listening_channels",
                              "pg_log_backend_memory_contexts", "pg_promote", "pg_switch_wal",
                              "pg_create_", "pg_drop_", "pg_replication_", "pg_logical_", "pg_backup_",
                              "pg_wal_replay_", "pg_import_system_collations", "dblink"),
    "server files and logs": ("pg_read_", "pg_ls_", "pg_stat_file", "pg_file_", "pg_current_logfile",
                              "pg_rotate_logfile"),
    "large objects": ("lo_", "loread", "lowrite"),
    # these run a query given as a string, which this check never sees
    "SQL run from a string": ("query_to_xml", "query_to_xmlschema", "cursor_to_xml", "ts_stat",
                              "ts_rewrite"),
}
_DENIED_RELATIONS = frozenset({"pg_largeobject", "pg_largeobject_metadata"})
_MODIFYING_NODES = frozenset({"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"})
_PARAMETER = re.compile(r"%\(\w+\)s")  # psycopg's named placeholders, as SQLAlchemy compiles them


def check_postgres(sql: str, url: str) -> str | None:
    """Parse ``sql`` with PostgreSQL's parser and refuse it unless it is one query (module notes).

    Returns:
        For a SELECT / WITH / VALUES / TABLE, the statement's own text (no ``;``, for
        :func:`capped_select`; it runs through a server-side cursor, whose columns are known even
        without rows); None for EXPLAIN and SHOW (always a row, streamed).

    Raises:
        ReadOnlyViolation: a statement class or function that is refused (named in the message).
        StoreError: not parseable, empty, or more than one statement.
    """
    import pglast  # with psycopg, part of the extra "postgres"

    # placeholders become parameter references of the same length: offsets stay those of ``sql``
    parsed = _PARAMETER.sub(lambda match: "$1".ljust(len(match.group())), sql.replace("%%", "% "))
    try:
        statements = pglast.parse_sql(parsed)
    except pglast.parser.ParseError as exc:
        raise StoreError(f"query on {url}: {exc}") from exc
    if not statements:
        raise StoreError("the query is empty: give one SQL statement")
    if len(statements) > 1:
        raise StoreError(f"query on {url}: {len(statements)} statements; give one SQL statement")
    raw = statements[0]
    node = raw.stmt
    kind = type(node).__name__
    if kind == "ExplainStmt":
        node = node.query
    elif kind == "VariableShowStmt":
        return None
    if type(node).__name__ != "SelectStmt":
        first = sql[raw.stmt_location or 0:].split(None, 1)
        raise _refused(url, f"{first[0].upper() if first else kind} (a statement that is not a query)")
    denial = _denied_node(node)
    if denial is not None:
        raise _refused(url, denial)
    if kind != "SelectStmt":
        return None
    start = raw.stmt_location or 0
    return sql[start:start + raw.stmt_len] if raw.stmt_len else sql[start:]


ROW_OVER_CAP = "specscope: a row is larger than the result cap"


def capped_select(select: str, max_bytes: int) -> str:
    """``select`` wrapped so that the server stops it (an error whose message holds
    :data:`ROW_OVER_CAP`) at the first row whose text form exceeds ``max_bytes``: such a row would
    otherwise reach this process whole, however large (libpq holds a row in memory). A subquery with
    ORDER BY is never flattened into the outer query, so the rows keep their order."""
    # the failing cast names the row's size: an expression of the row, so that the planner cannot
    # fold it into a constant (and raise) before any row is seen
    size = "octet_length(ROW(specscope_row.*)::text)"
    return (f"SELECT specscope_row.* FROM (\n{select}\n) AS specscope_row WHERE CASE WHEN "
            f"{size} > {int(max_bytes)} THEN CAST('{ROW_OVER_CAP}: ' || {size} AS integer) = 0 "
            "ELSE true END")


def _refused(url: str, what: str) -> ReadOnlyViolation:
    return ReadOnlyViolation(f"query on {url}: {what} is not allowed (the SQL surface is read-only: "
                             "SELECT, WITH, VALUES, TABLE, EXPLAIN and SHOW only)")


def _denied_node(root: object) -> str | None:
    """What in the parse tree below ``root`` is refused (functions, modifying CTEs, row locks)."""
    from pglast import ast

    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, tuple):
            pending.extend(node)
            continue
        if not isinstance(node, ast.Node):
            continue
        name = type(node).__name__
        if name in _MODIFYING_NODES:
            return f"{name[:-4].upper()} inside a query"
        if name == "SelectStmt" and (node.lockingClause or node.intoClause):
            return "SELECT ... FOR UPDATE / SHARE (row locks)" if node.lockingClause else "SELECT INTO"
        if name == "FuncCall":
            function = node.funcname[-1].sval.lower()
            for what, prefixes in DENIED_POSTGRES_FUNCTIONS.items():
                if function.startswith(prefixes):
                    return f"function {function}() ({what})"
        if name == "RangeVar" and node.relname.lower() in _DENIED_RELATIONS:
            return f"reading {node.relname} (large objects)"
        pending.extend(value for value in (getattr(node, slot) for slot in node)
                       if isinstance(value, (ast.Node, tuple)))
    return None


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


def row_bytes(row: tuple) -> int:
    """What a row counts against the byte cap: values as text, bytes as is, 8 for anything else."""
    return sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in row)
