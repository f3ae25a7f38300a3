"""What a user's SQL may do on PostgreSQL: parsed (PostgreSQL's own parser, ``pglast``) and refused
before it runs unless it is one query whose every function is a read-only built-in.

- One SELECT / WITH / VALUES / TABLE, or SHOW; no data-modifying CTE, SELECT INTO or row-locking
  clause; no EXPLAIN: the planner folds constant expressions (through inlined CTEs and pulled-up
  subqueries too) and prints the values into the plan, one line of up to a gigabyte that reaches
  this process whole, past the result cap (a query's rows are capped by the server, in a wrapper
  no EXPLAIN can take); no read of the catalog relations that reach past the store (the server's
  files, the roles' secrets, other sessions, the statistics' sampled values:
  :data:`DENIED_POSTGRES_RELATIONS`), whatever the role.
- Functions are refused by what runs, not by how the call is written: a call ``f(x)``, and a name
  PostgreSQL may resolve to a function through attribute notation (``(x).f``, ``t.f`` for a row of
  ``t``: a field name after the first of a column reference or of an indirection). Known-dangerous
  names (:data:`DENIED_POSTGRES_FUNCTIONS`) are refused from the parse alone; every other name is
  then looked up in ``pg_proc`` (:func:`refuse_unlisted`): it runs only if each function of that
  name is in ``pg_catalog`` and immutable, an aggregate or a window function, or is one of the
  read-only stable or volatile built-ins of :data:`READ_ONLY_BUILTINS`. Extension functions
  (``dblink_exec``, ``crosstab``) and a role's own are refused; a field name that is no function's
  stays a column.
- Operators likewise, wherever one is named (``a OP b``, ``a OP ANY (subquery)``, ``ORDER BY ...
  USING OP``): a schema-qualified one runs only from ``pg_catalog``, and an unqualified one is
  refused when an operator of that name lives in a schema of the search path other than
  ``pg_catalog`` (a role's own ``===`` on the store's schema ran its function, which can take a lock
  or sleep, from a plain ``1 === 1``).
- Before the parser sees it, the statement is bounded (:data:`MAX_SQL_OPERATORS`): a left-deep
  expression (``1+1+...``, 30,000 terms) overflows the C stack inside the parser and kills the
  process; PostgreSQL's grammar refuses right-deep nesting itself ("memory exhausted").

It then runs in a read-only transaction with ``SET LOCAL statement_timeout`` before every round trip,
on a connection closed afterwards: nothing it did to its session outlives it. The least-privilege
role: docs/robustness.md, "PostgreSQL: the reader's role".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specscope.errors import ReadOnlyViolation, StoreError

# About 400 bytes of C stack per level of a left-deep expression: 8 MiB overflow near 21,000 levels;
# 5,000 levels parse in a thread of 2 MiB.
MAX_SQL_OPERATORS = 5_000
# Tokens that never deepen the parse tree: names, constants, commas, dots, parameters, comments, AND
# and OR (the parser flattens their chains); parentheses deepen it only through the grammar's own
# bounded stack.
_FLAT_TOKENS = frozenset({"IDENT", "UIDENT", "ICONST", "FCONST", "SCONST", "USCONST", "BCONST", "XCONST",
                          "PARAM", "ASCII_44", "ASCII_46", "ASCII_40", "ASCII_41", "SQL_COMMENT",
                          "C_COMMENT", "AND", "OR"})

# Function name prefixes refused from the parse alone, by what they reach (named in the refusal).
DENIED_POSTGRES_FUNCTIONS = {
    "advisory locks": ("pg_advisory_", "pg_try_advisory_"),
    "sessions and settings": ("set_config", "pg_terminate_backend", "pg_cancel_backend",
                              "pg_signal_backend", "pg_reload_conf", "pg_notify", "pg_listening_channels",
                              "pg_log_backend_memory_contexts", "pg_promote", "pg_switch_wal",
                              "pg_create_", "pg_drop_", "pg_replication_", "pg_logical_", "pg_backup_",
                              "pg_wal_replay_", "pg_import_system_collations", "dblink"),
    "statistics resets": ("pg_stat_reset",),
    "server files and logs": ("pg_read_", "pg_ls_", "pg_stat_file", "pg_file_", "pg_current_logfile",
                              "pg_rotate_logfile"),
    "large objects": ("lo_", "loread", "lowrite"),
    # these run a query given as a string, which this check never sees
    "SQL run from a string": ("query_to_xml", "query_to_xmlschema", "cursor_to_xml", "ts_stat",
                              "ts_rewrite", "crosstab", "connectby"),
}
# Stable or volatile built-ins that only read (pg_catalog's immutable ones, aggregates and window
# functions need no list): time, text and JSON that depend on settings, randomness, the catalog.
READ_ONLY_BUILTINS = frozenset({
    "now", "clock_timestamp", "statement_timestamp", "transaction_timestamp", "timeofday", "age",
    "date_part", "date_trunc", "extract", "timezone", "to_char", "to_date", "to_number", "to_timestamp",
    "make_timestamptz", "date", "time", "timestamp", "timestamptz", "timetz", "overlaps",
    "generate_series", "length", "concat", "concat_ws", "format", "quote_literal", "quote_nullable",
    "convert", "convert_from", "convert_to", "anytextcat", "textanycat", "array_to_string", "numeric",
    "money", "to_json", "to_jsonb", "array_to_json", "row_to_json", "json_build_array",
    "json_build_object", "jsonb_build_array", "jsonb_build_object", "json_populate_record",
    "json_populate_recordset", "json_to_record", "json_to_recordset", "jsonb_populate_record",
    "jsonb_populate_recordset", "jsonb_to_record", "jsonb_to_recordset", "jsonb_path_exists_tz",
    "jsonb_path_match_tz", "jsonb_path_query_tz", "jsonb_path_query_array_tz",
    "jsonb_path_query_first_tz", "to_tsvector", "to_tsquery", "plainto_tsquery", "phraseto_tsquery",
    "websearch_to_tsquery", "ts_headline", "json_to_tsvector", "jsonb_to_tsvector",
    "get_current_ts_config", "enum_first", "enum_last", "enum_range", "random", "gen_random_uuid",
    "version", "current_database", "current_schema", "current_schemas", "pg_typeof", "format_type",
    "pg_column_size", "pg_collation_for", "pg_postmaster_start_time", "pg_backend_pid",
    "obj_description", "col_description", "shobj_description", "pg_get_viewdef", "pg_get_constraintdef",
    "pg_get_indexdef", "pg_get_expr", "pg_get_userbyid", "pg_table_is_visible", "pg_type_is_visible",
    "to_regclass", "to_regtype", "to_regproc", "to_regprocedure", "to_regnamespace", "to_regrole",
    "to_regoper", "to_regoperator", "to_regcollation", "regclass", "has_table_privilege",
    "has_column_privilege", "has_schema_privilege", "has_database_privilege", "has_function_privilege",
    "pg_has_role", "pg_relation_size", "pg_table_size", "pg_indexes_size", "pg_total_relation_size",
    "pg_database_size", "getdatabaseencoding", "pg_client_encoding", "pg_encoding_to_char",
})
# The names of ``names`` that some function outside that allow-list bears (psycopg parameters).
_UNLISTED = (
    "SELECT proname FROM pg_catalog.pg_proc WHERE proname = ANY(%s) GROUP BY proname "
    "HAVING NOT bool_and(pronamespace = 'pg_catalog'::regnamespace "
    "AND (provolatile = 'i' OR prokind IN ('a', 'w') OR proname = ANY(%s))) ORDER BY proname")
# The names of ``names`` that some operator of a schema on the search path other than pg_catalog bears.
# (pg_temp is never searched for operators.)
_UNLISTED_OPERATORS = (
    "SELECT o.oprname FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace "
    "WHERE o.oprname = ANY(%s) AND n.nspname <> 'pg_catalog' AND n.nspname = ANY(current_schemas(false)) "
    "ORDER BY o.oprname LIMIT 1")
# pg_catalog relations refused by name (named in the refusal), by what they reach beyond the store:
# the server's files, the roles' secrets, other sessions, other tables' values. Their functions
# (pg_hba_file_rules(), pg_stat_get_activity(), ...) are not read-only built-ins, so refused anyway.
DENIED_POSTGRES_RELATIONS = {
    "large objects": ("pg_largeobject", "pg_largeobject_metadata"),
    "server files": ("pg_hba_file_rules", "pg_ident_file_mappings", "pg_file_settings", "pg_config"),
    "roles' secrets": ("pg_authid", "pg_shadow", "pg_user_mapping", "pg_user_mappings", "pg_subscription"),
    "other sessions": ("pg_stat_activity", "pg_stat_ssl", "pg_stat_gssapi", "pg_backend_memory_contexts",
                       "pg_stat_replication", "pg_stat_wal_receiver", "pg_stat_subscription",
                       "pg_prepared_statements", "pg_cursors"),
    "other tables' values": ("pg_statistic", "pg_statistic_ext_data"),
}
_DENIED_RELATIONS = {relation: what for what, relations in DENIED_POSTGRES_RELATIONS.items()
                     for relation in relations}
_MODIFYING_NODES = frozenset({"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"})
# Where the parse names an operator: ``a OP b`` (and ANY / ALL of an array, IN, LIKE, ...), ``a OP ANY
# (subquery)``, ``ORDER BY x USING OP``.
_OPERATOR_SLOTS = {"A_Expr": "name", "SubLink": "operName", "SortBy": "useOp"}
_PARAMETER = re.compile(r"%\(\w+\)s")  # psycopg's named placeholders, as SQLAlchemy compiles them


@dataclass(frozen=True)
class CheckedQuery:
    """A statement that passed the parse: ``select`` is its own text for a SELECT / WITH / VALUES /
    TABLE (no ``;``, for :func:`capped_select`), None for SHOW; ``functions`` and ``operators`` the
    names :func:`refuse_unlisted` looks up before it runs."""

    select: str | None
    functions: frozenset[str] = frozenset()
    operators: frozenset[str] = frozenset()


def check_postgres(sql: str, url: str) -> CheckedQuery:
    """Parse ``sql`` with PostgreSQL's parser and refuse it unless it is one query (module notes).

    Raises:
        ReadOnlyViolation: a statement class or function that is refused (named in the message).
        StoreError: not parseable, too deeply nested, empty, or more than one statement.
    """
    import pglast  # with psycopg, part of the extra "postgres"

    # placeholders become parameter references of the same length: offsets stay those of ``sql``
    parsed = _PARAMETER.sub(lambda match: "$1".ljust(len(match.group())), sql.replace("%%", "% "))
    try:
        operators = sum(token.name not in _FLAT_TOKENS for token in pglast.parser.scan(parsed))
        if operators > MAX_SQL_OPERATORS:
            raise StoreError(f"query on {url}: {operators:,} operators and keywords, more than the "
                             f"{MAX_SQL_OPERATORS:,} a statement may hold (the parser's stack is bounded)")
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
        raise _refused(url, "EXPLAIN (a plan prints the values PostgreSQL folds while planning, of any "
                            "size, past the result cap; run it in psql)")
    if kind == "VariableShowStmt":
        return CheckedQuery(None)
    if kind != "SelectStmt":
        first = sql[raw.stmt_location or 0:].split(None, 1)
        raise _refused(url, f"{first[0].upper() if first else kind} (a statement that is not a query)")
    functions, operators = _names(node, url)
    start = raw.stmt_location or 0
    return CheckedQuery(sql[start:start + raw.stmt_len] if raw.stmt_len else sql[start:], functions, operators)


def refuse_unlisted(cursor: Any, checked: CheckedQuery, url: str) -> None:
    """Refuse the statement when one of its functions is not a read-only built-in, or one of its
    operators may resolve outside ``pg_catalog`` (module notes), asked of the server's own catalog on
    the statement's connection.

    Raises:
        ReadOnlyViolation: naming the first such function or operator.
    """
    if checked.functions:
        cursor.execute(_UNLISTED, (sorted(checked.functions), sorted(READ_ONLY_BUILTINS)))
        row = cursor.fetchone()
        if row is not None:
            raise _refused(url, f"function {row[0]}() (not a read-only built-in of pg_catalog)")
    if checked.operators:
        cursor.execute(_UNLISTED_OPERATORS, (sorted(checked.operators),))
        row = cursor.fetchone()
        if row is not None:
            raise _refused(url, f"operator {row[0]} (one of that name is not a built-in of pg_catalog)")


def postgres_timeout_sql(timeout_s: float) -> str:
    """``SET LOCAL statement_timeout`` for the user's transaction (undone by its rollback)."""
    return f"SET LOCAL statement_timeout = {max(1, min(int(timeout_s * 1000), 2**31 - 1))}"


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
    """The one-line refusal of a statement or function ``what``."""
    return ReadOnlyViolation(f"query on {url}: {what} is not allowed (the SQL surface is read-only: "
                             "SELECT, WITH, VALUES, TABLE and SHOW only)")


def _names(root: object, url: str) -> tuple[frozenset[str], frozenset[str]]:
    """The function and operator names below ``root`` to look up in the catalog; raises for what the
    parse alone refuses (modifying CTEs, row locks, denied functions, functions and operators outside
    pg_catalog)."""
    from pglast import ast

    names: set[str] = set()
    operators: set[str] = set()
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
            raise _refused(url, f"{name[:-4].upper()} inside a query")
        if name == "SelectStmt" and (node.lockingClause or node.intoClause):
            raise _refused(url, "SELECT ... FOR UPDATE / SHARE (row locks)" if node.lockingClause
                          else "SELECT INTO")
        if name == "FuncCall":
            *schema, function = (part.sval for part in node.funcname)
            if schema and schema != ["pg_catalog"]:
                raise _refused(url, f"function {'.'.join(schema)}.{function}() (only built-ins of "
                                   "pg_catalog run)")
            names.add(function)
        elif name == "ColumnRef":  # t.f: a column of t, else the function f(t)
            names.update(field.sval for field in node.fields[1:] if isinstance(field, ast.String))
        elif name == "A_Indirection":  # (x).f: a field of x, else the function f(x)
            names.update(part.sval for part in node.indirection if isinstance(part, ast.String))
        elif name in _OPERATOR_SLOTS and isinstance(operator := getattr(node, _OPERATOR_SLOTS[name]), tuple):
            *schema, symbol = (part.sval for part in operator)
            if schema and schema != ["pg_catalog"]:
                raise _refused(url, f"operator {'.'.join(schema)}.{symbol} (only built-ins of pg_catalog run)")
            operators.add(symbol)
        elif name == "RangeVar" and node.relname.lower() in _DENIED_RELATIONS:
            raise _refused(url, f"reading {node.relname} ({_DENIED_RELATIONS[node.relname.lower()]})")
        pending.extend(value for value in (getattr(node, slot) for slot in node)
                       if isinstance(value, (ast.Node, tuple)))
    for function in sorted(names):
        for what, prefixes in DENIED_POSTGRES_FUNCTIONS.items():
            if function.lower().startswith(prefixes):
                raise _refused(url, f"function {function}() ({what})")
    return frozenset(names), frozenset(operators)
