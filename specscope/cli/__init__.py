"""The ``specscope`` console script.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)`` (adds its
parser and sets ``func``) plus the function it points ``func`` at, ``(args) -> int`` exit status.
Only the module of the subcommand being run is imported, so ``query``, ``doctor`` and ``--version``
start without torch or transformers (the reference engine's ``demo`` and ``generate`` need them).
Exit status (docs/design.md, "Finding codes"): 0 no error finding, 1 at least one error finding (for
``compare``: a regression), 2 unusable input or arguments. Every :class:`~specscope.errors.SpecscopeError` becomes one line on stderr and
exit 2; a reader that closes the pipe early (``| head``) ends the command quietly with status 141.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specscope import __version__
from specscope.errors import SpecscopeError
from specscope.results import terminal_text

SUBCOMMANDS = {
    "generate": "generate with the reference EAGLE-3 engine and print acceptance",
    "demo": "run the instrumented reference engine into a store",
    "doctor": "diagnose recorded runs (aux capture, acceptance, weights, observation)",
    "compare": "compare two runs' acceptance with a confidence interval (exit 1 on a regression)",
    "query": "run one read-only SQL statement on a store",
    "dashboard": "serve the live dashboard on a store",
    "inspect": "check a draft checkpoint (and its target) for silent loader and contract failures",
    "watch": "scrape Prometheus endpoints of running servers into a store",
    "exporter": "serve a store's findings and acceptance as Prometheus metrics",
    "replay": "re-score a stored run with the target alone (no speculation): where its output departs",
}
"""Subcommand -> the one line the top-level ``--help`` lists for it."""

BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep it to one line
        self.exit(2, f"specscope: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: the full subparser of ``command`` (its module imported), a one-line entry
    for every other subcommand of :data:`SUBCOMMANDS` (its module not imported). ``None``: every
    subcommand fully registered."""
    parser = _Parser(prog="specscope", description="Observability for speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, summary in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"specscope.cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def _command(argv: list[str]) -> str:
    """The subcommand named in ``argv`` ('' when none: ``--version``, ``--help``, a typo)."""
    first = next((arg for arg in argv if not arg.startswith("-")), "")
    return first if first in SUBCOMMANDS else ""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command(argv)).parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # inside the try: a reader gone before the last flush is a closed pipe too
        return status
    except SpecscopeError as exc:
        # messages quote user input (paths, tensor names): escaped, they stay one harmless line
        print(f"specscope {args.command}: error: {terminal_text(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader stopped (e.g. `| head -2`): point stdout at /dev/null so the interpreter's
        # final flush does not raise again (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
