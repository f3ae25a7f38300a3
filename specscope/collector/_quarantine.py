"""Setting aside what the database refuses: a batch written in halves until each rejected event is
alone (about 2 log2(len(batch)) extra transactions per bad event), and counters written per rank
when one rank's are refused (a run id holding a NUL or a lone surrogate)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specscope.collector._boundary import Key
from specscope.collector._counts import Counters
from specscope.errors import EventRejected
from specscope.events import Event
from specscope.storage import Store


def bisect(store: Store, batch: Sequence[Event], rejection: EventRejected
           ) -> tuple[list[Event], list[tuple[Event, EventRejected]], tuple[list[Event], Exception] | None]:
    """Write ``batch`` (refused with ``rejection``) in halves, left half first.

    Returns:
        the events committed; each rejected event with its rejection; and, when the store itself
        failed meanwhile, the events not written with that error (else None).
    """
    good: list[Event] = []
    bad: list[tuple[Event, EventRejected]] = []
    # (events, the rejection they got, or None when not tried yet)
    pending: list[tuple[Sequence[Event], EventRejected | None]] = [(batch, rejection)]
    while pending:
        part, refused = pending.pop()
        if refused is None:
            try:
                store.write(part)
            except EventRejected as exc:
                refused = exc
            except Exception as exc:  # noqa: BLE001 - the store itself failed: the rest is lost
                return good, bad, ([event for events, _ in ((part, None), *pending) for event in events], exc)
            else:
                good.extend(part)
                continue
        if len(part) == 1:
            bad.append((part[0], refused))
        else:
            middle = len(part) // 2
            pending += [(part[middle:], None), (part[:middle], None)]
    return good, bad, None


def write_counters(store: Store, counters: Counters, refused: Callable[[Key, EventRejected], None]) -> None:
    """Write ``counters`` alone; a rank's the database refuses are left out (``refused`` is told), so
    they cannot keep every later batch from committing. Other store errors propagate."""
    try:
        store.write((), counters=counters)
    except EventRejected:
        for key, counts in counters.items():
            try:
                store.write((), counters={key: counts})
            except EventRejected as exc:
                refused(key, exc)
