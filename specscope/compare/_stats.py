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

from collections import defaultdict
from collections.abc import Iterator, Sequence
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
EQUIVALENCE_MARGIN = 0.05
"""``no change`` is a claim too: the whole interval within this share of the base AL either way (the
runs are shown to agree within 5% of tokens per verify step). An interval that straddles 0 and
reaches past it is ``inconclusive``: too few or too noisy requests to tell a regression from noise."""
MIN_REQUESTS = 2
VERDICTS = ("regression", "improvement", "inconclusive", "no change")


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

    def resampled(self, draws: np.ndarray) -> np.ndarray:
        """The AL of each resample: ``draws`` holds one row of request indices per resample."""
        return acceptance_length(self.accepted[draws].sum(axis=-1), self.steps[draws].sum(axis=-1))

    def subset(self, index: Sequence[int] | np.ndarray) -> Requests:
        """The requests at ``index``, in that order."""
        index = np.asarray(index, dtype=int)
        return Requests(tuple(self.ids[i] for i in index), tuple(self.keys[i] for i in index),
                        self.accepted[index], self.steps[index])


@dataclass(frozen=True)
class Difference:
    """Candidate minus base AL (tokens per verify step) with its ``ci95`` and ``verdict``; ``paired``
    with ``matched`` pairs, else two-sample; ``floor``: the practical-significance floor and
    ``margin`` the equivalence margin of ``no change`` (AL)."""

    delta: float
    ci95: tuple[float, float]
    verdict: str
    paired: bool
    matched: int
    base_requests: int
    candidate_requests: int
    floor: float
    margin: float

    def to_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "ci95": list(self.ci95), "verdict": self.verdict, "paired": self.paired,
                "matched_requests": self.matched, "base_requests": self.base_requests,
                "candidate_requests": self.candidate_requests, "practical_floor": self.floor,
                "equivalence_margin": self.margin}


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
    """Candidate AL minus base AL with a 95% interval over requests, paired when every request of
    both sides has a partner (the runs served the same prompts as often), and the verdict
    (:func:`verdict`; ``floor_share`` of the base AL is its practical floor). A paired difference
    speaks for the paired requests only, so with any request unpaired both runs are used whole: the
    candidate serving the base's prompts and then each once more, all of those collapsed, paired
    its first pass alone and read ``no change``.

    The interval is delta ± t x SE: SE from ``resamples`` bootstrap resamples of requests (pairs
    together; else each side on its own), each side's bootstrap variance scaled by n / (n - 1) (the
    bootstrap's plug-in variance is that much too small), and t the Student quantile with n - 1
    (paired) or Welch–Satterthwaite degrees of freedom. Percentile and BCa intervals flagged 8-14% of
    healthy-vs-healthy splits of 4-9 requests a side where this one flags about 5%
    (``benchmarks/compare_false_alarm.py``).

    Raises:
        ValueError: a side has fewer than :data:`MIN_REQUESTS` requests.
    """
    for name, side in (("base", base), ("candidate", candidate)):
        if len(side) < MIN_REQUESTS:
            raise ValueError(f"the {name} run has {len(side)} request(s) with verify steps; "
                             f"a comparison needs at least {MIN_REQUESTS}")
    b, c = match(base, candidate)
    paired = len(b) >= MIN_REQUESTS and len(b) == len(base) == len(candidate)
    rng = np.random.default_rng(seed)
    if paired:
        ours, theirs = base.subset(b), candidate.subset(c)
        moves = [theirs.resampled(d) - ours.resampled(d) for d in _draws(len(b), resamples, rng)]
        spread = [_variance(np.concatenate(moves), len(b))]
        df = len(b) - 1.0
    else:
        ours, theirs = base, candidate
        spread = [_variance(np.concatenate([side.resampled(d) for d in _draws(len(side), resamples, rng)]), len(side))
                  for side in (ours, theirs)]
        df = _welch(spread, (len(ours), len(theirs)))
    delta = theirs.mean_acceptance_length - ours.mean_acceptance_length
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df) * np.sqrt(sum(spread))) if sum(spread) > 0 else 0.0
    low, high = delta - half, delta + half
    floor = floor_share * ours.mean_acceptance_length
    margin = EQUIVALENCE_MARGIN * ours.mean_acceptance_length
    return Difference(delta, (low, high), verdict(delta, low, high, floor, margin), paired,
                      len(b) if paired else 0, len(base), len(candidate), floor, margin)


_BATCH = 2_000_000  # request indices drawn at once: bounded memory on runs of many requests


def _draws(n: int, resamples: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``resamples`` rows of ``n`` request indices drawn with replacement, in batches."""
    rows = max(1, _BATCH // n)
    for start in range(0, resamples, rows):
        yield rng.integers(0, n, size=(min(rows, resamples - start), n))


def _variance(values: np.ndarray, n: int) -> float:
    """Bootstrap variance of a statistic, scaled by n / (n - 1) to the unbiased sample variance."""
    return float(values.var(ddof=1)) * n / (n - 1)


def _welch(variances: list[float], sizes: tuple[int, int]) -> float:
    """Welch–Satterthwaite degrees of freedom of a difference of two independent estimates."""
    total = sum(variances)
    denominator = sum(v * v / (n - 1) for v, n in zip(variances, sizes))
    return total * total / denominator if denominator > 0 else float(sum(sizes) - 2)


def verdict(delta: float, low: float, high: float, floor: float, margin: float) -> str:
    """``regression`` when the interval lies below 0 and the drop is at least ``floor``;
    ``improvement`` the other way round; ``no change`` when the whole interval lies within
    ``margin`` of 0, or clear of 0 with a difference under ``floor``; else ``inconclusive``."""
    if high < 0 and -delta >= floor:
        return "regression"
    if low > 0 and delta >= floor:
        return "improvement"
    if -margin <= low and high <= margin or (low > 0 or high < 0):
        return "no change"
    return "inconclusive"


TAIL_PERCENTILES = (10, 50, 90)
"""Percentiles of per-request AL a comparison reports beside the mean: a draft that fails on some
requests only moves p10 long before the mean, one that loops on others moves p90."""


def tail(base: Requests, candidate: Requests, *, resamples: int = RESAMPLES, seed: int | None = 0) -> dict[str, Any]:
    """Per percentile of :data:`TAIL_PERCENTILES` (``"p10"``, ...): both sides' per-request AL at it
    (nearest rank, numpy's ``inverted_cdf``: ``v_request_acceptance_distribution``'s definition), the
    ``delta`` and its 95% percentile-bootstrap interval over requests (each side resampled on its own),
    ``changed`` when that interval is clear of 0."""
    rng = np.random.default_rng(seed)
    ours, theirs = base.per_request(), candidate.per_request()

    def at(values: np.ndarray, draws: np.ndarray | None = None) -> np.ndarray:
        picked = values if draws is None else values[draws]
        return np.percentile(picked, TAIL_PERCENTILES, axis=-1, method="inverted_cdf")

    boot = [np.concatenate([at(side, d) for d in _draws(len(side), resamples, rng)], axis=-1)
            for side in (ours, theirs)]
    moves = boot[1] - boot[0]  # (percentiles, resamples)
    low, high = np.percentile(moves, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)], axis=-1)
    result = {}
    for i, p in enumerate(TAIL_PERCENTILES):
        b, c = float(at(ours)[i]), float(at(theirs)[i])
        result[f"p{p}"] = {"base": b, "candidate": c, "delta": c - b, "ci95": [float(low[i]), float(high[i])],
                           "changed": bool(low[i] > 0 or high[i] < 0)}
    return result


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
    return {name: requests.subset([i for i, g in enumerate(groups) if g == name]) for name in dict.fromkeys(groups)}
