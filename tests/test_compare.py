"""``specscope compare``, the statistics under it and what-if k.

Real runs where the claim is about real runs: one SQLite store, written once for the module by the
reference engine as ``specscope demo`` serves it (4 held-out prompts healthy, the same 4 with
``no-aux-capture``, 4 other prompts healthy). Recorded verify steps (``Store.write`` of the events a
Tracer emits) where the statistics are the point.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from specscope import metrics
from specscope.app import DB_ENV, ENTRY
from specscope.cli import main
from specscope.compare import (
    MIN_REQUESTS,
    Requests,
    compare,
    difference,
    match,
    moved,
    render_text,
)
from specscope.doctor import diagnose
from specscope.events import RequestEnd, RequestStart, RunConfig, RunStart, VerifyStep
from specscope.storage import open_store
from specscope.storage import queries as q

PROMPTS = 5
TOKENS = 16


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, str]:
    """The store path and the run ids ``healthy``, ``no-aux`` (same prompts) and ``other-prompts``."""
    from specscope.adapters.reference import DemoOptions, run_demo

    db = str(tmp_path_factory.mktemp("compare") / "runs.db")
    runs = {"healthy": DemoOptions(db=db, requests=PROMPTS, max_new_tokens=TOKENS, provenance_every=0),
            "no-aux": DemoOptions(db=db, requests=PROMPTS, max_new_tokens=TOKENS, provenance_every=0,
                                  fault="no-aux-capture"),
            "other-prompts": DemoOptions(db=db, requests=PROMPTS, max_new_tokens=TOKENS, provenance_every=0,
                                         first_prompt=PROMPTS)}
    return {"db": db, **{name: run_demo(opts) for name, opts in runs.items()}}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["compare", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# -- real runs ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_healthy_to_no_aux_capture_is_a_regression_exit_1(real, capsys):
    status, out, _ = cli(capsys, "--base-db", real["db"], "--base-run", real["healthy"][:12],
                         "--db", real["db"], "--run", real["no-aux"], "--json")
    data = json.loads(out)
    assert status == 1 and data["verdict"] == "regression"
    assert data["doctor"]["base"]["error"] == 0 and data["doctor"]["candidate"]["error"] >= 1
    assert data["paired"] is True and data["matched_requests"] == PROMPTS
    base, candidate = data["base"], data["candidate"]
    assert base["run_id"] == real["healthy"] and candidate["fault"] == "no-aux-capture"
    assert candidate["mean_acceptance_length"] < 1.2 < base["mean_acceptance_length"]
    assert data["delta"] == pytest.approx(candidate["mean_acceptance_length"] - base["mean_acceptance_length"])
    status, out, _ = cli(capsys, "--base-db", real["db"], "--base-run", real["healthy"], "--db", real["db"],
                         "--run", real["no-aux"])
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: the doctor finds {data['doctor']['candidate']['error']} error(s) on the candidate run "
                     f"(specscope doctor --run {real['no-aux']})"]
    low, high = data["ci95"]
    assert low <= data["delta"] <= high < 0
    assert len(base["per_position_acceptance"]) == 4 and base["acceptance_rate"] > candidate["acceptance_rate"]
    assert len(data["moved"]) == PROMPTS and all(m["delta"] < 0 for m in data["moved"])
    assert {m["candidate_request_id"] for m in data["moved"]} == {f"req-{i:03d}" for i in range(PROMPTS)}


@pytest.mark.slow
def test_the_reverse_is_an_improvement_exit_0_and_text_names_it(real, capsys):
    status, out, _ = cli(capsys, "--base-db", real["db"], "--base-run", real["no-aux"],
                         "--db", real["db"], "--run", real["healthy"])
    assert status == 0
    assert "verdict: improvement" in out and f"paired over {PROMPTS} request(s)" in out


@pytest.mark.slow
def test_healthy_runs_over_different_prompts_are_not_a_regression(real, capsys):
    # the candidate defaults to the store's newest run: other-prompts
    status, out, _ = cli(capsys, "--base-db", real["db"], "--base-run", real["healthy"], "--db", real["db"], "--json")
    data = json.loads(out)
    assert data["candidate"]["run_id"] == real["other-prompts"]
    # a few requests a side, unpaired: the interval reaches far past 5% of AL either way, so the runs
    # cannot tell; a CI gate is not passed on what could not be measured
    low, high = data["ci95"]
    assert low < 0 < high and max(-low, high) > data["equivalence_margin"]
    assert status == 3 and data["verdict"] == "inconclusive" and "serve more" in data["rule"]
    assert data["paired"] is False and data["moved"] == []


@pytest.mark.slow
def test_run_al_is_the_stores_and_the_ratio_over_requests(real):
    with open_store(real["db"], create=False, read_only=True) as store:
        comparison = compare(store, store, real["healthy"], real["no-aux"])
        run = store.fetch(q.RUN, run_id=real["healthy"])[0]
        request_rows = store.fetch(q.COMPARE_REQUESTS, run_id=real["healthy"])
    assert comparison.base.mean_acceptance_length == pytest.approx(run["mean_acceptance_length"])
    assert comparison.base.requests.mean_acceptance_length == pytest.approx(run["mean_acceptance_length"])
    assert sum(r["verify_steps"] for r in request_rows) == run["verify_steps"]
    assert "regression" in render_text(comparison)


@pytest.mark.slow
def test_doctor_json_has_what_if_k_per_run(real, capsys):
    assert main(["doctor", "--db", real["db"], "--run", real["healthy"], "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    rows = run["what_if_k"]
    assert [r["k"] for r in rows] == [1, 2, 3, 4]
    lengths = [r["mean_acceptance_length"] for r in rows]
    assert lengths[-1] == pytest.approx(run["mean_acceptance_length"])  # the run's own k
    assert lengths == sorted(lengths) and lengths[0] == pytest.approx(1 + run["per_position_acceptance"][0])
    assert all(r["tokens_per_s"] > 0 for r in rows)  # the reference engine records draft / verify times


@pytest.mark.slow
def test_dashboard_overview_gives_the_verdict(real, monkeypatch):
    monkeypatch.setenv(DB_ENV, real["db"])
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.selectbox(key="run_picker").set_value(real["no-aux"]).run()
    at.selectbox(key="compare").set_value(real["healthy"]).run()
    assert not at.exception
    (box,) = [e.value for e in at.error if e.value.startswith("**regression**")]
    assert "95% CI" in box and f"paired over {PROMPTS} requests" in box
    assert any(s.value == "Did acceptance change?" for s in at.subheader)
    moved_rows = at.dataframe[0].value
    assert list(moved_rows.columns) == ["request", "base AL", "candidate AL", "difference"]
    assert (moved_rows["difference"] < 0).all() and len(moved_rows) == PROMPTS
    charts = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert "Per-position acceptance, base vs candidate" in charts
    assert charts.count("What if k were smaller") == 2  # one per run panel
    # healthy against healthy over other prompts: no verdict of change is forced
    at.selectbox(key="run_picker").set_value(real["other-prompts"]).run()
    at.selectbox(key="compare").set_value(real["healthy"]).run()
    assert not at.exception and not [e for e in at.error if "regression" in e.value]
    assert any("different prompts" in c.value for c in at.caption)


# -- bad input ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_bad_input_exits_2_with_one_line(real, tmp_path, capsys):
    db = real["db"]
    for argv, expected in (
        (("--base-db", str(tmp_path / "missing.db"), "--db", db), "missing.db"),
        (("--base-db", db, "--base-run", "nope", "--db", db), "no run 'nope'"),
        (("--base-db", db, "--db", db), "same run"),
        # the same store spelt another way: relative, through a link
        (("--base-db", db, "--db", os.path.relpath(db)), "same run"),
        (("--base-db", db, "--db", str(_linked(db, tmp_path))), "same run"),
    ):
        status, out, err = cli(capsys, *argv)
        assert status == 2 and out == "" and len(err.strip().splitlines()) == 1 and expected in err, err


@pytest.mark.postgres
def test_one_postgresql_store_is_one_store_however_the_host_is_named(pg_url, other_pg_url, capsys):
    import sqlalchemy as sa

    from specscope.storage import open_store

    with open_store(pg_url) as store:
        _write(store, "pg-run", {"a": [2, 3, 1], "b": [1, 4, 2]})
        location = store.location
    with open_store(other_pg_url) as store:
        assert store.location != location  # another schema of the same server is another store
    by_name = sa.make_url(pg_url).set(host="localhost").render_as_string(hide_password=False)
    with open_store(by_name, read_only=True) as store:
        assert store.location == location
    status, out, err = cli(capsys, "--base-db", pg_url, "--db", by_name)
    assert status == 2 and "same run" in err, err


def _linked(db: str, folder) -> str:
    link = folder / "link.db"
    link.symlink_to(db)
    return str(link)


def _write(store, run_id: str, accepted: dict[str, list[int]], k: int = 4) -> None:
    """A run whose requests (id -> accepted drafts per verify step) were recorded as a Tracer does."""
    events = [_run_start(run_id, k)]
    for rid, steps in accepted.items():
        events.append(RequestStart(run_id, rid, 0, 8))
        events += [VerifyStep(run_id, rid, 0, i, k, a, draft_s=0.004, verify_s=0.012) for i, a in enumerate(steps)]
        events.append(RequestEnd(run_id, rid, 0, sum(steps) + len(steps), len(steps)))
    store.write(events)


def _run_start(run_id: str, k: int) -> RunStart:
    config = RunConfig(aux_layer_ids_resolved=(), target_hidden_size=8, expected_fused_width=0, k=k,
                       num_target_layers=2)
    return RunStart(run_id, "test", "0", "target", "draft", config.to_dict())


def test_a_run_with_one_request_is_bad_input(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    with open_store(db) as store:
        _write(store, "base", {"a": [1, 2], "b": [3, 0]})
        _write(store, "one", {"a": [1, 2]})
    status, _, err = cli(capsys, "--base-db", db, "--base-run", "base", "--db", db, "--run", "one")
    assert status == 2 and f"at least {MIN_REQUESTS}" in err


def test_first_prompt_serves_another_prompt_set(capsys):
    from specscope.adapters.reference import DemoOptions
    from specscope.engine import demo_prompts
    from specscope.errors import ConfigError

    assert demo_prompts(3, 2) == demo_prompts(5)[2:]
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--no-dashboard", "--first-prompt", "-1"])
    assert exc.value.code == 2 and "--first-prompt" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="first-prompt"):
        DemoOptions(db="x.db", first_prompt=-1).check()


# -- statistics on recorded steps ---------------------------------------------------------------

def side(keys, accepted, steps) -> Requests:
    return Requests(tuple(keys), tuple(keys), np.asarray(accepted, float), np.asarray(steps, float))


def test_identical_runs_are_no_change_with_a_zero_interval():
    a = side("abcdef", [10, 20, 5, 8, 30, 12], [10, 10, 8, 9, 12, 10])
    diff = difference(a, a)
    assert (diff.delta, diff.ci95, diff.verdict, diff.paired, diff.matched) == (0.0, (0.0, 0.0), "no change", True, 6)


def test_a_consistent_shift_below_the_floor_is_no_change():
    rng = np.random.default_rng(3)
    steps = rng.integers(50, 100, 40).astype(float)
    accepted = np.round(steps * rng.uniform(1.0, 2.5, 40))
    keys = [f"r{i}" for i in range(40)]
    base, shifted = side(keys, accepted, steps), side(keys, accepted + np.round(steps * 0.005) + 1, steps)
    diff = difference(base, shifted)
    assert diff.ci95[0] > 0 and diff.delta < diff.floor and diff.verdict == "no change"
    bigger = difference(base, side(keys, accepted + np.round(steps * 0.2), steps))
    assert bigger.verdict == "improvement" and bigger.delta >= bigger.floor


def test_no_change_is_claimed_only_within_the_margin_else_inconclusive():
    rng = np.random.default_rng(4)
    steps = rng.integers(50, 100, 40).astype(float)
    keys = [f"r{i}" for i in range(40)]
    base = side(keys, np.round(steps * rng.uniform(0.5, 2.5, 40)), steps)
    noisy = side(keys, np.round(steps * rng.uniform(0.5, 2.5, 40)), steps)  # same law, other draws
    diff = difference(base, noisy)
    assert diff.margin == pytest.approx(0.05 * (1 + base.accepted.sum() / base.steps.sum()))
    assert diff.ci95[0] < 0 < diff.ci95[1] and max(-diff.ci95[0], diff.ci95[1]) > diff.margin
    assert diff.verdict == "inconclusive"
    many = side([f"r{i}" for i in range(400)], np.tile(base.accepted, 10), np.tile(base.steps, 10))
    close = difference(many, side(many.keys, many.accepted + 1, many.steps))
    assert -close.margin <= close.ci95[0] and close.ci95[1] <= close.margin and close.verdict == "no change"


def test_pairing_needs_every_request_matched():
    base = side([f"r{i}" for i in range(8)], [4] * 8, [4] * 8)
    assert difference(base, side([f"r{i}" for i in range(8)][::-1], [4] * 8, [4] * 8)).paired
    assert not difference(base, side([f"r{i}" for i in range(16)], [4] * 16, [4] * 16)).paired  # 8 of 16
    assert not difference(base, side([f"r{i}" for i in range(5, 15)], [4] * 10, [4] * 10)).paired  # 3 of 10


def test_a_collapse_in_requests_without_a_partner_is_not_left_out():
    """The candidate serves the base's 20 prompts, then each once more with nothing accepted: paired on
    the first pass alone (half of the candidate's requests) it read no change; over all requests it
    is a regression."""
    keys = [f"p{i}" for i in range(20)]
    accepted = [20 + i % 5 for i in range(20)]
    base = side(keys, accepted, [10] * 20)
    diff = difference(base, side(keys * 2, accepted + [0] * 20, [10] * 40))
    assert not diff.paired and diff.verdict == "regression"
    assert diff.delta == pytest.approx((sum(accepted) / 400 + 1) - (sum(accepted) / 200 + 1))


def test_repeated_prompts_pair_in_order():
    b, c = match(side(["x", "y", "x"], [1, 1, 1], [1, 1, 1]), side(["x", "x", "z", "y"], [1] * 4, [1] * 4))
    assert list(zip(b, c)) == [(0, 0), (1, 3), (2, 1)]


def test_moved_lists_the_largest_changes_first():
    base = side("abc", [10, 10, 10], [10, 10, 10])
    rows = moved(base, side("abc", [10, 2, 14], [10, 10, 10]))
    assert [(r["key"], round(r["delta"], 2)) for r in rows] == [("b", -0.8), ("c", 0.4), ("a", 0.0)]


# -- what-if k ----------------------------------------------------------------------------------

def test_what_if_k_on_chain_masks_is_exact():
    accepted = [0, 1, 4, 2, 2, 3, 4, 0]
    masks = {}
    for a in accepted:
        masks[metrics.chain_mask(a, 4)] = masks.get(metrics.chain_mask(a, 4), 0) + 1
    lengths = metrics.acceptance_length_by_k(masks)
    # each step cut to k' drafts accepts min(accepted, k')
    assert lengths == pytest.approx([metrics.mean_acceptance_length([min(a, k) for a in accepted]) for k in (1, 2, 3, 4)])
    rows = metrics.what_if_k([{"accepted_mask": m, "steps": n} for m, n in masks.items()],
                             {"steps": 8, "proposed": 32, "draft_s": 0.032, "verify_s": 0.08})
    assert [r["tokens_per_s"] for r in rows] == pytest.approx([al / (k * 0.001 + 0.01) for k, al in
                                                                zip((1, 2, 3, 4), lengths)])


def test_what_if_k_counts_only_accepted_prefixes_of_tree_masks():
    # position 1 accepted without position 0 (a tree's other branch) adds nothing at k' >= 2
    assert metrics.acceptance_length_by_k({"01": 1, "11": 1}) == pytest.approx([1.5, 2.0])
    assert metrics.what_if_k([], None) == []


def test_doctor_what_if_k_without_timings_has_no_throughput(tmp_path):
    with open_store(str(tmp_path / "s.db")) as store:
        store.write([_run_start("r", 2), RequestStart("r", "a", 0, 3), VerifyStep("r", "a", 0, 0, 2, 1)])
        (run,) = diagnose(store).runs
    assert run.what_if_k == [{"k": 1, "mean_acceptance_length": 2.0, "tokens_per_s": None},
                             {"k": 2, "mean_acceptance_length": 2.0, "tokens_per_s": None}]


def _mixed_run(store, run_id: str, groups: dict[float, tuple[int, list[int]]]) -> None:
    """A run whose requests at temperature t (0 greedy) number n, each accepting ``accepted`` drafts
    of 4 per step over their steps (the same prompts per group, so they pair)."""
    events = [RunStart(run_id, "e", "1", "t", "d", {})]
    for temperature, (n, accepted) in groups.items():
        for i in range(n):
            rid = f"{run_id}-{temperature}-{i}"
            events.append(RequestStart(run_id, rid, 0, 5, temperature=temperature,
                                       prompt_key=f"{temperature}-{i}"))
            events += [VerifyStep(run_id, rid, 0, s, 4, a) for s, a in enumerate(accepted)]
            events.append(RequestEnd(run_id, rid, 0, len(accepted) + sum(accepted), len(accepted)))
    store.write(events)


def test_the_verdict_is_per_sampling_group_not_over_a_different_mix(tmp_path, capsys):
    """Greedy and sampled requests accept differently by design: a candidate that serves more sampled
    requests is not a regression when each group accepts as before."""
    db = str(tmp_path / "mix.db")
    greedy, sampled = [3, 2, 3, 2], [0, 1, 0, 0]
    with open_store(db) as store:
        _mixed_run(store, "base", {0.0: (8, greedy), 0.8: (3, sampled)})
        _mixed_run(store, "cand", {0.0: (3, greedy), 0.8: (8, sampled)})
        _mixed_run(store, "only-sampled", {0.8: (8, sampled)})
        _mixed_run(store, "only-greedy", {0.0: (8, greedy)})
    assert main(["compare", "--base-db", db, "--base-run", "base", "--db", db, "--run", "cand", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "no change" and set(report["groups"]) == {"greedy", "T=0.8"}
    assert report["decided_by"] == ["T=0.8", "greedy"]
    # runs that share no sampling group: nothing to compare, said in one line
    assert main(["compare", "--base-db", db, "--base-run", "only-greedy", "--db", db, "--run", "only-sampled"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "share no sampling group" in err


def test_a_pooled_regression_beside_groups_that_decide_otherwise_is_not_printed_as_one(tmp_path, capsys):
    """More sampled requests in the candidate pull the pooled AL down (regression over all requests), while
    the greedy group alone is inconclusive and the sampled one unchanged: the text printed "all requests:
    ... regression" then "verdict: inconclusive". The pooled line is shown, not judged, and the verdict
    names the group that gave it (text, JSON)."""
    db = str(tmp_path / "mix.db")
    with open_store(db) as store:
        _mixed_run(store, "base", {0.0: (8, [3, 2, 3, 2]), 0.8: (3, [0, 1, 0, 0])})
        events = [RunStart("cand", "e", "1", "t", "d", {})]
        # greedy: noisy, three of the base's prompts; sampled: as before, over other prompts
        served = [(0.0, f"0.0-{i}", accepted) for i, accepted in enumerate([[3, 2, 3, 2], [1, 0, 4, 2], [4, 4, 3, 2]])]
        served += [(0.8, f"other-{i}", [0, 1, 0, 0]) for i in range(8)]
        for i, (temperature, key, accepted) in enumerate(served):
            events += [RequestStart("cand", f"c{i}", 0, 5, temperature=temperature, prompt_key=key),
                       *[VerifyStep("cand", f"c{i}", 0, n, 4, a) for n, a in enumerate(accepted)],
                       RequestEnd("cand", f"c{i}", 0, 4 + sum(accepted), 4)]
        store.write(events)
    status = main(["compare", "--base-db", db, "--base-run", "base", "--db", db, "--run", "cand", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "inconclusive" and status == 3
    assert report["decided_by"] == ["greedy"] and report["groups"]["greedy"]["verdict"] == "inconclusive"
    assert report["ci95"][1] < 0  # pooled over a changed mix it would read a regression
    main(["compare", "--base-db", db, "--base-run", "base", "--db", db, "--run", "cand"])
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.endswith(": regression")]
    (pooled,) = [line for line in lines if line.startswith("all requests")]
    assert pooled.endswith("not judged (each sampling group is)")
    assert lines[-1].startswith("verdict: inconclusive, decided by sampling group greedy (")


@pytest.fixture(scope="module")
def audited(target_pair, tmp_path_factory) -> tuple[str, dict[str, str]]:
    """Reference-engine runs over the same prompts, audited at every verify step: healthy, and through
    the ``emit-draft-token`` verifier (acceptance in the healthy range, output not the target's)."""
    from specscope.collector import Collector
    from specscope.engine import Engine, heldout_prompts
    from specscope.instrumentation import Tracer

    db = str(tmp_path_factory.mktemp("audited") / "audited.db")
    runs = {}
    for name in ("healthy", "emit-draft-token"):
        fault = None if name == "healthy" else name
        engine = Engine(target=target_pair, fault=fault)
        with Collector(db) as collector:
            engine.tracer = Tracer(collector, engine="specscope-reference", engine_version="0", target_model="t",
                                   draft_model="d", config=engine.run_config(), fault=fault, audit_every=1)
            engine.generate(heldout_prompts()[:PROMPTS], max_new_tokens=TOKENS, temperature=0.0)
            engine.tracer.close()
        runs[name] = engine.tracer.run_id
    return db, runs


def test_a_candidate_that_fails_its_losslessness_audit_is_lossy_whatever_its_acceptance(audited, capsys, monkeypatch):
    """The verdict was acceptance's alone, so a verifier that changes the text read as no change (or an
    improvement, where the fault raised acceptance). Now: ``lossy``, exit 1, in text, JSON and on the
    dashboard; the other way round the candidate is judged by its acceptance, the broken base noted."""
    db, runs = audited
    status, out, _ = cli(capsys, "--base-db", db, "--base-run", runs["healthy"], "--db", db,
                         "--run", runs["emit-draft-token"], "--json")
    data = json.loads(out)
    assert status == 1 and data["verdict"] == "lossy" and data["decided_by"] == ["losslessness audit"]
    assert data["acceptance_verdict"] in ("no change", "inconclusive", "improvement", "regression")
    (violation,) = data["lossless_violations"]
    assert data["doctor"]["candidate"]["error"] >= 1
    status, out, _ = cli(capsys, "--base-db", db, "--base-run", runs["healthy"], "--db", db,
                         "--run", runs["emit-draft-token"])
    lines = out.splitlines()
    assert status == 1 and f"lossy: {violation}" in lines
    (verdict,) = [line for line in lines if line.startswith("verdict:")]
    assert verdict.startswith("verdict: lossy, decided by the candidate's losslessness audit (acceptance alone: ")
    status, out, _ = cli(capsys, "--base-db", db, "--base-run", runs["emit-draft-token"], "--db", db,
                         "--run", runs["healthy"], "--json")
    assert json.loads(out)["verdict"] != "lossy" and status != 1
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.selectbox(key="run_picker").set_value(runs["emit-draft-token"]).run()
    at.selectbox(key="compare").set_value(runs["healthy"]).run()
    assert not at.exception
    (box,) = [e.value for e in at.error if e.value.startswith("**lossy**")]
    assert "fails its losslessness audit" in box and violation in box


def test_a_change_in_the_tail_is_reported_beside_the_mean(tmp_path, capsys):
    """A quarter of the candidate's requests accept nothing: p10 of per-request AL falls from 3 to 1 and
    is named changed; p90 does not move. The p10 / p90 read are the view's (nearest rank)."""
    from _acceptance_runs import Req, write_run

    db = str(tmp_path / "tail.db")
    base = [Req([2, 1, 3, 2] if i % 2 else [2, 2, 2, 2], start=i) for i in range(40)]
    cand = [Req([0, 0, 0, 0] if i % 4 == 3 else r.accepted, start=i) for i, r in enumerate(base)]
    with open_store(db) as store:
        write_run(store, "base", base)
        write_run(store, "cand", cand)
        sql = {r["run_id"]: r for run in ("base", "cand") for r in store.fetch(q.REQUEST_DISTRIBUTION, run_id=run)
               if r["sampling"] == "all"}
    assert main(["compare", "--base-db", db, "--base-run", "base", "--db", db, "--run", "cand", "--json"]) == 1
    tail = json.loads(capsys.readouterr().out)["tail"]
    assert (tail["p10"]["base"], tail["p10"]["candidate"]) == (sql["base"]["p10_al"], sql["cand"]["p10_al"]) == (3.0, 1.0)
    assert tail["p10"]["changed"] and tail["p10"]["ci95"][1] < 0
    assert tail["p90"]["base"] == sql["base"]["p90_al"] and not tail["p90"]["changed"]
    main(["compare", "--base-db", db, "--base-run", "base", "--db", db, "--run", "cand"])
    assert "per-request AL, all requests: p10 3.00 -> 1.00 (-2.00" in capsys.readouterr().out
