"""`specscope query`: one read-only SQL statement on a trace store, as a table, JSON or CSV.

The store is opened read-only (never created nor upgraded) and the database itself refuses writes,
ATTACH, temp objects and extension loading; on PostgreSQL only read-only built-in functions run
(see :mod:`specscope.storage.user_query`); the statement
has ``--timeout`` seconds (default 2, at most a day) and the result at most 64 MiB (a single value too).
The table escapes control characters of stored text; ``--json`` is strict JSON (non-finite numbers
as null). A refused statement, bad SQL, the
time limit or a missing store exits with status 2; a result cut by ``--limit`` or the byte cap says so
on stderr.
Tables and views to query: specscope/storage/schema.py and specscope/storage/views.py.
"""

from __future__ import annotations

import argparse
import sys

from specscope.cli._types import add_db_argument
from specscope.results import write_csv, write_json, write_table
from specscope.storage import DEFAULT_QUERY_TIMEOUT_S, MAX_QUERY_TIMEOUT_S, open_store


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``query`` subcommand."""
    parser = sub.add_parser(
        "query", help="run one read-only SQL statement on a store",
        description="Run one read-only SQL statement on a specscope store and print the rows. "
                    "Views: v_run_summary, v_run_ids, v_run_acceptance, v_rank_acceptance, v_request_acceptance, "
                    "v_position_acceptance, v_request_position_acceptance, v_tensor_contract.")
    add_db_argument(parser)
    parser.add_argument("sql", help="one SQL statement (writes are refused)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print a JSON list of objects")
    output.add_argument("--csv", action="store_true", help="print CSV with a header row")
    parser.add_argument("--limit", type=_non_negative, help="print at most N rows")
    parser.add_argument("--timeout", type=_positive_seconds, default=DEFAULT_QUERY_TIMEOUT_S,
                        metavar="SECONDS", help="stop the statement after this many seconds "
                        f"(default {DEFAULT_QUERY_TIMEOUT_S:g})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the statement's rows; 0 on success. Errors (StoreError) are exit 2 via the CLI shell."""
    with open_store(args.db, create=False, read_only=True) as store:
        result = store.query(args.sql, limit=args.limit, timeout_s=args.timeout)
    columns, rows = result
    if args.json:
        write_json(columns, rows, sys.stdout)
    elif args.csv:
        write_csv(columns, rows, sys.stdout)
    else:
        write_table(columns, rows, sys.stdout)
    if result.truncated:  # on stderr: stdout stays the rows alone for --json / --csv readers
        print(f"specscope query: showing the first {len(rows)} row(s); the result has more "
              f"(cut at {result.truncated}: raise --limit or narrow the query)", file=sys.stderr)
    return 0


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of rows: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_QUERY_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {MAX_QUERY_TIMEOUT_S:g} seconds, got {text}")
    return value
