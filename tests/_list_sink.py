"""A test-only sink that keeps events in a list (the package's real sink is the Collector)."""

from __future__ import annotations


class ListSink:
    """Collects events in a list (tests only)."""

    def __init__(self) -> None:
        self.events: list = []
        self.flushes = 0
        self.closed = False

    def emit(self, event) -> None:
        self.events.append(event)

    def flush(self, timeout_s: float | None = None) -> bool:
        self.flushes += 1
        return True

    def close(self) -> None:
        self.closed = True

    def of(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]

    def tensors(self, hook_point: str) -> list:
        return [e for e in self.events if getattr(e, "hook_point", None) == hook_point]
