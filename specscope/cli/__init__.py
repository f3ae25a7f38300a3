"""The ``specscope`` console script.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)`` (adds its
parser and sets ``func``) plus the function it points ``func`` at, ``(args) -> int`` exit status.
Exit status (DESIGN.md section 6): 0 no error finding, 1 at least one error finding, 2 unusable input
or arguments. Every :class:`~specscope.errors.SpecscopeError` becomes one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specscope import __version__
from specscope.errors import SpecscopeError

SUBCOMMANDS = ("generate", "demo", "doctor", "query", "dashboard", "inspect", "watch", "exporter")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep it to one line
        self.exit(2, f"specscope: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one subparser per module in :data:`SUBCOMMANDS`."""
    parser = _Parser(prog="specscope", description="Observability for speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"specscope.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecscopeError as exc:
        print(f"specscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
