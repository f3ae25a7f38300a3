"""The acceptance-distribution views (storage/_distribution_views.py) on SQLite and PostgreSQL: the
histogram of accepted drafts per verify step, per-request AL percentiles, windows over time and AL by
position in the output, as their named queries read them and as the views give them."""

from __future__ import annotations

import pytest
from _acceptance_runs import Req, write_run

from specscope.storage import queries as q

REQUESTS = [Req([0, 1, 4, 4], start=0), Req([2, 2], start=10, temperature=0.8), Req([3] * 40, start=20),
            Req([4] * 3, start=30)]


@pytest.fixture
def run(store):
    write_run(store, "other", [Req([1, 1, 1], start=0)])  # another run's steps count nowhere here
    return write_run(store, "run", REQUESTS)


def test_histogram_has_k_plus_1_buckets_per_sampling_group(store, run):
    rows = store.fetch(q.ACCEPTANCE_HISTOGRAM, run_id=run)
    greedy = {r["accepted_drafts"]: r["verify_steps"] for r in rows if r["sampling"] == "greedy"}
    sampled = {r["accepted_drafts"]: r["verify_steps"] for r in rows if r["sampling"] == "T=0.8"}
    assert greedy == {0: 1, 1: 1, 2: 0, 3: 40, 4: 5}
    assert sampled == {0: 0, 1: 0, 2: 2, 3: 0, 4: 0}
    assert sum(r["share"] for r in rows if r["sampling"] == "greedy") == pytest.approx(1.0)
    _, view = store.query("SELECT accepted_drafts, verify_steps FROM v_acceptance_histogram "
                          "WHERE run_id = 'run' AND sampling = 'greedy' ORDER BY accepted_drafts")
    assert dict(view) == greedy


def test_request_percentiles_are_nearest_rank_and_token_weighted(store, run):
    rows = {r["sampling"]: r for r in store.fetch(q.REQUEST_DISTRIBUTION, run_id=run)}
    assert set(rows) == {"greedy", "T=0.8", "all"}
    greedy = rows["greedy"]  # request ALs 3.25 (13 tokens), 4.0 (160), 5.0 (15)
    assert greedy["requests"] == 3
    assert (greedy["p10_al"], greedy["p50_al"], greedy["p90_al"], greedy["p99_al"]) == (3.25, 4.0, 5.0, 5.0)
    assert greedy["mean_request_al"] == pytest.approx((3.25 + 4.0 + 5.0) / 3)
    assert greedy["token_weighted_al"] == pytest.approx((13 * 3.25 + 160 * 4.0 + 15 * 5.0) / (13 + 160 + 15))
    assert rows["all"]["requests"] == 4 and rows["all"]["p10_al"] == 3.0
    _, view = store.query("SELECT sampling, p50_al FROM v_request_acceptance_distribution WHERE run_id = 'run'")
    assert dict(view) == {s: r["p50_al"] for s, r in rows.items()}


def test_windows_cover_every_step_in_time_order(store, run):
    rows = store.fetch(q.ACCEPTANCE_WINDOWS, run_id=run)
    assert sum(r["verify_steps"] for r in rows) == 4 + 2 + 40 + 3
    starts = [r["window_start_wall"] for r in rows]
    assert starts == sorted(starts) and rows[0]["window_index"] == 0 and rows[-1]["window_index"] == 31
    assert rows[-1]["mean_acceptance_length"] == 5.0  # the last request accepted everything
    first = rows[0]
    assert first["mean_acceptance_length"] == pytest.approx(1 + 9 / 4)  # r0 alone: 0.2 s of a 30 s span


def test_acceptance_by_output_position_buckets_generated_tokens(store, run):
    rows = {r["output_position"]: r for r in store.fetch(q.OUTPUT_POSITION_ACCEPTANCE, run_id=run)}
    # r2 emits 4 tokens a step: steps 0-3 start below 16 generated tokens, 4-7 below 32, 8-15 below 64
    assert rows[16]["verify_steps"] == 4 and rows[16]["mean_acceptance_length"] == 4.0
    assert rows[32]["verify_steps"] == 8 and rows[64]["verify_steps"] == 16 and rows[128]["verify_steps"] == 8
    assert rows[0]["verify_steps"] == 4 + 2 + 4 + 3
    assert sum(r["verify_steps"] for r in rows.values()) == 49
    # the view over every run (run id carried through) reads as the one-run query
    _, view = store.query("SELECT run_id, output_position, verify_steps, accepted FROM "
                          "v_acceptance_by_output_position WHERE run_id = :r ORDER BY output_position", {"r": run})
    assert [tuple(r) for r in view] == [(run, p, rows[p]["verify_steps"], rows[p]["accepted"]) for p in sorted(rows)]
