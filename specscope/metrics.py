"""Acceptance figures, defined once for Python (docs/design.md, "Acceptance figures"): an engine's own
figures in process (the reference engine, ``specscope generate``, the benchmarks). Over stored verify
steps the same formulas are SQL, written once in ``specscope/storage/_formulas.py``
(``mean_acceptance_length``, ``acceptance_columns``) and :mod:`specscope.storage.views`
(``_POSITION_HIT``); tests hold the two equal on the same steps.

- mean acceptance length (AL) = 1 + accepted / verify_steps: tokens emitted per verify step, bonus
  token included; 1 <= AL <= k + 1 for a chain of k drafts. None when there is no verify step.
- acceptance rate = accepted / proposed. None when nothing was proposed.
- per-position acceptance p_i = verify steps whose draft at position i was accepted / verify steps,
  read from each step's accepted mask (``'1'`` / ``'0'`` per draft position, position 0 first); a
  chain's mask is :func:`chain_mask`.

What-if k (:func:`what_if_k`): from a run's accepted masks, the acceptance length each smaller chain
length k' would have given on the same verify steps, AL(k') = 1 + sum over i < k' of P(drafts 0..i
all accepted), and from its draft / verify times the tokens per second that implies.

Engine conventions differ (vLLM: 1 + accepted / num_drafts; SGLang: completion_tokens / verify_ct with
K counting the root token): convert to these definitions before comparing engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

Number = TypeVar("Number")  # a float, or a numpy array of totals (one per bootstrap resample)


def acceptance_length(accepted: Number, steps: Number) -> Number:
    """AL from totals: 1 + accepted draft tokens / verify steps (tokens per step, bonus included);
    elementwise over numpy arrays. ``steps`` must be positive."""
    return 1.0 + accepted / steps


def mean_acceptance_length(accepted: Sequence[int]) -> float | None:
    """AL over verify steps given accepted draft tokens per step (tokens/step); None if empty."""
    return acceptance_length(sum(accepted), len(accepted)) if accepted else None


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
    steps (a shorter mask counts as not accepted there), over the steps whose positions are known: a
    step recorded as totals only (drafts proposed, no mask) is not among ``masks``, as in the views.
    Empty list when there is no verify step."""
    masks = list(masks)
    if not masks:
        return []
    longest = max(map(len, masks))
    return [sum(1 for m in masks if m[i:i + 1] == "1") / len(masks) for i in range(longest)]


def acceptance_length_by_k(mask_steps: Mapping[str, int]) -> list[float]:
    """AL(k') for k' = 1 .. the longest mask (element k' - 1), from verify steps per accepted mask:
    1 + sum over i < k' of (steps whose mask starts with i + 1 ``'1'``) / steps. A verify step cut to
    its first k' drafts accepts the accepted prefix of those, so for chain drafting this is exactly
    what the recorded steps would have emitted at k' (the last element is the run's AL); a run served
    at k' would start its steps at other tokens, so for that run it is an estimate. Empty when there
    is no verify step."""
    total = sum(mask_steps.values())
    longest = max(map(len, mask_steps), default=0)
    if not total:
        return []
    prefix = [sum(n for mask, n in mask_steps.items() if mask[:i + 1] == "1" * (i + 1)) for i in range(longest)]
    return [acceptance_length(sum(prefix[:k]), total) for k in range(1, longest + 1)]


def tokens_per_s_by_k(lengths: Sequence[float], draft_s_per_draft: float, verify_s_per_step: float
                      ) -> list[float]:
    """Predicted tokens per second at k' = 1, 2, ... from :func:`acceptance_length_by_k`: AL(k') /
    (k' x draft time per drafted token + verify time per step). The model: a chain drafts its tokens
    one forward each, so drafting costs k' times the run's mean per drafted token; the verify forward
    is one target pass over k' + 1 positions whose cost is taken as the run's mean, whatever k' (weight
    reads dominate decode at small k; where the pass grows with k', smaller k' is under-predicted)."""
    return [al / (k * draft_s_per_draft + verify_s_per_step) for k, al in enumerate(lengths, start=1)]


def what_if_k(masks: Iterable[Mapping[str, Any]], times: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per k' = 1 .. the run's longest mask: ``k``, ``mean_acceptance_length``
    (:func:`acceptance_length_by_k`) and ``tokens_per_s`` (:func:`tokens_per_s_by_k`; None when
    ``times`` has no timed step). ``masks``: rows of ``accepted_mask`` and its ``steps``; ``times``:
    ``steps``, ``proposed``, ``draft_s``, ``verify_s`` summed over the timed verify steps (seconds)
    (the store's ``run_masks`` and ``run_step_times`` queries)."""
    lengths = acceptance_length_by_k({row["accepted_mask"]: int(row["steps"]) for row in masks})
    rates: list[float | None] = [None] * len(lengths)
    if times and times.get("steps") and times.get("proposed") and (times["draft_s"] + times["verify_s"]) > 0:
        rates = tokens_per_s_by_k(lengths, times["draft_s"] / times["proposed"], times["verify_s"] / times["steps"])
    return [{"k": k, "mean_acceptance_length": al, "tokens_per_s": rate}
            for k, (al, rate) in enumerate(zip(lengths, rates), start=1)]
