"""The doctor's public surface: exported names, all-runs reports, unknown runs, read-only use,
saving findings, the JSON form and the text rendering."""

from __future__ import annotations

import json

import _traces as T
import pytest
import sqlalchemy as sa
from _threads import at_once

import specscope.doctor as doctor
from specscope.doctor import CODES, SEVERITY, diagnose, render_text, save_findings
from specscope.errors import ConfigError, ReadOnlyViolation
from specscope.events import Finding
from specscope.storage import open_store
from specscope.storage.queries import RUNS

RUNTIME_CODES = {  # docs/design.md "Findings", runtime
    "AUX_NOT_FUSED": "error", "AUX_CAPTURE_SILENT": "error", "AUX_CAPTURE_PARTIAL": "error",
    "AUX_LAYER_MISMATCH": "error", "ACCEPT_COLLAPSE": "error", "ACCEPT_SATURATED": "warning",
    "POSITION0_LOW": "warning", "NONFINITE_ACTIVATIONS": "error", "RANK_DIVERGENCE": "warning",
    "WEIGHTS_DROPPED": "error", "EVENTS_DROPPED": "warning", "HOOK_ERRORS": "warning",
    "GRAPH_MODE_BLIND": "info", "NOT_OBSERVED": "warning", "CHECKS_SKIPPED": "info",
    "LOSSLESS_VIOLATION": "error", "LOSSLESS_AUDITED": "info", "ACCEPT_COLLAPSE_SAMPLED": "warning",
    "REPLAY_DIVERGENCE": "error", "REPLAY_AUDITED": "info",
    "RUNNER_NOT_ATTACHED": "warning", "ACCEPT_DRIFT": "warning", "REQUEST_ACCEPT_OUTLIER": "warning",
    "RUN_START_MISSING": "warning",
}


def test_exported_members():
    assert sorted(doctor.__all__) == sorted(n for n in dir(doctor) if not n.startswith("_")
                                            and n not in {"annotations"})
    assert SEVERITY == RUNTIME_CODES and set(CODES) == set(RUNTIME_CODES)


def doctor_findings(store) -> list[tuple]:
    with store.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT run_id, code, source FROM findings ORDER BY run_id, code, source")))


def test_all_runs_newest_first_errors_first(store):
    for trace in (T.hook_errors(), T.healthy(), T.no_aux_capture()):
        trace.write(store)
    report = diagnose(store)
    assert {r.run_id for r in report.runs} == {"hook-errors", "healthy", "no-aux"}
    order = [{"error": 0, "warning": 1, "info": 2}[f.severity] for f in report.findings]
    assert order == sorted(order) and order[0] == 0 and order[-1] == 2
    assert {f.run_id for f in report.findings if f.severity != "info"} == {"hook-errors", "no-aux"}
    # every run's audit is named, the healthy one's too
    assert {f.run_id for f in report.findings if f.code == "LOSSLESS_AUDITED"} == {"hook-errors", "healthy", "no-aux"}
    assert report.exit_code == 1


def test_unknown_run_names_known_ones(store):
    T.healthy().write(store)
    with pytest.raises(ConfigError, match="no run 'nope'.*known runs: healthy"):
        diagnose(store, "nope")


def test_empty_store(store):
    report = diagnose(store)
    assert (report.runs, report.findings, report.exit_code) == ([], [], 0)
    assert "no runs" in render_text(report)


def test_diagnose_is_read_only_and_save_replaces(store_url):
    with open_store(store_url) as store:
        T.no_aux_capture().write(store)
        T.healthy().write(store)
        store.write([Finding("KEYS_DROPPED", "error", "m", {}, "f", run_id="no-aux", source="inspect")])
    with open_store(store_url, read_only=True) as ro:
        report = diagnose(ro, "no-aux")  # works on a read-only store, writes nothing
        assert len(doctor_findings(ro)) == 1
        with pytest.raises(ReadOnlyViolation):
            save_findings(ro, report)
    with open_store(store_url) as store:
        save_findings(store, report)
        save_findings(store, diagnose(store, "no-aux"))  # replaces, does not add
        rows = doctor_findings(store)
        assert rows == sorted([("no-aux", code, "doctor") for code in report.codes()]
                              + [("no-aux", "KEYS_DROPPED", "inspect")])
        assert store.fetch(RUNS)[0]["error_findings"] + store.fetch(RUNS)[1]["error_findings"] == 4
        save_findings(store, diagnose(store, "healthy"))  # other runs' findings stay, its audit is added
        assert len(doctor_findings(store)) == len(rows) + 1


def test_two_writers_replacing_one_runs_findings_at_once_leave_one_set(store_url):
    """Two ranks' run-end verdicts saved at the same moment (separate connections, as separate
    processes): the stored findings are one set, never both."""
    import threading

    with open_store(store_url) as store:
        T.no_aux_capture().write(store)
        report = diagnose(store, "no-aux")
    barrier = threading.Barrier(2, timeout=60)  # one writer failing breaks the other's wait, not hangs it

    def writer() -> None:
        with open_store(store_url) as own:
            for _ in range(200):
                barrier.wait()
                save_findings(own, report)

    assert at_once(writer, 2) == []
    with open_store(store_url, read_only=True) as store:
        assert sorted(code for _, code, _ in doctor_findings(store)) == sorted(report.codes())


def test_to_dict_is_the_design_schema(store):
    T.off_by_one().write(store)
    assert "acceptance_histogram" not in diagnose(store).to_dict()["runs"][0]  # a verdict reads no distribution
    data = json.loads(json.dumps(diagnose(store, distributions=True).to_dict()))
    assert set(data) == {"runs", "findings"}
    run = data["runs"][0]
    # the trace's 32 steps accept 1 draft in a quarter of them, none in the rest (k = 4: five buckets)
    assert [(r["sampling"], r["accepted_drafts"], r["verify_steps"]) for r in run.pop("acceptance_histogram")] == [
        ("unknown", 0, 24), ("unknown", 1, 8), ("unknown", 2, 0), ("unknown", 3, 0), ("unknown", 4, 0)]
    assert {r["sampling"]: (r["requests"], r["p50_al"]) for r in run.pop("request_acceptance")} == {
        "all": (4, 1.25), "unknown": (4, 1.25)}
    assert sum(r["verify_steps"] for r in run.pop("acceptance_windows")) == 32
    assert sum(r["verify_steps"] for r in run.pop("acceptance_by_output_position")) == 32
    # each request's tokens audited, greedy (4 x 10 emitted), every one the target's argmax
    assert [(g["sampling"], g["requests"], g["tokens_audited"], g["greedy_mismatches"], g["verdict"])
            for g in run.pop("lossless_audit")] == [("greedy", 4, 40, 0, "passed")]
    assert data["runs"] == [{
        "run_id": "off-by-one", "engine": "specscope-reference", "fault": "aux-off-by-one",
        "requests": 4, "verify_steps": 32, "mean_acceptance_length": 1.25, "acceptance_rate": 0.0625,
        "per_position_acceptance": [0.25, 0.0, 0.0, 0.0],
        # recorded without sampling settings: one 'unknown' group
        "sampling": [{"sampling": "unknown", "requests": 4, "verify_steps": 32, "proposed": 128, "accepted": 8,
                      "mean_acceptance_length": 1.25, "acceptance_rate": 0.0625, "position0_acceptance": 0.25}],
        # the trace's steps: 4 drafts in 0.004 s, verify 0.011 s; only position 0 ever accepted
        "what_if_k": [{"k": k, "mean_acceptance_length": 1.25,
                       "tokens_per_s": pytest.approx(1.25 / (k * 0.001 + 0.011))} for k in range(1, 5)]}]
    for finding in data["findings"]:
        assert set(finding) == {"code", "severity", "message", "evidence", "fix", "run_id"}
        assert finding["run_id"] == "off-by-one" and "\n" not in finding["message"]
    assert [f["code"] for f in data["findings"]] == ["AUX_LAYER_MISMATCH", "POSITION0_LOW", "LOSSLESS_AUDITED"]


def test_render_text(store):
    T.dropped_keys().write(store)
    text = render_text(diagnose(store))
    lines = text.splitlines()
    assert lines[0].startswith("run dropped-keys [specscope-reference fault=unrenamed-keys]: 4 request(s), "
                               "32 verify step(s), AL 1.00, rate 0.0%")
    assert lines[1] == "2 error(s), 0 warning(s), 1 info"
    assert any(line.startswith("ERROR   WEIGHTS_DROPPED [run dropped-keys]") for line in lines)
    assert "rename=['layers.0.', 'midlayer.']" in text and "+7 more]" in text
    assert sum(line.strip().startswith("fix: ") for line in lines) == 3


def test_run_id_prefix_on_both_databases(store):
    T.healthy("c0ffee00aa").write(store)
    T.no_aux_capture("c0ffee00bb").write(store)
    T.healthy("c0_fee").write(store)
    assert diagnose(store, "c0ffee00b").runs[0].run_id == "c0ffee00bb"
    assert diagnose(store, "c0_").runs[0].run_id == "c0_fee"  # '_' is no wildcard
    with pytest.raises(ConfigError, match="ambiguous.*c0ffee00aa, c0ffee00bb"):
        diagnose(store, "c0ffee")
    with pytest.raises(ConfigError, match="no run 'c1'"):
        diagnose(store, "c1")
    T.healthy("Baseline-7").write(store)
    assert diagnose(store, "B").runs[0].run_id == "Baseline-7"
    with pytest.raises(ConfigError, match="no run 'b'"):  # SQLite's LIKE named Baseline-7
        diagnose(store, "b")
