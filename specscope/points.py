"""Hook-point names: the one place they are spelled.

A hook point is ``<module>:<key>``: the module the hook sits on (``draft.forward``,
``target.layers.15``, ``draft.fc``) and what was read there (an argument name, ``input``,
``output``), with ``.<i>`` / ``.<key>`` for an item inside a tuple, list or dict (``output.0``).
Events, the store, the doctor and the dashboard carry these strings; build and parse them only with
this module (plain strings, no torch: the doctor and the dashboard import it too).
"""

from __future__ import annotations

import re

DRAFT_PREFIX = "draft."
"""Every draft hook point starts with it (``draft.forward:...``, ``draft.model.fc:input``)."""

DRAFT_FORWARD = "draft.forward"
"""The draft model's forward (its hooks record every tensor argument and the output)."""

INPUT = "input"
OUTPUT = "output"


def point(module: str, key: str) -> str:
    """``<module>:<key>``, e.g. ``point("draft.fc", "input")`` -> ``"draft.fc:input"``."""
    return f"{module}:{key}"


def item(key: str, index: object) -> str:
    """An item inside a container argument or output: ``item("output", 0)`` -> ``"output.0"``."""
    return f"{key}.{index}"


def draft_input(argument: str) -> str:
    """The draft forward's argument ``argument``: ``"draft.forward:hidden_states"``."""
    return point(DRAFT_FORWARD, argument)


DRAFT_HIDDEN_STATES = draft_input("hidden_states")
"""The default draft hidden-state argument (``instrument(draft_hidden_arg=...)`` may name another)."""

DRAFT_OUTPUT = point(DRAFT_FORWARD, OUTPUT)

TARGET_PREFIX = "target."
"""Every target hook point starts with it (``target.layers.15:input``, ``target.norm:output``)."""

TARGET_LAYER_PREFIX = TARGET_PREFIX + "layers."
_TARGET_LAYER_SUFFIX = f":{INPUT}"


def target_layer_input(index: int) -> str:
    """The hidden state entering target decoder layer ``index`` (HF ``hidden_states[index]``):
    ``"target.layers.15:input"``."""
    return f"{TARGET_LAYER_PREFIX}{index}{_TARGET_LAYER_SUFFIX}"


def capture_layer(name: str) -> int | None:
    """The layer index of a :func:`target_layer_input` point, None for any other point."""
    if not (name.startswith(TARGET_LAYER_PREFIX) and name.endswith(_TARGET_LAYER_SUFFIX)):
        return None
    index = name[len(TARGET_LAYER_PREFIX):-len(_TARGET_LAYER_SUFFIX)]
    return int(index) if index.isdigit() else None


TARGET_NORM_OUTPUT = point("target.norm", OUTPUT)
"""The target's final norm output (fingerprinted for provenance; no events)."""


def order(name: str) -> tuple:
    """A sort key that orders numbers inside names by value: ``target.layers.2:input`` before
    ``target.layers.15:input`` before ``target.layers.27:input`` (as text, 15 < 2 < 27)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name) if part)
