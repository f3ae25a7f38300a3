"""`specscope doctor --db URL [--run ID] [--json]`: runtime findings over a trace store, with the
checkpoint findings stored with each run (labelled so; docs/design.md, "Finding codes").

The store is opened read-only (never created nor upgraded). Exit status: 0 no error finding, 1 at
least one error finding, 2 unusable input (missing store, a store without runs, unknown run or
ambiguous run id prefix: one line on stderr).
"""

from __future__ import annotations

import argparse

from specscope.cli._types import add_db_argument, add_json_argument, run_id
from specscope.doctor import render_text
from specscope.errors import ConfigError
from specscope.readmodel import report as verdict
from specscope.results import terminal_lines, to_json
from specscope.storage import open_store


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` subcommand."""
    parser = sub.add_parser(
        "doctor", help="diagnose recorded runs (aux capture, acceptance, weights, observation)",
        description="Run the runtime rules over the runs of a specscope store and print the findings, "
                    "errors first, each with evidence and a fix.")
    add_db_argument(parser)
    parser.add_argument("--run", metavar="ID", type=run_id, help="diagnose this run only, by its id or a unique "
                        "prefix of it (default: every run)")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; returns 0 / 1 (StoreError, ConfigError: exit 2 via the CLI shell)."""
    with open_store(args.db, create=False, read_only=True) as store:
        # the verdict the dashboard and the exporter show: a stored checkpoint error fails the run too
        report = verdict(store, args.run, distributions=args.json)
    if not report.runs:  # a gate (`doctor || fail`) must not pass on a store nothing was written to
        raise ConfigError(f"no runs in {args.db}: nothing to diagnose (is --db the store the engine writes to?)")
    print(to_json(report.to_dict()) if args.json else terminal_lines(render_text(report)))
    return report.exit_code
