"""The per-second summaries ``step_seconds`` and ``draft_input_seconds`` and the views over time that
read them (acceptance over time and in windows, the draft's inputs over time): whatever the slices, a second inside
one slice counted at once and the raw rows of a second across a boundary give what slicing every raw
row gives (in Python, the oracle), on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope import events as ev
from specscope.storage import queries
from specscope.storage._distribution_views import ACCEPTANCE_WINDOWS

T0 = 1_000.0
FUSED, HIDDEN = 1728, 576

_steps = st.builds(
    lambda rank, accepted, ts: (rank, accepted, ts), st.integers(0, 1), st.integers(0, 4),
    st.floats(T0 - 0.5, T0 + 9.5))
_tensors = st.builds(
    lambda rank, point, width, expected, ts: ev.TensorEvent(
        run_id="r", rank=rank, hook_point=point, call_index=0, shape=(1, width), dtype="bfloat16", device="cuda:0",
        expected_shape=None if expected is None else (-1, expected), ts_wall=ts),
    st.integers(0, 1), st.sampled_from(["draft.forward:hidden_states", "draft.model.fc:input", "target.layers.2:input"]),
    st.sampled_from([HIDDEN, FUSED]), st.sampled_from([None, HIDDEN, FUSED]), st.floats(T0 - 0.5, T0 + 9.5))

_EXAMPLE = itertools.count()


def _slice(ts: float, t0: float, dt: float, buckets: int) -> int:
    """queries._slice in Python: the slice of the run's lifetime, times outside at the nearest end."""
    if dt <= 0 or ts <= t0:
        return 0
    if ts - t0 >= dt * buckets:
        return buckets - 1
    return math.floor((ts - t0) / dt)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(_steps, max_size=60), tensors=st.lists(_tensors, max_size=60), buckets=st.integers(1, 40),
       span=st.floats(0.5, 9.0), cut=st.integers(0, 60))
def test_views_over_time_slice_like_their_raw_rows(store, steps, tensors, buckets, span, cut) -> None:
    """A run of ``span`` seconds (rank heartbeats bound its lifetime), steps and draft inputs written in
    two batches, read in ``buckets`` slices: per slice, the counts of slicing each raw row."""
    run_id = f"run-{next(_EXAMPLE)}"
    verify = [ev.VerifyStep(run_id, "q", rank, step=i, proposed=4, accepted=accepted, ts_wall=ts)
              for i, (rank, accepted, ts) in enumerate(steps)]
    events = [*verify, *(dataclasses.replace(e, run_id=run_id) for e in tensors)]
    store.write([ev.RunStart(run_id, "e", "0", "t", "d", {}, ts_wall=T0),
                 ev.RankStart(run_id, 0, 1, "h", 1, "cuda:0", ts_wall=T0),
                 ev.RankStatus(run_id, 0, 0, 0, "eager", ts_wall=T0 + span)])
    for batch in (events[:cut], events[cut:]):
        if batch:
            store.write(batch)
    (t0, last_seen), = store.query("SELECT MIN(started_wall), MAX(last_seen_wall) FROM run_ranks "
                                   "WHERE run_id = :run_id", {"run_id": run_id})[1]
    dt = (last_seen - t0) / buckets

    over_time = store.fetch(queries.ACCEPTANCE_OVER_TIME, run_id=run_id, buckets=buckets)
    by_slice: Counter = Counter()
    accepted: Counter = Counter()
    for step in verify:
        by_slice[_slice(step.ts_wall, t0, dt, buckets)] += 1
        accepted[_slice(step.ts_wall, t0, dt, buckets)] += step.accepted
    assert [(round(r["t_s"] / dt) if dt > 0 else 0, r["verify_steps"], r["accepted"]) for r in over_time] == [
        (s, by_slice[s], accepted[s]) for s in sorted(by_slice)]

    (w0, w1), = store.query("SELECT MIN(first_wall), MAX(last_wall) FROM acceptance_masks WHERE run_id = :run_id "
                            "AND steps > 0", {"run_id": run_id})[1]
    windows: Counter = Counter()
    for step in verify:
        wdt = (w1 - w0) / ACCEPTANCE_WINDOWS
        at = (0 if wdt <= 0 or step.ts_wall <= w0 else ACCEPTANCE_WINDOWS - 1
              if step.ts_wall >= w0 + wdt * ACCEPTANCE_WINDOWS else math.floor((step.ts_wall - w0) / wdt))
        windows[step.rank, at] += 1
    assert {(r["rank"], r["window_index"]): r["verify_steps"]
            for r in store.fetch(queries.ACCEPTANCE_WINDOWS, run_id=run_id)} == dict(windows)

    inputs = store.fetch(queries.DRAFT_INPUTS_OVER_TIME, run_id=run_id, buckets=buckets)
    expected = Counter((e.rank, e.hook_point, e.shape[-1], e.expected_shape[-1], _slice(e.ts_wall, t0, dt, buckets))
                       for e in tensors if e.expected_shape is not None and e.hook_point.startswith("draft."))
    assert {(r["rank"], r["hook_point"], r["width"], r["expected_width"], r["slice"]): r["events"]
            for r in inputs} == dict(expected)
    assert len(inputs) == len(expected)


def test_straddling_seconds_are_looked_up_not_scanned(tmp_path) -> None:
    """SQLite's plan reads the raw rows of the seconds across a slice boundary through the index range
    on ``ts_wall`` of each such second, never a scan of the run's rows (1.2M tensor events a run on the
    dashboard benchmark)."""
    import re

    import sqlalchemy as sa

    from specscope.storage import open_store

    open_store(str(tmp_path / "plan.db")).close()
    with sa.create_engine(f"sqlite:///{tmp_path / 'plan.db'}").begin() as conn:
        # the statistics ANALYZE gives the benchmark's store: without them any join order looks alike
        conn.exec_driver_sql("ANALYZE")
        conn.exec_driver_sql("DELETE FROM sqlite_stat1")
        conn.exec_driver_sql("INSERT INTO sqlite_stat1 VALUES "
                             "('draft_input_seconds', 'sqlite_autoindex_draft_input_seconds_1', '141824 284 278 278 139 139 1'), "
                             "('step_seconds', 'sqlite_autoindex_step_seconds_1', '70912 142 139 1'), "
                             "('run_ranks', 'sqlite_autoindex_run_ranks_1', '511 1 1'), "
                             "('verify_steps', 'ix_verify_steps_run_rank', '1000000 2000 1957 1'), "
                             "('tensor_events', 'ix_tensor_events_run', '5000000 10000 9785 2')")
    with sa.create_engine(f"sqlite:///{tmp_path / 'plan.db'}").connect() as conn:
        for query in (queries.ACCEPTANCE_OVER_TIME, queries.ACCEPTANCE_WINDOWS, queries.DRAFT_INPUTS_OVER_TIME):
            sql = re.sub(r":(run_id)\b", "'r'", query.sql).replace(":buckets", "60")
            raw = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}") if " v " in row[3]]
            assert raw and all(step.startswith("SEARCH") and "ts_wall>?" in step for step in raw), (query.name, raw)
