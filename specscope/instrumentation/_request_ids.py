"""Which stored request an engine's request id names. A run stores one request per id, its verify
steps numbered from 0: an id served again after it finished (a benchmark harness numbering every
round from ``req-0``, a client setting ``X-Request-Id``) would restart at step 0, and the store keeps
the first of each numbered step (``storage/_steps.py``), so every later serving of the id was
dropped as a repeat, its acceptance never read. Each serving after the first is stored as its own
request, ``<id>#2``, ``<id>#3``, ...: the first such name that no id under way or remembered holds
(an engine's own ``req-0#2`` included), the id cut to fit the store's request ids.

The ids finished are remembered, most recent last, up to :data:`REMEMBERED`; an id served again
after more other requests than that finished in between is not recognised (its steps are then kept
only where they do not repeat a stored step number)."""

from __future__ import annotations

from collections import OrderedDict

from specscope.event_checks import MAX_REQUEST_ID

REMEMBERED = 65_536
"""Finished request ids kept to recognise a serving again: about 10 MB with ids of 40 characters
(measured with tracemalloc, ids included)."""


class RequestIds:
    def __init__(self) -> None:
        self._active: dict[str, tuple[str, int]] = {}  # engine id under way -> (stored id, serving)
        self._names: set[str] = set()  # stored ids under way that are not their engine id
        self._finished: OrderedDict[str, int] = OrderedDict()  # id -> servings, oldest first

    def start(self, request_id: str) -> str:
        """The stored id of a serving of ``request_id`` that starts now (the one under way, when it
        has not finished: an engine starting a request again is still serving it)."""
        if request_id not in self._active:
            served = self._finished.pop(request_id, 0)
            stored = request_id
            if served or request_id in self._names:
                stored, served = self._free(request_id, served + 1)
                self._names.add(stored)
            self._active[request_id] = stored, max(served, 1)
        return self._active[request_id][0]

    def stored(self, request_id: str) -> str:
        """The stored id of the serving of ``request_id`` under way (the id itself when none is)."""
        serving = self._active.get(request_id)
        return request_id if serving is None else serving[0]

    def finish(self, request_id: str) -> None:
        """The serving of ``request_id`` under way finished."""
        stored, serving = self._active.pop(request_id, (request_id, 1))
        self._finished[request_id] = serving
        if stored != request_id:  # taken: an engine id equal to it is a serving again
            self._names.discard(stored)
            self._finished.setdefault(stored, 1)
        while len(self._finished) > REMEMBERED:
            self._finished.popitem(last=False)

    def renamed(self) -> bool:
        """Whether a serving under way is stored under another id than the engine's."""
        return bool(self._names)

    def _free(self, request_id: str, serving: int) -> tuple[str, int]:
        """``<id>#<serving>`` (the id cut to fit the store's request ids), past names finished or under way."""
        while True:
            suffix = f"#{serving}"
            name = request_id[:MAX_REQUEST_ID - len(suffix)] + suffix
            if name not in self._finished and name not in self._active and name not in self._names:
                return name, serving
            serving += 1
