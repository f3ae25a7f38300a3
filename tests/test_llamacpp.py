"""Real llama.cpp servers (PyPI xllamacpp, the SmolLM2 GGUF as target; draft-model, n-gram and EAGLE-3
speculation) on 127.0.0.1: `specscope watch` and the response recorder store exactly what the server's
own ``/metrics`` counters count (AL, rate, p_i), through series created after the first scrape, a
restart, an outage, and two servers watched at once; and the GGUF files specscope writes for it (the
EAGLE-3 head, the target in float32). One server per mode for the module; requests are short and
seeded (counters are the same run to run), threads 1."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specscope.adapters.llamacpp import ONE_SHOT, LlamaCppServer, engine_version
from specscope.adapters.prometheus_watch import Watcher
from specscope.adapters.recorder import ResponseRecorder
from specscope.collector import Collector
from specscope.doctor import diagnose
from specscope.storage import open_store

pytestmark = pytest.mark.llamacpp
pytest.importorskip("xllamacpp")

K = 3
PROMPTS = ["List the colours of the rainbow.", "Count from one to ten in words."]
NGRAM_PROMPT = ("<|im_start|>user\nCopy this text exactly: The quick brown fox jumps over the lazy dog. "
                "The quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def draft_server():
    with LlamaCppServer("draft", k=K) as server:
        yield server


@pytest.fixture(scope="module")
def ngram_server():
    with LlamaCppServer("ngram", k=K) as server:
        yield server


def counters(url: str) -> dict:
    """The server's own speculative-decoding counters, read straight from its exposition."""
    out = {"steps": 0.0, "proposed": 0.0, "accepted": 0.0, "pos": {}}
    names = {"llamacpp:spec_decode_num_drafts": "steps", "llamacpp:spec_decode_num_draft_tokens": "proposed",
             "llamacpp:spec_decode_num_accepted_tokens": "accepted"}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in names:
                out[names[name]] = sample.value
            elif name == "llamacpp:spec_decode_num_accepted_tokens_per_pos":
                out["pos"][int(sample.labels["position"])] = sample.value
    return out


def minus(after: dict, before: dict) -> dict:
    return {"steps": after["steps"] - before["steps"], "proposed": after["proposed"] - before["proposed"],
            "accepted": after["accepted"] - before["accepted"],
            "pos": {i: n - before["pos"].get(i, 0.0) for i, n in after["pos"].items()}}


def plus(a: dict, b: dict) -> dict:
    return {key: a[key] + b[key] for key in ("steps", "proposed", "accepted")} | {
        "pos": {i: a["pos"].get(i, 0.0) + b["pos"].get(i, 0.0) for i in {*a["pos"], *b["pos"]}}}


def complete(url: str, prompt: str, *, tokens: int = 24, temperature: float = 1.0, stream: bool = False,
             client: httpx.Client | None = None) -> None:
    body = {"prompt": prompt, "n_predict": tokens, "seed": 7, "temperature": temperature, "stream": stream}
    with (client or httpx.Client(timeout=120, headers=ONE_SHOT)).stream("POST", f"{url}/completion",
                                                                       json=body) as response:
        response.raise_for_status()
        response.read()


def assert_stored(store, run_id: str, truth: dict) -> None:
    """The store's figures for ``run_id`` are the counters' own, exactly."""
    steps, proposed, accepted = (int(truth[k]) for k in ("steps", "proposed", "accepted"))
    assert steps > 0
    row = store.query("SELECT verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate "
                      f"FROM v_run_acceptance WHERE run_id = '{run_id}'")[1][0]
    assert tuple(row) == pytest.approx((steps, proposed, accepted, 1 + accepted / steps, accepted / proposed))
    stored = store.query(f"SELECT position, acceptance FROM v_position_acceptance WHERE run_id = '{run_id}' "
                         "ORDER BY position")[1]
    assert [position for position, _ in stored] == sorted(truth["pos"])
    assert [p for _, p in stored] == pytest.approx([truth["pos"][i] / steps for i in sorted(truth["pos"])])


def test_watch_equals_the_counters_through_new_series_a_restart_and_an_outage(tmp_path) -> None:
    """A fresh server has no per-position series at the baseline scrape (llama.cpp creates them at the
    first draft): their first window counts whole. Then the server stops (two gap scrapes), restarts on
    the same port from 0, and serves again: the stored run is the sum of both lives' counters."""
    server = LlamaCppServer("draft", k=K)
    try:
        with open_store(str(tmp_path / "w.db")) as store, Watcher(store, [server.url]) as watcher:
            assert counters(server.url)["pos"] == {}
            watcher.scrape()
            for prompt in PROMPTS:
                complete(server.url, prompt)
            first_life = counters(server.url)
            assert first_life["pos"]  # created since the baseline
            watcher.scrape()
            (run_id,) = watcher.run_ids
            assert_stored(store, run_id, first_life)
            port = server.port
            server.close()
            assert [r.ok for r in watcher.scrape() + watcher.scrape()] == [False, False]
            server = LlamaCppServer("draft", k=K, port=port)
            complete(server.url, PROMPTS[0], tokens=16)
            second_life = counters(server.url)
            (result,) = watcher.scrape()
            assert result.ok and result.verify_steps == second_life["steps"]
            assert_stored(store, run_id, plus(first_life, second_life))
    finally:
        server.close()


def test_two_servers_watched_at_once(draft_server, ngram_server, tmp_path) -> None:
    urls = [draft_server.url, ngram_server.url]
    with open_store(str(tmp_path / "w.db")) as store, Watcher(store, urls) as watcher:
        watcher.scrape()
        before = [counters(u) for u in urls]
        complete(draft_server.url, PROMPTS[1])
        complete(ngram_server.url, NGRAM_PROMPT, tokens=32, temperature=0.0)
        after = [counters(u) for u in urls]
        results = watcher.scrape()
        assert [r.ok for r in results] == [True, True]
        for result, b, a in zip(results, before, after):
            assert_stored(store, result.runs[0], minus(a, b))
        engines = store.query("SELECT DISTINCT engine FROM runs")[1]
    assert engines == [("llama.cpp",)]


@pytest.mark.parametrize("mode", ["draft", "ngram"])
def test_recorded_streamed_requests_equal_the_counters(mode, draft_server, ngram_server, tmp_path) -> None:
    """Streamed through the recorder (an httpx transport, here under the openai client for one request):
    every draft becomes a verify step with its chain mask; the stored run equals the counters' increase."""
    import openai

    server = draft_server if mode == "draft" else ngram_server
    db = str(tmp_path / "r.db")
    before = counters(server.url)
    with Collector(db) as collector:
        recorder = ResponseRecorder(collector, engine="llama.cpp", engine_version=engine_version(),
                                    draft_model=server.draft_model, k=K)
        with httpx.Client(transport=recorder, timeout=120, headers=ONE_SHOT) as client:
            prompt = PROMPTS[0] if mode == "draft" else NGRAM_PROMPT
            complete(server.url, prompt, stream=True, client=client, temperature=1.0 if mode == "draft" else 0.0)
            chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", http_client=client)
            stream = chat.chat.completions.create(
                model="m", stream=True, max_tokens=24, seed=7, temperature=0.0,
                messages=[{"role": "user", "content": "Repeat: one two three, one two three, one two three."}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        recorder.close()
        assert collector.flush()
    truth = minus(counters(server.url), before)
    with open_store(db, read_only=True) as store:
        assert_stored(store, recorder.run_id, truth)
        requests = store.query(f"SELECT COUNT(*) FROM requests WHERE run_id = '{recorder.run_id}'")[1]
        run = store.query(f"SELECT engine, engine_version FROM runs WHERE run_id = '{recorder.run_id}'")[1]
    assert requests == [(2,)] and run == [("llama.cpp", engine_version())]


def test_the_reference_eagle3_head_serves_in_llamacpp_and_is_recorded_exactly(tmp_path) -> None:
    """draft-eagle3 with the shipped head converted to GGUF: it drafts and is accepted (its first
    position well above nothing), and the recorder's steps equal the server's counters."""
    db = str(tmp_path / "e.db")
    with LlamaCppServer("eagle3", k=K) as server, Collector(db) as collector:
        recorder = ResponseRecorder(collector, k=K)
        with httpx.Client(transport=recorder, timeout=120, headers=ONE_SHOT) as client:
            for prompt in PROMPTS:
                complete(server.url, prompt, stream=True, temperature=0.0, client=client)
        recorder.close()
        assert collector.flush()
        truth = counters(server.url)
    with open_store(db, read_only=True) as store:
        assert_stored(store, recorder.run_id, truth)
    assert truth["pos"][0] / truth["steps"] > 0.2


def test_recorded_plain_requests_keep_the_exact_token_counts(draft_server, tmp_path) -> None:
    """Not streamed, llama.cpp returns totals only: proposed and accepted equal the counters exactly."""
    db = str(tmp_path / "r.db")
    before = counters(draft_server.url)
    with Collector(db) as collector:
        recorder = ResponseRecorder(collector, k=K)
        with httpx.Client(transport=recorder, timeout=120, headers=ONE_SHOT) as client:
            for prompt in PROMPTS:
                complete(draft_server.url, prompt, client=client)
        recorder.close()
        assert collector.flush()
    truth = minus(counters(draft_server.url), before)
    with open_store(db, read_only=True) as store:
        row = store.query("SELECT (SELECT COUNT(*) FROM requests), proposed, accepted FROM v_run_acceptance")[1]
        (positions,) = store.query("SELECT COUNT(*) FROM v_position_acceptance")[1]
    assert tuple(row[0]) == (2, truth["proposed"], truth["accepted"]) and positions == (0,)


def test_demo_stores_a_llamacpp_run_the_doctor_and_the_pages_read(tmp_path, monkeypatch, capsys) -> None:
    from streamlit.testing.v1 import AppTest

    from specscope.app import DB_ENV, ENTRY
    from specscope.cli import main

    db = str(tmp_path / "demo.db")
    assert main(["demo", "--engine", "llama.cpp", "--no-dashboard", "--requests", "2", "--max-new-tokens", "16",
                 "--k", str(K), "--db", db]) == 0
    out = capsys.readouterr().out
    assert "[llama.cpp]: 2 request(s)" in out and "0 error(s)" in out
    with open_store(db, read_only=True) as store:
        run = store.query("SELECT engine, engine_version, draft_model FROM runs")[1]
        (steps,) = store.query("SELECT COUNT(*) FROM verify_steps WHERE step >= 0")[1]
    assert run == [("llama.cpp", engine_version(), draft_model_of("draft"))] and steps[0] > 0
    with open_store(db, read_only=True) as store:
        skipped = [f for f in diagnose(store).findings if f.code == "CHECKS_SKIPPED"]
    assert skipped and "recorded from the server's responses: no hooks" in skipped[0].message
    monkeypatch.setenv(DB_ENV, db)
    at = AppTest.from_file(str(ENTRY), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    for page in ("requests", "gpus", "findings"):
        at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, f"{page}: {[e.value for e in at.exception]}"


def draft_model_of(mode: str) -> str:
    from specscope.engine.target import TARGET_MODEL_ID

    return TARGET_MODEL_ID if mode == "draft" else "ngram-simple (n=2)"


def test_the_dequantized_target_is_the_shipped_gguf_in_float32() -> None:
    """What ``LlamaCppServer(dequantized=True)`` serves: every tensor of the Q4_1 GGUF as float32, equal
    to what the ``gguf`` package (and so transformers, vLLM and the reference engine) dequantizes."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    from specscope.adapters.llamacpp import dequantized_target_gguf
    from specscope.engine.target import gguf_path

    source, ours = gguf.GGUFReader(str(gguf_path())), gguf.GGUFReader(str(dequantized_target_gguf()))
    assert [t.name for t in ours.tensors] == [t.name for t in source.tensors]
    assert {t.tensor_type for t in ours.tensors} == {gguf.GGMLQuantizationType.F32}
    assert ours.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    for theirs, mine in zip(source.tensors, ours.tensors):
        assert np.array_equal(np.asarray(mine.data).ravel(), dequantize(theirs.data, theirs.tensor_type).ravel()), mine.name
    assert ours.fields["tokenizer.chat_template"].contents() == source.fields["tokenizer.chat_template"].contents()


def test_the_eagle3_gguf_maps_the_pruned_head_by_absolute_target_ids() -> None:
    """llama.cpp reads ``d2t`` as target ids (the checkpoint's offsets as written: AL 1.0, measured)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from specscope.adapters.llamacpp import eagle3_draft_gguf
    from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR

    weights = load_file(str(DEFAULT_DRAFT_DIR / "model.safetensors"))
    tensors = {t.name: t for t in gguf.GGUFReader(str(eagle3_draft_gguf())).tensors}
    d2t = np.asarray(tensors["d2t"].data)
    assert np.array_equal(d2t, np.arange(len(weights["d2t"])) + weights["d2t"]) and np.all(np.diff(d2t) > 0)
    assert np.array_equal(np.asarray(tensors["output.weight"].data), weights["lm_head.weight"].astype(np.float32))
