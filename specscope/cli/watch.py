"""`specscope watch --db URL ENDPOINT... [--interval 5s] [--count N | --duration 10m]`: store the
acceptance of servers you cannot instrument, from their Prometheus endpoints (vLLM, SGLang,
TensorRT-LLM, llama.cpp; see :mod:`specscope.adapters.prometheus_watch`).

Runs until ``--count`` scrapes or ``--duration`` have passed, or Ctrl-C or SIGTERM (both end the watch
the same way: every rank marked finished, the store flushed); then prints one line per watched run.
While it runs, one line per scrape on stderr (endpoints answered, verify steps stored); httpx's
per-request log lines stay off unless ``--verbose`` (they would drown the gap warnings). An endpoint
that is down or answers garbage is a gap (one warning line), never an exit, while another endpoint
gives metrics; when none gave any in the whole watch, nothing is stored and the watch fails.
Exit status 0; 2 for bad arguments, an unusable store, or no endpoint that gave metrics (one line
naming each endpoint's last error).
"""

from __future__ import annotations

import argparse
import logging
import re
import signal

from specscope.adapters.prometheus_watch import watch
from specscope.cli._signals import stopped_by
from specscope.cli._store_path import check_store_location
from specscope.cli._types import add_db_argument, positive_int
from specscope.errors import ConfigError
from specscope.storage import open_store, queries

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

MAX_SECONDS = 366 * 24 * 3600.0
"""Longest duration a flag takes (a year): far longer ones overflow the clock's waits."""


def seconds(text: str) -> float:
    """``"5s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a plain number of seconds -> seconds (> 0, at most
    :data:`MAX_SECONDS`).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 5s, 500ms, 2m or 1h")
    value = float(match[1]) * _UNITS[match[2] or "s"]
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than a year ({MAX_SECONDS / 3600:g}h)")
    return value



def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``watch`` subcommand."""
    parser = sub.add_parser(
        "watch", help="store the acceptance of servers from their Prometheus endpoints",
        description="Scrape Prometheus endpoints of vLLM, SGLang, TensorRT-LLM or llama.cpp servers and "
                    "store their acceptance (per server, rank label and draft position) as runs the "
                    "dashboard, query and doctor read.")
    add_db_argument(parser, created=True)
    parser.add_argument("endpoints", nargs="+", metavar="ENDPOINT",
                        help="a metrics URL, or host:port (then /metrics)")
    parser.add_argument("--interval", type=seconds, default=5.0, help="time between scrapes (default 5s)")
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request of every scrape")
    until = parser.add_mutually_exclusive_group()
    until.add_argument("--count", type=positive_int, help="stop after N scrapes (the first is the baseline)")
    until.add_argument("--duration", type=seconds, help="stop after this long (e.g. 10m)")
    parser.add_argument("--timeout", type=seconds, default=5.0,
                        help="time limit of one endpoint's scrape, connect to last line read (default 5s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Watch, then print one line per watched run; 0 (errors, no endpoint answering among them: exit 2
    via the CLI shell)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.INFO if args.verbose else logging.WARNING)
    check_store_location(args.db, "watch")
    # Ctrl-C stays a KeyboardInterrupt: the watch ends its runs on it itself
    with open_store(args.db) as store, stopped_by(signal.SIGTERM) as stop:
        try:
            run_ids = watch(store, args.endpoints, interval_s=args.interval, count=args.count,
                            duration_s=args.duration, timeout_s=args.timeout, stop=stop)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        for row in store.fetch(queries.RUNS):
            if row["run_id"] in run_ids:
                al, rate = row["mean_acceptance_length"], row["acceptance_rate"]
                print(f"run {row['run_id']} [{row['engine']} {row['target_model']}]: "
                      f"{row['verify_steps']} verify step(s), AL {_fmt(al, '.2f')}, rate {_fmt(rate, '.1%')}")
    return 0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)
