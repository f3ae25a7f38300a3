"""Many ranks into one PostgreSQL store: 8 writer processes at once (4 ranks of one run, 4 single-rank
runs), each through its own Collector and COPY; no deadlock, no lost or duplicated row, exact
per-rank counters."""

from __future__ import annotations

import pytest

from specscope.collector.loadgen import rank_events, run_writers, writer_layout
from specscope.storage import open_store

pytestmark = pytest.mark.postgres
EVENTS = 1_500
BATCH = 200  # many small transactions per writer, interleaved with the other writers'


def test_eight_writer_processes_lose_and_duplicate_nothing(pg_url: str) -> None:
    open_store(pg_url).close()  # created once; the writers open an existing store
    layout = writer_layout(8)
    reports, _ = run_writers(pg_url, layout, EVENTS, BATCH, timeout_s=300)
    assert sorted((r[0], r[1]) for r in reports) == sorted((run, rank) for run, rank, _ in layout)
    assert all(r[3] == 0 for r in reports)  # nothing dropped
    with open_store(pg_url, read_only=True) as store:
        for run_id, rank, world in layout:
            events = rank_events(run_id, rank, world, EVENTS)
            expected = {kind: sum(e.kind == kind for e in events)
                        for kind in ("verify_step", "tensor", "request_start")}
            where = f"run_id = '{run_id}' AND rank = {rank}"
            steps, distinct = store.query(f"SELECT COUNT(*), COUNT(DISTINCT request_id || '/' || step) "
                                          f"FROM verify_steps WHERE {where}")[1][0]
            assert steps == distinct == expected["verify_step"], (run_id, rank)
            tensors, calls = store.query(f"SELECT COUNT(*), COUNT(DISTINCT hook_point || '/' || call_index) "
                                         f"FROM tensor_events WHERE {where}")[1][0]
            assert tensors == calls == expected["tensor"], (run_id, rank)
            assert store.query(f"SELECT COUNT(*) FROM requests WHERE {where}")[1][0][0] == expected["request_start"]
            written, dropped = store.query(f"SELECT events_written, events_dropped FROM run_ranks "
                                           f"WHERE {where}")[1][0]
            assert (written, dropped) == (len(events), 0), (run_id, rank)
        runs = store.query("SELECT run_id, world_size, verify_steps FROM v_run_summary ORDER BY run_id")[1]
    per_rank_steps = sum(e.kind == "verify_step" for e in rank_events("x", 0, 1, EVENTS))
    assert runs == [("shared", 4, 4 * per_rank_steps)] + [(f"solo-{i}", 1, per_rank_steps) for i in range(4)]
