"""The summary tables (``acceptance_masks``, ``request_accepts``, ``step_seconds``,
``draft_input_seconds``, ``tensor_shapes``) that the run-level, per-request and over-time views and
the shape contract read: however the rows arrive in batches, what the store
keeps equals the summary computed from scratch over the raw rows (``Store.rebuild_summaries``), on
SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import itertools

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope import events as ev
from specscope import metrics
from specscope.errors import EventRejected

RUN = "r"  # replaced per example
SUMMARIES = ("SELECT run_id, rank, accepted_mask, steps, proposed, accepted, first_wall, last_wall, step_detail "
             "FROM acceptance_masks ORDER BY run_id, rank, accepted_mask",
             "SELECT run_id, request_id, accepted_drafts, steps, proposed, accepted, position0_steps, drafts, "
             "first_wall, last_wall, step_detail FROM request_accepts ORDER BY run_id, request_id, accepted_drafts",
             "SELECT run_id, rank, wall_second, steps, accepted, first_wall, last_wall FROM step_seconds "
             "ORDER BY run_id, rank, wall_second",
             "SELECT run_id, rank, hook_point, width, expected_width, wall_second, events, first_wall, last_wall "
             "FROM draft_input_seconds ORDER BY run_id, rank, hook_point, width, expected_width, wall_second",
             "SELECT run_id, rank, hook_point, shape, dtype, device, expected_shape, graph_phase, width, "
             "expected_width, events, first_call, last_call, first_wall, last_wall, nonfinite "
             "FROM tensor_shapes ORDER BY run_id, rank, hook_point, shape, dtype, device, expected_shape, "
             "graph_phase")

_steps = st.builds(
    lambda rank, step, accepted, ts: ev.VerifyStep(run_id=RUN, request_id=f"q{rank}", rank=rank, step=step,
                                                   proposed=4, accepted=accepted, ts_wall=ts),
    st.integers(0, 1), st.integers(0, 50), st.integers(0, 4), st.floats(1.0, 1e3))
_groups = st.builds(
    lambda rank, mask, n, ts: ev.VerifyGroup(run_id=RUN, request_id="g", rank=rank, accepted_mask=mask, steps=n,
                                             proposed=4 * n, accepted=mask.count("1") * n, ts_wall=ts),
    st.integers(0, 1), st.sampled_from(["0000", "1000", "1100", "1111", "1010", ""]), st.integers(1, 9),
    st.floats(1.0, 1e3))
_tensors = st.builds(
    lambda rank, point, width, expected, nonfinite, call, ts: ev.TensorEvent(
        run_id=RUN, rank=rank, hook_point=point, call_index=call, shape=() if width is None else (1, 3, width),
        dtype="bfloat16",
        device=f"cuda:{rank}", expected_shape=None if expected is None else (-1, -1, expected),
        nonfinite=nonfinite, ts_wall=ts),
    st.integers(0, 1), st.sampled_from(["draft.forward:hidden_states", "target.layers.2:input"]),
    st.sampled_from([576, 1728, None]), st.sampled_from([None, 1728]), st.sampled_from([None, 0, 3]),
    st.integers(0, 10_000), st.floats(1.0, 1e3))


_EXAMPLE = itertools.count()


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(st.one_of(_steps, _groups, _tensors), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=6))
def test_batched_summaries_equal_a_rebuild(store, events, cuts) -> None:
    """Each example writes a run of its own into the same store, cut into batches at ``cuts``."""
    run_id = f"run-{next(_EXAMPLE)}"
    seen: set[tuple] = set()  # a step number repeated is stored once by design: this oracle counts each once
    events = [dataclasses.replace(e, run_id=run_id) for e in events
              if e.kind != "verify_step" or (e.request_id, e.step) not in seen and not seen.add((e.request_id, e.step))]
    store.write([ev.RunStart(run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=0.5)])
    bounds = sorted({0, len(events), *[c for c in cuts if c < len(events)]})
    for start, end in zip(bounds, bounds[1:]):
        store.write(events[start:end])
    kept = [store.query(sql)[1] for sql in SUMMARIES]
    store.rebuild_summaries()
    assert [store.query(sql)[1] for sql in SUMMARIES] == kept
    steps = [e for e in events if e.kind != "tensor"]
    tensors = [e for e in events if e.kind == "tensor"]
    where = {"run_id": run_id}
    assert store.query("SELECT verify_steps, accepted FROM v_run_acceptance WHERE run_id = :run_id", where)[1] == (
        [(sum(getattr(e, "steps", 1) for e in steps), sum(e.accepted for e in steps))] if steps else [])
    assert store.query("SELECT SUM(calls) FROM v_tensor_contract WHERE run_id = :run_id", where)[1] == [
        (len(tensors) or None,)]
    # per-position acceptance: the view (SQL) and metrics.py (Python) on the same masks, step by step
    # (steps recorded as totals only, an empty mask for drafts proposed, have no known positions)
    masks = [e.mask() if e.kind == "verify_step" else e.accepted_mask
             for e in steps for _ in range(getattr(e, "steps", 1))
             if e.kind == "verify_step" or e.accepted_mask or not e.proposed]
    positions = store.query("SELECT acceptance FROM v_position_acceptance WHERE run_id = :run_id "
                            "ORDER BY position", where)[1]
    assert [p for (p,) in positions] == pytest.approx(metrics.per_position_acceptance(masks))


def test_counters_past_32_bits_are_kept_and_read_as_ints(store) -> None:
    """A watched server's windows on one (rank, mask) summing past 2**31 - 1 proposed tokens: both
    are stored (PostgreSQL's INTEGER refused the second with "integer out of range"), and every view
    and named query reads the sums as Python ints, not PostgreSQL's NUMERIC (Decimal)."""
    from specscope.storage import queries

    window = 1_500_000_000  # one window fits a verify_steps row; two pass 2**31 - 1 in the summary
    store.write([ev.RunStart(run_id="big", engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=1.0)])
    for ts in (2.0, 3.0):
        store.write([ev.VerifyGroup(run_id="big", request_id="w", rank=0, accepted_mask="1000", steps=window,
                                    proposed=window, accepted=window, ts_wall=ts)],
                    counters={("big", 0): (window, window)})
    total = 2 * window
    where = {"run_id": "big"}
    read = [store.query("SELECT verify_steps, proposed, accepted FROM v_run_acceptance WHERE run_id = :run_id",
                        where)[1][0],
            store.query("SELECT verify_steps, proposed, accepted FROM v_rank_acceptance WHERE run_id = :run_id",
                        where)[1][0],
            store.query("SELECT verify_steps, events_written, events_dropped FROM v_run_summary "
                        "WHERE run_id = :run_id", where)[1][0],
            store.query("SELECT accepted_steps, verify_steps, position FROM v_position_acceptance "
                        "WHERE run_id = :run_id AND position = 0", where)[1][0][:2],
            tuple(store.fetch(queries.RUN_MASKS, run_id="big")[0].values())[1:]]
    assert read == [(total,) * 3] * 3 + [(total, total), (total,)]
    assert all(type(value) is int for row in read for value in row)


def test_a_verify_step_stored_again_counts_once(store) -> None:
    """The same numbered verify step twice in a batch and again in a later one is stored once, and the
    summary counts it once (AL 3.0, not inflated); aggregate rows and unnumbered steps (-1) all count."""
    step = ev.VerifyStep(run_id="dup", request_id="q", rank=0, step=0, proposed=4, accepted=2, ts_wall=2.0)
    window = ev.VerifyGroup(run_id="dup", request_id="w", rank=0, accepted_mask="1000", steps=2, proposed=8,
                            accepted=2, ts_wall=3.0)
    store.write([ev.RunStart(run_id="dup", engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=1.0),
                 ev.RequestStart("dup", "q", 0, prompt_tokens=3), step, step, window])
    store.write([step, dataclasses.replace(step, rank=1), dataclasses.replace(step, step=1, accepted=4), window])
    where = {"run_id": "dup"}
    assert store.query("SELECT request_id, rank, step, accepted FROM verify_steps WHERE run_id = :run_id AND "
                       "step >= 0 ORDER BY rank, step", where)[1] == [("q", 0, 0, 2), ("q", 0, 1, 4), ("q", 1, 0, 2)]
    assert store.query("SELECT verify_steps, accepted, mean_acceptance_length FROM v_request_acceptance "
                       "WHERE run_id = :run_id AND request_id = 'q'", where)[1] == [(3, 8, pytest.approx(1 + 8 / 3))]
    assert store.query("SELECT verify_steps, accepted FROM v_run_acceptance WHERE run_id = :run_id",
                       where)[1] == [(3 + 4, 8 + 4)]
    kept = [store.query(sql)[1] for sql in SUMMARIES]
    store.rebuild_summaries()
    assert [store.query(sql)[1] for sql in SUMMARIES] == kept


def test_steps_stored_again_are_found_among_many_requests_and_spans(store) -> None:
    """A retried batch of 120 requests (more than one probe holds, ``_steps.PROBE_SIZES``) whose spans
    mix new and stored steps: only the new ones are written, on every request and rank."""
    def steps(request: int, numbers: range, rank: int = 0) -> list[ev.VerifyStep]:
        return [ev.VerifyStep(run_id="many", request_id=f"q{request}", rank=rank, step=n, proposed=4,
                              accepted=1, ts_wall=2.0) for n in numbers]

    store.write([ev.RunStart(run_id="many", engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=1.0)])
    store.write([s for q in range(120) for s in steps(q, range(0, 10, 2))])  # 0, 2, 4, 6, 8
    store.write([s for q in range(120) for s in steps(q, range(5, 12)) + steps(q, range(3, 4), rank=1)])
    counts = store.query("SELECT request_id, rank, COUNT(*), COUNT(DISTINCT step), SUM(steps) FROM verify_steps "
                         "WHERE run_id = 'many' GROUP BY request_id, rank ORDER BY request_id, rank")[1]
    assert counts == [(f"q{q}", rank, n, n, n) for q in sorted(range(120), key=str)
                      for rank, n in ((0, 5 + 5), (1, 1))]  # 0, 2, 4, 6, 8 + 5, 7, 9, 10, 11; rank 1: 3
    assert store.query("SELECT steps FROM acceptance_masks WHERE run_id = 'many' ORDER BY rank")[1] == [
        (120 * 10,), (120,)]


_SHAPE_DIMS = itertools.count(40_001)  # the write path caches shapes per process: a new one per example


@pytest.mark.parametrize("first", [float, numpy.int64], ids=["float", "numpy-int"])
def test_a_shape_given_with_other_numbers_stores_the_integer_shape(store, first) -> None:
    """A shape whose last dimension is ``4096.0`` or ``numpy.int64(4096)`` is the same cache key as
    ``(7, 4096)``: whichever comes first, every one of them stores ``"7x<n>"`` with an integer width
    (a float cached as given stored the later valid shapes as ``"7x<n>.0"`` on SQLite and failed them
    on PostgreSQL; a numpy width went into SQLite as an 8-byte blob), and the summaries equal a
    rebuild. A dimension that is no integer is refused, and the store takes the next batch."""
    n = next(_SHAPE_DIMS)

    def tensor(call: int, shape: tuple) -> ev.TensorEvent:
        return ev.TensorEvent(run_id="shape", rank=0, hook_point="draft.fc:input", call_index=call, shape=shape,
                              dtype="float32", device="cpu", expected_shape=(1, -1, n), ts_wall=2.0 + call)

    store.write([ev.RunStart(run_id="shape", engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=1.0)])
    store.write([tensor(0, (7, first(n)))])
    store.write([tensor(1, (7, n)), tensor(2, (7, n))])
    store.write([tensor(3, (7, float(n)))])  # a hit of the cache, now the integer's columns
    with pytest.raises(EventRejected, match=r"shape dimension 0\.5 is not an integer"):
        store.write([tensor(4, (7, 0.5))])
    store.write([tensor(5, (7, n))])
    assert store.query("SELECT call_index, shape, width FROM tensor_events WHERE run_id = 'shape' "
                       "ORDER BY call_index")[1] == [(c, f"7x{n}", n) for c in (0, 1, 2, 3, 5)]
    assert {type(width) for (width,) in store.query("SELECT width FROM tensor_events")[1]} == {int}
    kept = [store.query(sql)[1] for sql in SUMMARIES]
    store.rebuild_summaries()
    assert [store.query(sql)[1] for sql in SUMMARIES] == kept


def test_an_integer_wall_time_past_double_precision_is_summed_by_its_stored_second(store) -> None:
    """``ts_wall`` given in nanoseconds as an int (``time.time_ns()``): the column keeps a double, so the
    per-second summaries fold the second of the stored double, as a rebuild does (floored exactly,
    four steps a nanosecond apart made four seconds where the stored rows hold one)."""
    t0 = 1_733_580_000_123_456_789
    store.write([ev.RunStart(run_id="ns", engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=1.0)])
    for i in range(0, 4, 2):
        store.write([ev.VerifyStep(run_id="ns", request_id="q", rank=0, step=s, proposed=4, accepted=2,
                                   ts_wall=t0 + s) for s in (i, i + 1)]
                    + [ev.TensorEvent(run_id="ns", rank=0, hook_point="draft.fc:input", call_index=i, shape=(1, 8),
                                      dtype="float32", device="cpu", expected_shape=(1, 8), ts_wall=t0 + i)])
    assert store.query("SELECT steps FROM step_seconds WHERE run_id = 'ns'")[1] == [(4,)]
    kept = [store.query(sql)[1] for sql in SUMMARIES]
    store.rebuild_summaries()
    assert [store.query(sql)[1] for sql in SUMMARIES] == kept
