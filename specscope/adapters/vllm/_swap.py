"""An attribute specscope sets on a vLLM object, which it can take out and put back (the plugin's
``paused()``) or take out for good (the end of a run)."""

from __future__ import annotations

from typing import Any

_ABSENT = object()


class Swap:
    """Set ``owner.name`` to ``ours`` (a class's method, or an instance's ``forward``), remembering
    what ``owner`` itself held under ``name`` (nothing, for an instance that took it from its class).

    :meth:`take_out` and :meth:`put_back` touch the attribute only while it is what specscope left
    there: something that replaced it since stays.
    """

    def __init__(self, owner: Any, name: str, ours: Any) -> None:
        self.owner, self.name, self.ours = owner, name, ours
        self.theirs = owner.__dict__.get(name, _ABSENT)
        setattr(owner, name, ours)

    def take_out(self) -> None:
        """vLLM's own attribute again (idempotent)."""
        if self.owner.__dict__.get(self.name, _ABSENT) is self.ours:
            if self.theirs is _ABSENT:
                delattr(self.owner, self.name)
            else:
                setattr(self.owner, self.name, self.theirs)

    def put_back(self) -> None:
        """Ours again, after :meth:`take_out` (idempotent)."""
        if self.owner.__dict__.get(self.name, _ABSENT) is self.theirs:
            setattr(self.owner, self.name, self.ours)
