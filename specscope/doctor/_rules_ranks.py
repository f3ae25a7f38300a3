"""RANK_DIVERGENCE: ranks of one run that disagree on acceptance or on the tensor contract."""

from __future__ import annotations

from specscope.doctor._context import RunContext
from specscope.doctor._rules_accept import MIN_VERIFY_STEPS
from specscope.events import Finding
from specscope.findings import runtime_finding

RANK_AL_MARGIN = 0.5
"""Largest AL spread (tokens per verify step) between ranks that is not reported. Tensor-parallel
ranks verify the same steps and agree exactly; data-parallel ranks serve different requests, which
moves AL by a few tenths over a few dozen steps. Half a token per step is beyond that and costs a
rank 15-25% of its decode throughput."""

MAX_LISTED = 10
"""Hook points listed in evidence at most."""

_FIX = ("Compare the ranks' setup: every rank must capture the same aux layers and load the same "
        "draft weights (check each rank's load report and tensor contract; SGLang "
        "`set_eagle3_layers_to_capture` / vLLM `set_aux_hidden_state_layers` run per worker).")


def check_rank_acceptance(ctx: RunContext) -> list[Finding]:
    """Ranks with >= MIN_VERIFY_STEPS steps whose AL differ by more than RANK_AL_MARGIN."""
    ranks = [r for r in ctx.rank_acceptance if r.verify_steps >= MIN_VERIFY_STEPS]
    if len(ranks) < 2:
        return []
    low = min(ranks, key=lambda r: r.mean_acceptance_length)
    high = max(ranks, key=lambda r: r.mean_acceptance_length)
    spread = float(high.mean_acceptance_length) - float(low.mean_acceptance_length)
    if spread <= RANK_AL_MARGIN:
        return []
    return [runtime_finding(
        "RANK_DIVERGENCE", ctx.run_id,
        f"ranks disagree on acceptance: mean acceptance length {float(low.mean_acceptance_length):.2f} "
        f"on rank {low.rank} vs {float(high.mean_acceptance_length):.2f} on rank {high.rank}",
        {"ranks": [r.rank for r in ranks],
         "mean_acceptance_length": [float(r.mean_acceptance_length) for r in ranks],
         "verify_steps": [int(r.verify_steps) for r in ranks],
         "spread": spread, "margin": RANK_AL_MARGIN, "low_rank": low.rank, "high_rank": high.rank},
        _FIX)]


def check_rank_shapes(ctx: RunContext) -> list[Finding]:
    """Contract hook points (those with an expected width; other widths, e.g. ``input_ids``, follow
    the sequence length and differ between ranks anyway) whose recorded widths differ by rank."""
    if len(ctx.rank_status) < 2 and len(ctx.rank_acceptance) < 2:
        return []
    widths: dict[tuple[str, int], dict[int, list[int]]] = {}
    for w in sorted(ctx.contract_widths, key=lambda w: (w.hook_point, w.rank, w.width or 0)):
        widths.setdefault((w.hook_point, w.expected_width), {}).setdefault(w.rank, []).append(w.width)
    diverging = [(key, per_rank) for key, per_rank in widths.items()
                 if len(per_rank) > 1 and len({tuple(w) for w in per_rank.values()}) > 1]
    if not diverging:
        return []
    listed = [{"hook_point": point, "expected_width": expected, "ranks": list(per_rank),
               "widths": list(per_rank.values())}
              for (point, expected), per_rank in diverging[:MAX_LISTED]]
    first = listed[0]
    shown = ", ".join(f"rank {r}: {w}" for r, w in zip(first["ranks"], first["widths"]))
    return [runtime_finding(
        "RANK_DIVERGENCE", ctx.run_id,
        f"ranks record different widths at {len(diverging)} contract point(s), e.g. "
        f"{first['hook_point']} expected {first['expected_width']} wide ({shown})",
        {"hook_point": first["hook_point"], "expected_width": first["expected_width"],
         "ranks": first["ranks"], "widths": first["widths"], "hook_points": listed},
        _FIX)]
