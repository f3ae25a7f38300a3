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
from specscope.doctor import diagnose
from specscope.metrics import chain_mask
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


def _serve(server: MetricsServer, db: str, exchanges: list[tuple[str, dict, str]], **recorder) -> str:
    """Each ``(path, request body, answer)`` in turn through one recorder into ``db``; the run id."""
    with Collector(db) as collector:
        rec = ResponseRecorder(collector, **recorder)
        with httpx.Client(transport=rec) as client:
            for path, body, answer in exchanges:
                server.body = answer
                client.post(server.url.replace("/metrics", path), json=body).raise_for_status()
        rec.close()
        assert collector.flush()
    return rec.run_id


def _sse(chunks: list[dict]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _positions(store, run_id: str) -> list[float]:
    rows = store.query(f"SELECT acceptance FROM v_position_acceptance WHERE run_id = '{run_id}' ORDER BY position")[1]
    return [p for (p,) in rows]


def test_a_run_mixing_streamed_and_plain_requests_reads_the_streamed_ones_p_i(server, store_url) -> None:
    """p_i, what-if-k and the doctor read the steps whose positions are known (the streamed request's
    four drafts, masks 1100 1111 0000 1000): the plain request's totals count in AL only (they halved
    every p_i, and 1 + sum p_i fell short of the AL)."""
    drafts = [(4, 2), (8, 6), (12, 6), (16, 7)]
    streamed = _sse([{"content": "t", "timings": {"predicted_n": 1 + i, "draft_n": p, "draft_n_accepted": a}}
                     for i, (p, a) in enumerate(drafts)]
                    + [{"content": "", "stop": True, "tokens_predicted": 12, "tokens_evaluated": 5,
                        "timings": {"predicted_n": 12, "draft_n": 16, "draft_n_accepted": 7}}])
    plain = json.dumps({"content": "x" * 40, "tokens_predicted": 12, "tokens_evaluated": 5,
                        "timings": {"predicted_n": 12, "draft_n": 16, "draft_n_accepted": 7}})
    run_id = _serve(server, store_url, [("/completion", {"prompt": "a", "stream": True}, streamed),
                                        ("/completion", {"prompt": "b"}, plain)], k=4)
    with open_store(store_url, read_only=True) as store:
        positions = _positions(store, run_id)
        (row,) = store.query("SELECT verify_steps, accepted, mean_acceptance_length FROM v_run_acceptance")[1]
        report = diagnose(store, run_id)
    assert positions == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 4])
    assert tuple(row) == pytest.approx((4 + 4, 14, 1 + 14 / 8))  # the plain request: 12 - 1 - 7 = 4 steps
    (run,) = report.runs
    assert run.per_position_acceptance == pytest.approx(positions)
    assert run.what_if_k[-1]["mean_acceptance_length"] == pytest.approx(1 + sum(positions))
    assert "POSITION0_LOW" not in {f.code for f in report.findings}


# vLLM 0.32's answer with --per-request-spec-decode-metrics detailed, as a real server returned it
VLLM_SPEC = {"mean_acceptance_length": 1.6666666666666665, "draft_acceptance_rate": 0.16666666666666666,
             "acceptance_histogram": [5, 6, 1, 0, 0], "num_spec_steps": 12, "num_accepted_draft_tokens": 8,
             "num_draft_tokens": 48, "num_spec_tokens": 4,
             "per_step_accepted": [1, 2, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1], "per_step_drafted": [4] * 12}
VLLM_ANSWER = {"id": "cmpl-1", "object": "text_completion", "model": "m",
               "choices": [{"index": 0, "text": " Paris.\n\nThe answer is: 2018-01-22 ", "finish_reason": "length"}],
               "usage": {"prompt_tokens": 5, "total_tokens": 25, "completion_tokens": 20},
               "metrics": {"time_to_first_token_ms": None, "speculative_decoding": VLLM_SPEC}}


@pytest.mark.parametrize("level", ["detailed", "summary"])
def test_vllm_per_request_metrics_give_exact_steps_and_positions(server, tmp_path, level, caplog) -> None:
    """Per step (``detailed``): each step with its chain mask; by the histogram (``summary``): the same
    per-request and per-position figures. The run's k is vLLM's num_spec_tokens (4), not the 3 given,
    and the recorder says so."""
    spec = VLLM_SPEC if level == "detailed" else {
        k: v for k, v in VLLM_SPEC.items() if not k.startswith("per_step")}
    db = str(tmp_path / "r.db")
    run_id = _serve(server, db, [("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 20},
                                  json.dumps({**VLLM_ANSWER, "metrics": {"speculative_decoding": spec}}))],
                    engine="vllm", k=3)
    with open_store(db, read_only=True) as store:
        (row,) = store.query("SELECT verify_steps, proposed, accepted, mean_acceptance_length FROM v_run_acceptance")[1]
        request = store.query("SELECT prompt_tokens, output_tokens, verify_steps FROM requests")[1]
        steps = store.query("SELECT accepted_mask FROM verify_steps WHERE step >= 0 ORDER BY step")[1]
        positions = _positions(store, run_id)
        (config,) = store.query("SELECT config FROM runs")[1][0]
    assert tuple(row) == pytest.approx((12, 48, 8, 1 + 8 / 12)) and request == [(5, 20, 12)]
    assert positions == pytest.approx([7 / 12, 1 / 12, 0, 0])  # 7 steps accepted position 0, 1 position 1
    assert [m for (m,) in steps] == ([chain_mask(a, 4) for a in VLLM_SPEC["per_step_accepted"]]
                                     if level == "detailed" else [])
    assert json.loads(config)["k"] == 4
    assert sum("num_spec_tokens" in r.getMessage() for r in caplog.records) == 1


def test_vllm_streamed_metrics_ride_on_the_final_usage_chunk(server, tmp_path) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    answer = _sse([{**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}}]},
                   {**chunk, "choices": [], "usage": {"prompt_tokens": 34, "completion_tokens": 20},
                    "metrics": {"speculative_decoding": VLLM_SPEC}}])
    db = str(tmp_path / "r.db")
    _serve(server, db, [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                                  "stream_options": {"include_usage": True}}, answer)], engine="vllm")
    with open_store(db, read_only=True) as store:
        request = store.query("SELECT prompt_tokens, output_tokens, verify_steps FROM requests")[1]
    assert request == [(34, 20, 12)]


def test_sglang_histogram_gives_per_position_sums(server, tmp_path) -> None:
    """SGLang's own counts and histogram (steps that accepted exactly j drafts) as its docs give them:
    3 steps accepting 0, 1 and 3 of 3 drafts."""
    meta = {"prompt_tokens": 7, "completion_tokens": 7, "spec_verify_ct": 3, "spec_num_correct_drafts": 4,
            "spec_num_proposed_drafts": 9, "spec_correct_drafts_histogram": [1, 1, 0, 1], "spec_accept_length": 7 / 3}
    db = str(tmp_path / "r.db")
    run_id = _serve(server, db, [("/generate", {"text": "hi"}, json.dumps({"text": "x" * 7, "meta_info": meta}))],
                    engine="sglang")
    with open_store(db, read_only=True) as store:
        (row,) = store.query("SELECT verify_steps, proposed, accepted FROM v_run_acceptance")[1]
        positions = _positions(store, run_id)
    assert tuple(row) == (3, 9, 4) and positions == pytest.approx([2 / 3, 1 / 3, 1 / 3])


def test_a_streamed_chat_answer_stores_its_prompt_length_from_the_timings(server, tmp_path) -> None:
    """llama.cpp's streamed chat chunks carry no usage: the prompt is the cached plus evaluated tokens."""
    timings = {"cache_n": 35, "prompt_n": 1, "predicted_n": 4, "draft_n": 3, "draft_n_accepted": 2}
    chunk = {"object": "chat.completion.chunk", "model": "m"}
    answer = _sse([{**chunk, "choices": [{"index": 0, "delta": {"content": "abcd"}}], "timings": timings},
                   {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": timings}])
    db = str(tmp_path / "r.db")
    _serve(server, db, [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}, answer)])
    with open_store(db, read_only=True) as store:
        assert store.query("SELECT prompt_tokens, output_tokens FROM requests")[1] == [(36, 4)]


def test_a_draft_longer_than_the_given_k_is_said_once(server, tmp_path, caplog) -> None:
    chunks = [{"content": "a", "timings": {"predicted_n": 5, "draft_n": 4, "draft_n_accepted": 3}},
              {"content": "", "stop": True, "tokens_predicted": 5, "timings": {"predicted_n": 5, "draft_n": 4,
                                                                               "draft_n_accepted": 3}}]
    db = str(tmp_path / "r.db")
    _serve(server, db, [("/completion", {"prompt": "x", "stream": True}, _sse(chunks))] * 2, k=3)
    said = [r.getMessage() for r in caplog.records if "ResponseRecorder(k=)" in r.getMessage()]
    assert len(said) == 1 and "drafted 4 tokens in one step, more than the run's k=3" in said[0]
