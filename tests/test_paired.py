"""The paired-timing statistics the overhead benchmarks share (``specscope.paired``), on synthetic
times: no clock is read."""

from __future__ import annotations

import itertools

import numpy as np

from specscope.paired import AA, Interval, compare, report, slowdown


def noisy(rng: np.random.Generator, base: np.ndarray, factor: float, sigma: float) -> np.ndarray:
    return base * factor * np.exp(rng.normal(0.0, sigma, base.size))


def test_the_interval_covers_a_known_slowdown_under_drift():
    rng = np.random.default_rng(0)
    base = np.linspace(1.0, 1.6, 40)  # the machine slows down by 60% over the run
    result = slowdown(noisy(rng, base, 1.0, 0.003), noisy(rng, base, 1.02, 0.003))
    assert result.low < 2.0 < result.high
    assert result.low > 1.0  # resolved: a 2% cost is not confused with none
    assert result.n == 40


def test_the_gate_refuses_a_noisy_calibration_and_reports_a_quiet_one():
    rng = np.random.default_rng(1)
    base = np.ones(16)
    b = slowdown(noisy(rng, base, 1.0, 0.003), noisy(rng, base, 1.01, 0.003))
    loud = slowdown(noisy(rng, base, 1.0, 0.05), noisy(rng, base, 1.0, 0.05))
    quiet = slowdown(noisy(rng, base, 1.0, 0.003), noisy(rng, base, 1.0, 0.003))
    assert not loud.within(0.5) and quiet.within(0.5)
    refused = report({AA: loud, "plugin": b})
    assert "too noisy" in refused[1] and not any(str(b) in line for line in refused)
    assert loud.pairs_for(0.5) > 16 * 10  # a 5% scatter needs hundreds of pairs
    assert report({AA: quiet, "plugin": b})[1].endswith(str(b))


def test_a_narrow_calibration_off_zero_is_called_a_bias_not_noise():
    """Two compiled engines of one process, built alike, read -1.25% (-1.44% .. -1.06%) over 330
    pairs: more pairs would not bring that within +-0.5%, and the report must not ask for them."""
    rng = np.random.default_rng(2)
    base = np.ones(300)
    biased = slowdown(noisy(rng, base, 1.0, 0.01), noisy(rng, base, 0.9875, 0.01))
    b = slowdown(noisy(rng, base, 1.0, 0.01), noisy(rng, base, 1.02, 0.01))
    assert biased.half_width() < 0.5 and biased.high < -0.5
    lines = report({AA: biased, "plugin": b})
    assert lines[1].startswith("biased: the identical sides differ by -1.") and "pairs would be needed" not in lines[1]
    assert not any(str(b) in line for line in lines)


def test_a_calibration_around_zero_that_pokes_past_the_bound_asks_for_more_pairs():
    """The compiled engine paused vs paused read +0.23% (-0.06% .. +0.53%) over 320 pairs: narrower
    than +-0.5% but past it on one side, around zero: noise, which more pairs shrink, not a bias."""
    calibration = Interval(0.23, -0.06, 0.53, 320, (0.29, -0.10, 0.67))
    assert not calibration.within(0.5) and not calibration.excludes_zero()
    lines = report({AA: calibration, "plugin": calibration})
    assert lines[1].startswith("too noisy") and len(lines) == 2
    # at a half-width of 0.295 the estimate's own scatter must fit under the bound too: more pairs
    assert 320 < calibration.pairs_for(0.5) < 500


def test_compare_pairs_each_side_with_its_own_and_alternates_the_order():
    calls = []
    clock = itertools.count(1)

    def side(name: str, factor: float):
        def run() -> float:
            calls.append(name)
            return factor * (1 + next(clock) / 1000)  # a machine that slows down with every batch
        return run

    results = compare({AA: (side("a", 1.0), side("a'", 1.0)), "b": (side("A", 1.0), side("B", 1.05))}, pairs=4)
    assert calls[:8] == ["a", "a'", "A", "B", "a'", "a", "B", "A"]
    assert isinstance(results["b"], Interval) and results["b"].low < 5.0 < results["b"].high
    assert abs(results[AA].pct) < 0.1  # the drift cancels over an ABBA order


def test_rare_stalls_widen_the_plain_mean_but_not_the_trimmed_figure():
    """One pair in ten stalled by 10% either way, as this machine does: the trimmed interval still
    resolves a 1% cost, the plain mean's does not, and the plain mean is printed beside it."""
    rng = np.random.default_rng(2)
    base = np.ones(100)
    a, b = noisy(rng, base, 1.0, 0.01), noisy(rng, base, 1.01, 0.01)
    stalled = rng.choice(100, 10, replace=False)
    b[stalled[:5]] *= 1.10
    a[stalled[5:]] *= 1.10
    result = slowdown(a, b)
    assert result.low > 0 and result.low < 1.0 < result.high
    assert result.mean is not None and result.mean[2] - result.mean[1] > 1.5 * (result.high - result.low)
    assert "plain mean" in str(result)


def test_the_ratio_of_a_slowdown_is_the_time_ratio_its_inverse_a_share_of_the_floor():
    """benchmarks.collector_ingest reports the Collector as a share of raw sqlite3 (raw time over its
    time) and benchmarks.pg_ingest COPY's speed-up (executemany's time over COPY's): both read the
    paired figure as a ratio, bounds included."""
    rng = np.random.default_rng(5)
    floor = np.linspace(1.0, 1.3, 12)
    result = slowdown(noisy(rng, floor, 1.0, 0.01), noisy(rng, floor, 1.25, 0.01))
    estimate, low, high = result.ratio()
    assert low < 1.25 < high and low < estimate < high
    assert 0.78 < 1 / high < 0.8 < 1 / low < 0.82  # the share of the floor: 80% within its interval
