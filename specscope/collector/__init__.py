"""The in-process collector (docs/design.md, "Components and data flow"): the sink instrumentation emits events into.

:class:`Collector` queues events without blocking the engine thread and writes them to a
:class:`~specscope.storage.Store` in batches from a background thread.
"""

from specscope.collector._collector import HEARTBEAT_S, Collector

__all__ = ["HEARTBEAT_S", "Collector"]
