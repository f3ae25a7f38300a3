"""Acceptance figures, defined once for Python (docs/design.md, "Acceptance figures"): an engine's own
figures in process (the reference engine, ``specscope generate``, the benchmarks). Over stored verify
steps the same formulas are SQL, written once in :mod:`specscope.storage.views`
(``mean_acceptance_length``, ``_acceptance_columns``, ``_POSITION_HIT``); tests hold the two equal
on the same steps.

- mean acceptance length (AL) = 1 + accepted / verify_steps: tokens emitted per verify step, bonus
  token included; 1 <= AL <= k + 1 for a chain of k drafts. None when there is no verify step.
- acceptance rate = accepted / proposed. None when nothing was proposed.
- per-position acceptance p_i = verify steps whose draft at position i was accepted / verify steps,
  read from each step's accepted mask (``'1'`` / ``'0'`` per draft position, position 0 first); a
  chain's mask is :func:`chain_mask`.

Engine conventions differ (vLLM: 1 + accepted / num_drafts; SGLang: completion_tokens / verify_ct with
K counting the root token): convert to these definitions before comparing engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def mean_acceptance_length(accepted: Sequence[int]) -> float | None:
    """AL over verify steps given accepted draft tokens per step (tokens/step); None if empty."""
    return 1.0 + sum(accepted) / len(accepted) if accepted else None


def acceptance_rate(accepted: Sequence[int], proposed: Sequence[int]) -> float | None:
    """Accepted / proposed draft tokens; None when nothing was proposed."""
    total = sum(proposed)
    return sum(accepted) / total if total else None


def chain_mask(accepted: int, proposed: int) -> str:
    """The accepted mask of a chain verify step: ``accepted`` leading ``'1'``, then ``'0'`` up to
    ``proposed`` (a chain accepts a prefix of its drafts)."""
    return "1" * accepted + "0" * (proposed - accepted)


def per_position_acceptance(masks: Iterable[str]) -> list[float]:
    """p_i for every position below the longest mask: verify steps whose mask has ``'1'`` at i / verify
    steps (a shorter mask counts as not accepted there). Empty list when there is no verify step."""
    masks = list(masks)
    if not masks:
        return []
    longest = max(map(len, masks))
    return [sum(1 for m in masks if m[i:i + 1] == "1") / len(masks) for i in range(longest)]
