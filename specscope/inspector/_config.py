"""Normalised draft and target configurations.

EAGLE / SpecForge / SGLang drafts keep a flat Llama config with ``draft_vocab_size``,
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``; speculators configs
nest the layer config under ``transformer_layer_config`` and carry ``speculators_config``
(DESIGN.md section 5). Both become one :class:`DraftConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope.errors import CheckpointError, ConfigError

DEFAULT_INITIALIZER_RANGE = 0.02
"""HF ``PretrainedConfig.initializer_range`` default: std of the normal init of Llama projections."""


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class DraftConfig:
    """What the checks need from a draft config; ``None`` where the config does not say.

    Sizes are element counts. ``target_hidden_size`` defaults to ``hidden_size`` (engines do the same);
    ``aux_layer_ids`` is ``None`` when the engine default applies.
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
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids must be a list of ints, got {ids!r}")
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
    return DraftConfig(
        hidden_size=hidden,
        vocab_size=_int(merged.get("vocab_size")),
        draft_vocab_size=_int(merged.get("draft_vocab_size")),
        target_hidden_size=_int(merged.get("target_hidden_size")) or hidden,
        num_hidden_layers=_int(merged.get("num_hidden_layers")) or 1,
        tie_word_embeddings=bool(merged.get("tie_word_embeddings", False)),
        aux_layer_ids=_aux_ids(raw),
        initializer_range=float(merged.get("initializer_range", DEFAULT_INITIALIZER_RANGE)),
        speculators=speculators,
    )


@dataclass(frozen=True)
class TargetConfig:
    """The target (verifier) model facts the draft must agree with: widths and counts in elements."""

    hidden_size: int | None
    vocab_size: int | None
    num_hidden_layers: int | None


def load_target_config(path: str | Path) -> TargetConfig:
    """Read a target ``config.json`` (or a folder holding one); nested ``text_config`` is honoured.

    Raises :class:`ConfigError` when the file is missing or not a JSON object.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"no target config at {file}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"target config {file} is not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"target config {file} is not a JSON object")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    merged = {**raw, **text}
    return TargetConfig(_int(merged.get("hidden_size")), _int(merged.get("vocab_size")),
                        _int(merged.get("num_hidden_layers")))
