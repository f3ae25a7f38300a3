"""Side-by-side timing with a calibration: the statistics every overhead benchmark shares.

A comparison times two sides, A (the baseline) and B, as pairs of adjacent batches of identical work,
A first in even rounds and B first in odd ones (ABBA over two rounds: a load that drifts linearly
hits both sides alike). Pair i gives the log-ratio ln(b_i / a_i); the figure is the 20% trimmed mean
of the log-ratios as a percentage, exp(trimmed mean) - 1, with Yuen's confidence interval of it
(scipy's ``mstats.trimmed_mean_ci``), mapped the same way. Logs, because timing noise is
multiplicative: a ratio and its inverse weigh the same. Trimmed, because this machine stalls now and
then: in an A/A run about one pair in ten read 7-15% off, either way, while the rest scattered by
1-3%, and those few pairs widened the plain mean's interval several times over. The plain mean and
its Student's t interval are reported beside it: a cost that comes in rare spikes (a periodic write)
would be trimmed away, and shows as a plain mean above the trimmed one.

Calibration: an A/A comparison (both sides the same code, same state) is timed in the same rounds,
so under the same load. Its interval says how small a difference this machine, now, can resolve: an
A/B figure is reported only when the A/A interval lies within :data:`RESOLVE_PCT` either side of
zero, else the report shows the A/A interval instead and says why: too noisy (an interval around
zero that reaches past the bound: more pairs narrow it), or biased (an interval that excludes zero:
the two sides are not identical after all, and no number of pairs helps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.stats import mstats

CONFIDENCE = 0.95
RESOLVE_PCT = 0.5
"""Half-width (percent) the A/A interval must fit in: then a 1% cost cannot hide in the noise."""
AA = "A/A (both sides identical)"
"""The name of the calibration comparison."""


TRIM = 0.2
"""Share of the log-ratios cut from each end for the trimmed mean."""


@dataclass(frozen=True)
class Interval:
    """An estimate in percent with its confidence interval, over ``n`` pairs or rounds, and the plain
    mean with its interval (``mean``: ``(pct, low, high)``)."""

    pct: float
    low: float
    high: float
    n: int
    mean: tuple[float, float, float]

    def within(self, bound_pct: float) -> bool:
        """The whole interval lies in [-bound_pct, +bound_pct]."""
        return -bound_pct <= self.low and self.high <= bound_pct

    def half_width(self) -> float:
        """Half the interval's width, in percent points."""
        return (self.high - self.low) / 2

    def excludes_zero(self) -> bool:
        """The interval lies on one side of zero: the two sides differ (at its confidence)."""
        return self.low > 0 or self.high < 0

    def pairs_for(self, bound_pct: float) -> int:
        """About how many pairs at this scatter would put an A/A interval within +-``bound_pct`` nine
        times in ten: the estimate of identical sides scatters around zero with the half-width (which
        shrinks as 1 / sqrt(n)), so the half-width must leave room for that scatter too."""
        room = 1 + stats.norm.ppf(0.95) / stats.norm.ppf(0.5 + CONFIDENCE / 2)  # |estimate| < 0.84 hw, 90%
        return max(self.n + 1, round(self.n * (room * self.half_width() / bound_pct) ** 2))

    def ratio(self) -> tuple[float, float, float]:
        """``(estimate, low, high)`` as B's time over A's (1.05 for +5%): a speed-up or a share of a
        floor is this ratio or its inverse."""
        return 1 + self.pct / 100, 1 + self.low / 100, 1 + self.high / 100

    def __str__(self) -> str:
        return (f"{self.pct:+.2f}% (95% CI {self.low:+.2f}% .. {self.high:+.2f}%, {self.n} pairs); "
                f"plain mean {self.mean[0]:+.2f}% ({self.mean[1]:+.2f}% .. {self.mean[2]:+.2f}%)")


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and Student's t interval for it (at least two
    values)."""
    sample = np.asarray(values, dtype=float)
    ci = stats.ttest_1samp(sample, 0.0).confidence_interval(confidence)
    return float(sample.mean()), float(ci.low), float(ci.high)


def slowdown(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """B's time over A's minus 1, in percent, from paired times ``a[i]``, ``b[i]``: the trimmed mean with
    Yuen's interval, and the plain mean with Student's t (see the module doc)."""
    ratios = np.log(np.asarray(b, dtype=float) / np.asarray(a, dtype=float))
    low, high = mstats.trimmed_mean_ci(ratios, limits=(TRIM, TRIM), alpha=1 - confidence)
    trimmed = [100 * float(np.expm1(x)) for x in (stats.trim_mean(ratios, TRIM), low, high)]
    mean = tuple(100 * float(np.expm1(x)) for x in mean_interval(ratios, confidence))
    return Interval(*trimmed, len(a), mean)


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
        withheld = f"no A/B figure reported ({', '.join(n for n in results if n != AA)})"
        if calibration.excludes_zero():  # the identical sides differ: more pairs would not help
            lines.append(f"biased: the identical sides differ by {calibration.pct:+.2f}%, an interval off "
                         f"zero that reaches past +-{bound_pct}%: what differs between the sides (not "
                         f"the machine's noise) must go before they can be compared; {withheld}")
        else:
            lines.append(f"too noisy to resolve 1%: the A/A interval is not within +-{bound_pct}% (at this "
                         f"scatter about {calibration.pairs_for(bound_pct)} pairs would be needed); {withheld}")
        return lines
    lines += [f"{name:48} {result}" for name, result in results.items() if name != AA]
    return lines
