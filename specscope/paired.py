"""Side-by-side timing with a calibration: the statistics every overhead benchmark shares.

A comparison times two sides, A (the baseline) and B, as pairs of adjacent batches of identical work,
A first in even rounds and B first in odd ones (ABBA over two rounds: a load that drifts linearly
hits both sides alike). Pair i gives the log-ratio ln(b_i / a_i); the figure is the mean log-ratio
as a percentage, exp(mean) - 1, with Student's t confidence interval of that mean (scipy), mapped
the same way. Logs, because timing noise is multiplicative: a ratio and its inverse weigh the same.

Calibration: an A/A comparison (both sides the same code, same state) is timed in the same rounds,
so under the same load. Its interval says how small a difference this machine, now, can resolve: an
A/B figure is reported only when the A/A interval lies within :data:`RESOLVE_PCT` either side of
zero, else the report says the machine was too noisy and shows the A/A interval instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESOLVE_PCT = 0.5
"""Half-width (percent) the A/A interval must fit in: then a 1% cost cannot hide in the noise."""
AA = "A/A (both sides identical)"
"""The name of the calibration comparison."""


@dataclass(frozen=True)
class Interval:
    """An estimate in percent with its confidence interval, over ``n`` pairs or rounds."""

    pct: float
    low: float
    high: float
    n: int

    def within(self, bound_pct: float) -> bool:
        """The whole interval lies in [-bound_pct, +bound_pct]."""
        return -bound_pct <= self.low and self.high <= bound_pct

    def pairs_for(self, bound_pct: float) -> int:
        """About how many pairs at this scatter would narrow the interval to +-``bound_pct`` around
        its estimate (the half-width shrinks as 1 / sqrt(n))."""
        half = (self.high - self.low) / 2
        return max(self.n, round(self.n * (half / bound_pct) ** 2))

    def __str__(self) -> str:
        return f"{self.pct:+.2f}% (95% CI {self.low:+.2f}% .. {self.high:+.2f}%, {self.n} pairs)"


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and Student's t interval for it (at least two
    values)."""
    sample = np.asarray(values, dtype=float)
    ci = stats.ttest_1samp(sample, 0.0).confidence_interval(confidence)
    return float(sample.mean()), float(ci.low), float(ci.high)


def slowdown(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """B's time over A's minus 1, in percent, from paired times ``a[i]``, ``b[i]`` (see the module doc)."""
    mean, low, high = mean_interval(np.log(np.asarray(b, dtype=float) / np.asarray(a, dtype=float)), confidence)
    pct = [100 * float(np.expm1(x)) for x in (mean, low, high)]
    return Interval(*pct, len(a))


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(25th percentile, median, 75th percentile)`` of ``values``."""
    q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(q1), float(median), float(q3)


def timed(run: Callable[[], object]) -> float:
    """Wall seconds of ``run()``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


Side = Callable[[], float]
"""Runs one batch of one side and returns its time (seconds)."""


def compare(comparisons: Mapping[str, tuple[Side, Side]], pairs: int,
            budget_s: float | None = None) -> dict[str, Interval]:
    """Time every comparison ``name: (a, b)`` as ``pairs`` pairs, interleaved: round i runs one pair
    of each comparison in turn (A first when i is even), so that all of them, the A/A included, meet
    the same load. ``budget_s``: start no round after that many seconds, once two rounds are done
    (fewer pairs, wider intervals: the report says how many). Returns each comparison's
    :func:`slowdown`."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in comparisons}
    start = time.monotonic()
    for round_ in range(pairs):
        if budget_s is not None and round_ >= 2 and time.monotonic() - start > budget_s:
            break
        for name, (a, b) in comparisons.items():
            first, second = (a, b) if round_ % 2 == 0 else (b, a)
            t_first, t_second = first(), second()
            times[name][0].append(t_first if round_ % 2 == 0 else t_second)
            times[name][1].append(t_second if round_ % 2 == 0 else t_first)
    return {name: slowdown(a_times, b_times) for name, (a_times, b_times) in times.items()}


def report(results: Mapping[str, Interval], bound_pct: float = RESOLVE_PCT) -> list[str]:
    """One line per comparison, the A/A (:data:`AA`) first: every A/B figure with its interval when
    the A/A interval is within ``bound_pct``; else one line saying the machine was too noisy."""
    calibration = results[AA]
    lines = [f"{AA:48} {calibration}"]
    if not calibration.within(bound_pct):
        lines.append(f"too noisy to resolve 1%: the A/A interval is not within +-{bound_pct}% (at this scatter "
                     f"about {calibration.pairs_for(bound_pct)} pairs would be needed); no A/B figure reported "
                     f"({', '.join(n for n in results if n != AA)})")
        return lines
    lines += [f"{name:48} {result}" for name, result in results.items() if name != AA]
    return lines
