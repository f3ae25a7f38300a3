"""Runs whose RunStart never reached the store (the collector dropped its batch, or the database refused
its values) while their later rows were stored: the doctor judges them on what was stored and names the
missing RunStart, instead of leaving them out of its verdict."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import _traces as T
import pytest

from specscope import events as ev
from specscope.doctor import diagnose
from specscope.errors import ConfigError
from specscope.storage import open_store
from specscope.storage import queries as q

TABLES = ("run_ranks", "verify_steps", "tensor_events", "requests")
CONTRACT = ["AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "AUX_CAPTURE_PARTIAL", "AUX_LAYER_MISMATCH"]


def write_orphan(store, trace: T.Trace, *, ranks: bool = True) -> None:
    """``trace`` stored without its RunStart: as the collector writes the rest (``ranks``: with the rank
    rows and counters), or by a writer without counters (no ``run_ranks`` row at all)."""
    skipped = (ev.RunStart,) if ranks else (ev.RunStart, ev.RankStart, ev.RankStatus)
    events = [e for e in trace.events() if not isinstance(e, skipped)]
    store.write(events, counters={(trace.run_id, 0): (len(events), 0)} if ranks else None)


def serious(report, run_id: str) -> list[str]:
    return [f.code for f in report.findings if f.run_id == run_id and f.severity in ("error", "warning")]


def test_an_orphaned_collapse_is_judged_and_fails_the_doctor(store, store_url):
    T.healthy().write(store)
    write_orphan(store, T.no_aux_capture("broken"))
    out = subprocess.run([sys.executable, "-m", "specscope", "doctor", "--db", store_url, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert [(r["run_id"], r["engine"], r["mean_acceptance_length"]) for r in data["runs"]] == [
        ("healthy", "specscope-reference", 2.0), ("broken", "unknown", 1.0)]
    found = {(f["run_id"], f["code"]): f for f in data["findings"]}
    assert found["broken", "ACCEPT_COLLAPSE"]["severity"] == "error"
    missing = found["broken", "RUN_START_MISSING"]
    assert missing["severity"] == "warning" and missing["evidence"]["verify_steps"] == 32
    (missed,) = missing["evidence"]["draft_width_mismatches"]  # shown, not judged: the contract is unknown
    assert (missed["hook_point"], missed["width"], missed["expected_width"]) == ("draft.forward:hidden_states", 576, 1728)
    assert not [f for f in data["findings"] if f["run_id"] == "healthy" and f["severity"] != "info"]
    # the contract is unknown, not broken: no AUX_* verdict either way, and the gap is named
    assert not {code for run, code in found if run == "broken"} & set(CONTRACT)
    (skipped,) = found["broken", "CHECKS_SKIPPED"]["evidence"]["not_checked"]
    assert skipped["codes"] == CONTRACT and "no RunStart" in skipped["reason"]


def test_a_healthy_orphan_gets_only_the_missing_run_start(store):
    write_orphan(store, T.healthy("quiet"), ranks=False)  # no rank row: found through its other rows
    assert store.fetch(q.ORPHAN_RUN_IDS) == [{"run_id": "quiet"}]
    report = diagnose(store)
    assert serious(report, "quiet") == ["RUN_START_MISSING"] and report.exit_code == 0
    assert report.findings[0].evidence["draft_width_mismatches"] == []
    (run,) = report.runs
    assert (run.run_id, run.engine, run.requests, run.verify_steps) == ("quiet", "unknown", 4, 32)


def test_doctor_run_names_an_orphan_by_id_or_prefix(store):
    T.healthy("c0ffee-started").write(store)
    write_orphan(store, T.no_aux_capture("c0ffee-orphan"))
    write_orphan(store, T.healthy("d00d-orphan"))
    assert diagnose(store, "c0ffee-orphan").codes()[:2] == ["ACCEPT_COLLAPSE", "RUN_START_MISSING"]
    assert [r.run_id for r in diagnose(store, "d00d").runs] == ["d00d-orphan"]
    assert [r.run_id for r in diagnose(store, "c0ffee-s").runs] == ["c0ffee-started"]
    with pytest.raises(ConfigError, match="prefix 'c0ffee' is ambiguous.*c0ffee-orphan, c0ffee-started"):
        diagnose(store, "c0ffee")
    with pytest.raises(ConfigError, match="no run 'e0'"):
        diagnose(store, "e0")


def test_a_store_without_orphans_reads_as_before(store):
    T.healthy().write(store)
    T.no_aux_capture().write(store)
    assert store.fetch(q.ORPHAN_RUN_IDS) == []
    report = diagnose(store)
    assert [r.run_id for r in report.runs] == ["healthy", "no-aux"]
    assert report.codes() == ["AUX_NOT_FUSED", "AUX_CAPTURE_SILENT", "ACCEPT_COLLAPSE", "LOSSLESS_AUDITED",
                              "LOSSLESS_AUDITED"]


def test_finding_orphans_seeks_each_run_id_instead_of_reading_every_row(tmp_path):
    """SQLite's plan: per table, one ordered index read for the first run id, then one index seek past
    each run id found (a DISTINCT would read every verify step and tensor event of the store)."""
    path = tmp_path / "store.db"
    open_store(str(path)).close()
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + q.ORPHAN_RUN_IDS.sql)]
    seeks = [line for line in plan if re.fullmatch(r"SEARCH t USING (COVERING )?INDEX \w+ \(run_id>\?\)", line)]
    assert len(seeks) == 4, plan
    assert all("INDEX" in line for line in plan if line.startswith("SCAN ") and line.split()[1] in TABLES), plan
