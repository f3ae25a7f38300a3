"""Acceptance figures, defined once (docs/design.md, "Acceptance figures"); the SQL views in
:mod:`specscope.storage.views` compute the same formulas over stored verify steps.

- mean acceptance length (AL) = 1 + accepted / verify_steps: tokens emitted per verify step, bonus
  token included; 1 <= AL <= k + 1 for a chain of k drafts. None when there is no verify step.
- acceptance rate = accepted / proposed. None when nothing was proposed.
- per-position acceptance p_i = verify steps whose draft at position i was accepted / verify steps.

Engine conventions differ (vLLM: 1 + accepted / num_drafts; SGLang: completion_tokens / verify_ct with
K counting the root token): convert to these definitions before comparing engines.
"""

from __future__ import annotations

from collections.abc import Sequence


def mean_acceptance_length(accepted: Sequence[int]) -> float | None:
    """AL over verify steps given accepted draft tokens per step (tokens/step); None if empty."""
    return 1.0 + sum(accepted) / len(accepted) if accepted else None


def acceptance_rate(accepted: Sequence[int], proposed: Sequence[int]) -> float | None:
    """Accepted / proposed draft tokens; None when nothing was proposed."""
    total = sum(proposed)
    return sum(accepted) / total if total else None


def per_position_acceptance(accepted: Sequence[int], k: int) -> list[float]:
    """p_i for i in 0..k-1 for chain drafting, where position i is accepted iff ``accepted > i``.
    Empty list when there is no verify step."""
    if not accepted:
        return []
    return [sum(1 for a in accepted if a > i) / len(accepted) for i in range(k)]
