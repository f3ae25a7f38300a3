"""The difference in mean acceptance length between two sets of requests, with a bootstrap confidence
interval and a verdict (docs/design.md, "Comparing runs").

A request is the unit of resampling: its verify steps share a prompt and a context, so they are not
independent draws, and resampling steps would give intervals far too narrow. A side's AL is the ratio
estimator 1 + sum(accepted) / sum(verify steps) over its requests (each request weighs by its steps,
exactly as the run's own AL), recomputed on every resample. Paired when both sides served the same
prompts (the same key at the same place): one resample of the pairs moves both sides together, so
what the prompts have in common cancels; else the two sides are resampled independently.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from specscope.metrics import acceptance_length

CONFIDENCE = 0.95
RESAMPLES = 4000
PRACTICAL_FLOOR = 0.01
"""A difference smaller than this share of the base AL is ``no change`` whatever its interval: tokens
per verify step, and so decode throughput at a fixed step cost, moves by under 1%, which is the
decode overhead specscope's own hooks are allowed (docs/design.md, "Budgets") and within what a
serving benchmark resolves. On a long enough run any real difference has an interval clear of 0;
the floor keeps a CI gate from failing builds over differences nobody would act on."""
PAIRED_MIN_SHARE = 0.5
"""Pair only when the requests with a partner are at least this share of each side: the paired
difference then speaks for most of both runs; otherwise both runs are used whole, unpaired."""
MIN_REQUESTS = 2
VERDICTS = ("regression", "improvement", "no change")


@dataclass(frozen=True)
class Requests:
    """One side's requests with verify steps, in order: ``keys`` pair requests across runs,
    ``accepted`` draft tokens and ``steps`` (verify steps) per request, ``ids`` the request ids."""

    ids: tuple[str, ...]
    keys: tuple[str, ...]
    accepted: np.ndarray
    steps: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def mean_acceptance_length(self) -> float:
        return float(acceptance_length(self.accepted.sum(), self.steps.sum()))

    def per_request(self) -> np.ndarray:
        return acceptance_length(self.accepted, self.steps)


@dataclass(frozen=True)
class Difference:
    """Candidate minus base AL (tokens per verify step) with its ``ci95`` and ``verdict``; ``paired``
    with ``matched`` pairs, else two-sample; ``floor``: the practical-significance floor (AL)."""

    delta: float
    ci95: tuple[float, float]
    verdict: str
    paired: bool
    matched: int
    base_requests: int
    candidate_requests: int
    floor: float

    def to_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "ci95": list(self.ci95), "verdict": self.verdict, "paired": self.paired,
                "matched_requests": self.matched, "base_requests": self.base_requests,
                "candidate_requests": self.candidate_requests, "practical_floor": self.floor}


def match(base: Requests, candidate: Requests) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays (into ``base``, into ``candidate``) of the requests with the same key; a key that
    repeats (a prompt served twice) pairs its n-th occurrence on one side with its n-th on the other."""
    places: dict[str, list[int]] = defaultdict(list)
    for index, key in enumerate(candidate.keys):
        places[key].append(index)
    seen: dict[str, int] = defaultdict(int)
    pairs = []
    for index, key in enumerate(base.keys):
        if seen[key] < len(places[key]):
            pairs.append((index, places[key][seen[key]]))
        seen[key] += 1
    return (np.array([b for b, _ in pairs], dtype=int), np.array([c for _, c in pairs], dtype=int))


def difference(base: Requests, candidate: Requests, *, resamples: int = RESAMPLES, seed: int | None = 0,
               floor_share: float = PRACTICAL_FLOOR) -> Difference:
    """Candidate AL minus base AL with a bootstrap (BCa) 95% interval over requests, paired when at
    least :data:`PAIRED_MIN_SHARE` of each side's requests have a partner, and the verdict: a
    ``regression`` / ``improvement`` when the interval excludes 0 and the difference is at least
    ``floor_share`` of the base AL, else ``no change``.

    Raises:
        ValueError: a side has fewer than :data:`MIN_REQUESTS` requests.
    """
    for name, side in (("base", base), ("candidate", candidate)):
        if len(side) < MIN_REQUESTS:
            raise ValueError(f"the {name} run has {len(side)} request(s) with verify steps; "
                             f"a comparison needs at least {MIN_REQUESTS}")
    b, c = match(base, candidate)
    paired = len(b) >= MIN_REQUESTS and min(len(b) / len(base), len(c) / len(candidate)) >= PAIRED_MIN_SHARE
    rng = np.random.default_rng(seed)
    if paired:
        ba, bs, ca, cs = base.accepted[b], base.steps[b], candidate.accepted[c], candidate.steps[c]

        def statistic(i, axis=-1):
            return (acceptance_length(ca[i].sum(axis), cs[i].sum(axis))
                    - acceptance_length(ba[i].sum(axis), bs[i].sum(axis)))

        data: tuple[np.ndarray, ...] = (np.arange(len(b)),)
    else:
        def statistic(i, j, axis=-1):
            return (acceptance_length(candidate.accepted[j].sum(axis), candidate.steps[j].sum(axis))
                    - acceptance_length(base.accepted[i].sum(axis), base.steps[i].sum(axis)))

        data = (np.arange(len(base)), np.arange(len(candidate)))
    delta = float(statistic(*data))
    low, high = _interval(data, statistic, resamples, rng)
    floor = floor_share * (base.mean_acceptance_length if not paired
                           else float(acceptance_length(base.accepted[b].sum(), base.steps[b].sum())))
    return Difference(delta, (low, high), verdict(delta, low, high, floor), paired, len(b) if paired else 0,
                      len(base), len(candidate), floor)


def _interval(data, statistic, resamples: int, rng: np.random.Generator) -> tuple[float, float]:
    # every resample equal (identical runs): BCa is undefined (0 / 0), the interval is that one value
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(data, statistic, n_resamples=resamples, confidence_level=CONFIDENCE,
                                 vectorized=True, paired=False, method="BCa", rng=rng, batch=500)
    low, high = result.confidence_interval
    if not (np.isfinite(low) and np.isfinite(high)):
        tail = 50 * (1 - CONFIDENCE)
        low, high = np.percentile(result.bootstrap_distribution, [tail, 100 - tail])
    return float(low), float(high)


def verdict(delta: float, low: float, high: float, floor: float) -> str:
    """``regression`` when the interval lies below 0 and the drop is at least ``floor``;
    ``improvement`` the other way round; else ``no change``."""
    if high < 0 and -delta >= floor:
        return "regression"
    if low > 0 and delta >= floor:
        return "improvement"
    return "no change"


def moved(base: Requests, candidate: Requests, limit: int = 10) -> list[dict[str, Any]]:
    """The paired requests whose AL changed most (largest absolute difference first): ``key``, both
    request ids, both ALs and ``delta``. Empty when no request has a partner."""
    b, c = match(base, candidate)
    before, after = base.per_request()[b], candidate.per_request()[c]
    order = np.argsort(-np.abs(after - before), kind="stable")[:limit]
    return [{"key": base.keys[b[i]], "base_request_id": base.ids[b[i]],
             "candidate_request_id": candidate.ids[c[i]], "base_acceptance_length": float(before[i]),
             "candidate_acceptance_length": float(after[i]), "delta": float(after[i] - before[i])}
            for i in order]


def split_groups(requests: Requests, groups: Sequence[str]) -> dict[str, Requests]:
    """``requests`` split by ``groups`` (one group name per request)."""
    out = {}
    for name in dict.fromkeys(groups):
        keep = np.array([g == name for g in groups])
        out[name] = Requests(tuple(np.array(requests.ids, dtype=object)[keep]),
                             tuple(np.array(requests.keys, dtype=object)[keep]),
                             requests.accepted[keep], requests.steps[keep])
    return out
