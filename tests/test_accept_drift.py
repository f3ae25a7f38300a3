"""ACCEPT_DRIFT (doctor/_rules_drift.py): its false-alarm bound and its power in simulation, and the
finding over runs written through the real Store, time driven by the events' timestamps.

Simulated requests: each has its own difficulty (the chance its draft at any position is accepted,
drawn per request: prompts differ far more than steps of one prompt), a chain of k = 4 drafts per
verify step, 3-30 steps. The AL of a request thus varies widely; a "steady" run draws its requests
from one mix, possibly a mix that changes over the run in ways the test must not read as drift, or
serves a few prompts again and again (each prompt with its own difficulty, as a benchmark loop does)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from _acceptance_runs import K, Req, write_run

from specscope.doctor import DRIFT_ALPHA, diagnose, group_drift

ALPHA = 0.05  # the simulations judge at a large alpha so that its bound is measurable in 200 runs
RUNS = 200


def _request(rng: np.random.Generator, difficulty: float, steps: int) -> list[int]:
    """Accepted drafts per verify step of a chain of K drafts, each accepted with ``difficulty``."""
    accepted = rng.geometric(1 - difficulty, size=steps) - 1  # drafts accepted before the first rejection
    return np.minimum(accepted, K).tolist()


def _series(rng, n: int, difficulty, prompt_tokens, prompt_key=lambda i: None) -> list[SimpleNamespace]:
    """``n`` requests one second apart; ``difficulty(i)``, ``prompt_tokens(i)`` and ``prompt_key(i)``
    of request i."""
    rows = []
    for i in range(n):
        accepted = _request(rng, difficulty(i), int(rng.integers(3, 31)))
        rows.append(SimpleNamespace(sampling="greedy", started_wall=float(i), prompt_key=prompt_key(i),
                                    prompt_tokens=prompt_tokens(i), verify_steps=len(accepted),
                                    accepted=sum(accepted), mean_acceptance_length=1 + sum(accepted) / len(accepted)))
    return rows


def _steady(rng, n):
    return _series(rng, n, lambda i: rng.beta(6, 4), lambda i: int(rng.integers(16, 1024)))


def _mix_shift(rng, n):
    """Short prompts first, long prompts later, and long prompts accept much less: the traffic changes,
    the engine does not."""
    def prompt(i):
        return int(rng.integers(16, 64)) if i < n // 2 else int(rng.integers(512, 1024))
    return _series(rng, n, lambda i: rng.beta(8, 2) if i < n // 2 else rng.beta(3, 7), prompt)


def _recurring(rng, n, decay=0.0):
    """Six prompts of one prompt-length band served in turn, each with its own difficulty; ``decay``: how
    much of its acceptance chance each prompt has lost by the last request (0: steady)."""
    difficulty, length = rng.uniform(0.2, 0.8, size=6), rng.integers(32, 64, size=6)
    return _series(rng, n, lambda i: difficulty[i % 6] * (1 - decay * i / n), lambda i: int(length[i % 6]),
                   lambda i: f"prompt-{i % 6}")


@pytest.mark.parametrize("make", [_steady, _mix_shift, _recurring], ids=["steady", "prompt-mix-changes", "recurring"])
def test_false_alarms_stay_within_the_bound_at_any_length(make):
    rng = np.random.default_rng(7)
    lengths = rng.choice([20, 40, 100, 200], size=RUNS)
    alarms = sum(group_drift(make(rng, int(n)), ALPHA, min_drop=0.0) is not None for n in lengths)
    # at most alpha in expectation; 3 standard deviations of 200 draws above it (without the Bonferroni
    # correction over the split points these runs raise 12-18%)
    assert alarms <= RUNS * ALPHA + 3 * (RUNS * ALPHA * (1 - ALPHA)) ** 0.5


def test_a_long_steady_run_is_quiet_at_the_doctors_settings():
    rng = np.random.default_rng(5)
    assert group_drift(_steady(rng, 5000), DRIFT_ALPHA) is None


def test_the_strata_are_what_keep_a_mix_change_quiet():
    """Without the prompt-length strata the same mix change reads as drift: the control is real."""
    rng = np.random.default_rng(3)
    runs = [_mix_shift(rng, 100) for _ in range(20)]
    for rows in runs:
        for row in rows:
            row.prompt_tokens = 100  # one stratum: the length the test controls for is hidden from it
    assert sum(group_drift(rows, ALPHA, min_drop=0.0) is not None for rows in runs) >= 18


def test_recurring_prompts_are_compared_with_themselves():
    """A decay that what the prompts ask hides from the bands is found when each prompt served on both
    sides of a cut is its own stratum: the same runs with their prompt keys withheld read no drift."""
    rng = np.random.default_rng(13)
    runs = [_recurring(rng, 48, decay=0.6) for _ in range(20)]
    named = sum(group_drift(rows, DRIFT_ALPHA) is not None for rows in runs)
    for rows in runs:
        for row in rows:
            row.prompt_key = None
    # measured: 13 of 20 named, 4 with the keys withheld
    assert named >= 12 and sum(group_drift(rows, DRIFT_ALPHA) is not None for rows in runs) <= 6


def test_a_slow_decay_is_named_with_when_and_how_much():
    rng = np.random.default_rng(11)
    n = 60
    rows = _series(rng, n, lambda i: 0.75 - 0.5 * i / n + rng.normal(0, 0.05), lambda i: int(rng.integers(16, 1024)))
    drift = group_drift(rows, DRIFT_ALPHA)
    assert drift is not None and drift.p_value <= DRIFT_ALPHA / 7
    assert drift.al_after <= 0.9 * drift.al_before
    assert drift.changed_at_wall == rows[drift.requests_before].started_wall


def _traffic(n: int, accepted, temperature=lambda i: 0.0, prompt_tokens=lambda i: 24) -> list[Req]:
    """``n`` requests one minute apart over "hours" of wall time, 8 steps each."""
    return [Req(accepted(i), start=60.0 * i, temperature=temperature(i), prompt_tokens=prompt_tokens(i))
            for i in range(n)]


def test_doctor_names_a_decaying_run_and_not_a_steady_one_nor_a_changing_mix(tmp_path):
    from specscope.storage import open_store
    pattern = [3, 2, 4, 1, 3, 2, 0, 3]
    with open_store(str(tmp_path / "s.db")) as store:
        write_run(store, "steady", _traffic(120, lambda i: pattern))
        # greedy requests give way to sampled ones, which accept less by design: two groups, no drift
        write_run(store, "mix", _traffic(120, lambda i: pattern if i < 60 else [1, 0, 1, 0, 2, 0, 1, 0],
                                         temperature=lambda i: 0.0 if i < 60 else 0.8))
        write_run(store, "decay", _traffic(120, lambda i: [max(0, a - (i * 4) // 120) for a in pattern]))
        report = diagnose(store)
    assert "ACCEPT_DRIFT" not in report.codes("steady") and "ACCEPT_DRIFT" not in report.codes("mix")
    (finding,) = [f for f in report.findings if f.code == "ACCEPT_DRIFT"]
    assert finding.run_id == "decay"
    e = finding.evidence
    assert e["sampling"] == "greedy" and e["al_after"] < 0.9 * e["al_before"] and e["p_value"] <= e["threshold"]
    assert 60.0 * 0.2 * 120 <= e["changed_after_s"] <= 60.0 * 0.8 * 120
