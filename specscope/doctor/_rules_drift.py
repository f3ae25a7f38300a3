"""ACCEPT_DRIFT: acceptance that falls over a run by more than noise (docs/design.md, "Acceptance
across time and requests"). The unit is the request: its AL, in the order requests started.

Within one sampling group, for each candidate split (the group's requests cut at :data:`SPLITS` of
their count, in start order), a one-sided Mann-Whitney test asks whether the requests before the
split accept more than those after. The test is run within strata: a prompt served on both sides of
the split (the same ``prompt_key``) is a stratum of its own, so its AL is compared with itself and
what the prompt asks does not blur the comparison; the other requests are stratified by prompt
length (doubling bands), so a run whose traffic moves from short prompts to long ones (or from greedy
to sampled requests: another group) is not read as drift. The strata are combined as a stratified
rank-sum test (van Elteren's): each stratum's normal score, without a continuity correction, weighted
by sqrt(n1 n2 / (n1 + n2)) (Stouffer's method), so many small strata add up their evidence instead of
each being rounded to a coarse exact p-value. Bonferroni over the splits and the groups bounds the
chance that a run whose requests are exchangeable in time within their stratum raises the finding by
:data:`DRIFT_ALPHA`, whatever its length. A fall must also be large enough to matter
(:data:`MIN_DROP`): a long steady server is never exactly stationary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from scipy import stats

from specscope.doctor._context import RunContext
from specscope.events import Finding
from specscope.findings import runtime_finding
from specscope.metrics import acceptance_length

DRIFT_ALPHA = 1e-3
"""Bound on the chance that ACCEPT_DRIFT is raised on a run without drift (per run: Bonferroni over
:data:`SPLITS` and the run's sampling groups)."""

SPLITS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
"""Candidate change points, as fractions of a group's requests in start order: at least a fifth of the
requests on each side, so each side's AL is measured on more than a few requests."""

MIN_REQUESTS = 20
"""Requests (with verify steps) a sampling group needs before its AL over time is judged."""

MIN_DROP = 0.1
"""The AL after the change must be at least 10% below the AL before (pooled over each side's verify
steps): smaller falls are not worth a warning even when real."""


@dataclass(frozen=True)
class Drift:
    """A fall of AL within one sampling group at one split: ``changed_at_wall`` is the start of the first
    request after it; ``p_value`` the stratified one-sided test's, judged against ``threshold``."""

    sampling: str
    changed_at_wall: float
    changed_after_s: float
    requests_before: int
    requests_after: int
    al_before: float
    al_after: float
    p_value: float
    threshold: float


def _band(prompt_tokens: int | None) -> int:
    """Doubling bands of prompt length (0, 1, 2-3, 4-7, ...); unknown lengths share one band."""
    return -1 if prompt_tokens is None else int(prompt_tokens).bit_length()


def _pooled_al(requests: Sequence[SimpleNamespace]) -> float:
    return acceptance_length(sum(r.accepted for r in requests), sum(r.verify_steps for r in requests))


def _strata(before: Sequence[SimpleNamespace], after: Sequence[SimpleNamespace]) -> list[tuple[list, list]]:
    """``(AL before, AL after)`` per stratum with requests on both sides: a prompt served on both sides
    is its own stratum, every other request goes to its prompt-length band."""
    recurring = ({r.prompt_key for r in before} & {r.prompt_key for r in after}) - {None}
    strata: dict[tuple, tuple[list, list]] = {}
    for side, requests in enumerate((before, after)):
        for r in requests:
            key = ("prompt", r.prompt_key) if r.prompt_key in recurring else ("band", _band(r.prompt_tokens))
            strata.setdefault(key, ([], []))[side].append(r.mean_acceptance_length)
    return [(a, b) for a, b in strata.values() if a and b]


def _split_p_value(before: Sequence[SimpleNamespace], after: Sequence[SimpleNamespace]) -> float:
    """One-sided p-value of "requests before accept more than requests after": :func:`_strata`'s
    Mann-Whitney normal scores combined by Stouffer's method, weighted by sqrt(n1 n2 / (n1 + n2)). A
    stratum whose requests all accept alike carries no evidence and is left out."""
    p_values, weights = [], []
    for a, b in _strata(before, after):
        if len(set(a) | set(b)) == 1:
            continue
        p_values.append(stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic",
                                           use_continuity=False).pvalue)
        weights.append(math.sqrt(len(a) * len(b) / (len(a) + len(b))))
    if not p_values:
        return 1.0
    if len(p_values) == 1:
        return float(p_values[0])
    return float(stats.combine_pvalues(p_values, method="stouffer", weights=weights).pvalue)


def group_drift(requests: Sequence[SimpleNamespace], alpha: float, min_drop: float = MIN_DROP) -> Drift | None:
    """The strongest fall of AL over ``requests`` (one sampling group, oldest first, each with
    ``sampling``, ``started_wall``, ``prompt_key`` (None: not recorded), ``prompt_tokens``,
    ``verify_steps``, ``accepted`` and ``mean_acceptance_length``) whose p-value is at most ``alpha`` / len(:data:`SPLITS`) and whose AL
    falls by at least ``min_drop`` (relative); None when there is none or too few requests."""
    if len(requests) < MIN_REQUESTS:
        return None
    threshold = alpha / len(SPLITS)
    found = None
    for fraction in SPLITS:
        cut = round(fraction * len(requests))
        before, after = requests[:cut], requests[cut:]
        al_before, al_after = _pooled_al(before), _pooled_al(after)
        if al_after > (1 - min_drop) * al_before:
            continue
        p = _split_p_value(before, after)
        if p <= threshold and (found is None or p < found.p_value):
            found = Drift(requests[0].sampling, after[0].started_wall, after[0].started_wall - requests[0].started_wall,
                          len(before), len(after), al_before, al_after, p, threshold)
    return found


def check_drift(ctx: RunContext) -> list[Finding]:
    """ACCEPT_DRIFT [warning]: AL fell over the run within a sampling group (:func:`group_drift` at
    :data:`DRIFT_ALPHA` shared by the groups judged)."""
    judged = [g for g in ctx.request_groups.values() if len(g) >= MIN_REQUESTS]
    findings = []
    for requests in judged:
        drift = group_drift(requests, DRIFT_ALPHA / len(judged))
        if drift is None:
            continue
        findings.append(runtime_finding(
            "ACCEPT_DRIFT", ctx.run_id,
            f"acceptance fell over the run ({drift.sampling} requests): AL {drift.al_before:.2f} over the first "
            f"{drift.requests_before} requests, {drift.al_after:.2f} over the {drift.requests_after} from "
            f"{drift.changed_after_s:.0f} s on (p = {drift.p_value:.1e})",
            {"sampling": drift.sampling, "al_before": drift.al_before, "al_after": drift.al_after,
             "changed_at_wall": drift.changed_at_wall, "changed_after_s": drift.changed_after_s,
             "requests_before": drift.requests_before, "requests_after": drift.requests_after,
             "p_value": drift.p_value, "threshold": drift.threshold, "false_alarm_bound": DRIFT_ALPHA,
             "min_drop": MIN_DROP},
            "Acceptance that decays while the server stays up points at state that outlives requests: compare "
            "the draft's inputs early and late (the Tensors page), look for caches or buffers reused across "
            "requests, and check whether a restart restores the early AL."))
    return findings
