"""`specscope exporter --db URL [--port 9464] [--host 127.0.0.1] [--max-runs 50]`: serve the store's
findings, draft-input contract, acceptance and counters as a Prometheus target (``/metrics``; metric
names in :mod:`specscope.exporter`). The store is opened read-only. Runs until Ctrl-C or SIGTERM (either
shuts the server down, closes the store and exits 0), or exits 2 for a missing store or an address
that cannot be bound.
"""

from __future__ import annotations

import argparse
import signal

from specscope.cli._signals import stopped_by
from specscope.cli._types import add_db_argument, host, port, positive_int
from specscope.errors import ConfigError
from specscope.exporter import serve_exporter
from specscope.storage import open_store


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``exporter`` subcommand."""
    parser = sub.add_parser(
        "exporter", help="serve the store as a Prometheus target (/metrics)",
        description="Serve open findings, observed vs expected draft-input widths, acceptance per "
                    "run / rank / position, dropped events and hook errors for Prometheus to scrape.")
    add_db_argument(parser)
    parser.add_argument("--port", type=port, default=9464, help="TCP port (default 9464)")
    parser.add_argument("--host", type=host, default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--max-runs", type=positive_int, default=50, help="newest runs exported (default 50)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; 0 (StoreError / ConfigError: exit 2 via the CLI shell)."""
    with open_store(args.db, create=False, read_only=True) as store, \
            stopped_by(signal.SIGINT, signal.SIGTERM) as stop:
        try:
            server, _, _ = serve_exporter(store, host=args.host, port=args.port, max_runs=args.max_runs)
        except OSError as exc:
            raise ConfigError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from exc
        host, port = server.server_address[:2]
        print(f"specscope exporter: http://{host}:{port}/metrics", flush=True)
        try:
            stop.wait()
        finally:
            server.shutdown()
            server.server_close()
    return 0
