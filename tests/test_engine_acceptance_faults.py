"""The reference engine's acceptance faults across requests, diagnosed from the store:
``request-aux-noise`` (every third request's draft input is noise) is named by REQUEST_ACCEPT_OUTLIER; a
healthy run serving the same requests is named by neither it nor ACCEPT_DRIFT. Short generations (the
acceptance pattern matters, not hours): the requests cycle through six prompts, so early and late
requests of a healthy run are alike."""

from __future__ import annotations

import pytest

from specscope.doctor import diagnose
from specscope.storage import open_store

REQUESTS = 24
MAX_NEW = 32


@pytest.fixture(scope="module")
def runs(target_pair, tmp_path_factory):
    """``(store path, run(fault) -> (run_id, results))``: the same requests served with ``fault`` (None:
    healthy), each run served once, when a test first asks for it."""
    from specscope.collector import Collector
    from specscope.engine import Engine, demo_prompts
    from specscope.instrumentation import Tracer

    db = str(tmp_path_factory.mktemp("accept-faults") / "store.db")
    prompts = (demo_prompts(6) * (REQUESTS // 6 + 1))[:REQUESTS]
    served = {}

    def run(fault):
        if fault not in served:
            engine = Engine(target=target_pair, fault=fault)
            with Collector(db) as collector:
                engine.tracer = Tracer(collector, engine="specscope-reference", engine_version="0",
                                       target_model="t", draft_model="d", config=engine.run_config(), fault=fault)
                results = engine.generate(prompts, max_new_tokens=MAX_NEW)
                engine.tracer.close()
            served[fault] = (engine.tracer.run_id, results)
        return served[fault]

    return db, run


def _rates(results) -> list[tuple[str, int, float]]:
    """Per request: id, verify steps, acceptance rate (shown when an assertion fails)."""
    return [(r.request_id, len(r.accepted), round(sum(r.accepted) / sum(r.proposed), 3)) for r in results]


def _report(db: str, run_id: str):
    with open_store(db, read_only=True) as store:
        return diagnose(store, run_id)


def test_noisy_requests_are_named_and_only_they(runs):
    db, run = runs
    run_id, results = run("request-aux-noise")
    found = [f for f in _report(db, run_id).findings if f.code == "REQUEST_ACCEPT_OUTLIER"]
    assert len(found) == 1, _rates(results)
    (finding,) = found
    noisy = {r.request_id for i, r in enumerate(results) if i % 3 == 2}
    assert {r["request_id"] for r in finding.evidence["near_zero"]} == noisy and finding.evidence["repeating"] == []
    by_id = {r.request_id: r for r in results}
    assert all(r["text_excerpt"] == by_id[r["request_id"]].text[:120] for r in finding.evidence["near_zero"])
    # lossless all the same: the noisy requests wrote what the healthy run wrote for the same prompts
    assert [r.token_ids for r in results] == [r.token_ids for r in run(None)[1]]


def test_the_healthy_run_of_the_same_requests_reads_neither(runs):
    db, run = runs
    run_id, results = run(None)
    codes = _report(db, run_id).codes()
    assert "ACCEPT_DRIFT" not in codes and "REQUEST_ACCEPT_OUTLIER" not in codes, _rates(results)
