"""Which stored request an engine's request id names. A run stores one request per id, its verify
steps numbered from 0: an id served again after it finished (a benchmark harness numbering every
round from ``req-0``, a client setting ``X-Request-Id``) would restart at step 0, and the store keeps
the first of each numbered step (``storage/_steps.py``), so every later serving of the id was
dropped as a repeat, its acceptance never read. Each serving after the first is stored as its own
request, ``<id>#2``, ``<id>#3``, ...

The ids finished are remembered, most recent last, up to :data:`REMEMBERED`; an id served again
after more other requests than that finished in between is not recognised (its steps are then kept
only where they do not repeat a stored step number)."""

from __future__ import annotations

from collections import OrderedDict

REMEMBERED = 65_536
"""Finished request ids kept to recognise a serving again: about 10 MB with ids of 40 characters
(measured with tracemalloc, ids included)."""


class RequestIds:
    def __init__(self) -> None:
        self._active: dict[str, int] = {}  # engine id -> its serving under way, for servings after the first
        self._finished: OrderedDict[str, int] = OrderedDict()  # engine id -> servings, oldest first

    def start(self, request_id: str) -> str:
        """The stored id of a serving of ``request_id`` that starts now (the one under way, when it
        has not finished: an engine starting a request again is still serving it)."""
        if request_id not in self._active:
            served = self._finished.pop(request_id, 0)
            if served:
                self._active[request_id] = served + 1
        return self.stored(request_id)

    def stored(self, request_id: str) -> str:
        """The stored id of the serving of ``request_id`` under way."""
        if not self._active:
            return request_id
        serving = self._active.get(request_id)
        return request_id if serving is None else f"{request_id}#{serving}"

    def finish(self, request_id: str) -> None:
        """The serving of ``request_id`` under way finished."""
        self._finished[request_id] = self._active.pop(request_id, 1)
        if len(self._finished) > REMEMBERED:
            self._finished.popitem(last=False)

    def renamed(self) -> bool:
        """Whether a serving under way is stored under another id than the engine's."""
        return bool(self._active)
