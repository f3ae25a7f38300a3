"""specscope.app.queries on real stores (SQLite and PostgreSQL) holding the dashboard traces."""

from __future__ import annotations

import pytest
from _dashboard_traces import AUX, FUSED, HIDDEN, LAYERS, T0, K, accepted_pattern, trace

from specscope import events as ev
from specscope import metrics, points
from specscope.app import charts, queries
from specscope.storage.queries import ROLLING_STEPS

REQUESTS, STEPS = 6, 12


@pytest.fixture
def filled(store):
    store.write(trace("healthy", world_size=2, requests=REQUESTS, steps=STEPS))
    store.write(trace("faulty", fault="no-aux-capture", requests=REQUESTS, steps=STEPS, t0=1_750_000_100.0))
    return store


def accepted(fault, request=None):
    return [accepted_pattern(fault, s, r) for r in range(REQUESTS) if request in (None, r) for s in range(STEPS)]


def test_runs_newest_first_with_state(filled):
    rows = queries.runs(filled)
    assert [r["run_id"] for r in rows] == ["faulty", "healthy"]
    assert {r["state"] for r in rows} == {"finished"}
    assert [r["requests"] for r in rows] == [REQUESTS, REQUESTS]
    assert rows[0]["fault"] == "no-aux-capture" and rows[0]["config"]["expected_fused_width"] == FUSED


def test_run_summary_matches_metrics_and_view(filled):
    for run_id, fault in (("healthy", None), ("faulty", "no-aux-capture")):
        row = queries.run_summary(filled, run_id)
        steps = accepted(fault)
        assert row["verify_steps"] == REQUESTS * STEPS
        assert row["mean_acceptance_length"] == pytest.approx(metrics.mean_acceptance_length(steps))
        assert row["acceptance_rate"] == pytest.approx(metrics.acceptance_rate(steps, [K] * len(steps)))
        view = filled.query("SELECT mean_acceptance_length, status, requests, events_dropped FROM v_run_summary "
                            "WHERE run_id = :r", {"r": run_id})[1][0]
        assert row["mean_acceptance_length"] == pytest.approx(float(view[0]))
        assert (row["state"], row["requests"], row["events_dropped"]) == tuple(view[1:])
    assert queries.run_summary(filled, "faulty")["mean_acceptance_length"] == 1.0
    assert queries.run_summary(filled, "nope") is None


def test_acceptance_over_time_covers_every_step(filled):
    rows = queries.acceptance_over_time(filled, "healthy", buckets=10)
    assert sum(r["verify_steps"] for r in rows) == REQUESTS * STEPS
    assert sum(r["accepted"] for r in rows) == sum(accepted(None))
    assert len(rows) <= 10 and [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)
    assert {r["mean_acceptance_length"] for r in queries.acceptance_over_time(filled, "faulty")} == {1.0}
    rolling = queries.acceptance_over_time(filled, "healthy", buckets=3 * ROLLING_STEPS)
    assert len(rolling) > ROLLING_STEPS
    for i, row in enumerate(rolling):  # steps-weighted AL of this and the ROLLING_STEPS - 1 slices before it
        window = rolling[max(0, i - ROLLING_STEPS + 1):i + 1]
        expected = 1 + sum(r["accepted"] for r in window) / sum(r["verify_steps"] for r in window)
        assert row["rolling_acceptance_length"] == pytest.approx(expected)


def test_position_acceptance_equals_view_and_metrics(filled):
    rows = queries.position_acceptance(filled, "healthy")
    view = filled.query("SELECT position, acceptance FROM v_position_acceptance WHERE run_id = 'healthy' "
                        "ORDER BY position")[1]
    assert [(r["position"], r["acceptance"]) for r in rows] == [(p, pytest.approx(float(a))) for p, a in view]
    assert [r["acceptance"] for r in rows] == pytest.approx(metrics.per_position_acceptance(metrics.chain_mask(a, K) for a in accepted(None)))


def test_requests_ordering_and_figures(filled):
    rows = queries.requests(filled, "healthy")
    assert [r["request_id"] for r in rows] == [f"req-{i}" for i in range(REQUESTS)]
    for row in rows:
        steps = accepted(None, int(row["request_id"].split("-")[1]))
        assert row["verify_steps"] == STEPS
        assert row["mean_acceptance_length"] == pytest.approx(metrics.mean_acceptance_length(steps))
        assert row["duration_s"] > 0
    worst = queries.requests(filled, "healthy", order="acceptance length")
    assert [r["mean_acceptance_length"] for r in worst] == sorted(r["mean_acceptance_length"] for r in rows)
    assert len(queries.requests(filled, "healthy", limit=2)) == 2
    with pytest.raises(ValueError, match="unknown request order"):
        queries.requests(filled, "healthy", order="bogus")


def test_request_drilldown_marks_each_token(filled):
    steps = queries.request_steps(filled, "healthy", "req-1")
    assert [s["step"] for s in steps] == list(range(STEPS))
    tokens = queries.marked_tokens(steps)
    assert sum(t["source"] == "draft" for t in tokens) == sum(accepted(None, 1))
    assert sum(t["source"] == "target" for t in tokens) == STEPS  # one bonus token per step
    text = filled.query("SELECT text FROM requests WHERE run_id = 'healthy' AND request_id = 'req-1'")[1][0][0]
    assert "".join(t["token"] for t in tokens) == text
    positions = queries.request_positions(filled, "healthy", "req-1")
    assert [p["acceptance"] for p in positions] == pytest.approx(
        metrics.per_position_acceptance(metrics.chain_mask(a, K) for a in accepted(None, 1)))


def test_ranks_split_the_run(filled):
    rows = queries.ranks(filled, "healthy")
    assert [r["rank"] for r in rows] == [0, 1]
    assert sum(r["verify_steps"] for r in rows) == REQUESTS * STEPS
    assert [r["device"] for r in rows] == ["cuda:0", "cuda:1"]


def test_tensor_contract_and_draft_widths(filled):
    contract = queries.tensor_contract(filled, "faulty")
    view = filled.query("SELECT hook_point, SUM(calls) FROM v_tensor_contract WHERE run_id = 'faulty' "
                        "GROUP BY hook_point ORDER BY hook_point")[1]
    sums: dict[str, int] = {}
    for row in contract:
        sums[row["hook_point"]] = sums.get(row["hook_point"], 0) + row["events"]
    assert sorted(sums.items()) == [(p, int(n)) for p, n in view]
    widths = queries.draft_input_widths(contract, FUSED)
    fed = [r for r in widths if r["call"] == "target-fed"]
    assert [(r["width"], r["expected_width"], r["width_mismatch"]) for r in fed] == [(HIDDEN, FUSED, True)]
    chained = [r for r in widths if r["call"] == "chained"]
    assert [(r["width"], r["width_mismatch"]) for r in chained] == [(HIDDEN, False)]
    assert sum(r["events"] for r in widths) == sums["draft.forward:hidden_states"]
    healthy = queries.draft_input_widths(queries.tensor_contract(filled, "healthy"), FUSED)
    assert not any(r["width_mismatch"] for r in healthy)
    assert queries.graph_phases(contract) == {"eager": sum(sums.values())}
    layers = [points.capture_layer(r["hook_point"]) for r in contract if points.capture_layer(r["hook_point"])]
    assert layers == sorted(layers) and set(layers) == set(AUX)  # 2 < 15 < 27, not text order


def test_draft_inputs_over_time_leaves_unsampled_slices_empty(store):
    """Target-fed calls not sampled for the middle of a run: their slices have no row (a gap the
    chart keeps), while the chained calls, sampled throughout, fill every slice."""
    run = trace("gappy", requests=REQUESTS, steps=STEPS)  # 72 steps, one every 0.05 s
    end = max(e.ts_wall for e in run)
    fed = (-1, -1, FUSED)

    def unsampled(e) -> bool:
        return isinstance(e, ev.TensorEvent) and e.expected_shape == fed and T0 + 1.15 < e.ts_wall < T0 + 2.45

    store.write([e for e in run if not unsampled(e)])
    rows = queries.draft_inputs_over_time(store, "gappy", FUSED, buckets=12)  # 0.3 s slices
    slices = {call: [r["slice"] for r in rows if r["call"] == call] for call in ("target-fed", "chained")}
    assert slices["chained"] == list(range(12))
    assert slices["target-fed"] == [0, 1, 2, 3, 8, 9, 10, 11]
    kept = sum(1 for e in run if isinstance(e, ev.TensorEvent) and e.expected_shape == fed and not unsampled(e))
    assert sum(r["events"] for r in rows if r["call"] == "target-fed") == kept
    assert {(r["width"], r["width_mismatch"]) for r in rows} == {(FUSED, False), (HIDDEN, False)}
    figure = charts.draft_widths(rows, FUSED, end - T0)
    line = next(t for t in figure.data if t.name.startswith("target-fed"))
    gap = list(line.x).index(None)  # one break between slice 3 and slice 8, not a line through it
    assert list(line.x).count(None) == 1 and line.x[gap - 1] < 1.2 and line.x[gap + 1] == pytest.approx(2.4)
    assert figure.layout.xaxis.range[1] == pytest.approx(end - T0)  # the axis spans the whole run


def test_capture_layers_fired_and_silent(store):
    events = [e for e in trace("silent") if getattr(e, "hook_point", "") != f"target.layers.{AUX[1]}:input"]
    store.write(events)
    layers = queries.capture_layers(queries.run_summary(store, "silent")["config"],
                                    queries.tensor_contract(store, "silent"))
    assert [(r["layer"], r["rank"], r["fired"]) for r in layers] == \
        [(AUX[0], 0, True), (AUX[1], 0, False), (AUX[2], 0, True)]
    assert all(r["configured"] for r in layers)


def test_capture_layers_name_the_rank_that_never_ran_a_layer(store):
    silent = f"target.layers.{AUX[1]}:input"
    store.write([e for e in trace("healthy", world_size=2)
                 if not (getattr(e, "hook_point", "") == silent and e.rank == 1)])
    layers = queries.capture_layers(queries.run_summary(store, "healthy")["config"],
                                    queries.tensor_contract(store, "healthy"))
    assert [(r["layer"], r["rank"]) for r in layers if not r["fired"]] == [(AUX[1], 1)]
    assert len(layers) == 2 * len(AUX)


def test_provenance_and_load_reports(filled):
    rows = queries.provenance(filled, "faulty")
    assert [(r["configured"], r["received"], r["matches"]) for r in rows] == [(list(AUX), [LAYERS], False)]
    assert all(r["matches"] for r in queries.provenance(filled, "healthy"))
    reports = queries.load_reports(filled, "healthy")
    assert [(r["rank"], r["strict"], r["missing"], r["unexpected"]) for r in reports] == \
        [(0, True, [], []), (1, True, [], [])]


def test_what_if_chart_keeps_the_predicted_line_inside_the_plot_and_above_the_bars():
    rows = [{"k": 1, "mean_acceptance_length": 1.2, "tokens_per_s": 10.1},
            {"k": 2, "mean_acceptance_length": 1.4, "tokens_per_s": 11.2}]
    figure = charts.what_if_k(rows)
    bars, line = figure.data
    assert line.yaxis == "y2" and figure.layout.yaxis2.range[1] > max(line.y)
    # the bars top out below the line's share of the plot height
    assert max(bars.y) / figure.layout.yaxis.range[1] < min(line.y) / figure.layout.yaxis2.range[1]
    assert len(charts.what_if_k([{**r, "tokens_per_s": None} for r in rows]).data) == 1


def test_short_ids_are_the_shortest_unique_prefixes_of_at_least_eight():
    from specscope.app import widgets

    ids = ["llamacpp-draft-1a2b3c4d", "llamacpp-ngram-5e6f7a8b", "llamacpp-eagle3-9c0d1e2f",
           "llamacpp-draft-1a2b9999", "3f2a9c1e5b7d4a60"]
    short = widgets.short_ids(ids)
    assert short == {"llamacpp-draft-1a2b3c4d": "llamacpp-draft-1a2b3", "llamacpp-draft-1a2b9999": "llamacpp-draft-1a2b9",
                     "llamacpp-ngram-5e6f7a8b": "llamacpp-n", "llamacpp-eagle3-9c0d1e2f": "llamacpp-e",
                     "3f2a9c1e5b7d4a60": "3f2a9c1e"}
    assert all(sum(other.startswith(prefix) for other in ids) == 1 for prefix in short.values())
    assert widgets.short_ids(["ab"]) == {"ab": "ab"} and widgets.short_ids([]) == {}
