"""What every check reads: the opened checkpoint, the normalised configs, the engine's key plan."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specscope.checkpoint_reader import CheckpointReader
from specscope.conventions import LoadPlan
from specscope.inspector._config import DraftConfig, TargetConfig
from specscope.inspector._stats import TensorStats, tensor_stats

MAP_MAX_BYTES = 32 * 2**20
"""Most bytes a vocabulary map (``d2t`` int64, ``t2d`` bool) may declare: 4M int64 entries, 16x the
largest vocabularies in use (262,144). The checks hold a few int64 copies of it at once."""


@dataclass
class CheckContext:
    """Inputs of the checks, with values read lazily and cached (each tensor read at most once).

    ``serve_dtype``: ``"bf16"``, ``"fp16"``, ``"fp32"`` or ``None`` (not said). ``target_weights``: the
    target's safetensors when ``--target`` is a model folder holding them; ``shared``: the shared-tensor
    comparison rows (``_checks_shared.shared_rows``), filled once before the checks run;
    ``loaded_d2t``: the ``d2t`` the engine holds after loading the draft, where the caller read it
    (the vLLM plugin: vLLM's ``draft_id_to_target_id``).
    """

    reader: CheckpointReader
    config: DraftConfig
    engine: str
    plan: LoadPlan
    format: str
    target: TargetConfig | None = None
    serve_dtype: str | None = None
    target_weights: CheckpointReader | None = None
    shared: list[dict] = field(default_factory=list)
    loaded_d2t: np.ndarray | None = None
    _values: dict[str, np.ndarray] = field(default_factory=dict)
    _stats: dict[str, TensorStats] = field(default_factory=dict)

    def has(self, key: str) -> bool:
        return key in self.reader.tensors

    def shape(self, key: str) -> tuple[int, ...] | None:
        """Shape of checkpoint tensor ``key`` from its header, ``None`` when absent."""
        info = self.reader.tensors.get(key)
        return info.shape if info is not None else None

    def value(self, key: str) -> np.ndarray:
        """The whole (small) tensor ``key``: ``d2t``, ``t2d``; at most :data:`MAP_MAX_BYTES`.

        Raises:
            CheckpointError: its header declares more (before anything is read).
        """
        if key not in self._values:
            self._values[key] = self.reader.get(key, max_bytes=MAP_MAX_BYTES)
        return self._values[key]

    def d2t(self) -> np.ndarray:
        """The ``d2t`` the engine serves: :attr:`loaded_d2t` when read, else the checkpoint's."""
        return self.loaded_d2t if self.loaded_d2t is not None else self.value("d2t")

    def stats(self, key: str) -> TensorStats:
        """Value statistics of floating-point tensor ``key`` (read in chunks once, then cached)."""
        if key not in self._stats:
            self._stats[key] = tensor_stats(self.reader, key)
        return self._stats[key]

    def float_keys(self) -> list[str]:
        return sorted(k for k, t in self.reader.tensors.items() if t.is_float)

    @property
    def hidden_size(self) -> int | None:
        """Draft hidden width: the config's, else the width of ``norm.weight``."""
        norm = self.shape("norm.weight")
        return self.config.hidden_size or (norm[0] if norm else None)

    @property
    def target_vocab_size(self) -> int | None:
        """Target vocabulary: ``--target-config`` when given, else the draft config's ``vocab_size``."""
        if self.target is not None and self.target.vocab_size is not None:
            return self.target.vocab_size
        return self.config.vocab_size

    @property
    def draft_vocab_size(self) -> int | None:
        """Rows the engine gives the draft head: ``draft_vocab_size``, defaulting to ``vocab_size``."""
        return self.config.draft_vocab_size or self.config.vocab_size
