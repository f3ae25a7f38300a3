"""Running one function in several threads at once, for the race tests."""

from __future__ import annotations

import threading
from collections.abc import Callable


def at_once(target: Callable[[], None], threads: int) -> list[BaseException]:
    """Run ``target`` in ``threads`` threads started together; return what they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # collected for the caller's assertion
            errors.append(exc)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return errors
