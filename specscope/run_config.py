"""The contract between target and draft a run declares (``RunStart.config``), which the runtime
checks compare observations against, and how a run recorded from outside its engine says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specscope.errors import ConfigError
from specscope.event_checks import is_int

UNHOOKED_SOURCES = {"prometheus": "watched through its Prometheus endpoint",
                    "responses": "recorded from the server's responses"}
"""``RunStart.config["source"]`` of runs recorded from outside the engine: no hooks, so the acceptance
is exact and no tensor, graph mode or capture layer is observed."""


_STORED_INTS = ("target_hidden_size", "expected_fused_width", "k", "topk", "num_draft_tokens", "num_target_layers")
_STORED_IDS = ("aux_layer_ids_resolved", "aux_layer_ids_configured", "aux_layer_ids_active")


def stored_config_problem(config: Any) -> str | None:
    """What makes a stored ``RunStart.config`` unreadable to the contract's rules (one line), or None.
    Any field may be absent (other adapters); a present contract field must be what :class:`RunConfig`
    writes: an int, or a list of ints for the aux ids (a string ``"1728"`` would compare unequal to
    every width, and ``"2,15,27"`` is no list of layers)."""
    if not isinstance(config, dict):
        return f"is {type(config).__name__}, not an object"
    for name in _STORED_INTS:
        value = config.get(name)
        if value is not None and not is_int(value):
            return f"{name} is {value!r}, not an int"
    for name in _STORED_IDS:
        ids = config.get(name)
        if ids is not None and not (isinstance(ids, list) and all(map(is_int, ids))):
            return f"{name} is {ids!r}, not a list of ints"
    return None


def unhooked(config: dict) -> str | None:
    """How a run with this ``RunStart.config`` was recorded from outside its engine; None when hooked."""
    return UNHOOKED_SOURCES.get(config.get("source"))


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The speculative-decoding contract of a run.

    - ``aux_layer_ids_configured``: ids as written in the draft config (``None`` = engine default);
      ``aux_layer_ids_resolved``: physical capture points, "hidden state entering layer i" (HF
      ``hidden_states[i]``); ``aux_layer_ids_active``: those the engine reports active once the target
      is loaded (``()`` = none, ``None`` = the engine does not say).
    - ``expected_fused_width``: ``len(aux ids) * target_hidden_size`` = ``fc.in_features``; 0 for a
      method without aux capture (prompt lookup, n-gram, MTP, a draft model).
    - ``k``: draft tokens per verify step; ``num_draft_tokens`` counts the root too (SGLang: ``k + 1``).
    - ``model_runner``: which of the engine's runners served where it has several (vLLM 0.32: ``"v1"``
      or ``"v2"``); ``None`` = the engine has one.

    Raises ConfigError when it contradicts itself (a value of the wrong type or range, a fused width
    other than the aux layers times the hidden size, an aux id outside ``0..num_target_layers``).
    """

    aux_layer_ids_resolved: tuple[int, ...]
    target_hidden_size: int
    expected_fused_width: int
    k: int
    num_target_layers: int
    aux_layer_ids_configured: tuple[int, ...] | None = None
    topk: int = 1
    num_draft_tokens: int | None = None
    dtype: str = "float32"
    aux_layer_ids_active: tuple[int, ...] | None = None
    model_runner: str | None = None

    def __post_init__(self) -> None:
        for name in ("target_hidden_size", "expected_fused_width", "k", "num_target_layers", "topk"):
            value = getattr(self, name)
            # no aux capture (prompt lookup, n-gram, MTP, draft models): no capture layers, width 0
            least = 0 if name == "expected_fused_width" and not self.aux_layer_ids_resolved else 1
            if not is_int(value) or value < least:
                raise ConfigError(f"RunConfig.{name} must be an int >= {least}, got {value!r}")
        if self.num_draft_tokens is not None and (not is_int(self.num_draft_tokens) or self.num_draft_tokens < 1):
            raise ConfigError(f"RunConfig.num_draft_tokens must be an int >= 1 or None, got {self.num_draft_tokens!r}")
        if not isinstance(self.dtype, str):
            raise ConfigError(f"RunConfig.dtype must be a string such as 'bfloat16', got {self.dtype!r}")
        if self.model_runner is not None and not isinstance(self.model_runner, str):
            raise ConfigError(f"RunConfig.model_runner must be a string such as 'v2' or None, got {self.model_runner!r}")
        for name in ("aux_layer_ids_resolved", "aux_layer_ids_configured"):
            ids = getattr(self, name)
            if ids is None and name == "aux_layer_ids_configured":
                continue
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__") or not all(is_int(i) for i in ids):
                raise ConfigError(f"RunConfig.{name} must be a sequence of ints, got {ids!r}")
            outside = [i for i in ids if not 0 <= i <= self.num_target_layers]
            if outside:
                raise ConfigError(f"RunConfig.{name} {list(ids)}: {outside} outside the target's hidden "
                                  f"states 0..{self.num_target_layers} (num_target_layers={self.num_target_layers})")
        fused = len(self.aux_layer_ids_resolved) * self.target_hidden_size
        if self.expected_fused_width != fused:
            raise ConfigError(
                f"RunConfig.expected_fused_width={self.expected_fused_width} contradicts "
                f"{len(self.aux_layer_ids_resolved)} aux layers x target_hidden_size {self.target_hidden_size} "
                f"= {fused} (fc.in_features of an EAGLE-3 draft)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``num_draft_tokens`` defaults to ``k + 1`` (SGLang's convention)."""
        return {
            "aux_layer_ids_configured": None if self.aux_layer_ids_configured is None
            else list(self.aux_layer_ids_configured),
            "aux_layer_ids_resolved": list(self.aux_layer_ids_resolved),
            "target_hidden_size": self.target_hidden_size,
            "expected_fused_width": self.expected_fused_width,
            "k": self.k,
            "topk": self.topk,
            "num_draft_tokens": self.num_draft_tokens if self.num_draft_tokens is not None else self.k + 1,
            "num_target_layers": self.num_target_layers,
            "dtype": self.dtype,
            "aux_layer_ids_active": None if self.aux_layer_ids_active is None
            else list(self.aux_layer_ids_active),
            "model_runner": self.model_runner,
        }
