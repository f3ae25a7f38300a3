"""Runtime finding codes and their severities (docs/design.md, "Finding codes"), and the one way to build one."""

from __future__ import annotations

from typing import Any

from specscope.events import Finding

SEVERITY = {
    "AUX_NOT_FUSED": "error",
    "AUX_CAPTURE_SILENT": "error",
    "AUX_CAPTURE_PARTIAL": "error",
    "AUX_LAYER_MISMATCH": "error",
    "ACCEPT_COLLAPSE": "error",
    "ACCEPT_SATURATED": "warning",
    "ACCEPT_COLLAPSE_SAMPLED": "warning",
    "LOSSLESS_VIOLATION": "error",
    "LOSSLESS_AUDITED": "info",
    "POSITION0_LOW": "warning",
    "NONFINITE_ACTIVATIONS": "error",
    "RANK_DIVERGENCE": "warning",
    "WEIGHTS_DROPPED": "error",
    "EVENTS_DROPPED": "warning",
    "HOOK_ERRORS": "warning",
    "GRAPH_MODE_BLIND": "info",
    "NOT_OBSERVED": "warning",
    "CHECKS_SKIPPED": "info",
    # a model runner the engine adapter cannot attach to (vLLM 0.32 runner v2; _rules_observed.check_runner)
    "RUNNER_NOT_ATTACHED": "warning",
}
CODES = tuple(SEVERITY)
CONTRACT_CODES = ("AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "AUX_CAPTURE_PARTIAL", "AUX_LAYER_MISMATCH")
"""The codes of the contract between the target's capture layers and the draft's input."""

# Engine knobs named in fixes (docs/design.md, "Where the engines let us in").
CAPTURE_KNOBS = ("SGLang `set_eagle3_layers_to_capture`, vLLM `set_aux_hidden_state_layers`, "
                 "draft config `eagle_aux_hidden_state_layer_ids`")


def finding(code: str, run_id: str, message: str, evidence: dict[str, Any], fix: str) -> Finding:
    """A :class:`~specscope.events.Finding` of ``code`` with its fixed severity, ``source="doctor"``."""
    return Finding(code=code, severity=SEVERITY[code], message=message, evidence=evidence, fix=fix,
                   run_id=run_id, source="doctor")



def named_ranks(code: str, evidence: Any) -> list[int]:
    """The ranks a finding pins itself to, from its evidence: ``rank`` (a load on one rank),
    RANK_DIVERGENCE's ``low_rank`` (its ``ranks`` are all the ranks compared, and a width divergence
    names no culprit), else ``ranks`` (the ranks it was seen on). Empty: a run-wide finding, or one
    not about ranks (checkpoint inspection). Evidence as stored (a dict, or anything else: none)."""
    if not isinstance(evidence, dict):
        return []
    if "rank" in evidence:
        return [evidence["rank"]]
    if code == "RANK_DIVERGENCE":
        return [evidence["low_rank"]] if "low_rank" in evidence else []
    return list(evidence.get("ranks", []))
