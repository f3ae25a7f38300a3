"""A run whose RunStart never reached the store is listed by every reader, not only the doctor: the
read model (dashboard, ``watch``), ``compare`` and the Prometheus exporter read ``v_run_summary``, which
lists it with an unknown engine, so its collapse is seen and alerted on."""

from __future__ import annotations

import _traces as T
from streamlit.testing.v1 import AppTest
from test_app_pages import PAGES, app, texts, visit
from test_doctor_orphan_runs import write_orphan
from test_exporter import _samples, _scrape, _value

from specscope import events as ev
from specscope import readmodel
from specscope.compare import read_side
from specscope.storage import open_store
from specscope.storage import queries as q


def ghost_rows(run_id: str) -> list[ev.Event]:
    """Three tensor events of a run and nothing else: no rank row, no verify step, no time to place it."""
    return [e for e in T.healthy(run_id).events() if isinstance(e, ev.TensorEvent)][:3]


def test_every_run_is_listed_with_what_was_stored_of_it(store):
    T.healthy().write(store)
    write_orphan(store, T.no_aux_capture("broken"))
    write_orphan(store, T.healthy("quiet"), ranks=False)
    store.write(ghost_rows("ghost"))
    rows = {r["run_id"]: r for r in readmodel.summaries(store)}
    # newest first; a run with no rank row either (written around the collector) is the doctor's alone
    assert list(rows) == ["healthy", "broken"]
    assert [rows[r]["run_start"] for r in rows] == [1, 0]
    broken = rows["broken"]
    assert (broken["engine"], broken["config"], broken["target_model"], broken["world_size"], broken["state"]) == (
        "unknown", {}, None, 1, "finished")  # its rank rows say one rank, ended
    assert (broken["verify_steps"], broken["mean_acceptance_length"], broken["requests"]) == (32, 1.0, 4)
    assert broken["started_wall"] > 0 and broken["host"] == "host-a"
    assert readmodel.summary(store, "broken") == broken
    assert store.fetch(q.ORPHAN_RUN_IDS) == [{"run_id": r} for r in ("broken", "ghost", "quiet")]


def test_ranks_seen_count_when_no_rank_said_the_world_size(store):
    """Rank rows made from counters alone say world size 1: a run without its RunStart whose rank 0
    ended while rank 1 still writes is running, not finished."""
    store.write([ev.RankStatus("twin", 0, 10, 0, finished=True)], counters={("twin", 0): (1, 0), ("twin", 1): (1, 0)})
    (row,) = readmodel.summaries(store)
    assert (row["run_id"], row["world_size"], row["state"]) == ("twin", 2, "running")
    store.write([ev.RankStatus("twin", 1, 10, 0, finished=True)], counters={("twin", 1): (1, 0)})
    assert readmodel.summary(store, "twin")["state"] == "finished"


def test_the_verdict_of_an_orphan_is_the_doctors_and_compare_reads_it(store):
    T.healthy().write(store)
    write_orphan(store, T.no_aux_capture("broken"))
    verdict = readmodel.report(store, "broken")
    assert {"ACCEPT_COLLAPSE", "RUN_START_MISSING"} <= set(verdict.codes())
    side = read_side(store, "brok")  # a prefix of it names it, as for any run
    assert (side.run_id, side.engine, side.verify_steps, side.mean_acceptance_length) == ("broken", "unknown", 32, 1.0)


def test_the_exporter_exports_an_orphaned_collapse(tmp_path):
    path = str(tmp_path / "s.db")
    with open_store(path) as store:
        T.healthy().write(store)
        write_orphan(store, T.no_aux_capture("broken"))
    samples = _samples(_scrape(path).text)
    assert _value(samples, "specscope_run_running", run_id="broken", engine_name="unknown", model_name="") == 0
    assert _value(samples, "specscope_mean_acceptance_length", run_id="broken", rank="all") == 1.0
    findings = {labels["code"]: labels["severity"] for labels in
                (dict(ls) for n, ls in samples if n == "specscope_finding") if labels["run_id"] == "broken"}
    assert findings["ACCEPT_COLLAPSE"] == "error" and findings["RUN_START_MISSING"] == "warning"
    assert _value(samples, "specscope_run_findings", run_id="broken", severity="error") >= 1


def test_every_dashboard_page_opens_an_orphan(monkeypatch, tmp_path):
    path = tmp_path / "s.db"
    with open_store(str(path)) as store:
        T.healthy().write(store)
        write_orphan(store, T.no_aux_capture("broken"))
        write_orphan(store, T.healthy("quiet"), ranks=False)
        store.write(ghost_rows("ghost"))
    at: AppTest = app(monkeypatch, str(path))
    assert at.session_state["run_id"] == "healthy"  # the newest
    (strip,) = [m.value for m in at.markdown if m.value.startswith("Runs: ")]
    # the doctor's verdict on every run named, though none was stored (no collector wrote them)
    assert ":red[**1 error, 1 warning**] unknown `broken`" in strip, strip
    assert ":green[**no finding**] specscope-reference `healthy`" in strip, strip
    for run_id in ("broken",):
        at.selectbox(key="run_picker").set_value(run_id).run()
        assert not at.exception, [e.value for e in at.exception]
        if run_id == "broken":
            assert texts(at, "error")[0].startswith("**ACCEPT_COLLAPSE**")
        visit(at, "tensors")
        assert any(i.startswith("Contract unknown: this run's RunStart") for i in texts(at, "info")), run_id
        assert not [m.value for m in at.markdown if m.value.startswith("Contract:")], run_id
        visit(at, "overview")
        assert any("RUN_START_MISSING" in w for w in texts(at, "warning")), run_id
        assert any(c.value.startswith(f"run `{run_id}` · no RunStart stored") for c in at.caption), run_id
        assert any(i.startswith("**Not checked** — ") for i in texts(at, "info")), run_id  # CHECKS_SKIPPED
        for page in PAGES[1:]:
            visit(at, page)
        visit(at, "overview")
