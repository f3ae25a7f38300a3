"""Checkpoint finding codes and their severities (docs/design.md, "Finding codes"), and the one way to build one."""

from __future__ import annotations

from typing import Any

from specscope.events import Finding

SEVERITY = {
    "CKPT_FORMAT": "info",
    "KEYS_DROPPED": "error",
    "PARAM_MISSING": "error",
    "LM_HEAD_MISSING": "error",
    "FC_SHAPE_MISMATCH": "error",
    "AUX_LAYER_COUNT_MISMATCH": "error",
    "AUX_LAYER_IDS_CONVENTION": "warning",
    "AUX_LAYER_IDS_ORDER": "warning",
    "D2T_NOT_OFFSETS": "error",
    "D2T_INVALID": "error",
    "VOCAB_MAP_MISMATCH": "warning",  # no serving engine reads t2d (docs/design.md, "EAGLE-3 conventions")
    "D2T_IDENTITY_WITH_PRUNED_VOCAB": "warning",
    "DRAFT_VOCAB_MISMATCH": "error",
    "VOCAB_SIZE_MISMATCH": "error",
    "HIDDEN_SIZE_MISMATCH": "error",
    "UNTRAINED_WEIGHTS": "warning",
    "NONFINITE_WEIGHTS": "error",
    "FP16_OVERFLOW_RISK": "warning",
    "TIED_EMBEDDINGS_MISMATCH": "warning",
    "ROPE_MISMATCH": "warning",
    "MAX_POSITIONS_MISMATCH": "warning",
    "SLIDING_WINDOW_IGNORED": "warning",
    "DRAFT_KEY_IGNORED": "warning",
    "AUX_LAYER_OUT_OF_RANGE": "error",
    "TARGET_TIED_WEIGHT_MISSING": "error",
    "SHARED_TENSOR_REPLACED": "warning",
    "DRAFT_HEAD_IS_TARGET_HEAD": "warning",
    "CONTRACT_CHANGED": "warning",
    "HEAD_ROWS_STALE": "error",
    "CHECKS_SKIPPED": "info",
}
CODES = tuple(SEVERITY)


def finding(code: str, message: str, evidence: dict[str, Any], fix: str, *, severity: str | None = None) -> Finding:
    """A :class:`~specscope.events.Finding` of ``code``, ``source="inspect"``, with the code's severity
    or ``severity`` where the engine inspected for is known not to act on the problem (the warning
    then names the engines that would)."""
    return Finding(code=code, severity=severity or SEVERITY[code], message=message, evidence=evidence, fix=fix,
                   source="inspect")

