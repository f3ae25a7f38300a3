"""The one error tree of specscope.

Every error specscope raises on purpose derives from :class:`SpecscopeError`; errors from the libraries
underneath (SQLAlchemy, safetensors, json, transformers) are converted where they enter
(``raise ... from exc``) so callers catch one family. The CLI maps every ``SpecscopeError`` to one clear
line on stderr and exit status 2 (docs/design.md, "Finding codes").
"""

from __future__ import annotations


class SpecscopeError(Exception):
    """Root of every error specscope raises on purpose."""


class ConfigError(SpecscopeError, ValueError):
    """A configuration value or argument is unusable (unknown fault, bad k, malformed config.json)."""


class InvalidEvent(SpecscopeError, ValueError):
    """An event's values contradict each other or the store's limits (e.g. ``accepted > proposed``).
    Raised by the event constructors; the tracer catches it, counts it and drops the event."""


class ModelNotFoundError(SpecscopeError, FileNotFoundError):
    """A model file or package is not installed; the message names the command that installs it."""


class CheckpointError(SpecscopeError, ValueError):
    """A checkpoint cannot be read or loaded: missing file, truncated safetensors, missing/unexpected keys."""


class StoreError(SpecscopeError):
    """The trace store cannot be opened, written or read (bad URL, locked file, not a specscope store)."""


class EventRejected(StoreError):
    """The database refused the values of the events being written (too long, out of range, a
    constraint), not the store as a whole: the collector then isolates the bad event and writes the rest."""


class SchemaVersionError(StoreError):
    """The store was written by a newer specscope (schema version above the one this code knows)."""


class ReadOnlyViolation(StoreError):
    """A statement tried to write through a read-only connection (``specscope query``, the SQL page)."""


class HookTargetError(SpecscopeError, LookupError):
    """A module name given to ``instrument`` matches nothing; the message lists the closest names."""
