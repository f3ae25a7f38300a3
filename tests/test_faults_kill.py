"""SIGKILL of an instrumented engine process at random points: every event acknowledged by a flush
before the kill is in the store afterwards, the store opens cleanly, and the doctor and the
dashboard's queries read it.

The engine is ``tests/_fault_engine.py``: a real torch module with specscope hooks, every call
sampled, writing through a Collector into SQLite; a zygote process forks one engine per trial (torch is
imported once) and kills it after a random number of acknowledged flushes plus a random delay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specscope.app import DB_ENV, ENTRY, queries
from specscope.doctor import diagnose
from specscope.storage import open_store

TRIALS = int(os.environ.get("SPECSCOPE_KILL_TRIALS", "50"))
HELPER = Path(__file__).with_name("_fault_engine.py")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL") or not hasattr(os, "fork"), reason="needs POSIX")
def test_sigkill_at_random_points_loses_nothing_acknowledged(tmp_path, monkeypatch) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HELPER), "kill", str(tmp_path), str(TRIALS), "20261201"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(trials) == TRIALS
    acked_total = 0
    for trial in trials:
        assert trial["signal"] == signal.SIGKILL
        with open_store(trial["store"], read_only=True) as store:
            assert store.query("PRAGMA integrity_check")[1] == [("ok",)]
            tensors = store.query("SELECT COUNT(*) FROM tensor_events")[1][0][0]
            steps = store.query("SELECT COUNT(*) FROM verify_steps")[1][0][0]
            written = store.query("SELECT COALESCE(SUM(events_written), 0) FROM run_ranks")[1][0][0]
            assert tensors >= trial["acked_tensors"], trial
            assert steps >= trial["acked_verify_steps"], trial
            assert written >= trial["acked_events"], trial
            if trial["acked_events"]:
                report = diagnose(store, "run-kill")  # the doctor reads what survived
                assert report.runs[0].verify_steps == steps
                summary = queries.run_summary(store, "run-kill")  # ... and so does the dashboard
                assert summary["state"] != "finished" and summary["verify_steps"] == steps
        acked_total += trial["acked_events"]
    assert acked_total > TRIALS  # the trials did commit events before their kills
    # the dashboard itself opens a killed store, on its Overview and Tensors pages
    monkeypatch.setenv(DB_ENV, max(trials, key=lambda t: t["acked_events"])["store"])
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert not at.exception and at.session_state["run_id"] == "run-kill"
    at.switch_page("screens/tensors.py").run()
    assert not at.exception
    print(f"\n{TRIALS} SIGKILL trials, {acked_total} acknowledged events, 0 lost")
