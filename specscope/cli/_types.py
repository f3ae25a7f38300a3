"""argparse value types and arguments shared by subcommands: a bad value is one line and exit 2
(argparse's own)."""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Callable

_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # one label of a host name (RFC 1123)


def positive_int(text: str) -> int:
    """An int >= 1. Raises argparse.ArgumentTypeError otherwise."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def non_negative_int(text: str) -> int:
    """An int >= 0. Raises argparse.ArgumentTypeError otherwise."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """The argparse type of an int in ``low..high``; it raises argparse.ArgumentTypeError otherwise."""
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in {low}..{high}")
        return int(text)
    return parse


def host(text: str) -> str:
    """An IP address or a host name of dot-separated RFC 1123 labels (not resolved here: a name that
    does not resolve fails where it is bound). Raises argparse.ArgumentTypeError otherwise."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.split(".")):
        return text
    raise argparse.ArgumentTypeError(f"{text[:80]!r} is not an IP address or host name")


def port(text: str) -> int:
    """A TCP port 0..65535 (0: any free one). Raises argparse.ArgumentTypeError otherwise."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)


def _utf8(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a byte that is not UTF-8 arrives from argv as a lone surrogate
        raise argparse.ArgumentTypeError(f"{ascii(text)[:80]} is not UTF-8 text (character {exc.start + 1}); "
                                         f"give {what} as typed") from None
    return text


def run_id(text: str) -> str:
    """A run id or a unique prefix of one: UTF-8 text. Raises argparse.ArgumentTypeError otherwise."""
    return _utf8(text, "a run id")


def store_location(text: str) -> str:
    """A store's SQLite path or SQLAlchemy URL: UTF-8 text, not empty (an empty path names the
    current directory). Raises argparse.ArgumentTypeError otherwise."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the store location is empty: give a SQLite path or a SQLAlchemy URL")
    return _utf8(text, "a store path or URL")


def add_db_argument(parser: argparse.ArgumentParser, *, created: bool = False) -> None:
    """The required ``--db`` store location (``created``: a missing store is created)."""
    parser.add_argument("--db", required=True, type=store_location, help="store: a SQLite path or a SQLAlchemy URL "
                        "(postgresql+psycopg://user@host:5432/db)" + ("; created when missing" if created else ""))


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """``--json``: print the machine format documented in README, "Commands"."""
    parser.add_argument("--json", action="store_true", help="print the machine format (README, Commands)")
