"""Finding codes, their severities, the one way to build a finding and its text form, for the doctor
(runtime, ``source="doctor"``) and the inspector (checkpoint, ``source="inspect"``) alike
(docs/design.md, "Finding codes"; :class:`~specscope.events.Finding` is the record)."""

from __future__ import annotations

from typing import Any

from specscope.events import Finding
from specscope.results import terminal_text

_CHECKPOINT = {
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
}
_RUNTIME = {
    "AUX_NOT_FUSED": "error",
    "AUX_CAPTURE_SILENT": "error",
    "AUX_CAPTURE_PARTIAL": "error",
    "AUX_LAYER_MISMATCH": "error",
    "ACCEPT_COLLAPSE": "error",
    "ACCEPT_SATURATED": "warning",
    "ACCEPT_COLLAPSE_SAMPLED": "warning",
    "LOSSLESS_VIOLATION": "error",
    "LOSSLESS_AUDITED": "info",
    "REPLAY_DIVERGENCE": "error",  # warning when every departure is a near-tie
    "REPLAY_AUDITED": "info",
    "POSITION0_LOW": "warning",
    "ACCEPT_DRIFT": "warning",
    "REQUEST_ACCEPT_OUTLIER": "warning",
    "NONFINITE_ACTIVATIONS": "error",
    "RANK_DIVERGENCE": "warning",
    "WEIGHTS_DROPPED": "error",
    "EVENTS_DROPPED": "warning",
    "HOOK_ERRORS": "warning",
    "GRAPH_MODE_BLIND": "info",
    "NOT_OBSERVED": "warning",
    # a model runner the engine adapter cannot attach to (vLLM 0.32 runner v2; _rules_observed.check_runner)
    "RUNNER_NOT_ATTACHED": "warning",
    # rows of a run stored without its RunStart: a recording problem (_rules_observed.check_run_start)
    "RUN_START_MISSING": "warning",
}
# Both sources name what they could not check the same way, so a reader of the store (the dashboard's
# "not checked" box, the exporter) treats the two alike; the evidence says which checks.
_EITHER = {"CHECKS_SKIPPED": "info"}

SEVERITY = {**_CHECKPOINT, **_RUNTIME, **_EITHER}
"""Every finding code and its fixed severity."""
CODES = {"doctor": (*_RUNTIME, *_EITHER), "inspect": (*_CHECKPOINT, *_EITHER)}
"""The codes each source raises."""
CONTRACT_CODES = ("AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "AUX_CAPTURE_PARTIAL", "AUX_LAYER_MISMATCH")
"""The codes of the contract between the target's capture layers and the draft's input."""

# Engine knobs named in fixes (docs/design.md, "Where the engines let us in").
CAPTURE_KNOBS = ("SGLang `set_eagle3_layers_to_capture`, vLLM `set_aux_hidden_state_layers`, "
                 "draft config `eagle_aux_hidden_state_layer_ids`")


def _build(source: str, code: str, message: str, evidence: dict[str, Any], fix: str,
           run_id: str | None, severity: str | None = None) -> Finding:
    if code not in CODES[source]:
        raise ValueError(f"{code} is not a {source} finding code")
    return Finding(code=code, severity=severity or SEVERITY[code], message=message, evidence=evidence, fix=fix,
                   run_id=run_id, source=source)


def runtime_finding(code: str, run_id: str, message: str, evidence: dict[str, Any], fix: str, *,
                    severity: str | None = None) -> Finding:
    """The doctor's finding ``code`` about run ``run_id``, with the code's severity, or ``severity``
    where the rule grades it (``REPLAY_DIVERGENCE``: a warning when it is near-ties only)."""
    return _build("doctor", code, message, evidence, fix, run_id, severity)


def checkpoint_finding(code: str, message: str, evidence: dict[str, Any], fix: str, *,
                       severity: str | None = None) -> Finding:
    """The inspector's finding ``code`` (no run: the demo attaches one when it stores the report), with
    the code's severity, or ``severity`` where the engine inspected for is known not to act on the
    problem (the warning then names the engines that would)."""
    return _build("inspect", code, message, evidence, fix, None, severity)


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


_LISTED = 3  # list items shown per evidence value in text; --json has them all


def evidence_line(evidence: dict[str, Any]) -> str:
    """Scalars and flat lists (long ones shortened); nested details stay in ``--json``."""
    shown = []
    for key, value in evidence.items():
        if isinstance(value, dict) or (isinstance(value, list)
                                       and any(isinstance(x, (dict, list)) for x in value)):
            continue
        if isinstance(value, list) and len(value) > _LISTED:
            value = "[" + ", ".join(map(str, value[:_LISTED])) + f", +{len(value) - _LISTED} more]"
        shown.append(f"{key}={value}")
    return ", ".join(shown)


def finding_lines(finding: Finding) -> list[str]:
    """A finding for people: severity, code, its run (a checkpoint finding stored with a run says
    so) and message, then its evidence and fix, indented; each stored value on its line
    (:func:`~specscope.results.terminal_text`: a newline in a run id would forge a line)."""
    where = ""
    if finding.run_id is not None:
        origin = " (checkpoint inspection)" if finding.source == "inspect" else ""
        where = f" [run {terminal_text(finding.run_id)}]{origin}"
    lines = [f"{finding.severity.upper():7} {finding.code}{where}: {terminal_text(finding.message)}"]
    if shown := evidence_line(finding.evidence):
        lines.append(f"        evidence: {terminal_text(shown)}")
    lines.append(f"        fix: {terminal_text(finding.fix)}")
    return lines
