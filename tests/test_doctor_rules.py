"""Doctor rules over realistic stored traces (tests/_traces.py), on SQLite and PostgreSQL: each fault
gives its code with the evidence numbers; the healthy run gives no error or warning."""

from __future__ import annotations

import _traces as T
import pytest

from specscope.doctor import diagnose
from specscope.doctor._rules_capture import classify
from specscope.doctor._rules_health import prefix_rename


def run(store, trace: T.Trace):
    trace.write(store)
    return diagnose(store, trace.run_id)


def only(report, code: str):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.codes()
    assert found[0].source == "doctor" and found[0].run_id == report.runs[0].run_id
    return found[0]


def test_healthy_run_has_no_finding_but_what_its_audit_covered(store):
    report = run(store, T.healthy())
    assert report.codes() == ["LOSSLESS_AUDITED"] and report.findings[0].severity == "info"
    assert report.exit_code == 0
    summary = report.runs[0]
    assert (summary.requests, summary.verify_steps) == (4, 32)
    assert summary.mean_acceptance_length == pytest.approx(2.0)
    assert summary.acceptance_rate == pytest.approx(0.25)
    assert summary.per_position_acceptance == pytest.approx([0.75, 0.25, 0.0, 0.0])


def test_fault_label_is_never_read(store):
    """A healthy trace labelled with a fault switch stays clean: rules read observations only."""
    report = run(store, T.healthy("labelled", fault="no-aux-capture"))
    assert report.codes() == ["LOSSLESS_AUDITED"] and report.runs[0].fault == "no-aux-capture"


def test_no_aux_capture(store):
    report = run(store, T.no_aux_capture())
    assert report.codes() == ["AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "ACCEPT_COLLAPSE", "LOSSLESS_AUDITED"]
    assert report.exit_code == 1
    fused = only(report, "AUX_NOT_FUSED")
    assert fused.severity == "error"
    assert {k: fused.evidence[k] for k in ("observed_width", "expected_width", "calls", "hook_point")} == {
        "observed_width": 576, "expected_width": 1728, "calls": 36,  # 4 requests x (1 + 8) fed calls
        "hook_point": "draft.forward:hidden_states"}
    silent = only(report, "AUX_CAPTURE_SILENT").evidence
    assert silent["received"] == [30] and silent["final_hidden_state"] == 30
    assert (silent["samples"], silent["silent_samples"], silent["matching_samples"]) == (18, 18, 0)
    assert "capture_layer_events" not in silent  # the target's layers ran: only provenance tells
    collapse = only(report, "ACCEPT_COLLAPSE").evidence
    assert collapse["mean_acceptance_length"] == pytest.approx(1.0)
    assert (collapse["verify_steps"], collapse["threshold"]) == (32, 1.05)


def test_a_run_whose_output_was_not_audited_says_so(store):
    """The audit off, or an engine that hands it no verify step: nothing found is then no claim about
    the output, and CHECKS_SKIPPED says so with the codes that could not fire."""
    report = run(store, T.Trace("unaudited", (T.RankTrace(audited=False),)))
    assert report.codes() == ["CHECKS_SKIPPED"] and report.exit_code == 0
    skipped = only(report, "CHECKS_SKIPPED")
    (check,) = skipped.evidence["not_checked"]
    assert check["check"] == "losslessness audit" and check["codes"] == ["LOSSLESS_VIOLATION", "LOSSLESS_AUDITED"]
    assert "no verify step was audited" in skipped.message and "audit_every" in skipped.fix


def test_a_run_stopped_before_its_first_verify_step(store):
    """The texts fit a run with no verify step: no claim that the draft runs, and the skipped
    acceptance said as such."""
    report = run(store, T.stopped_before_verify())
    assert report.codes() == ["AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "CHECKS_SKIPPED"]
    silent = only(report, "AUX_CAPTURE_SILENT")
    assert silent.message.startswith("aux capture is silent before the first verify step: the engine "
                                     "activated no aux capture")
    assert "while the draft runs" not in silent.message and silent.evidence["active"] == []
    skipped = only(report, "CHECKS_SKIPPED")
    assert skipped.message.startswith("not checked: acceptance (") and "not drafted" not in skipped.message
    assert skipped.evidence["not_checked"][0]["codes"] == ["ACCEPT_COLLAPSE", "ACCEPT_SATURATED",
                                                           "POSITION0_LOW"]
    assert "while the draft runs" in only(run(store, T.no_aux_capture()), "AUX_CAPTURE_SILENT").message


def test_aux_off_by_one(store):
    report = run(store, T.off_by_one())
    mismatch = only(report, "AUX_LAYER_MISMATCH")
    assert mismatch.severity == "error"
    assert mismatch.evidence == {"configured": [2, 15, 27], "received": [3, 16, 28], "ranks": [0],
                                 "samples": 18, "matching_samples": 0, "mismatch_samples": 18, "shift": 1}
    assert "AUX_NOT_FUSED" not in report.codes()  # the width is right; the layers are not
    p0 = only(report, "POSITION0_LOW").evidence
    assert p0["position0_acceptance"] == pytest.approx(0.25) and p0["threshold"] == 0.3


def test_dropped_keys(store):
    report = run(store, T.dropped_keys())
    dropped = only(report, "WEIGHTS_DROPPED").evidence
    assert (dropped["dropped"], dropped["missing"], dropped["strict"]) == (10, 10, False)
    assert dropped["dropped_keys"][0] == "layers.0.self_attn.q_proj.weight"
    assert dropped["missing_params"][0] == "midlayer.self_attn.q_proj.weight"
    assert dropped["rename"] == ["layers.0.", "midlayer."]
    assert "ACCEPT_COLLAPSE" in report.codes()


def test_a_dropped_key_prefix_is_quoted_in_the_fix_as_one_code_span(store):
    """The fix is Markdown on the dashboard: a checkpoint's key prefix holding a backtick and an image
    stays inside one code span (fenced past its backticks), never an image a viewer's browser fetches."""
    hostile = "a`b![i](http://probe.invalid/x)."
    trace = T.Trace("hostile-keys", (T.RankTrace(missing=tuple(f"midlayer.{p}" for p in T.LAYER_PARAMS),
                                                 unexpected=tuple(f"{hostile}{p}" for p in T.LAYER_PARAMS),
                                                 accepted=(0,)),))
    dropped = only(run(store, trace), "WEIGHTS_DROPPED")
    assert dropped.evidence["rename"] == [hostile, "midlayer."]
    assert f"rename checkpoint keys ``{hostile}*`` to `midlayer.*`" in dropped.fix


def test_nonfinite_activations(store):
    report = run(store, T.nonfinite())
    evidence = only(report, "NONFINITE_ACTIVATIONS").evidence
    # 4 requests x (9 target-fed + 8 x 3 chained) draft calls, 3 inf/nan elements each
    assert (evidence["hook_point"], evidence["events"], evidence["count"]) == (
        "draft.forward:output.1", 132, 396)
    assert report.exit_code == 1


@pytest.mark.parametrize("trace, code, expected", [
    (T.dropped_events(), "EVENTS_DROPPED", {"events_dropped": 120, "dropped_per_rank": [120]}),
    (T.hook_errors(), "HOOK_ERRORS", {"hook_errors": 3, "errors_per_rank": [3]}),
    (T.capture_only(), "GRAPH_MODE_BLIND", {"graph_mode": "capture_only", "ranks": [0]}),
])
def test_observation_health(store, trace, code, expected):
    report = run(store, trace)
    assert sorted(report.codes()) == sorted([code, "LOSSLESS_AUDITED"])
    finding = only(report, code)
    assert {k: finding.evidence[k] for k in expected} == expected
    assert finding.severity == ("info" if code == "GRAPH_MODE_BLIND" else "warning")
    assert report.exit_code == 0


def test_cuda_graph_replays_read_from_the_buffer_are_not_blind(store):
    assert run(store, T.cuda_graph()).codes() == ["LOSSLESS_AUDITED"]


def test_cuda_graph_replays_without_provenance_say_what_is_missing(store):
    report = run(store, T.cuda_graph(provenance=False))
    assert report.codes() == ["LOSSLESS_AUDITED", "GRAPH_MODE_BLIND", "CHECKS_SKIPPED"] and report.exit_code == 0
    blind = only(report, "GRAPH_MODE_BLIND")
    assert (blind.evidence["graph_mode"], blind.evidence["not_observed"]) == ("cuda_graph", ["provenance"])
    assert "replayed" in blind.message and "provenance_every" in blind.fix
    reasons = [s["reason"] for s in only(report, "CHECKS_SKIPPED").evidence["not_checked"]]
    assert reasons == ["CUDA graphs replayed and no draft input was matched from the replay buffer "
                       "(provenance turned off)"]


def test_model_runner_v2_says_what_is_missing_and_what_still_works(store):
    report = run(store, T.runner_v2())
    assert report.codes() == ["RUNNER_NOT_ATTACHED"] and report.exit_code == 0  # not NOT_OBSERVED, GRAPH_MODE_BLIND
    runner = only(report, "RUNNER_NOT_ATTACHED")
    assert runner.severity == "warning" and runner.evidence["model_runner"] == "v2"
    missing = {code for item in runner.evidence["not_checked"] for code in item["codes"]}
    assert {"AUX_NOT_FUSED", "AUX_LAYER_MISMATCH", "LOSSLESS_VIOLATION"} <= missing
    assert "4 request(s) and 32 verify step(s)" in runner.message and "VLLM_USE_V2_MODEL_RUNNER=0" in runner.fix
    (summary,) = report.runs
    assert summary.verify_steps == 32 and summary.mean_acceptance_length == pytest.approx(2.0)


def test_two_ranks_diverging(store):
    report = run(store, T.two_ranks_diverging())
    divergence = [f.evidence for f in report.findings if f.code == "RANK_DIVERGENCE"]
    by_acceptance = next(e for e in divergence if "spread" in e)
    assert by_acceptance["ranks"] == [0, 1]
    assert by_acceptance["mean_acceptance_length"] == pytest.approx([2.0, 1.0])
    assert by_acceptance["verify_steps"] == [32, 32] and by_acceptance["margin"] == 0.5
    by_shape = next(e for e in divergence if "widths" in e)
    assert (by_shape["hook_point"], by_shape["expected_width"]) == ("draft.forward:hidden_states", 1728)
    assert by_shape["widths"] == [[1728], [576]]
    # the broken rank is not outvoted by the healthy one
    assert only(report, "AUX_CAPTURE_SILENT").evidence["ranks"] == [1]
    assert only(report, "AUX_NOT_FUSED").evidence["ranks"] == [1]
    assert "ACCEPT_COLLAPSE" not in report.codes()  # AL 1.5 over both ranks


def test_partial_capture(store):
    evidence = only(run(store, T.partial_capture()), "AUX_CAPTURE_PARTIAL").evidence
    assert (evidence["fired"], evidence["missing"]) == ([2, 27], [15])
    assert (evidence["observed_width"], evidence["observed_layers"], evidence["expected_layers"]) == (
        1152, 2, 3)
    assert (evidence["received"], evidence["partial_samples"]) == ([2, 27], 18)


def test_capture_layers_never_fire(store):
    report = run(store, T.capture_layers_silent())
    evidence = only(report, "AUX_CAPTURE_SILENT").evidence
    assert evidence == {"configured": [2, 15, 27], "capture_layer_events": 0}


def test_saturated_acceptance(store):
    report = run(store, T.saturated())
    assert report.codes() == ["ACCEPT_SATURATED", "LOSSLESS_AUDITED"]
    evidence = only(report, "ACCEPT_SATURATED").evidence
    assert (evidence["accepted"], evidence["proposed"], evidence["acceptance_rate"]) == (128, 128, 1.0)


@pytest.mark.parametrize("trace, skipped", [
    (T.few_steps(), [["ACCEPT_COLLAPSE", "ACCEPT_SATURATED", "POSITION0_LOW"]]),
    (T.draft_only(), [["AUX_LAYER_MISMATCH"], ["AUX_CAPTURE_PARTIAL"]]),
], ids=["few-steps", "draft-only"])
def test_skipped_checks_are_named(store, trace, skipped):
    """8 collapsed steps are below the 16-step minimum; a draft-only trace proves nothing about the
    capture layers: no error or warning, and an info finding naming the rules that had no evidence."""
    report = run(store, trace)
    assert report.codes() == ["LOSSLESS_AUDITED", "CHECKS_SKIPPED"] and report.exit_code == 0
    evidence = only(report, "CHECKS_SKIPPED").evidence
    assert [s["codes"] for s in evidence["not_checked"]] == skipped


def test_verify_steps_without_tensor_events_are_not_a_clean_verdict(store):
    """A run whose engine never called instrument(): acceptance is recorded, the contract is not."""
    report = run(store, T.not_instrumented())
    assert report.codes() == ["NOT_OBSERVED", "LOSSLESS_AUDITED"]
    finding = only(report, "NOT_OBSERVED")
    assert finding.severity == "warning" and finding.evidence["verify_steps"] == 32
    assert finding.evidence["not_checked"][0]["codes"] == [
        "AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "AUX_CAPTURE_PARTIAL", "AUX_LAYER_MISMATCH"]
    assert "instrument(" in finding.fix


@pytest.mark.parametrize("received, verdict", [
    ((2, 15, 27), "match"), ((30,), "silent"), ((None, None, None), "silent"),
    ((3, 16, 28), "mismatch"), ((27, 15, 2), "mismatch"), ((2, 27), "partial"), ((2, None, 27), "partial"),
])
def test_classify_provenance(received, verdict):
    assert classify(received, (2, 15, 27), 30) == verdict


def test_prefix_rename():
    assert prefix_rename(["layers.0.mlp.up_proj.weight", "extra.bias"],
                         ["midlayer.mlp.up_proj.weight"]) == ("layers.0.", "midlayer.")
    assert prefix_rename(["foo.weight"], ["bar.bias"]) is None


def _sampling_run(store, run_id: str, groups: dict[float, list[int]]):
    """A run of one request per temperature, each verify step proposing 4 drafts and accepting the
    listed counts (p_0: the share of steps accepting any); diagnosed. No aux-capture contract (a watched
    server's run): the acceptance rules alone speak."""
    from specscope import events as ev

    events = [ev.RunStart(run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
                          config={}, ts_wall=1.0)]
    for temperature, accepted in groups.items():
        request = f"T{temperature:g}"
        events.append(ev.RequestStart(run_id, request, 0, prompt_tokens=3, temperature=temperature))
        events += [ev.VerifyStep(run_id, request, 0, step=i, proposed=4, accepted=a, ts_wall=2.0 + i)
                   for i, a in enumerate(accepted)]
    store.write(events)
    return diagnose(store, run_id)


def test_position0_is_judged_on_the_greedy_group_beside_a_sampled_one(store):
    """Greedy p_0 0.1 (AL 1.4, not collapsed) beside T=0.8 p_0 0.6: POSITION0_LOW on the greedy group's figures."""
    report = _sampling_run(store, "mixed-low", {0.0: [4] * 2 + [0] * 18, 0.8: [1] * 12 + [0] * 8})
    low = only(report, "POSITION0_LOW")
    assert low.evidence["judged_on"] == "greedy requests" and "of greedy requests" in low.message
    assert (low.evidence["position0_acceptance"], low.evidence["verify_steps"]) == (pytest.approx(0.1), 20)


def test_a_low_sampled_group_beside_a_healthy_greedy_one_is_not_judged_and_named(store):
    """Greedy p_0 0.75 beside T=0.8 p_0 0.1 (the whole run's p_0 0.26): no POSITION0_LOW, and
    CHECKS_SKIPPED names the sampled group."""
    report = _sampling_run(store, "mixed-ok", {0.0: [2] * 15 + [0] * 5, 0.8: [4] * 6 + [0] * 54})
    assert "POSITION0_LOW" not in report.codes()
    skipped = [s for s in only(report, "CHECKS_SKIPPED").evidence["not_checked"] if "POSITION0_LOW" in s["codes"]]
    assert [s["check"] for s in skipped] == ["acceptance of sampled requests (T=0.8) against greedy thresholds"]


def test_a_sampled_only_run_that_accepts_nothing_still_collapses(store):
    """Sampled requests only at AL 1.0: the collapse is judged on them (a working draft accepts far more
    at any usual temperature); position 0 and saturation are not (greedy thresholds)."""
    report = _sampling_run(store, "sampled-collapse", {0.8: [0] * 20})
    collapse = only(report, "ACCEPT_COLLAPSE")
    assert collapse.evidence["judged_on"] == "sampled requests" and collapse.evidence["mean_acceptance_length"] == 1.0
    assert "POSITION0_LOW" not in report.codes() and "ACCEPT_SATURATED" not in report.codes()


def test_a_few_greedy_steps_do_not_hide_a_collapsed_sampled_run(store):
    """Ten greedy steps accepting well beside 600 sampled steps accepting nothing (AL 1.049 over the
    run): too few greedy steps to judge apart, so the whole run is judged and collapses (judging the
    greedy group alone left the run without a verdict)."""
    report = _sampling_run(store, "few-greedy", {0.0: [3] * 10, 0.8: [0] * 600})
    collapse = only(report, "ACCEPT_COLLAPSE")
    assert collapse.evidence["judged_on"] == "all requests" and collapse.evidence["verify_steps"] == 610
    assert collapse.evidence["mean_acceptance_length"] == pytest.approx(1 + 30 / 610)


def _request_run(store, run_id: str, requests: list[tuple[int, list[int]]]):
    """A greedy run of requests started one second apart, each ``(prompt tokens, accepted per verify
    step)`` proposing 4 drafts a step; diagnosed."""
    from specscope import events as ev

    events = [ev.RunStart(run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
                          config={}, ts_wall=1.0)]
    for n, (prompt_tokens, accepted) in enumerate(requests):
        t0 = 10.0 + n
        events.append(ev.RequestStart(run_id, f"q{n}", 0, prompt_tokens=prompt_tokens, temperature=0.0, ts_wall=t0))
        events += [ev.VerifyStep(run_id, f"q{n}", 0, step=i, proposed=4, accepted=a, ts_wall=t0 + 0.01 * i)
                   for i, a in enumerate(accepted)]
    store.write(events)
    return diagnose(store, run_id)


@pytest.mark.parametrize("requests", [
    [(40, [2, 3] * 10)] * 8 + [(40, [0] * 20)] * 11,  # too few requests for ACCEPT_DRIFT
    [(40, [2, 3] * 10)] * 12 + [(200, [0] * 20)] * 18,  # the collapse comes with longer prompts
], ids=["19-requests", "longer-prompts"])
def test_a_run_whose_later_requests_accept_nothing_collapses_from_then_on(store, requests):
    """The first requests accept well, every later one accepts nothing: the run's AL (about 2) reads
    healthy and ACCEPT_DRIFT does not judge it (too few requests, or no prompt-length band on both
    sides of the change); the collapse from the first collapsed request on is an error."""
    report = _request_run(store, f"late-{len(requests)}", requests)
    collapse = only(report, "ACCEPT_COLLAPSE")
    healthy = sum(1 for _, accepted in requests if sum(accepted))
    e = collapse.evidence
    assert (e["requests_before"], e["requests_after"], e["first_request_after"]) == (
        healthy, len(requests) - healthy, f"q{healthy}")
    assert (e["mean_acceptance_length"], e["al_before"]) == (1.0, 3.5) and report.exit_code == 1


def test_one_request_accepting_nothing_at_the_end_is_not_a_collapse(store):
    """A single hard prompt last (AL 1 over 20 steps) after healthy ones: no collapse, one request can
    do that by itself; two of them can not."""
    healthy = [(40, [2, 3] * 10)] * 8
    assert "ACCEPT_COLLAPSE" not in _request_run(store, "one-hard", healthy + [(40, [0] * 20)]).codes()
    assert "ACCEPT_COLLAPSE" in _request_run(store, "two-hard", healthy + [(40, [0] * 20)] * 2).codes()


@pytest.mark.parametrize("expected", [None, (1, -1, 576)], ids=["no-expected-shape", "another-expected-width"])
def test_a_draft_input_not_marked_target_fed_is_not_observed(store, expected):
    """The draft ran on 576-wide inputs where the config expects 1728, but no event marks a target-fed
    input (no expected shape, or the draft's own width): AUX_NOT_FUSED reads nothing, and the run says
    so instead of reading healthy."""
    from specscope import events as ev

    config = ev.RunConfig(aux_layer_ids_resolved=(2, 15, 27), target_hidden_size=576, expected_fused_width=1728,
                          k=4, num_target_layers=30).to_dict()
    events = [ev.RunStart(run_id="unmarked", engine="e", engine_version="0", target_model="t", draft_model="d",
                          config=config, ts_wall=1.0), ev.RequestStart("unmarked", "q", 0, prompt_tokens=3)]
    for i in range(20):
        events.append(ev.VerifyStep("unmarked", "q", 0, step=i, proposed=4, accepted=2, ts_wall=2.0 + i))
        events.append(ev.TensorEvent(run_id="unmarked", rank=0, hook_point="draft.forward:hidden_states",
                                     call_index=i, shape=(1, 1, 576), dtype="float32", device="cpu",
                                     expected_shape=expected, ts_wall=2.0 + i))
    store.write(events)
    blind = only(diagnose(store, "unmarked"), "NOT_OBSERVED")
    assert blind.evidence["not_checked"][0]["codes"] == ["AUX_NOT_FUSED"]
    assert "no draft input recorded as target-fed (expected 1728 wide" in blind.message


@pytest.mark.parametrize("seed", range(5))
def test_healthy_runs_read_no_collapse_from_either_new_path(store, seed):
    """The counterparts of the collapse cases above, healthy: ten greedy steps beside sampled requests
    that accept (AL about 2), and 30 greedy requests of random acceptance (a few steps accepting
    nothing among them): no ACCEPT_COLLAPSE, whatever the seed."""
    import random

    rng = random.Random(seed)
    mixed = _sampling_run(store, f"few-greedy-ok-{seed}",
                          {0.0: [rng.randint(0, 4) for _ in range(10)], 0.8: [rng.randint(0, 3) for _ in range(600)]})
    series = _request_run(store, f"series-ok-{seed}", [(rng.choice([40, 200]), [rng.randint(0, 4) for _ in range(20)])
                                                       for _ in range(30)])
    assert "ACCEPT_COLLAPSE" not in mixed.codes() and "ACCEPT_COLLAPSE" not in series.codes()
