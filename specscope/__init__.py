"""specscope: live observability for speculative decoding.

Public API (everything else is internal), importable from the top package:

- instrumentation: ``Tracer``, ``instrument``, ``check_load`` (hooks on a running engine)
- collector: ``Collector`` (the in-process sink: bounded, never blocks the engine)
- storage: ``open_store``, ``Store`` (SQLite or any SQLAlchemy URL)
- doctor: ``diagnose`` (runtime findings); inspector: ``inspect_checkpoint`` (checkpoint findings)
- events: ``RunConfig`` and the event dataclasses in :mod:`specscope.events`
- errors: the ``SpecscopeError`` tree

The heavy ones (torch, SQLAlchemy) load on first use, so ``import specscope`` stays cheap.
"""

import importlib

from specscope.errors import (
    CheckpointError,
    ConfigError,
    HookTargetError,
    ModelNotFoundError,
    ReadOnlyViolation,
    SchemaVersionError,
    SpecscopeError,
    StoreError,
)

__version__ = "0.1.0"

_LAZY = {
    "Tracer": "specscope.instrumentation",
    "instrument": "specscope.instrumentation",
    "check_load": "specscope.instrumentation",
    "Collector": "specscope.collector",
    "open_store": "specscope.storage",
    "Store": "specscope.storage",
    "diagnose": "specscope.doctor",
    "inspect_checkpoint": "specscope.inspector",
    "RunConfig": "specscope.events",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specscope' has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "CheckpointError",
    "ConfigError",
    "HookTargetError",
    "ModelNotFoundError",
    "ReadOnlyViolation",
    "SchemaVersionError",
    "SpecscopeError",
    "StoreError",
    "__version__",
]
