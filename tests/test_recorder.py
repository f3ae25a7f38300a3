"""The response recorder (an httpx transport) against a real HTTP server on 127.0.0.1 answering what
SGLang's native ``/generate`` returns (``meta_info``, per its docs), and what it must pass through
unrecorded. llama.cpp itself: tests/test_llamacpp.py."""

from __future__ import annotations

import json

import httpx
import pytest
from _exposition import MetricsServer

from specscope.adapters.recorder import ResponseRecorder
from specscope.collector import Collector
from specscope.storage import open_store


@pytest.fixture
def server():
    srv = MetricsServer()
    yield srv
    srv.close()


def _record(server: MetricsServer, db: str, path: str, body: dict, **recorder) -> tuple[httpx.Response, str, int]:
    with Collector(db) as collector:
        rec = ResponseRecorder(collector, **recorder)
        with httpx.Client(transport=rec) as client:
            response = client.post(server.url.replace("/metrics", path), json=body)
        rec.close()
        assert collector.flush()
    return response, rec.run_id, rec.recorded


def test_sglang_meta_info_in_one_definition(server, tmp_path) -> None:
    """40 completion tokens over 16 verify steps (accept length 2.5, bonus included): 24 accepted; rate
    0.5 means 48 proposed (SGLang's denominator counts steps x (num_draft_tokens - 1))."""
    answer = {"text": "hi", "meta_info": {"prompt_tokens": 7, "completion_tokens": 40, "spec_verify_ct": 16,
                                          "spec_accept_length": 2.5, "spec_accept_rate": 0.5}}
    server.body = json.dumps(answer)
    db = str(tmp_path / "r.db")
    response, run_id, recorded = _record(server, db, "/generate", {"text": "hi", "stream": False},
                                         engine="sglang", k=3)
    assert response.json() == answer and recorded == 1
    assert json.loads(server.posted[0]) == {"text": "hi", "stream": False}  # not streamed: sent as given
    with open_store(db, read_only=True) as store:
        row = store.query("SELECT verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate "
                          f"FROM v_run_acceptance WHERE run_id = '{run_id}'")[1]
        request = store.query("SELECT prompt_tokens, output_tokens FROM requests")[1]
        engine = store.query("SELECT engine FROM runs")[1]
    assert tuple(row[0]) == pytest.approx((16, 48, 24, 2.5, 0.5))
    assert request == [(7, 40)] and engine == [("sglang",)]


def test_llamacpp_stream_is_asked_for_per_token_timings_and_passed_through(server, tmp_path) -> None:
    chunks = [{"content": "a", "timings": {"predicted_n": 1}},
              {"content": "b", "timings": {"predicted_n": 2, "draft_n": 3, "draft_n_accepted": 1}},
              {"content": "c", "timings": {"predicted_n": 3, "draft_n": 3, "draft_n_accepted": 1}},
              {"content": "d", "timings": {"predicted_n": 5, "draft_n": 6, "draft_n_accepted": 4}},
              {"content": "", "stop": True, "tokens_predicted": 5, "tokens_evaluated": 4,
               "timings": {"predicted_n": 5, "draft_n": 6, "draft_n_accepted": 4}}]
    server.body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    server.headers = {"Content-Type": "text/event-stream"}
    db = str(tmp_path / "r.db")
    response, run_id, recorded = _record(server, db, "/completion",
                                         {"prompt": "x", "stream": True, "temperature": 0.8, "top_k": 40})
    assert response.text == server.body and recorded == 1
    assert json.loads(server.posted[0])["timings_per_token"] is True
    with open_store(db, read_only=True) as store:
        steps = store.query("SELECT step, proposed, accepted, accepted_mask FROM verify_steps ORDER BY step")[1]
        request = store.query("SELECT prompt_tokens, output_tokens, verify_steps FROM requests")[1]
        sampling = store.query("SELECT sampling, temperature, top_p, top_k, prompt_key IS NOT NULL FROM requests")[1]
    assert [tuple(s) for s in steps] == [(0, 3, 1, "100"), (1, 3, 3, "111")] and request == [(4, 5, 2)]
    # the request's own settings (top_p left to the server's default: unknown)
    assert [tuple(r) for r in sampling] == [("T=0.8 top_k=40", 0.8, None, 40, 1)]


@pytest.mark.parametrize(("path", "status", "body"), [
    ("/health", 200, '{"status": "ok"}'),
    ("/completion", 500, '{"error": "x"}'),
    ("/completion", 200, '{"content": "no speculation", "timings": {"predicted_n": 3}}'),
    ("/completion", 200, "not json"),
])
def test_what_carries_no_acceptance_passes_through_unrecorded(server, tmp_path, path, status, body) -> None:
    server.status, server.body = status, body
    db = str(tmp_path / "r.db")
    response, _, recorded = _record(server, db, path, {"prompt": "x"})
    assert response.status_code == status and response.text == body and recorded == 0
    with open_store(db) as store:
        assert store.query("SELECT COUNT(*) FROM runs")[1] == [(0,)]
