"""``inspect_checkpoint``: read a draft checkpoint lazily, plan its keys, run every check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from specscope.checkpoint_reader import CheckpointReader
from specscope.conventions import ENGINES, expected_draft_params, plan_load
from specscope.errors import ConfigError
from specscope.events import Finding, by_severity
from specscope.findings import checkpoint_finding
from specscope.inspector._checks_contract import CONTRACT_CHECKS, contract_rows
from specscope.inspector._checks_keys import check_keys_dropped, check_lm_head, check_params_missing
from specscope.inspector._checks_shapes import (
    check_aux_convention,
    check_aux_count,
    check_aux_order,
    check_fc,
    check_head_rows,
    check_target_sizes,
    check_tied,
)
from specscope.inspector._checks_shared import check_shared, shared_rows
from specscope.inspector._checks_values import check_fp16_range, check_nonfinite, check_untrained
from specscope.inspector._checks_vocab import check_vocab_maps
from specscope.inspector._compare import compare as compare_drafts
from specscope.inspector._config import TargetConfig, draft_config
from specscope.inspector._context import CheckContext
from specscope.inspector._format import check_format, detect_format
from specscope.inspector._report import InspectionReport, draft_key_rows
from specscope.inspector._target import load_target_config, open_target_weights

SERVE_DTYPES = ("bf16", "fp16", "fp32")
CONFIG_CODES = ("AUX_LAYER_COUNT_MISMATCH", "AUX_LAYER_IDS_CONVENTION", "AUX_LAYER_IDS_ORDER", "LM_HEAD_MISSING",
                "DRAFT_VOCAB_MISMATCH", "D2T_IDENTITY_WITH_PRUNED_VOCAB", "TIED_EMBEDDINGS_MISMATCH")
"""Checks that read the draft's ``config.json`` (aux ids, draft vocabulary, tied embeddings)."""

CHECKS: tuple[Callable[[CheckContext], list[Finding]], ...] = (
    check_format, check_keys_dropped, check_params_missing, check_lm_head, check_fc, check_aux_count,
    check_aux_order, check_aux_convention, check_vocab_maps, check_head_rows, check_target_sizes, check_tied,
    check_untrained, check_nonfinite, check_fp16_range, *CONTRACT_CHECKS, check_shared,
)


def inspect_checkpoint(path: str | Path, engine: str = "sglang",
                       target_config: str | Path | TargetConfig | None = None,
                       serve_dtype: str | None = None, *, target: str | Path | None = None,
                       compare: str | Path | None = None, loaded_d2t: np.ndarray | None = None) -> InspectionReport:
    """Inspect the EAGLE-3 draft checkpoint at ``path`` for ``engine``'s loader.

    ``path``: a folder (``config.json`` + ``model.safetensors`` or a sharded set with
    ``model.safetensors.index.json``) or one ``.safetensors`` file. ``target``: the target model (a
    model folder, whose safetensors are compared with the draft's shared tensors, a bare
    ``config.json``, a ``.gguf`` file, or ``"reference"`` for the reference engine's GGUF) for the
    contract checks. ``target_config``: the older spelling (a config path or a :class:`TargetConfig`;
    no weights). ``serve_dtype``: ``"bf16"``, ``"fp16"`` or ``"fp32"`` (the fp16 range check runs for
    ``"fp16"``). ``compare``: an older draft of the same target to diff against (``--compare``).
    ``loaded_d2t``: the ``d2t`` the engine holds after loading this draft (the vLLM plugin reads
    vLLM's ``draft_id_to_target_id``), judged in place of the checkpoint's.
    Peak memory stays near a few float32 copies of one read chunk (4 MiB of data), whatever the
    size of the checkpoint (``benchmarks/inspect_memory.py``), except that the shared-tensor and
    ``--compare`` checks hold the draft's ``lm_head`` in float32. Raises
    :class:`~specscope.errors.CheckpointError` for an unreadable checkpoint and
    :class:`~specscope.errors.ConfigError` for an unknown engine or serve dtype, an unreadable target,
    or both ``target`` and ``target_config``.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
    if serve_dtype is not None and serve_dtype not in SERVE_DTYPES:
        raise ConfigError(f"unknown serve dtype {serve_dtype!r}; expected one of {', '.join(SERVE_DTYPES)}")
    if target is not None and target_config is not None:
        raise ConfigError("give the target once: --target or --target-config, not both")
    weights = None
    if target is not None:
        target_config, weights = load_target_config(target), open_target_weights(target)
    elif target_config is not None and not isinstance(target_config, TargetConfig):
        target_config = load_target_config(target_config)
    reader = CheckpointReader(path)
    config = draft_config(reader.config)
    keys = list(reader.tensors)
    expected = expected_draft_params(engine, config.num_hidden_layers,
                                     pruned_vocab=config.pruned_vocab or "d2t" in keys,
                                     tied_embeddings=config.tie_word_embeddings)
    ctx = CheckContext(reader=reader, config=config, engine=engine, plan=plan_load(engine, keys, expected),
                       format=detect_format(keys, reader.config), target=target_config,
                       serve_dtype=serve_dtype, target_weights=weights, loaded_d2t=loaded_d2t)
    ctx.shared = shared_rows(ctx)
    findings = [f for check in CHECKS for f in check(ctx)]
    if reader.config is None:
        findings.append(checkpoint_finding(
            "CHECKS_SKIPPED", f"no config.json beside the weights: {', '.join(CONFIG_CODES)} not checked",
            {"not_checked": list(CONFIG_CODES), "reason": "no config.json"},
            "Put the draft's config.json next to the weights (the engine needs it to serve them too)."))
    diff = None
    if compare is not None:
        diff, compare_findings = compare_drafts(ctx, str(compare))
        findings += compare_findings
    contract = {"target": None if target_config is None else {
                    "path": target_config.path, "kind": target_config.kind,
                    "architectures": list(target_config.architectures or []) or None},
                "settings": contract_rows(ctx), "draft_keys": draft_key_rows(engine, config),
                "shared_tensors": ctx.shared}
    return InspectionReport(str(path), ctx.format, engine, tuple(by_severity(findings)), ctx.plan,
                            contract, diff)
