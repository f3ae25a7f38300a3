"""Rules on what flows from the target's capture layers into the draft (docs/design.md, "The failure" and "EAGLE-3 conventions").

Evidence comes from three recordings of the instrumentation: the draft's target-fed input width
(``expected_width`` = the run's ``expected_fused_width`` marks the first draft call after the target
ran), the ``target.layers.{i}:input`` events of the configured capture layers, and provenance rows
(which layer every target-width chunk of the draft input matched by fingerprint). Counts are of
recorded (sampled) events, not of all calls.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from specscope.doctor._context import RunContext
from specscope.events import Finding
from specscope.findings import CAPTURE_KNOBS, runtime_finding

Received = tuple[int | None, ...]


def check_not_fused(ctx: RunContext) -> list[Finding]:
    """AUX_NOT_FUSED: a target-fed draft input whose width is not n_aux x H, per hook point."""
    fused = ctx.fused_width
    widths: dict[str, Counter] = {}
    ranks: dict[str, set[int]] = {}
    for row in ctx.fed_widths:
        if row.width != fused:
            widths.setdefault(row.hook_point, Counter())[row.width] += row.events
            ranks.setdefault(row.hook_point, set()).add(row.rank)
    findings = []
    for point, counts in widths.items():
        width, _ = counts.most_common(1)[0]
        calls = sum(counts.values())
        findings.append(runtime_finding(
            "AUX_NOT_FUSED", ctx.run_id,
            f"{point} is {width} wide on target-fed draft calls where {fused} (the fused aux hidden "
            f"states) is expected; fc fusion is skipped or fed the wrong tensor ({calls} recorded calls)",
            {"observed_width": width, "expected_width": fused, "calls": calls, "hook_point": point,
             "target_hidden_size": ctx.hidden_size, "ranks": sorted(ranks[point])},
            f"Make the target capture its aux hidden states and pass their concatenation ({fused} wide) "
            f"to the draft: check {CAPTURE_KNOBS}."))
    return findings


def classify(received: Received, configured: tuple[int, ...], num_layers: int | None) -> str:
    """``"match"``, ``"silent"`` (no chunk from a capture point: final hidden state or no match),
    ``"mismatch"`` (another layer, or the configured ones in another order) or ``"partial"`` (a
    subset of the configured layers)."""
    if tuple(received) == tuple(configured):
        return "match"
    layers = [r for r in received if r is not None and r != num_layers]
    if not layers:
        return "silent"
    if any(r not in configured for r in layers) or set(layers) == set(configured):
        return "mismatch"
    return "partial"


def provenance_verdicts(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """Provenance by majority (plurality) of each rank's samples, ties going to ``"match"``, then
    gathered per verdict: ``{verdict: {ranks, received (its most frequent answer), samples,
    matching_samples, verdict_samples}}`` over the ranks with that verdict. Empty without provenance.
    Per rank, so one broken rank is not outvoted by healthy ones."""
    per_rank: dict[int, dict[str, Counter]] = {}
    for rank, received, samples in ctx.provenance:
        verdict = classify(received, ctx.capture_layers, ctx.num_target_layers)
        per_rank.setdefault(rank, {}).setdefault(verdict, Counter())[received] += samples
    gathered: dict[str, dict[str, Any]] = {}
    for rank, by_class in per_rank.items():
        totals = {verdict: sum(c.values()) for verdict, c in by_class.items()}
        verdict = max(totals, key=lambda v: (totals[v], v == "match"))
        entry = gathered.setdefault(verdict, {"ranks": [], "answers": Counter(), "samples": 0,
                                              "matching_samples": 0, "verdict_samples": 0})
        entry["ranks"].append(rank)
        entry["answers"].update(by_class[verdict])
        entry["samples"] += sum(totals.values())
        entry["matching_samples"] += totals.get("match", 0)
        entry["verdict_samples"] += totals[verdict]
    for entry in gathered.values():
        entry["received"] = list(entry.pop("answers").most_common(1)[0][0])
    return gathered


def check_capture_silent(ctx: RunContext) -> list[Finding]:
    """AUX_CAPTURE_SILENT: the draft ran but no configured capture layer's data reached it."""
    layers = list(ctx.capture_layers)
    active = ctx.active_capture_layers
    # The engine saying it captures nothing is evidence even if the draft never ran (vLLM fails on
    # its first verify step then).
    if not layers or not (ctx.draft_ran or active == ()):
        return []
    evidence: dict[str, Any] = {"configured": layers}
    reasons = []
    if active == ():
        evidence["active"] = []
        reasons.append("the engine activated no aux capture after loading the target "
                       "(vLLM: aux_hidden_state_layers is empty)")
    # A target that was not instrumented at all records no target event: no evidence either way.
    if ctx.draft_ran and ctx.target_observed and not any(ctx.capture_events.values()):
        evidence["capture_layer_events"] = 0
        reasons.append(f"no event from capture layers {layers}")
    proof = provenance_verdicts(ctx).get("silent")
    if proof is not None:
        evidence.update(received=proof["received"], ranks=proof["ranks"], samples=proof["samples"],
                        silent_samples=proof["verdict_samples"],
                        matching_samples=proof["matching_samples"],
                        final_hidden_state=ctx.num_target_layers)
        reasons.append(f"the draft input matched {_describe(proof['received'], ctx.num_target_layers)} "
                       f"in {proof['verdict_samples']} of {proof['samples']} samples")
    if not reasons:
        return []
    # vLLM without aux capture stops on its first verify step: the finding must not claim drafting.
    when = "while the draft runs" if ctx.acceptance.verify_steps else "before the first verify step"
    return [runtime_finding(
        "AUX_CAPTURE_SILENT", ctx.run_id,
        f"aux capture is silent {when}: {'; '.join(reasons)}",
        evidence,
        f"Activate aux hidden-state capture of layers {layers} in the target and feed those states, "
        f"not the final hidden state, to the draft: check {CAPTURE_KNOBS}.")]


def _describe(received: list[int | None], num_layers: int | None) -> str:
    if all(r is None for r in received):
        return "no target layer"
    return "only the target's final hidden state" if num_layers in received else f"layers {received}"


def check_capture_partial(ctx: RunContext) -> list[Finding]:
    """AUX_CAPTURE_PARTIAL: only some configured capture layers reach the draft."""
    layers = list(ctx.capture_layers)
    if not layers or not ctx.draft_ran:
        return []
    evidence: dict[str, Any] = {"configured": layers}
    reasons = []
    fired = [i for i, events in ctx.capture_events.items() if events]
    if fired and len(fired) < len(layers):
        missing = [i for i in layers if i not in fired]
        evidence.update(fired=fired, missing=missing)
        reasons.append(f"capture layers {missing} never fired while {fired} did")
    width_part = _partial_width(ctx)
    if width_part is not None:
        evidence.update(width_part)
        reasons.append(f"the target-fed draft input holds {width_part['observed_layers']} of "
                       f"{width_part['expected_layers']} hidden states ({width_part['observed_width']} "
                       f"of {width_part['expected_width']} wide)")
    proof = provenance_verdicts(ctx).get("partial")
    if proof is not None:
        evidence.update(received=proof["received"], ranks=proof["ranks"], samples=proof["samples"],
                        partial_samples=proof["verdict_samples"],
                        matching_samples=proof["matching_samples"])
        reasons.append(f"the draft received layers {proof['received']} in {proof['verdict_samples']} "
                       f"of {proof['samples']} samples")
    if not reasons:
        return []
    return [runtime_finding(
        "AUX_CAPTURE_PARTIAL", ctx.run_id, f"aux capture is partial: {'; '.join(reasons)}", evidence,
        f"Capture all {len(layers)} configured layers {layers} and concatenate them for the draft: "
        f"check {CAPTURE_KNOBS} list every one.")]


def _partial_width(ctx: RunContext) -> dict[str, Any] | None:
    """The most recorded target-fed width that is 2..n_aux-1 target hidden states (one hidden state
    is the final-state case: AUX_NOT_FUSED / AUX_CAPTURE_SILENT)."""
    hidden, fused = ctx.hidden_size, ctx.fused_width
    if not hidden or not fused:
        return None
    counts: Counter = Counter()
    for row in ctx.fed_widths:
        if row.width and row.width % hidden == 0 and 1 < row.width // hidden < fused // hidden:
            counts[row.width] += row.events
    if not counts:
        return None
    width, calls = counts.most_common(1)[0]
    return {"observed_width": width, "expected_width": fused, "observed_layers": width // hidden,
            "expected_layers": fused // hidden, "calls": calls}


def check_layer_mismatch(ctx: RunContext) -> list[Finding]:
    """AUX_LAYER_MISMATCH: by fingerprint, the draft received other layers than configured; or the
    engine reports other capture layers active than configured."""
    configured = list(ctx.capture_layers)
    if not configured:  # nothing to compare with: no aux capture, or its config unknown (no RunStart)
        return []
    active = ctx.active_capture_layers
    proof = provenance_verdicts(ctx).get("mismatch")
    if proof is not None:
        received = proof["received"]
        evidence = {"configured": configured, "received": received, "ranks": proof["ranks"],
                    "samples": proof["samples"],
                    "matching_samples": proof["matching_samples"],
                    "mismatch_samples": proof["verdict_samples"]}
        how = f"received target layers {received}"
        count = f" ({proof['verdict_samples']} of {proof['samples']} fingerprint samples)"
    elif active and sorted(active) != sorted(configured):
        received = list(active)
        evidence = {"configured": configured, "active": received}
        how, count = f"is fed target layers {received} (the engine's active capture layers)", ""
    else:
        return []
    if active:
        evidence["active"] = list(active)
    shifts = {r - c for r, c in zip(received, configured) if r is not None}
    shifted = len(received) == len(configured) and None not in received and len(shifts) == 1
    note = ""
    if shifted and shifts != {0}:
        evidence["shift"] = shifts.pop()
        note = f"; every layer is off by {evidence['shift']:+d}"
    return [runtime_finding(
        "AUX_LAYER_MISMATCH", ctx.run_id,
        f"the draft {how} where {configured} are configured{count}{note}",
        evidence,
        "Capture the layers the draft was trained on: explicit `eagle_aux_hidden_state_layer_ids` get "
        "+1 in SGLang (`set_eagle3_layers_to_capture` captures layer i's output) but are used as "
        "hidden_states indices by vLLM (`set_aux_hidden_state_layers`), so correct the ids for this "
        "engine.")]
