"""Rules on acceptance: AL, rate and p_i as defined once in ``specscope/storage/views.py``
(docs/design.md, "Acceptance figures"). Thresholds are module constants, each with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from specscope.doctor._context import RunContext
from specscope.events import Finding
from specscope.findings import runtime_finding
from specscope.metrics import acceptance_length

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


SAMPLED_NOT_JUDGED = ("An argmax draft is accepted with the target's probability of its token, so sampled "
                      "acceptance is lower by design: the greedy thresholds do not apply to it")


@dataclass(frozen=True)
class Judged:
    """The acceptance the greedy-calibrated rules judge: the whole run when no request is known to
    sample, else its greedy requests (``group`` names which; ``per_position`` only for the whole run)."""

    group: str
    verify_steps: int
    proposed: int
    accepted: int
    mean_acceptance_length: float | None
    position0: float | None
    per_position: list[float]


def sampled_groups(ctx: RunContext) -> list[SimpleNamespace]:
    """The run's sampling groups whose requests sample (temperature > 0)."""
    return [g for g in ctx.sampling_acceptance if g.sampling not in ("greedy", "unknown")]


def judged(ctx: RunContext) -> Judged | None:
    """What ACCEPT_COLLAPSE, ACCEPT_SATURATED and POSITION0_LOW judge, or None (too few verify steps,
    or sampled requests only: there only a collapse is judged, see :func:`check_collapse`)."""
    if not sampled_groups(ctx):
        acc, p = ctx.acceptance, ctx.per_position
        figures = Judged("all requests", acc.verify_steps, acc.proposed, acc.accepted, acc.mean_acceptance_length,
                         p[0] if p else None, p)
    else:
        g = next((g for g in ctx.sampling_acceptance if g.sampling == "greedy"), None)
        if g is None:
            return None
        figures = Judged("greedy requests", int(g.verify_steps), int(g.proposed or 0), int(g.accepted or 0),
                         g.mean_acceptance_length, g.position0_acceptance, [])
    return figures if figures.verify_steps >= MIN_VERIFY_STEPS else None


def _scope(j: Judged) -> str:
    return "" if j.group == "all requests" else f" of {j.group}"


def check_collapse(ctx: RunContext) -> list[Finding]:
    """ACCEPT_COLLAPSE [error]: AL <= COLLAPSE_AL over >= MIN_VERIFY_STEPS verify steps: of the greedy
    requests where some sample, of the whole run where all do or the greedy ones are too few to judge
    (a working draft accepts far more than one draft in twenty steps at any usual temperature, so a few
    greedy steps must not hide a collapsed run; ACCEPT_COLLAPSE_SAMPLED compares groups)."""
    j = judged(ctx)
    if j is None:  # too few greedy steps to judge them apart: the whole run, as when none is greedy
        acc = ctx.acceptance
        greedy = any(g.sampling == "greedy" for g in ctx.sampling_acceptance)
        j = Judged("all requests" if greedy else "sampled requests", acc.verify_steps, acc.proposed, acc.accepted,
                   acc.mean_acceptance_length, None, [])
    if j.verify_steps < MIN_VERIFY_STEPS or j.mean_acceptance_length > COLLAPSE_AL:
        return []
    return [runtime_finding(
        "ACCEPT_COLLAPSE", ctx.run_id,
        f"acceptance collapsed{_scope(j)}: mean acceptance length {j.mean_acceptance_length:.3f} over "
        f"{j.verify_steps} verify steps ({j.accepted} of {j.proposed} drafts accepted)",
        {"mean_acceptance_length": j.mean_acceptance_length, "verify_steps": j.verify_steps,
         "accepted": j.accepted, "proposed": j.proposed, "threshold": COLLAPSE_AL, "judged_on": j.group},
        "Find the broken link between target and draft: fix any AUX_* or WEIGHTS_DROPPED finding of "
        "this run, then check the draft checkpoint (d2t map, lm_head) with `specscope inspect`.")]


MIN_COLLAPSED_REQUESTS = 2
"""A collapse from some point of a run on needs at least this many requests after it: one hard prompt
can pull its own AL to 1 (the reason for :data:`MIN_VERIFY_STEPS`), two in a row at AL <= 1.05 cannot."""


def check_late_collapse(ctx: RunContext) -> list[Finding]:
    """ACCEPT_COLLAPSE [error] from a point of the run on: within a sampling group, in start order,
    the requests from some request on hold AL <= COLLAPSE_AL over >= MIN_VERIFY_STEPS verify steps and
    at least :data:`MIN_COLLAPSED_REQUESTS` requests, while those before accept more (the earliest
    such point). A draft that stopped working mid-run is then named whatever the run's length or
    traffic: ACCEPT_DRIFT needs 20 requests and compares requests within prompt-length bands, and the
    run's whole AL may still read well above the threshold."""
    findings = []
    for sampling, requests in ctx.request_groups.items():
        steps = [int(r.verify_steps) for r in requests]
        accepted = [int(r.accepted or 0) for r in requests]
        total_steps, total_accepted = sum(steps), sum(accepted)
        if acceptance_length(total_accepted, total_steps) <= COLLAPSE_AL:
            continue  # the whole group collapsed: check_collapse's, or ACCEPT_COLLAPSE_SAMPLED's
        after_steps = after_accepted = 0
        found = None  # (start, steps, accepted): the earliest request from which on the group collapsed
        for i in range(len(requests) - 1, 0, -1):
            after_steps += steps[i]
            after_accepted += accepted[i]
            if (len(requests) - i >= MIN_COLLAPSED_REQUESTS and after_steps >= MIN_VERIFY_STEPS
                    and acceptance_length(after_accepted, after_steps) <= COLLAPSE_AL
                    and acceptance_length(total_accepted - after_accepted, total_steps - after_steps) > COLLAPSE_AL):
                found = i, after_steps, after_accepted
        if found is None:
            continue
        start, collapsed_steps, collapsed_accepted = found
        before, after = requests[:start], requests[start:]
        al_before = acceptance_length(total_accepted - collapsed_accepted, total_steps - collapsed_steps)
        al_after = acceptance_length(collapsed_accepted, collapsed_steps)
        after_s = float(after[0].started_wall) - float(requests[0].started_wall)
        findings.append(runtime_finding(
            "ACCEPT_COLLAPSE", ctx.run_id,
            f"acceptance collapsed from {after_s:.0f} s into the run on ({sampling} requests): mean acceptance "
            f"length {al_after:.3f} over the {len(after)} requests ({collapsed_steps} verify steps) started "
            f"from then, {al_before:.2f} over the {len(before)} before",
            {"mean_acceptance_length": al_after, "verify_steps": collapsed_steps, "accepted": collapsed_accepted,
             "requests_after": len(after), "al_before": al_before, "requests_before": len(before),
             "changed_at_wall": float(after[0].started_wall), "changed_after_s": after_s,
             "first_request_after": after[0].request_id, "threshold": COLLAPSE_AL,
             "judged_on": f"{sampling} requests from {after_s:.0f} s on"},
            "The draft stopped working while the server stayed up: compare the draft's inputs before and "
            "after that time (the Tensors page), look for state reused across requests (caches, buffers, "
            "a weight or map reloaded), and check whether a restart restores the early AL."))
    return findings


def check_saturated(ctx: RunContext) -> list[Finding]:
    """ACCEPT_SATURATED [warning]: every proposed draft of >= MIN_VERIFY_STEPS steps was accepted."""
    j = judged(ctx)
    if j is None or j.proposed == 0 or j.accepted < j.proposed:
        return []
    return [runtime_finding(
        "ACCEPT_SATURATED", ctx.run_id,
        f"every one of {j.proposed} drafts in {j.verify_steps} verify steps{_scope(j)} was accepted "
        f"(AL {j.mean_acceptance_length:.2f}): verification may not be comparing against the target",
        {"acceptance_rate": j.accepted / j.proposed, "accepted": j.accepted, "proposed": j.proposed,
         "verify_steps": j.verify_steps, "mean_acceptance_length": j.mean_acceptance_length,
         "expected_acceptance_rate_below": 1.0, "judged_on": j.group},
        "Check that the target really verifies the drafts (not the draft's own logits) and that the "
        "accepted counts come from the verifier; if they are genuine, raise k (vLLM "
        "`num_speculative_tokens`, SGLang `speculative_num_steps`).")]


def check_position0(ctx: RunContext) -> list[Finding]:
    """POSITION0_LOW [warning]: p_0 < POSITION0_MIN over >= MIN_VERIFY_STEPS steps, not collapsed;
    judged on greedy requests only (:data:`SAMPLED_NOT_JUDGED`)."""
    j = judged(ctx)
    if j is None or j.mean_acceptance_length <= COLLAPSE_AL or j.position0 is None or j.position0 >= POSITION0_MIN:
        return []
    return [runtime_finding(
        "POSITION0_LOW", ctx.run_id,
        f"the first draft is accepted in only {j.position0:.1%} of {j.verify_steps} verify steps{_scope(j)} "
        f"(below {POSITION0_MIN:.0%})",
        {"position0_acceptance": j.position0, "threshold": POSITION0_MIN, "verify_steps": j.verify_steps,
         "per_position_acceptance": j.per_position or None, "judged_on": j.group},
        "Check that the draft was trained for this target and prompt format: its aux capture layers "
        "(`eagle_aux_hidden_state_layer_ids`), d2t map and lm_head (`specscope inspect`).")]
