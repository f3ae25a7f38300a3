"""Load check: what a loader does with a checkpoint's keys for one module, as a :class:`LoadReport`.

Which keys a loader renames, consumes or drops is decided by :func:`specscope.conventions.plan_load`
(shared with the checkpoint inspector); this module only gathers the two key sets and reports.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from specscope.checkpoint_reader import CheckpointReader
from specscope.conventions import plan_load
from specscope.events import LoadReport
from specscope.instrumentation.tracer import Tracer


def checkpoint_keys(checkpoint: Mapping[str, Any] | str | os.PathLike | Iterable[str]) -> tuple[list[str], str]:
    """``(keys, source)`` of a state dict, a checkpoint path (a ``.safetensors`` file, a folder with
    ``model.safetensors``, a sharded set or loose ``*.safetensors``: headers only, read by the
    :class:`~specscope.checkpoint_reader.CheckpointReader` the inspector uses) or a plain key list.
    Raises :class:`~specscope.errors.CheckpointError` for a path that is missing or not a readable
    safetensors checkpoint."""
    if isinstance(checkpoint, Mapping):
        return [str(k) for k in checkpoint], "state_dict"
    if isinstance(checkpoint, (str, os.PathLike)):
        return list(CheckpointReader(checkpoint).tensors), str(checkpoint)
    return [str(k) for k in checkpoint], "keys"


def check_load(tracer: Tracer, module_or_param_names: nn.Module | Iterable[str],
               checkpoint: Mapping[str, Any] | str | os.PathLike | Iterable[str], *,
               engine: str = "reference", strict: bool | None = None,
               module_name: str = "draft") -> LoadReport:
    """Compare a checkpoint's keys with a module's ``state_dict()`` keys as ``engine``'s loader would.

    ``module_or_param_names``: the module (parameters and persistent buffers) or its names;
    ``checkpoint``: a state dict, a ``.safetensors`` path (header only) or a key list; ``engine``: a
    loader convention of :mod:`specscope.conventions` (``reference``, ``sglang``, ``vllm``, ``eagle``,
    ``speculators``); ``strict``: whether the loader fails on missing/unexpected keys (None: the
    engine's convention). Emits and returns a :class:`LoadReport`: ``loaded`` (keys that land in a
    parameter, renamed ones included), ``missing`` (parameters left at their init), ``unexpected``
    (checkpoint keys dropped), ``renamed`` (checkpoint key -> parameter). Raises
    :class:`~specscope.errors.CheckpointError` for an unreadable checkpoint, :class:`~specscope.errors.ConfigError` for an unknown engine.
    """
    keys, source = checkpoint_keys(checkpoint)
    if isinstance(module_or_param_names, nn.Module):
        expected = list(module_or_param_names.state_dict(keep_vars=True))
    else:
        expected = [str(name) for name in module_or_param_names]
    plan = plan_load(engine, keys, expected)
    tracer.start()
    report = LoadReport(tracer.run_id, tracer.rank, module_name, source,
                        plan.strict if strict is None else strict,
                        len(plan.loaded) + len(plan.renamed), plan.missing, plan.dropped, plan.renamed)
    tracer.hook_state.emit(report)
    return report
