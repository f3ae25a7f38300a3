"""Normalised draft and target configurations.

EAGLE / SpecForge / SGLang drafts keep a flat Llama config with ``draft_vocab_size``,
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``; speculators configs
nest the layer config under ``transformer_layer_config`` and carry ``speculators_config``
(docs/design.md, "EAGLE-3 conventions"). Both become one :class:`DraftConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specscope.conventions import DRAFT_BEHAVIOUR_KEYS
from specscope.errors import CheckpointError

DEFAULT_INITIALIZER_RANGE = 0.02
"""HF ``PretrainedConfig.initializer_range`` default: std of the normal init of Llama projections."""


MAX_COUNT = 2**63 - 1
"""Largest config count taken (an int64, what engines size by): a 4,000-digit ``vocab_size`` is
refused here, before arithmetic on it makes numbers too long to print."""


def _int(value: Any) -> int | None:
    """A config count: an int (or a whole float, as some exporters write them); None when the key is
    absent or not a number. Raises CheckpointError for a fractional, non-finite or out-of-range
    number, which no engine can size anything by."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise CheckpointError(f"config value {value!r} is not a whole number")
    if abs(value) > MAX_COUNT:
        raise CheckpointError(f"config value {_short(value)} is out of range (at most {MAX_COUNT})")
    return int(value)


def _real(value: Any) -> float | None:
    """A config number as a float; None when absent or not a number. Raises CheckpointError for an
    int past a float's range."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError as exc:
        raise CheckpointError(f"config value {_short(value)} is out of range") from exc


def _short(value: Any) -> str:
    """``repr(value)``, cut to its start when long (a message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text):,} characters)"


def _float(value: Any, key: str) -> float:
    number = _real(value)
    if number is None or not math.isfinite(number):
        raise CheckpointError(f"config {key} must be a finite number, got {_short(value)}")
    return number


_DEFAULT_ROPE = ("default", None, None)


def _rope(raw: dict[str, Any]) -> tuple[float | None, tuple[str, float | None, int | None]]:
    """``(rope_theta, (type, factor, original_max_position_embeddings))`` of a HF config dict.

    Reads ``rope_theta`` / ``rope_scaling`` (transformers 4.x) and ``rope_parameters`` (transformers 5,
    which also holds the theta); the scaling type is ``rope_type`` or the older ``type``; no scaling
    is ``("default", None, None)``.
    """
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    scaling = raw.get("rope_scaling") if isinstance(raw.get("rope_scaling"), dict) else params
    theta = _real(raw.get("rope_theta", params.get("rope_theta")))
    kind = scaling.get("rope_type", scaling.get("type")) or "default"
    if kind == "default":
        return theta, _DEFAULT_ROPE
    factor = scaling.get("factor")
    return theta, (str(kind), _real(factor), _int(scaling.get("original_max_position_embeddings")))


@dataclass(frozen=True)
class ModelSettings:
    """The settings a draft and its target must agree on, one side's values; ``None`` where not said.

    ``rope_scaling``: ``(type, factor, original_max_position_embeddings)``, ``("default", None, None)``
    for plain RoPE; ``sliding_window``: window in tokens, ``None`` when attention is full (a config with
    ``use_sliding_window: false`` counts as full); ``layer_types``: per-layer attention kinds
    (``"sliding_attention"`` / ``"full_attention"``) when the config lists them.
    """

    hidden_size: int | None = None
    vocab_size: int | None = None
    num_hidden_layers: int | None = None
    head_dim: int | None = None
    rope_theta: float | None = None
    rope_scaling: tuple[str, float | None, int | None] = _DEFAULT_ROPE
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    tie_word_embeddings: bool | None = None


def model_settings(raw: dict[str, Any]) -> ModelSettings:
    """The :class:`ModelSettings` of a flat HF config dict (callers merge nested configs first)."""
    theta, scaling = _rope(raw)
    heads, hidden = _int(raw.get("num_attention_heads")), _int(raw.get("hidden_size"))
    layer_types = raw.get("layer_types")
    window = _int(raw.get("sliding_window")) if raw.get("use_sliding_window") is not False else None
    tie = raw.get("tie_word_embeddings")
    return ModelSettings(
        hidden_size=hidden, vocab_size=_int(raw.get("vocab_size")),
        num_hidden_layers=_int(raw.get("num_hidden_layers")),
        head_dim=_int(raw.get("head_dim")) or (hidden // heads if hidden and heads else None),
        rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=_int(raw.get("max_position_embeddings")),
        sliding_window=window,
        layer_types=tuple(str(t) for t in layer_types) if isinstance(layer_types, list) else None,
        tie_word_embeddings=bool(tie) if isinstance(tie, bool) else None)


@dataclass(frozen=True)
class DraftConfig:
    """What the checks need from a draft config; ``None`` where the config does not say.

    Sizes are element counts. ``target_hidden_size`` defaults to ``hidden_size`` (engines do the same);
    ``aux_layer_ids`` is ``None`` when the engine default applies. ``settings``: the draft side of the
    draft-target contract; ``behaviour``: the :data:`~specscope.conventions.DRAFT_BEHAVIOUR_KEYS` the
    config sets, with their values.
    """

    hidden_size: int | None = None
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    num_hidden_layers: int = 1
    tie_word_embeddings: bool = False
    aux_layer_ids: tuple[int, ...] | None = None
    initializer_range: float = DEFAULT_INITIALIZER_RANGE
    speculators: bool = False
    settings: ModelSettings = ModelSettings()
    behaviour: tuple[tuple[str, Any], ...] = ()

    @property
    def pruned_vocab(self) -> bool:
        """Whether the draft predicts a subset of the target vocabulary (d2t / t2d needed)."""
        return (self.draft_vocab_size is not None and self.vocab_size is not None
                and self.draft_vocab_size < self.vocab_size)


def _aux_ids(raw: dict[str, Any]) -> tuple[int, ...] | None:
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(_int(i) is not None for i in ids):
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must be a list of ints, got {_short(ids)}")
    return tuple(int(i) for i in ids)


def draft_config(raw: dict[str, Any] | None) -> DraftConfig:
    """Normalise a draft ``config.json`` (EAGLE/SpecForge flat or speculators nested); ``None`` -> empty.

    Raises :class:`CheckpointError` when aux layer ids are not a list of ints.
    """
    if raw is None:
        return DraftConfig()
    speculators = "speculators_config" in raw or "speculators_model_type" in raw
    layer = raw.get("transformer_layer_config") if isinstance(raw.get("transformer_layer_config"), dict) else {}
    merged = {**layer, **raw}
    hidden = _int(merged.get("hidden_size"))
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    flat = {**merged, **{f"eagle_config.{k}": v for k, v in eagle.items()}}
    return DraftConfig(
        hidden_size=hidden,
        vocab_size=_int(merged.get("vocab_size")),
        draft_vocab_size=_int(merged.get("draft_vocab_size")),
        target_hidden_size=_int(merged.get("target_hidden_size")) or hidden,
        num_hidden_layers=_int(merged.get("num_hidden_layers")) or 1,
        tie_word_embeddings=bool(merged.get("tie_word_embeddings", False)),
        aux_layer_ids=_aux_ids(raw),
        initializer_range=_float(merged.get("initializer_range", DEFAULT_INITIALIZER_RANGE), "initializer_range"),
        speculators=speculators,
        settings=model_settings(merged),
        behaviour=tuple((k, flat[k]) for k in DRAFT_BEHAVIOUR_KEYS if k in flat),
    )


@dataclass(frozen=True)
class TargetConfig(ModelSettings):
    """The target (verifier) model facts the draft must agree with: widths and counts in elements.

    ``kind``: ``"config"`` (a bare config.json), ``"hf-folder"`` (a model folder) or ``"gguf"``;
    ``architectures``: the config's ``architectures`` (``None`` when absent; a GGUF names its
    ``general.architecture``); ``path``: where it was read.
    """

    architectures: tuple[str, ...] | None = None
    kind: str = "config"
    path: str = ""


def target_from_config(raw: dict[str, Any], kind: str = "config", path: str = "") -> TargetConfig:
    """A :class:`TargetConfig` from a target ``config.json`` dict; a nested ``text_config`` is honoured."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    arch = raw.get("architectures")
    return TargetConfig(**vars(model_settings({**raw, **text})),
                        architectures=tuple(str(a) for a in arch) if isinstance(arch, list) and arch else None,
                        kind=kind, path=path)
