"""Save and load the reference EAGLE-3 draft checkpoint (``config.json`` + ``model.safetensors``).

The healthy load path is strict, like a loader should be: a missing or unexpected key raises
:class:`CheckpointError` naming the keys. The faults ``unrenamed-keys``, ``lm-head-missing`` and
``d2t-absolute`` reproduce what lenient real loaders do (SGLang / vLLM ``load_weights`` skip names they
do not map), so the failure is silent.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specscope.engine.draft import DraftConfig, Eagle3Draft
from specscope.errors import CheckpointError

DEFAULT_DRAFT_DIR = Path(__file__).parent / "assets" / "eagle3-smollm2-135m"
DRAFT_MODEL_ID = "specscope/eagle3-smollm2-135m (reference EAGLE-3 head)"
# Buffers and index maps keep their dtype; only floating weights are stored in half precision.
_KEEP_DTYPE = ("d2t", "t2d")


@dataclass(frozen=True)
class LoadedDraft:
    """A loaded draft and what its loader saw: ``checkpoint_keys`` as stored (after any fault's
    rewrite), ``missing`` parameters left at init, ``unexpected`` keys dropped, and whether the load
    was ``strict`` (raises on either) or lenient (silent, like the engines' ``load_weights``)."""

    model: Eagle3Draft
    path: Path
    checkpoint_keys: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    strict: bool


def save_draft(folder: str | Path, draft: Eagle3Draft) -> None:
    """Write ``config.json`` and ``model.safetensors`` (floating weights in float16, ``d2t`` int64,
    ``t2d`` bool) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    import json

    (folder / "config.json").write_text(json.dumps(draft.config.to_json(), indent=2) + "\n")
    state = {k: (v if k in _KEEP_DTYPE else v.to(torch.float16)).contiguous()
             for k, v in draft.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def read_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of ``folder/model.safetensors``. Raises CheckpointError if missing or unreadable."""
    path = Path(folder) / "model.safetensors"
    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read draft weights {path}: {exc}") from exc


def load_draft(folder: str | Path, embed_tokens: nn.Module, fault: str | None = None,
               dtype: torch.dtype = torch.float32, seed: int = 0) -> LoadedDraft:
    """Build an :class:`Eagle3Draft` and load ``folder``'s checkpoint into it.

    Args:
        folder: checkpoint folder (``config.json`` + ``model.safetensors``).
        embed_tokens: the target's embedding module (shared).
        fault: one of :data:`specscope.engine.faults.FAULTS` or None for the healthy, strict path.
        dtype: compute dtype of the draft.
        seed: seeds the random init that parameters the checkpoint does not provide keep.

    Raises:
        CheckpointError: unreadable files, or (healthy path) missing / unexpected keys, named.
        ConfigError: malformed ``config.json``.
    """
    cfg = DraftConfig.load(folder)
    torch.manual_seed(seed)
    model = Eagle3Draft(cfg, embed_tokens)
    state = _apply_fault(read_state(folder), fault)
    strict = fault not in ("unrenamed-keys", "lm-head-missing")
    result = model.load_state_dict(state, strict=False)
    if strict and (result.missing_keys or result.unexpected_keys):
        raise CheckpointError(f"draft checkpoint {folder} does not match the model: missing keys "
                              f"{sorted(result.missing_keys)}, unexpected keys {sorted(result.unexpected_keys)}")
    model.to(dtype).eval()
    return LoadedDraft(model, Path(folder), tuple(state), tuple(result.missing_keys),
                       tuple(result.unexpected_keys), strict)


def write_faulty_draft(source: str | Path, dest: str | Path, fault: str) -> Path:
    """Copy the draft checkpoint at ``source`` to ``dest`` with ``fault``'s change written into its
    weights (e.g. ``d2t-absolute``), for engines that load the folder themselves (vLLM). Returns
    ``dest``. Raises CheckpointError for unreadable weights."""
    source, dest = Path(source), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", dest / "config.json")
    state = {k: v.contiguous() for k, v in _apply_fault(read_state(source), fault).items()}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _apply_fault(state: dict[str, torch.Tensor], fault: str | None) -> dict[str, torch.Tensor]:
    if fault == "unrenamed-keys":  # speculators layout handed to a loader that maps midlayer.* only
        return {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    if fault == "lm-head-missing":
        return {k: v for k, v in state.items() if k != "lm_head.weight"}
    if fault == "d2t-absolute":  # converted twice: offsets turned into absolute ids
        d2t = state["d2t"]
        return {**state, "d2t": d2t + torch.arange(d2t.numel(), dtype=d2t.dtype)}
    return state
