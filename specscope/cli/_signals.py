"""How the long-running commands (`watch`, `exporter`) stop: a service manager's SIGTERM (systemd,
Docker, Kubernetes) and, where asked, Ctrl-C's SIGINT set one event; the command then ends its work
the normal way (runs ended, servers shut down, the store closed) and exits 0."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stopped_by(*signals: signal.Signals) -> Iterator[threading.Event]:
    """An event that ``signals`` set while the block runs; the previous handlers are restored after.
    Off the main thread (tests) signals cannot be handled: the event is then only set by the caller."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in signals}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
