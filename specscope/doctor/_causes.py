"""Cause and effect read together: a run's checkpoint findings (static suspicions about the draft)
against what its acceptance shows.

A warning whose effect is acceptance (the engine feeds the draft differently than it may have been
trained) is settled by a healthy run: it drops to info and says so, naming the figures. When
acceptance collapses, the collapse finding names the run's checkpoint findings first, errors before
warnings: the likeliest cause of the symptom, with its evidence (a vocabulary map mismatch says
which map is broken). Checkpoint errors are never downgraded: an error
means the inspected engine's documented behaviour breaks the draft.
"""

from __future__ import annotations

import dataclasses

from specscope.doctor._rules_accept import COLLAPSE_AL, MIN_VERIFY_STEPS
from specscope.doctor._summary import RunSummary
from specscope.events import Finding, by_severity

SETTLED_BY_ACCEPTANCE = ("AUX_LAYER_IDS_ORDER", "VOCAB_SIZE_MISMATCH", "VOCAB_MAP_MISMATCH", "ROPE_MISMATCH",
                         "MAX_POSITIONS_MISMATCH", "D2T_IDENTITY_WITH_PRUNED_VOCAB")
"""Checkpoint warning codes whose only effect on a served draft is lower acceptance."""

COLLAPSE_CODES = ("ACCEPT_COLLAPSE", "ACCEPT_COLLAPSE_SAMPLED", "POSITION0_LOW")
"""Runtime findings that are a symptom whose cause may sit in the checkpoint."""

UNSETTLED_BY = (*COLLAPSE_CODES, "RANK_DIVERGENCE", "ACCEPT_SATURATED")
"""Runtime findings after which a run's acceptance settles nothing: a rank that collapsed, or
acceptance that may not come from comparing with the target."""

SETTLEMENT_KEYS = ("as_inspected", "verified_by_provenance", "served_mean_acceptance_length", "served_verify_steps")
"""Evidence a run's reading adds to a stored checkpoint finding (:func:`settled`)."""


def as_inspected(f: Finding) -> Finding:
    """``f`` as the inspector wrote it: a stored finding a run settled keeps its original severity and
    message in its evidence (``as_inspected``), so every reading starts from the inspection, not from
    an earlier run's reading of it."""
    original = f.evidence.get("as_inspected") if isinstance(f.evidence, dict) else None
    if not isinstance(original, dict):
        return f
    return dataclasses.replace(f, severity=original["severity"], message=original["message"],
                               evidence={k: v for k, v in f.evidence.items() if k not in SETTLEMENT_KEYS})


def settled(f: Finding, note: str, **evidence) -> Finding:
    """``f`` read as info in the light of a run: its message gains ``note``, its evidence ``evidence``
    and the original (:func:`as_inspected` restores it)."""
    base = as_inspected(f)
    return dataclasses.replace(base, severity="info", message=f"{base.message}; {note}",
                               evidence={**base.evidence, **evidence,
                                         "as_inspected": {"severity": base.severity, "message": base.message}})


def _healthy(run: RunSummary) -> bool:
    return (run.verify_steps >= MIN_VERIFY_STEPS and run.mean_acceptance_length is not None
            and run.mean_acceptance_length > COLLAPSE_AL)


def relate(runs: list[RunSummary], runtime: list[Finding], stored: list[Finding]) -> list[Finding]:
    """``runtime`` and ``stored`` (checkpoint, as :func:`specscope.doctor.checkpoint_findings` reads
    them: as inspected, or settled by provenance) findings of ``runs``, each read in the light of the
    other, errors first and within a severity the checkpoint's first."""
    by_run = {run.run_id: run for run in runs}
    symptoms = {f.run_id for f in runtime if f.code in UNSETTLED_BY}
    suspects: dict[str, list[Finding]] = {}
    for f in by_severity(stored):
        if f.severity in ("error", "warning"):
            suspects.setdefault(f.run_id, []).append(f)
    checkpoint = [_settled(f, by_run[f.run_id]) if f.run_id in by_run and f.run_id not in symptoms else f
                  for f in stored]
    explained = [_explained(f, suspects[f.run_id]) if f.code in COLLAPSE_CODES and suspects.get(f.run_id) else f
                 for f in runtime]
    return by_severity([*checkpoint, *explained])


def _settled(f: Finding, run: RunSummary) -> Finding:
    if f.severity != "warning" or f.code not in SETTLED_BY_ACCEPTANCE or not _healthy(run):
        return f
    return settled(f, f"served here with healthy acceptance (AL {run.mean_acceptance_length:.2f} over "
                      f"{run.verify_steps} verify steps on {run.engine}): no effect measured",
                   served_mean_acceptance_length=run.mean_acceptance_length, served_verify_steps=run.verify_steps)


def _explained(f: Finding, causes: list[Finding]) -> Finding:
    first = causes[0]
    return dataclasses.replace(
        f, message=f"{f.message}; likeliest cause, from the draft checkpoint: {first.code} ({first.message})"
                   + (f"; also {', '.join(c.code for c in causes[1:])}" if len(causes) > 1 else ""),
        evidence={**f.evidence, "likely_causes": [c.code for c in causes], "likely_cause_evidence": first.evidence},
        fix=f"{first.fix} Then rerun: this symptom should clear. ({f.fix})")
