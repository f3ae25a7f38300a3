"""Rules on acceptance: AL, rate and p_i as defined once in ``specscope/storage/views.py``
(docs/design.md, "Acceptance figures"). Thresholds are module constants, each with its reason."""

from __future__ import annotations

from specscope.doctor._context import RunContext
from specscope.events import Finding
from specscope.findings import runtime_finding

MIN_VERIFY_STEPS = 16
"""Verify steps a run (or rank) needs before its acceptance is judged (docs/design.md, "Finding codes"): fewer
steps are one or two requests, where a single hard prompt can pull AL to 1 by itself."""

COLLAPSE_AL = 1.05
"""ACCEPT_COLLAPSE at AL <= 1.05 (docs/design.md, "Finding codes"): under one accepted draft per twenty verify
steps. A working EAGLE-3 head reaches AL 2-4; the failure of docs/design.md, "The failure", read exactly 1.0."""

POSITION0_MIN = 0.3
"""POSITION0_LOW below p_0 = 0.3: a trained EAGLE-3 head gets its first draft accepted in roughly 60-80%
of verify steps on chat traffic (the section 1 head reached 74.5% step-0 accuracy offline); under 30%
the draft costs more than it brings at k >= 2, a sign of wrong aux layers, vocabulary map or head."""


def check_collapse(ctx: RunContext) -> list[Finding]:
    """ACCEPT_COLLAPSE [error]: AL <= COLLAPSE_AL over >= MIN_VERIFY_STEPS verify steps."""
    acc = ctx.acceptance
    if acc.verify_steps < MIN_VERIFY_STEPS or acc.mean_acceptance_length > COLLAPSE_AL:
        return []
    return [runtime_finding(
        "ACCEPT_COLLAPSE", ctx.run_id,
        f"acceptance collapsed: mean acceptance length {acc.mean_acceptance_length:.3f} over "
        f"{acc.verify_steps} verify steps ({acc.accepted} of {acc.proposed} drafts accepted)",
        {"mean_acceptance_length": acc.mean_acceptance_length, "verify_steps": acc.verify_steps,
         "accepted": acc.accepted, "proposed": acc.proposed, "threshold": COLLAPSE_AL},
        "Find the broken link between target and draft: fix any AUX_* or WEIGHTS_DROPPED finding of "
        "this run, then check the draft checkpoint (d2t map, lm_head) with `specscope inspect`.")]


def check_saturated(ctx: RunContext) -> list[Finding]:
    """ACCEPT_SATURATED [warning]: every proposed draft of >= MIN_VERIFY_STEPS steps was accepted."""
    acc = ctx.acceptance
    if acc.verify_steps < MIN_VERIFY_STEPS or acc.proposed == 0 or acc.accepted < acc.proposed:
        return []
    return [runtime_finding(
        "ACCEPT_SATURATED", ctx.run_id,
        f"every one of {acc.proposed} drafts in {acc.verify_steps} verify steps was accepted "
        f"(AL {acc.mean_acceptance_length:.2f}): verification may not be comparing against the target",
        {"acceptance_rate": acc.acceptance_rate, "accepted": acc.accepted, "proposed": acc.proposed,
         "verify_steps": acc.verify_steps, "mean_acceptance_length": acc.mean_acceptance_length,
         "expected_acceptance_rate_below": 1.0},
        "Check that the target really verifies the drafts (not the draft's own logits) and that the "
        "accepted counts come from the verifier; if they are genuine, raise k (vLLM "
        "`num_speculative_tokens`, SGLang `speculative_num_steps`).")]


def check_position0(ctx: RunContext) -> list[Finding]:
    """POSITION0_LOW [warning]: p_0 < POSITION0_MIN over >= MIN_VERIFY_STEPS steps, not collapsed."""
    acc = ctx.acceptance
    if (acc.verify_steps < MIN_VERIFY_STEPS or acc.mean_acceptance_length <= COLLAPSE_AL
            or not ctx.per_position or ctx.per_position[0] >= POSITION0_MIN):
        return []
    p0 = ctx.per_position[0]
    return [runtime_finding(
        "POSITION0_LOW", ctx.run_id,
        f"the first draft is accepted in only {p0:.1%} of {acc.verify_steps} verify steps "
        f"(below {POSITION0_MIN:.0%})",
        {"position0_acceptance": p0, "threshold": POSITION0_MIN, "verify_steps": acc.verify_steps,
         "per_position_acceptance": ctx.per_position},
        "Check that the draft was trained for this target and prompt format: its aux capture layers "
        "(`eagle_aux_hidden_state_layer_ids`), d2t map and lm_head (`specscope inspect`).")]
