"""`specscope compare --base-db STORE [--base-run ID] --db STORE [--run ID] [--json]`: did acceptance
change between two runs? (docs/design.md, "Comparing runs").

Both stores are opened read-only (never created nor upgraded) and may be the same store. Exit status,
for a CI gate: 1 when the candidate's acceptance length regressed or the candidate fails its losslessness
audit (verdict ``lossy``: LOSSLESS_VIOLATION), 3 when the runs cannot tell
(inconclusive: too few or too noisy requests), 0 otherwise (improvement or no change), 2 on unusable
input (missing store, unknown or ambiguous run, the same run on both sides, a run with fewer than two
requests with verify steps: one line on stderr).
"""

from __future__ import annotations

import argparse
import json

from specscope.cli._types import add_db_argument, add_json_argument, run_id, store_location


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand."""
    parser = sub.add_parser(
        "compare", help="compare two runs' acceptance with a confidence interval (exit 1 on a regression)",
        description="Compare the candidate run (--db, --run) with the base run (--base-db, --base-run): "
                    "each run's acceptance length, rate and per-position acceptance, the difference in "
                    "acceptance length with a 95% bootstrap interval over requests (paired by prompt when "
                    "both served the same prompts), and a verdict, per sampling group where the runs served "
                    "several (the verdict names the groups that gave it); a candidate that fails its "
                    "losslessness audit is lossy. Exit 1 on a regression or lossy, 3 when inconclusive.")
    parser.add_argument("--base-db", required=True, type=store_location, help="store of the base run: a SQLite path or a SQLAlchemy URL")
    parser.add_argument("--base-run", metavar="ID", type=run_id, help="the base run, by its id or a unique prefix "
                        "(default: the base store's newest run)")
    add_db_argument(parser)
    parser.add_argument("--run", metavar="ID", type=run_id, help="the candidate run, by its id or a unique prefix "
                        "(default: the store's newest run)")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the comparison; returns 1 on a regression or a lossy candidate, 3 when inconclusive, else 0
    (ConfigError, StoreError: exit 2)."""
    from specscope.compare import compare, render_text
    from specscope.results import terminal_lines
    from specscope.storage import open_store

    with open_store(args.base_db, create=False, read_only=True) as base, \
            open_store(args.db, create=False, read_only=True) as candidate:
        comparison = compare(base, candidate, args.base_run, args.run)
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        lines = [render_text(comparison)]
        # a run the doctor finds broken is said beside the verdict: an unchanged acceptance says nothing
        # of, e.g., a capture layer that went missing on the base
        for name, side in (("base", comparison.base), ("candidate", comparison.candidate)):
            if comparison.doctor[name]["error"]:
                lines.append(f"note: the doctor finds {comparison.doctor[name]['error']} error(s) on the {name} "
                             f"run (specscope doctor --run {side.run_id})")
        print(terminal_lines("\n".join(lines)))
    return comparison.exit_code
