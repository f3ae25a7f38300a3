"""The per-request summary ``request_accepts`` and what reads it (``v_request_acceptance``,
``v_sampling_acceptance``, ``v_acceptance_histogram``, the per-request AL spread): however a run's
verify steps arrive in batches, the summary is the aggregate of the stored raw rows, and the views
give what a direct computation over those rows (in Python, the oracle) gives, on SQLite and
PostgreSQL."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope import events as ev
from specscope.storage import queries

RUN = "r"  # replaced per example
REQUESTS = ("q0", "q1", "q2", "q3")  # q3 has steps but no RequestStart: no view counts it

_steps = st.builds(
    lambda request, rank, step, proposed, accepted, ts: ev.VerifyStep(
        run_id=RUN, request_id=request, rank=rank, step=step, proposed=proposed, accepted=min(accepted, proposed),
        ts_wall=ts),
    st.sampled_from(REQUESTS), st.integers(0, 1), st.integers(0, 30), st.sampled_from([0, 3, 4]),
    st.integers(0, 4), st.floats(1.0, 1e3))
_groups = st.builds(
    lambda request, mask, n, extra, ts: ev.VerifyGroup(
        run_id=RUN, request_id=request, rank=0, accepted_mask=mask, steps=n,
        proposed=(len(mask) or extra) * n, accepted=mask.count("1") * n if mask else min(extra, 1) * n, ts_wall=ts),
    st.sampled_from(REQUESTS), st.sampled_from(["0000", "1000", "1100", "1111", "0110", "100", ""]),
    st.integers(0, 9), st.sampled_from([0, 4]), st.floats(1.0, 1e3))
_SAMPLING = {"q0": {}, "q1": {"temperature": 0.0}, "q2": {"temperature": 0.8}}

SUMMARY = ("SELECT request_id, accepted_drafts, steps, proposed, accepted, position0_steps, drafts, first_wall, "
           "last_wall, step_detail FROM request_accepts WHERE run_id = :run_id ORDER BY request_id, accepted_drafts")

_EXAMPLE = itertools.count()


def _known(row: dict) -> bool:
    """The steps' accepted drafts are known: they share a mask, or proposed nothing."""
    return row["steps"] > 0 and (row["accepted_mask"] != "" or row["proposed"] == 0)


def _oracle(rows: list[dict]) -> list[tuple]:
    """``request_accepts`` computed from the stored ``verify_steps`` rows."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        drafts = row["accepted"] // row["steps"] if _known(row) else -1
        groups[row["request_id"], drafts].append(row)
    return [(request_id, drafts, sum(r["steps"] for r in g), sum(r["proposed"] for r in g),
             sum(r["accepted"] for r in g), sum(r["steps"] for r in g if r["accepted_mask"].startswith("1")),
             max(r["proposed"] // r["steps"] for r in g) if drafts >= 0 else 0,
             min(r["ts_wall"] for r in g), max(r["ts_wall"] for r in g), int(any(r["step"] >= 0 for r in g)))
            for (request_id, drafts), g in sorted(groups.items())]


def _histogram(rows: list[dict], sampling: dict[str, str]) -> list[tuple]:
    """``v_acceptance_histogram`` of the run: per sampling group and accepted drafts 0..k, the steps."""
    per_group: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    k: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["request_id"] in sampling and _known(row):
            group = sampling[row["request_id"]]
            per_group[group][row["accepted"] // row["steps"]] += row["steps"]
            k[group] = max(k[group], row["proposed"] // row["steps"])
    return [(group, drafts, k[group], counts.get(drafts, 0),
             pytest.approx(counts.get(drafts, 0) / sum(counts.values())))
            for group, counts in sorted(per_group.items()) for drafts in range(k[group] + 1)]


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(st.one_of(_steps, _groups), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=6))
def test_request_summary_is_the_aggregate_of_its_steps_in_any_batches(store, events, cuts) -> None:
    """Each example writes a run of its own into the same store, cut into batches at ``cuts``."""
    run_id = f"run-{next(_EXAMPLE)}"
    starts = [ev.RequestStart(run_id, request, 0, prompt_tokens=3, ts_wall=1.0 + i, **_SAMPLING[request])
              for i, request in enumerate(_SAMPLING)]
    store.write([ev.RunStart(run_id=run_id, engine="e", engine_version="0", target_model="t", draft_model="d",
                             config={}, ts_wall=0.5), *starts])
    events = [dataclasses.replace(e, run_id=run_id) for e in events]
    bounds = sorted({0, len(events), *[c for c in cuts if c < len(events)]})
    for start, end in zip(bounds, bounds[1:]):
        store.write(events[start:end])
    where = {"run_id": run_id}
    names, raw = store.query("SELECT request_id, step, proposed, accepted, accepted_mask, ts_wall, steps "
                             "FROM verify_steps WHERE run_id = :run_id", where)
    rows = [dict(zip(names, row)) for row in raw]
    kept = store.query(SUMMARY, where)[1]
    assert kept == _oracle(rows)
    store.rebuild_summaries()
    assert store.query(SUMMARY, where)[1] == kept

    sampling = {e.request_id: e.sampling or "unknown" for e in starts}
    counted = [r for r in rows if r["request_id"] in sampling]
    per_request = store.query("SELECT request_id, verify_steps, proposed, accepted, step_detail FROM "
                              "v_request_acceptance WHERE run_id = :run_id ORDER BY request_id", where)[1]
    assert per_request == [
        (q, sum(r["steps"] for r in mine), sum(r["proposed"] for r in mine) if mine else None,
         sum(r["accepted"] for r in mine) if mine else None, int(any(r["step"] >= 0 for r in mine)) if mine else None)
        for q in sorted(sampling) for mine in [[r for r in counted if r["request_id"] == q]]]
    keys = ("sampling", "requests", "verify_steps", "proposed", "accepted", "position0_acceptance")
    groups = [{k: g[k] for k in keys} for g in store.fetch(queries.SAMPLING_ACCEPTANCE, run_id=run_id)]
    expected = []
    for group in sorted({sampling[r["request_id"]] for r in counted}):
        mine = [r for r in counted if sampling[r["request_id"]] == group]
        steps = sum(r["steps"] for r in mine)
        expected.append(dict(zip(keys, (
            group, len({r["request_id"] for r in mine}), steps, sum(r["proposed"] for r in mine),
            sum(r["accepted"] for r in mine), None if steps == 0 else pytest.approx(
                sum(r["steps"] for r in mine if r["accepted_mask"].startswith("1")) / steps)))))
    assert groups == expected
    histogram = store.fetch(queries.ACCEPTANCE_HISTOGRAM, run_id=run_id)
    assert [tuple(h.values())[1:] for h in histogram] == _histogram(rows, sampling)
