"""argparse value types shared by subcommands: a bad value is one line and exit 2 (argparse's own)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An int >= 1. Raises argparse.ArgumentTypeError otherwise."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def port(text: str) -> int:
    """A TCP port 0..65535 (0: any free one). Raises argparse.ArgumentTypeError otherwise."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)
