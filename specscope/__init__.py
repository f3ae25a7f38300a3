"""specscope: live observability for speculative decoding.

Public API (everything else is internal):

- :mod:`specscope.instrumentation`: ``Tracer``, ``instrument``, ``check_load``
- :mod:`specscope.collector`: ``Collector`` (the in-process sink)
- :mod:`specscope.storage`: ``Store``, ``open_store``
- :mod:`specscope.events`: the event dataclasses
- :mod:`specscope.errors`: the error tree
"""

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

__all__ = [
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
