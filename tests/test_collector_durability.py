"""Nothing acknowledged is lost: a writer process killed with SIGKILL, and one that exits without close().

Each test runs a real Python subprocess writing through a Collector into a SQLite store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from specscope.storage import open_store

BATCHES, BATCH = 20, 250

_EMITTER = textwrap.dedent("""
    import sys
    from specscope import events as ev
    from specscope.collector import Collector

    def tensor(i):
        return ev.TensorEvent(run_id="run-k", rank=0, hook_point="draft.forward:hidden_states",
                              call_index=i, shape=(1, 1, 1728), dtype="float32", device="cpu")

    collector = Collector(sys.argv[1], batch_size={batch}, flush_interval_s=0.01)
    i = 0
    for _ in range({batches}):
        for _ in range({batch}):
            collector.emit(tensor(i))
            i += 1
        if not collector.flush(timeout_s=60):
            sys.exit("flush failed")
    print("ACKNOWLEDGED", i, flush=True)
    {tail}
""")


def _run_emitter(path: str, tail: str) -> subprocess.Popen:
    script = _EMITTER.format(batch=BATCH, batches=BATCHES, tail=tail)
    return subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_loses_nothing_acknowledged(tmp_path) -> None:
    path = str(tmp_path / "killed.db")
    # after the marker: keep the writer busy committing, so the kill lands mid-stream
    proc = _run_emitter(path, tail="while True:\n        collector.emit(tensor(i)); i += 1")
    try:
        line = proc.stdout.readline()
        assert line.split() == ["ACKNOWLEDGED", str(BATCHES * BATCH)], proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    with open_store(path, read_only=True) as store:
        assert store.query("PRAGMA integrity_check")[1] == [("ok",)]
        acknowledged = BATCHES * BATCH
        rows = store.query("SELECT COUNT(*), MIN(call_index), MAX(call_index) FROM tensor_events "
                           "WHERE call_index < :n", {"n": acknowledged})[1]
        assert rows == [(acknowledged, 0, acknowledged - 1)]
        written = store.query("SELECT events_written FROM run_ranks")[1][0][0]
        total = store.query("SELECT COUNT(*) FROM tensor_events")[1][0][0]
        assert written == total >= acknowledged  # counters committed with their batches


def test_exit_without_close_flushes_at_interpreter_exit(tmp_path) -> None:
    path = str(tmp_path / "exited.db")
    # the events after the marker are flushed by the atexit hook, not by the script
    proc = _run_emitter(path, tail="for _ in range(777):\n        collector.emit(tensor(i)); i += 1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    with open_store(path, read_only=True) as store:
        assert store.query("SELECT COUNT(*) FROM tensor_events")[1] == [(BATCHES * BATCH + 777,)]
