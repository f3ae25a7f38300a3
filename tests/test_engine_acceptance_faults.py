"""The reference engine's acceptance faults over time and across requests, diagnosed from the store:
``request-aux-noise`` (every third request's draft input is noise) is named by REQUEST_ACCEPT_OUTLIER,
``aux-decay`` (the draft's input degrades with every verify step served) by ACCEPT_DRIFT; a healthy run
serving the same requests is named by neither. Short generations (the acceptance pattern matters, not
hours): the requests cycle through six prompts, so early and late requests of a healthy run are alike."""

from __future__ import annotations

import pytest

from specscope.doctor import diagnose
from specscope.storage import open_store

REQUESTS = 24
MAX_NEW = 16


@pytest.fixture(scope="module")
def runs(target_pair, tmp_path_factory):
    """``(store path, {fault or "healthy": (run_id, results)})``: three runs of the same requests."""
    from specscope.collector import Collector
    from specscope.engine import Engine, demo_prompts
    from specscope.instrumentation import Tracer

    db = str(tmp_path_factory.mktemp("accept-faults") / "store.db")
    prompts = (demo_prompts(6) * (REQUESTS // 6 + 1))[:REQUESTS]
    out = {}
    for fault in (None, "request-aux-noise", "aux-decay"):
        engine = Engine(target=target_pair, fault=fault)
        with Collector(db) as collector:
            engine.tracer = Tracer(collector, engine="specscope-reference", engine_version="0", target_model="t",
                                   draft_model="d", config=engine.run_config(), fault=fault)
            results = engine.generate(prompts, max_new_tokens=MAX_NEW)
            engine.tracer.close()
        out[fault or "healthy"] = (engine.tracer.run_id, results)
    return db, out


def _report(db: str, run_id: str):
    with open_store(db, read_only=True) as store:
        return diagnose(store, run_id)


def test_noisy_requests_are_named_and_only_they(runs):
    db, out = runs
    run_id, results = out["request-aux-noise"]
    (finding,) = [f for f in _report(db, run_id).findings if f.code == "REQUEST_ACCEPT_OUTLIER"]
    noisy = {r.request_id for i, r in enumerate(results) if i % 3 == 2}
    assert {r["request_id"] for r in finding.evidence["near_zero"]} == noisy and finding.evidence["repeating"] == []
    by_id = {r.request_id: r for r in results}
    assert all(r["text_excerpt"] == by_id[r["request_id"]].text[:120] for r in finding.evidence["near_zero"])
    # lossless all the same: the noisy requests wrote what the healthy run wrote for the same prompts
    assert [r.token_ids for r in results] == [r.token_ids for r in out["healthy"][1]]


def test_a_slowly_degrading_draft_input_is_named_as_drift(runs):
    db, out = runs
    run_id, results = out["aux-decay"]
    (finding,) = [f for f in _report(db, run_id).findings if f.code == "ACCEPT_DRIFT"]
    e = finding.evidence
    assert e["al_after"] < 0.9 * e["al_before"] and e["p_value"] <= e["threshold"]
    assert e["requests_before"] + e["requests_after"] == REQUESTS and e["changed_after_s"] > 0
    # what the fault does, seen from the engine's own counts: the last requests accept less than the first
    rate = [sum(r.accepted) / sum(r.proposed) for r in results]
    assert sum(rate[-6:]) < 0.5 * sum(rate[:6])


def test_the_healthy_run_of_the_same_requests_reads_neither(runs):
    db, out = runs
    codes = _report(db, out["healthy"][0]).codes()
    assert "ACCEPT_DRIFT" not in codes and "REQUEST_ACCEPT_OUTLIER" not in codes
