"""What the doctor could not check: a verdict without findings means something only when the rules had
evidence to read, so a serving run whose recordings leave a rule blind says so.

- NOT_OBSERVED [warning]: the draft-input contract, the failure specscope exists for, was not observed
  (no ``draft.forward:*`` event, or no expected fused width configured), so AUX_NOT_FUSED and the
  capture rules could not fire. A warning, not info: "0 errors" would otherwise read as "aux capture
  works" on a run where nothing was looked at.
- RUN_START_MISSING [warning]: the run's rows are stored but its RunStart is not, so its engine and
  contract are unknown: the contract is not checked (CHECKS_SKIPPED names it), the rest is judged.
- CHECKS_SKIPPED [info]: the contract was observed but a refinement had no evidence: no provenance
  sample (which layers the draft received is unverified, AUX_LAYER_MISMATCH cannot fire), no capture
  layer hooked, no verify step audited (nothing said of the output's losslessness), or too few verify
  steps to judge acceptance. The main failure modes stay covered.

NOT_OBSERVED fires only once the run has verify steps; a run without any gets CHECKS_SKIPPED (nothing
was judged: still starting, or the engine stopped before its first verify step).
A run with no aux-capture contract to observe — watched through Prometheus (no hooks by design), or a
method without capture layers (prompt lookup, n-gram, MTP) — gets CHECKS_SKIPPED for the contract, not
NOT_OBSERVED: nothing was forgotten there.
"""

from __future__ import annotations

from typing import Any

from specscope import points
from specscope.doctor._context import RunContext
from specscope.doctor._rules_accept import MIN_VERIFY_STEPS, SAMPLED_NOT_JUDGED, sampled_groups
from specscope.events import Finding, unhooked
from specscope.findings import CONTRACT_CODES, runtime_finding


def _skipped(check: str, codes: list[str], reason: str) -> dict[str, Any]:
    return {"check": check, "codes": codes, "reason": reason}


def _no_contract(ctx: RunContext) -> str | None:
    """Why the run has no aux-capture contract to observe, or None when it has one."""
    if not ctx.run_start:
        return "no RunStart stored: the run's capture layers and fused width are unknown"
    outside = unhooked(ctx.config)
    if outside is not None:
        return f"{outside}: no hooks, acceptance only"
    if not ctx.capture_layers:
        return "no capture layers configured: not an EAGLE-3 run (aux capture does not apply)"
    return None


AUDIT = ("losslessness audit", ["LOSSLESS_VIOLATION", "LOSSLESS_AUDITED"])

RUNNER_NOT_RECORDED = (
    ("draft input width", ["AUX_NOT_FUSED"]),
    ("capture layers firing", ["AUX_CAPTURE_SILENT", "AUX_CAPTURE_PARTIAL"]),
    ("layers received by the draft (fingerprints)", ["AUX_LAYER_MISMATCH"]),
    AUDIT,
    ("draft checkpoint inspection at load", ["KEYS_DROPPED", "LM_HEAD_MISSING", "FC_SHAPE_MISMATCH"]),
)
"""What the vLLM plugin records in the model runner (worker) and so not under runner v2, with the codes
that then cannot fire (the inspection's codes abridged)."""


def runner_not_attached(ctx: RunContext) -> bool:
    """The engine served with a model runner specscope does not attach to (the run's config says
    ``model_runner: "v2"``, vLLM 0.32's second runner): the worker-side evidence is missing by
    construction, which :func:`check_runner` names, instead of the rules that read it."""
    return ctx.config.get("model_runner") == "v2"


def check_runner(ctx: RunContext) -> list[Finding]:
    """RUNNER_NOT_ATTACHED [warning]: vLLM served with its model runner v2, which has none of the
    plugin's worker attach points: what is then not recorded, and what still is."""
    if not runner_not_attached(ctx):
        return []
    missing = [_skipped(check, codes, "vLLM model runner v2: specscope does not attach to it")
               for check, codes in RUNNER_NOT_RECORDED]
    return [runtime_finding(
        "RUNNER_NOT_ATTACHED", ctx.run_id,
        "vLLM served with its model runner v2 (`vllm/v1/worker/gpu/model_runner.py`), which specscope "
        "does not attach to: not recorded: " + ", ".join(m["check"] for m in missing) + "; recorded: "
        f"{ctx.acceptance.requests} request(s) and {ctx.acceptance.verify_steps} verify step(s) from the "
        "scheduler, so acceptance (mean acceptance length, per position, ACCEPT_*) is exact",
        {"model_runner": "v2", "expected_model_runner": "v1", "not_checked": missing,
         "recorded": ["requests", "verify steps", "acceptance"]},
        "For the draft-input contract and the losslessness audit, serve a diagnostic replica on model "
        "runner v1: `VLLM_USE_V2_MODEL_RUNNER=0` (vLLM 0.32 picks v2 by default where Triton is present "
        "and the run's features allow it); this run's acceptance figures stay valid.")]


def check_run_start(ctx: RunContext) -> list[Finding]:
    """RUN_START_MISSING [warning]: rows of the run are stored, its RunStart is not (the database
    refused its values, the collector closed on a store that never came back, or rows were loaded
    around the collector). A recording problem, so a warning; what was stored is judged as for any
    run: a collapse there is still an error."""
    if ctx.run_start:
        return []
    acc = ctx.acceptance
    missed = _draft_widths_missed(ctx)
    seen = (f"; recorded: {missed[0]['hook_point']} {missed[0]['width']} wide where {missed[0]['expected_width']} "
            f"was expected ({missed[0]['events']} events)" if missed else "")
    return [runtime_finding(
        "RUN_START_MISSING", ctx.run_id,
        f"{acc.requests} request(s) and {acc.verify_steps} verify step(s) of this run are stored, its RunStart "
        "is not: its engine, models and contract (capture layers, fused width) are unknown, so "
        f"{', '.join(CONTRACT_CODES)} could not be checked; what was stored (acceptance, audit, ranks) is judged{seen}",
        {"run_start": "missing", "expected_run_start": "stored", "requests": acc.requests,
         "verify_steps": acc.verify_steps, "events_written": sum(int(r.events_written) for r in ctx.rank_status),
         "draft_width_mismatches": missed},
        "The collector's log names the RunStart the store refused (a value longer than its column: the "
        "engine version, for one, holds 64 characters) or the outage it closed in (a store unwritable from "
        "the engine's start to its end). Keep the run's values within their columns and the store "
        "reachable; this run's acceptance figures stand, its contract stays unchecked.")]


def _draft_widths_missed(ctx: RunContext) -> list[dict[str, Any]]:
    """The draft's recorded inputs not of the width recorded as expected with them. Without the run's
    contract AUX_NOT_FUSED cannot tell which input the target feeds; what the recorder expected is
    still evidence worth showing."""
    return [{"hook_point": w.hook_point, "rank": w.rank, "width": w.width, "expected_width": w.expected_width,
             "events": w.events} for w in ctx.contract_widths
            if w.hook_point.startswith(points.DRAFT_PREFIX) and w.width != w.expected_width]


def check_not_observed(ctx: RunContext) -> list[Finding]:
    """NOT_OBSERVED [warning]: verify steps recorded but the draft's input contract was not observed
    (not on a runner specscope does not attach to: RUNNER_NOT_ATTACHED names that cause)."""
    steps = ctx.acceptance.verify_steps
    if steps == 0 or _no_contract(ctx) is not None or runner_not_attached(ctx):
        return []
    if not ctx.draft_ran:
        blind = _skipped("draft input width", list(CONTRACT_CODES),
                         "no tensor event at the draft's forward: instrument() was not called on the "
                         "draft, or its hooks never fired")
        fix = ("Call `instrument(tracer, draft=draft_model, target=target_model)` before serving (or "
               "check that the hooked module is the one the engine runs).")
    elif ctx.fused_width is None:
        blind = _skipped("draft input width", ["AUX_NOT_FUSED", "AUX_CAPTURE_PARTIAL"],
                         "no expected fused width in the run's config")
        fix = "Give the tracer `RunConfig(expected_fused_width=n_aux * target_hidden_size, ...)`."
    elif not ctx.fed_widths:
        # AUX_NOT_FUSED reads the draft inputs recorded as target-fed (expected the fused width): with
        # none, a draft input of any width passes unread
        blind = _skipped("draft input width", ["AUX_NOT_FUSED"],
                         f"no draft input recorded as target-fed (expected {ctx.fused_width} wide, the "
                         "run's fused width): the hooked argument is not the one the target feeds, or "
                         "the recording marks no expected width")
        fix = ("Name the draft argument that receives the target's hidden states: "
               "`instrument(..., draft_hidden_arg=...)`, or `fused_input=` where the engine applies `fc` "
               "before the draft; a recording written without the tracer must give the target-fed "
               "input's `expected_shape` (its last dimension the fused width).")
    else:
        return []
    return [runtime_finding(
        "NOT_OBSERVED", ctx.run_id,
        f"not observed: {blind['check']} ({blind['reason']}) over {steps} verify steps; "
        f"{', '.join(blind['codes'])} could not be checked, so no finding there proves nothing",
        {"verify_steps": steps, "not_checked": [blind]}, fix)]


def check_skipped(ctx: RunContext) -> list[Finding]:
    """CHECKS_SKIPPED [info]: the contract was observed, some refinements had no evidence; or the run
    recorded no verify step at all (still starting, or the engine stopped before its first one)."""
    steps = ctx.acceptance.verify_steps
    if steps == 0:
        requests = ctx.acceptance.requests
        # A draft that ran before the engine stopped was checked (its width, its capture): only
        # acceptance is left unjudged then.
        if ctx.draft_ran:
            what, codes = "acceptance", ["ACCEPT_COLLAPSE", "ACCEPT_SATURATED", "POSITION0_LOW"]
            why = "the draft ran, then the engine stopped before its first verify step"
        else:
            what, codes = "acceptance and the draft's input", ["ACCEPT_COLLAPSE", "AUX_NOT_FUSED"]
            why = "the engine has not drafted yet, or stopped before its first verify step"
        return [runtime_finding(
            "CHECKS_SKIPPED", ctx.run_id,
            f"not checked: {what} ({requests} request(s) started, no verify step recorded: {why})",
            {"verify_steps": 0, "requests": requests,
             "not_checked": [_skipped(what, codes, "no verify step recorded")]},
            "If the engine stopped, its log names why (the other findings of this run may say what it "
            "tripped on); if it is still starting, look again once it serves.")]
    reason = _no_contract(ctx)
    if reason is None and (not ctx.draft_ran or ctx.fused_width is None):
        return []  # NOT_OBSERVED names the larger gap
    skipped = []
    if reason is not None:
        skipped.append(_skipped("draft input contract", list(CONTRACT_CODES), reason))
    outside = unhooked(ctx.config)
    if outside is not None:  # a server's counters and responses carry no logits to audit
        skipped.append(_skipped(*AUDIT, f"{outside}: no target logits to audit its output against"))
    elif not ctx.lossless_audit and not ctx.replay_audit:  # a healthy verdict then says nothing of the text
        skipped.append(_skipped(*AUDIT, "no verify step was audited: the audit was off, or the engine hands it "
                                        "no verify step"))
    modes = {r.graph_mode for r in ctx.rank_status}
    compiled, replayed = "compiled" in modes, "cuda_graph" in modes
    if reason is None and not ctx.provenance:
        skipped.append(_skipped("layers received by the draft (fingerprints)", ["AUX_LAYER_MISMATCH"],
                                "CUDA graphs replayed and no draft input was matched from the replay buffer "
                                "(provenance turned off)" if replayed
                                else "the target ran compiled: its layers are not fingerprinted" if compiled
                                else "no provenance sample (provenance turned off)"))
    if reason is None and not ctx.target_observed:
        skipped.append(_skipped("capture layers firing", ["AUX_CAPTURE_PARTIAL"],
                                "CUDA graphs replayed and no capture-layer call reached the replay buffer "
                                "(target not hooked before capture)" if replayed
                                else "the target ran compiled: its capture layers' hooks do not fire" if compiled
                                else "no target capture layer hooked"))
    if steps < MIN_VERIFY_STEPS:
        skipped.append(_skipped("acceptance", ["ACCEPT_COLLAPSE", "ACCEPT_SATURATED", "POSITION0_LOW"],
                                f"{steps} verify steps, fewer than the {MIN_VERIFY_STEPS} judged"))
    elif sampled_groups(ctx):
        names = ", ".join(g.sampling for g in sampled_groups(ctx))
        skipped.append(_skipped(f"acceptance of sampled requests ({names}) against greedy thresholds",
                                ["POSITION0_LOW", "ACCEPT_SATURATED"], SAMPLED_NOT_JUDGED))
    if not skipped:
        return []
    return [runtime_finding(
        "CHECKS_SKIPPED", ctx.run_id,
        "not checked: " + "; ".join(f"{s['check']} ({s['reason']})" for s in skipped),
        {"verify_steps": steps, "not_checked": skipped},
        _evidence_fix(ctx, compiled and not replayed))]


def _evidence_fix(ctx: RunContext, compiled: bool) -> str:
    """How to record the missing evidence, for the way the run was recorded (``compiled``: compiled
    without CUDA-graph replays read from the buffer)."""
    judged = f"acceptance is judged from {MIN_VERIFY_STEPS} verify steps on."
    if not ctx.run_start:
        return f"The contract is read from the run's RunStart, not stored here (RUN_START_MISSING says why); {judged}"
    if unhooked(ctx.config) is not None:
        return ("Recorded from outside the server, this run shows acceptance only. The draft-input contract "
                "and the losslessness audit need hooks inside the engine (the vLLM plugin, or the embedded "
                "API in your own engine); "
                f"`specscope inspect DRAFT --engine ...` checks the checkpoint without serving; {judged}")
    if ctx.engine == "vllm":
        eager = ("serve a diagnostic replica with `--enforce-eager` (the plugin then hooks the capture "
                 "layers and fingerprints them); " if compiled else "")
        return (f"With the vLLM plugin: {eager}keep `SPECSCOPE_PROVENANCE_EVERY` above 0 (default 16: "
                f"every 16th fused draft input is fingerprinted) and `SPECSCOPE_AUDIT_EVERY` above 0 (default "
                f"4: the output of every 4th verify batch is audited against the target); {judged}")
    return ("Embedded API: `Tracer(provenance_every=16)` verifies the received layers by fingerprint, "
            "`instrument(..., target=target_model)` hooks the capture layers, `Tracer(audit_every=4)` with "
            f"`Tracer.record_audit` at each verify step audits the output; {judged}")
