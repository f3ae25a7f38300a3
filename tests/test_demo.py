"""End to end on the real reference engine: instrumented demo runs into a store, then the doctor.

Each fault must surface as its runtime finding with evidence (issue "observability spine": Must
hold); the healthy run must have no error finding. The doctor never reads ``runs.fault``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from specscope.adapters.reference import DemoOptions, run_demo
from specscope.doctor import checkpoint_findings, diagnose
from specscope.errors import ConfigError
from specscope.storage import open_store
from specscope.storage.queries import RUNS

pytestmark = pytest.mark.slow


def _findings(path: str, run_id: str) -> dict[str, dict]:
    with open_store(path, create=False, read_only=True) as store:
        report = diagnose(store, run_id)
    return {f.code: f for f in report.findings}


def _run(tmp_path, fault: str | None, **kw) -> tuple[str, str]:
    path = str(tmp_path / "trace.db")
    return path, run_demo(DemoOptions(db=path, requests=kw.pop("requests", 3), fault=fault,
                                      max_new_tokens=kw.pop("max_new_tokens", 32), **kw))


def _demo_runs(store) -> list[dict]:
    return sorted(store.fetch(RUNS), key=lambda r: r["started_wall"])  # healthy, faulty, rank fault


def test_healthy_demo_has_no_error_or_warning(demo_store):
    """Nothing to warn about on the healthy run: the draft is inspected against the target it serves
    (its explicit aux ids are the defaults this engine captures, so no convention warning arises) and
    the runtime rules find nothing."""
    with open_store(demo_store, create=False, read_only=True) as store:
        healthy, faulty, ranked = _demo_runs(store)
        report = diagnose(store, healthy["run_id"])
        checkpoint = {f.code: f for f in checkpoint_findings(store, healthy["run_id"])}
    assert (healthy["fault"], faulty["fault"], ranked["fault"]) == (None, "no-aux-capture",
                                                                    "rank 1: no-aux-capture")
    assert [f.code for f in report.findings if f.severity in ("error", "warning")] == []
    assert report.runs[0].verify_steps > 0 and report.runs[0].mean_acceptance_length > 1.3
    assert "CKPT_FORMAT" in checkpoint and {f.severity for f in checkpoint.values()} <= {"info"}


def test_no_aux_capture_is_diagnosed_with_widths(demo_store):
    with open_store(demo_store, create=False, read_only=True) as store:
        faulty = _demo_runs(store)[1]
    found = _findings(demo_store, faulty["run_id"])
    assert found["AUX_NOT_FUSED"].evidence["observed_width"] == 576
    assert found["AUX_NOT_FUSED"].evidence["expected_width"] == 1728
    assert {"ACCEPT_COLLAPSE", "POSITION0_LOW"} & set(found)


def test_aux_off_by_one_is_diagnosed_by_provenance(tmp_path):
    path, run_id = _run(tmp_path, "aux-off-by-one")
    evidence = _findings(path, run_id)["AUX_LAYER_MISMATCH"].evidence
    assert evidence["configured"] == [2, 15, 27]
    assert evidence["received"] == [3, 16, 28]


def test_unrenamed_keys_is_diagnosed_naming_keys(tmp_path):
    path, run_id = _run(tmp_path, "unrenamed-keys", requests=1, max_new_tokens=8)
    finding = _findings(path, run_id)["WEIGHTS_DROPPED"]
    text = json.dumps(finding.evidence)
    assert "layers.0.self_attn.q_proj.weight" in text and "midlayer.self_attn.q_proj.weight" in text


def test_two_ranks_write_one_run_with_per_rank_data(tmp_path):
    path, run_id = _run(tmp_path, None, ranks=2, requests=2, max_new_tokens=16)
    with open_store(path, create=False, read_only=True) as store, store.connect() as conn:
        ranks = conn.execute(sa.text("SELECT rank, world_size, ended_wall FROM run_ranks WHERE run_id = :r "
                                     "ORDER BY rank"), {"r": run_id}).all()
        steps = conn.execute(sa.text("SELECT rank, verify_steps FROM v_rank_acceptance WHERE run_id = :r "
                                     "ORDER BY rank"), {"r": run_id}).all()
    assert [(r.rank, r.world_size) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r.ended_wall is not None for r in ranks)
    assert [s.rank for s in steps] == [0, 1] and all(s.verify_steps > 0 for s in steps)


def test_demo_rejects_bad_options(tmp_path):
    with pytest.raises(ConfigError, match="unknown fault"):
        run_demo(DemoOptions(db=str(tmp_path / "x.db"), fault="nope"))
    with pytest.raises(ConfigError, match="exceeds --requests"):
        run_demo(DemoOptions(db=str(tmp_path / "x.db"), ranks=3, requests=2))


def test_cli_demo_and_doctor_exit_codes(tmp_path, demo_store):
    cli = [sys.executable, "-m", "specscope"]
    done = subprocess.run([*cli, "demo", "--no-dashboard", "--db", str(tmp_path / "d.db"), "--requests", "1",
                           "--max-new-tokens", "8"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "mean acceptance length" in done.stdout.lower() or "AL" in done.stdout
    doctor = subprocess.run([*cli, "doctor", "--db", demo_store, "--json"], capture_output=True, text=True)
    assert doctor.returncode == 1  # the faulty run has error findings
    report = json.loads(doctor.stdout)
    assert {r["fault"] for r in report["runs"]} == {None, "no-aux-capture", "rank 1: no-aux-capture"}
    assert any(f["code"] == "AUX_NOT_FUSED" for f in report["findings"])
    bad = subprocess.run([*cli, "demo", "--no-dashboard", "--db", str(tmp_path / "e.db"), "--ranks", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_rank_fault_shows_as_rank_divergence(demo_store):
    """Two ranks, rank 1 without aux capture: one run whose per-GPU split the doctor reports."""
    with open_store(demo_store, create=False, read_only=True) as store:
        ranked = _demo_runs(store)[2]
        report = diagnose(store, ranked["run_id"])
    assert ranked["world_size"] == 2
    fused = [f for f in report.findings if f.code == "AUX_NOT_FUSED"]
    assert [f.evidence["ranks"] for f in fused] == [[1]]
    divergence = [f for f in report.findings if f.code == "RANK_DIVERGENCE"]
    assert divergence and all(f.evidence["ranks"] == [0, 1] for f in divergence)
