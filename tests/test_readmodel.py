"""specscope.readmodel: one state, one verdict and one count of a run for every reader (the run
picker, ``v_run_summary``, the exporter and ``specscope doctor``), and the 'lost' state, on SQLite
and PostgreSQL."""

from __future__ import annotations

import json
import time

import _traces
import pytest

from specscope import events as ev
from specscope import readmodel
from specscope.app import queries
from specscope.cli import main
from specscope.collector import HEARTBEAT_S, Collector
from specscope.doctor import save_findings
from specscope.exporter import StoreCollector
from specscope.storage import open_store


def test_run_state_running_stale_and_the_views_states():
    assert readmodel.run_state("running", 1000.0, now=1010.0) == "running"
    assert readmodel.run_state("running", 1000.0, now=1000.0 + readmodel.STALE_AFTER_S + 1) == "stale"
    assert readmodel.run_state("running", None, now=5.0) == "stale"
    for status in ("finished", "crashed", "lost"):
        assert readmodel.run_state(status, 0.0, now=1e9) == status
    assert readmodel.STALE_AFTER_S < readmodel.LOST_AFTER_S
    assert HEARTBEAT_S < readmodel.STALE_AFTER_S


def test_the_dashboard_names_every_state_with_the_timeouts():
    from specscope.app import widgets

    assert set(widgets.STATE_LABEL) == set(widgets.STATE_HELP) == set(widgets.STATE_COLOR) == set(readmodel.STATES)
    assert f"{readmodel.LOST_AFTER_S:g} s" in widgets.STATE_HELP["lost"]
    assert f"{readmodel.STALE_AFTER_S:g} s" in widgets.STATE_HELP["stale"]


def _started(run_id: str, wall: float) -> list:
    return [ev.RunStart(run_id, "e", "0", "t", "d", {}, ts_wall=wall),
            ev.RankStart(run_id, 0, 1, "h", 1, "cpu", ts_wall=wall)]


def _status(store, run_id: str) -> str:
    return store.query("SELECT status FROM v_run_summary WHERE run_id = :r", {"r": run_id})[1][0][0]


def test_a_silent_run_reads_lost_until_heard_from_again(store):
    now = time.time()
    store.write([*_started("gone", now - readmodel.LOST_AFTER_S - 30),
                 *_started("quiet", now - readmodel.LOST_AFTER_S + 30),
                 *_started("ended", now - 10 * readmodel.LOST_AFTER_S),
                 ev.RankStatus("ended", 0, 0, 0, "eager", finished=True,
                               ts_wall=now - 10 * readmodel.LOST_AFTER_S)])
    assert [_status(store, r) for r in ("gone", "quiet", "ended")] == ["lost", "running", "finished"]
    states = {row["run_id"]: row["state"] for row in queries.runs(store)}
    assert states == {"gone": "lost", "quiet": "stale", "ended": "finished"}
    store.touch([("gone", 0)])  # the collector's heartbeat: the process was alive after all
    assert _status(store, "gone") == "running"


def test_the_process_that_stopped_a_runs_engines_ends_their_open_ranks(store):
    """vLLM's API server SIGKILLs its engine processes right after asking them to stop: it ends the
    ranks they could not end, and leaves those that ended (or crashed) as they are."""
    now = time.time()
    store.write([ev.RunStart("served", "vllm", "0", "t", "d", {}, world_size=3, ts_wall=now),
                 *(ev.RankStart("served", rank, 3, "h", rank, "cpu", ts_wall=now) for rank in range(3)),
                 ev.RankStatus("served", 2, 0, 0, "eager", finished=True, ts_wall=now - 5)])
    assert _status(store, "served") == "running"
    assert store.end_open_ranks("served") == [0, 1]
    assert _status(store, "served") == "finished"
    ended = dict(store.query("SELECT rank, ended_wall FROM run_ranks WHERE run_id = 'served'")[1])
    assert ended[2] == pytest.approx(now - 5) and ended[0] >= now  # rank 2's own end stands
    assert store.end_open_ranks("served") == []


def _last_seen(store, run_id: str) -> float:
    return store.query("SELECT last_seen_wall FROM v_run_summary WHERE run_id = :r", {"r": run_id})[1][0][0]


def test_the_collector_heartbeat_keeps_an_idle_live_rank_heard(store):
    with Collector(store, flush_interval_s=0.05, heartbeat_s=0.2) as sink:
        for event in _started("idle", time.time()):
            sink.emit(event)
        assert sink.flush(10)
        heard = _last_seen(store, "idle")
        deadline = time.time() + 10
        while _last_seen(store, "idle") == heard and time.time() < deadline:
            time.sleep(0.1)
        assert _last_seen(store, "idle") > heard  # nothing written since, yet heard from
        sink.emit(ev.RankStatus("idle", 0, 0, 0, "eager", finished=True))
        assert sink.flush(10)
        ended = _last_seen(store, "idle")
        time.sleep(0.6)
        assert _last_seen(store, "idle") == ended  # an ended rank gets no heartbeat
    assert _status(store, "idle") == "finished"


def _counts_everywhere(store, url: str, run_id: str, capsys) -> dict[str, dict[str, int]]:
    picker = next(row for row in queries.runs(store) if row["run_id"] == run_id)
    (errors, warnings), = store.query("SELECT error_findings, warning_findings FROM v_run_summary "
                                      "WHERE run_id = :r", {"r": run_id})[1]
    exported = {s.labels["severity"]: int(s.value)
                for family in StoreCollector(store).collect() if family.name == "specscope_run_findings"
                for s in family.samples if s.labels["run_id"] == run_id}
    assert main(["doctor", "--db", url, "--run", run_id, "--json"]) == 1
    severities = [f["severity"] for f in json.loads(capsys.readouterr().out)["findings"]]
    doctor = {severity: severities.count(severity) for severity in ("error", "warning")}
    return {"picker (stored)": {"error": picker["error_findings"], "warning": picker["warning_findings"]},
            "picker (open run)": readmodel.RunReader(store).counts(run_id),
            "v_run_summary": {"error": errors, "warning": warnings},
            "exporter": exported, "doctor": doctor}


def test_picker_view_exporter_and_doctor_count_a_runtime_only_error_alike(store_url, capsys):
    """A no-aux-capture run (ACCEPT_COLLAPSE, AUX_NOT_FUSED: runtime findings, nothing stored by an
    inspection) written through a collector whose run end stores the verdict."""
    trace = _traces.no_aux_capture()
    with open_store(store_url) as store:
        _traces.healthy().write(store)  # another run, ended without a stored verdict
        with Collector(store, on_run_end=readmodel.store_verdict) as sink:
            for event in trace.events():
                sink.emit(event)
        verdict = readmodel.report(store, trace.run_id)
        assert {"ACCEPT_COLLAPSE", "AUX_NOT_FUSED"} <= set(verdict.codes(trace.run_id))
        counts = _counts_everywhere(store, store_url, trace.run_id, capsys)
    expected = readmodel.counts(verdict.findings)
    assert expected["error"] >= 2
    assert counts == dict.fromkeys(counts, expected)


def test_a_collector_busy_with_one_run_keeps_its_idle_run_heard(store):
    """``watch`` on two servers, one of them down: the writer commits for the live one every scrape,
    and the idle one must still be marked heard."""
    now = time.time()
    with Collector(store, flush_interval_s=0.05, heartbeat_s=0.3) as sink:
        for event in [*_started("idle", now), *_started("busy", now)]:
            sink.emit(event)
        assert sink.flush(10)
        heard = _last_seen(store, "idle")
        for i in range(40):  # 2 s of commits for the busy run only
            sink.emit(ev.RequestStart("busy", f"r{i}", 0, 3))
            time.sleep(0.05)
        assert sink.flush(10)
        assert time.time() - _last_seen(store, "idle") < 1.5 and _last_seen(store, "idle") > heard


def test_a_collector_holding_events_longer_than_the_heartbeat_still_keeps_its_ranks_heard(store):
    """``watch --interval 600``: its collector flushes once per scrape only, yet the run must not
    read 'lost' between scrapes; and what is queued in between waits for the flush."""
    with Collector(store, flush_interval_s=3600, heartbeat_s=0.2) as sink:
        for event in _started("slow-scrapes", time.time()):
            sink.emit(event)
        assert sink.flush(10)
        heard = _last_seen(store, "slow-scrapes")
        sink.emit(ev.RankStatus("slow-scrapes", 0, 5, 0, "eager"))  # queued, not yet flushed
        deadline = time.time() + 10
        while _last_seen(store, "slow-scrapes") == heard and time.time() < deadline:
            time.sleep(0.1)
        assert _last_seen(store, "slow-scrapes") > heard
        assert store.query("SELECT hook_calls FROM run_ranks WHERE run_id = 'slow-scrapes'")[1] == [(0,)]
        assert sink.flush(10)
        assert store.query("SELECT hook_calls FROM run_ranks WHERE run_id = 'slow-scrapes'")[1] == [(5,)]


def test_the_last_ranks_end_is_in_the_stored_verdict_when_two_ranks_end_at_once(store, monkeypatch):
    """Rank 1 ends, with hook errors, while rank 0's run-end callback is still diagnosing the run it
    read as open: the verdict stored last must be the one that saw rank 1's end."""
    now = time.time()
    store.write([ev.RunStart("two", "e", "0", "t", "d", {}, world_size=2, ts_wall=now),
                 *(ev.RankStart("two", rank, 2, "h", rank, "cpu", ts_wall=now) for rank in (0, 1)),
                 ev.RankStatus("two", 0, 100, 0, "eager", finished=True, ts_wall=now)])
    diagnose, calls = readmodel._run_view.diagnose, []

    def racing(store_, run_id):
        report = diagnose(store_, run_id)
        if not calls:  # rank 1 ends (and stores its own verdict) after rank 0 read the run
            store_.write([ev.RankStatus("two", 1, 100, 7, "eager", finished=True, ts_wall=now)])
            save_findings(store_, diagnose(store_, run_id))
        calls.append(run_id)
        return report

    monkeypatch.setattr(readmodel._run_view, "diagnose", racing)
    readmodel.store_verdict(store, "two")
    assert len(calls) == 2 and _status(store, "two") == "finished"
    stored = store.query("SELECT code FROM findings WHERE run_id = 'two'")[1]
    assert ("HOOK_ERRORS",) in stored


def test_an_ended_runs_verdict_is_computed_once(store, monkeypatch):
    _traces.no_aux_capture().write(store)
    reader = readmodel.RunReader(store)
    first = reader.findings("no-aux")
    monkeypatch.setattr(readmodel._run_view, "report", pytest.fail)
    assert reader.findings("no-aux") is first


def test_an_ended_runs_verdict_is_computed_again_after_a_replay(store):
    """A replay against the target (``specscope replay``) is the one write that changes an ended run's
    verdict: a dashboard or exporter that read the run before shows the replay's finding after it."""
    from specscope.events import LosslessAudit, ReplayResult

    _traces.no_aux_capture().write(store)
    reader = readmodel.RunReader(store)
    assert "REPLAY_DIVERGENCE" not in {f.code for f in reader.findings("no-aux")}
    audit = LosslessAudit("no-aux", 0, "q", "greedy", 8, mismatches=1)
    store.write([ReplayResult("no-aux", "q", "folder", 0.25, audit, departures=1, first_departure=3,
                              first_margin=5.0, max_margin=5.0)])
    again = reader.findings("no-aux")
    assert "REPLAY_DIVERGENCE" in {f.code for f in again}
    assert reader.findings("no-aux") is again  # cached again until the next replay
