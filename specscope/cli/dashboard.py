"""`specscope dashboard`: serve the Streamlit dashboard on a trace store.

The store is checked first, so a file or database that is not a specscope store, or a newer schema, is
one line and exit 2 before any server starts, and so is an existing empty file (a user's file is never
turned into a store), a bad :data:`specscope.app.TRACE_ENV`, or an address that cannot be listened on
(a port taken). A store that does not exist yet is created empty, in a folder that exists (and an
older one upgraded, as an engine's collector would): the dashboard can be opened before the engine writes, shows how to
instrument it, and switches to the run as soon as its first event arrives. Then ``streamlit run`` of
:data:`specscope.app.ENTRY` replaces this process (same interpreter, headless, no usage stats), with
the store in the :data:`specscope.app.DB_ENV` environment variable.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from typing import NoReturn

from specscope.app import ACCENT, DB_ENV, ENTRY, trace_threshold
from specscope.cli._store_path import check_store_location
from specscope.cli._types import add_db_argument, host, port
from specscope.errors import ConfigError
from specscope.storage import open_store


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``dashboard`` subcommand."""
    parser = sub.add_parser("dashboard", help="serve the live dashboard on a store",
                            description="Serve the specscope dashboard (Streamlit) on a trace store.")
    add_db_argument(parser)
    parser.add_argument("--port", type=port, default=8501, help="port to listen on (default 8501)")
    parser.add_argument("--host", type=host, default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.set_defaults(func=run)


def check_address(host: str, port: int) -> None:
    """Raise ConfigError, naming ``--port`` or ``--host``, when the dashboard could not listen on
    ``host:port`` now (port 0: any free one, always possible). Bound as Streamlit's server binds
    (``SO_REUSEADDR``), then released."""
    if port == 0:
        return
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except OSError as exc:
        raise ConfigError(f"--host {host} does not resolve here ({exc.strerror or exc})") from exc
    try:
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is taken (another dashboard?): choose another "
                              "--port") from exc
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): check --host and "
                          "--port") from exc


def streamlit_command(host: str, port: int) -> list[str]:
    """The ``streamlit run`` command line of the dashboard (this interpreter, headless, no stats)."""
    return [sys.executable, "-m", "streamlit", "run", str(ENTRY),
            "--server.headless", "true", "--server.address", host, "--server.port", str(port),
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
            "--global.developmentMode", "false", "--client.toolbarMode", "viewer",
            # Streamlit's default red accent would colour plain figures (progress bars) as alarms,
            # and with any other accent it draws inline code (run ids, fault labels) green, a verdict's
            # colour: code keeps the body text's
            "--theme.primaryColor", ACCENT, "--theme.codeTextColor", "#31333f"]


def run(args: argparse.Namespace) -> NoReturn:
    """Check the store, then become the Streamlit server (``os.execve``): Ctrl-C, or a signal sent to
    this process id, stops the server itself; a child process would outlive a killed parent."""
    trace_threshold()  # raises ConfigError: one line, exit 2, before the server starts
    check_store_location(args.db, "dashboard", existing_folder=True)
    check_address(args.host, args.port)  # before the store: a taken port creates nothing
    with open_store(args.db):
        pass  # raises StoreError / SchemaVersionError: one line, exit 2 (cli/__init__.py)
    print(f"specscope dashboard on http://{args.host}:{args.port} (store {args.db})", flush=True)
    sys.stderr.flush()
    command = streamlit_command(args.host, args.port)
    os.execve(command[0], command, {**os.environ, DB_ENV: args.db})
