"""The replay against the target alone (docs/design.md, "Replay against the target"): which token ids a
Tracer keeps and how many, the stored results, ``v_replay_audit`` and the doctor's verdict on synthetic
results, both targets' scoring on the same logits (the server through a stand-in answering in vLLM's
``prompt_logprobs`` shape), and the CLI's bad input. Reference-engine and vLLM replays are in
tests/test_lossless_audit.py and tests/test_vllm_lossless.py."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import torch
from _list_sink import ListSink

from specscope.doctor import diagnose
from specscope.events import LosslessAudit, RankStart, ReplayResult, RequestStart, RequestTokens, RunConfig, RunStart
from specscope.instrumentation import Tracer
from specscope.replay import ReplayInput, ServerTarget, departures, replay_run, score_logits
from specscope.storage import open_store

RUN = "replayed"


def _tracer(sink, **kwargs) -> Tracer:
    return Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                  config=RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8, k=2,
                                    num_target_layers=4), **kwargs)


def test_a_tracer_keeps_the_token_ids_of_audited_requests_within_its_bounds(monkeypatch):
    from specscope.instrumentation import _token_ids

    monkeypatch.setattr(_token_ids, "MAX_REQUEST_TOKENS", 10)
    sink = ListSink()
    tracer = _tracer(sink, token_requests=2)
    tracer.start_request("a", 3, temperature=0.0, prompt=[1, 2, 3])
    tracer.start_request("text", 3, temperature=0.0, prompt="a text prompt has no ids to replay")
    tracer.start_request("b", 4, temperature=0.0, prompt=[4, 5, 6, 7])
    tracer.finish_request("a", 4, output_ids=[8, 9, 10, 11])
    tracer.finish_request("text", 1, output_ids=[1])
    tracer.finish_request("b", 9, output_ids=list(range(9)))  # 4 + 9 > 10: the output is cut to 6
    tracer.start_request("c", 1, temperature=0.0, prompt=[1])  # past the 2 requests: not kept
    tracer.finish_request("c", 1, output_ids=[2])
    tracer.close()
    kept = {e.request_id: e for e in sink.of(RequestTokens)}
    assert set(kept) == {"a", "b"}
    assert kept["a"].prompt_ids == (1, 2, 3) and kept["a"].output_ids == (8, 9, 10, 11)
    assert not kept["a"].output_truncated
    assert kept["b"].output_ids == (0, 1, 2, 3, 4, 5) and kept["b"].output_truncated

    quiet = ListSink()
    tracer = _tracer(quiet, audit_every=0)  # no audit, no ids: the replay is the audit's second half
    tracer.start_request("a", 3, temperature=0.0, prompt=[1, 2, 3])
    tracer.finish_request("a", 1, output_ids=[4])
    tracer.close()
    assert not quiet.of(RequestTokens)


@pytest.mark.parametrize("bad", [(1, -1), (1, 2**32), (1, 1.5), (1, "7"), [1, 2]])
def test_token_ids_that_are_not_ids_are_refused_at_the_boundary(bad):
    from specscope.errors import InvalidEvent

    with pytest.raises(InvalidEvent, match="output_ids"):
        RequestTokens(RUN, 0, "q", (1, 2), bad)
    with pytest.raises(InvalidEvent, match="prompt_ids is empty"):
        RequestTokens(RUN, 0, "q", (), (1,))


def test_a_replay_result_is_refused_with_another_requests_audit_or_inconsistent_counts():
    from specscope.errors import InvalidEvent

    with pytest.raises(InvalidEvent, match="LosslessAudit of request 'a'"):
        ReplayResult(RUN, "a", "folder", 0.25, LosslessAudit(RUN, 0, "b", "greedy", 3))
    with pytest.raises(InvalidEvent, match="departures 4 <= tokens 3"):
        ReplayResult(RUN, "a", "folder", 0.25, LosslessAudit(RUN, 0, "a", "greedy", 3), departures=4, first_departure=0)
    with pytest.raises(InvalidEvent, match="first_departure"):
        _replayed("a", departures=1)


def test_greedy_departures_split_near_ties_from_bugs():
    assert departures([0.0, 0.0], 0.25) == {"departures": 0, "near_ties": 0}
    assert departures([0.0, 0.1, 0.0, 3.0, 0.2], 0.25) == {
        "departures": 3, "near_ties": 2, "first_departure": 1, "first_margin": 0.1, "max_margin": 3.0}


def _item(temperature: float = 0.0, output=(2, 0, 1)) -> ReplayInput:
    return ReplayInput("r", "greedy" if temperature == 0 else f"T={temperature:g}", temperature, None, None,
                       (5, 6), tuple(output))


LOGITS = torch.tensor([[0.0, 1.0, 3.0, -1.0],    # the emitted 2 is the argmax
                       [2.0, 2.1, -1.0, 0.0],    # the emitted 0 is 0.1 below: a near-tie
                       [4.0, 1.0, 0.0, 0.0]])    # the emitted 1 is 3 below: a bug


def test_score_logits_finds_the_first_departure_and_its_margin():
    result = score_logits(_item(), LOGITS, RUN, "folder")
    assert (result.audit.tokens, result.departures, result.near_ties, result.audit.mismatches) == (3, 2, 1, 1)
    assert result.first_departure == 1 and result.first_margin == pytest.approx(0.1, abs=1e-6)
    assert result.max_margin == pytest.approx(3.0)
    assert result.audit.example == {"position": 1, "emitted_token": 0, "target_argmax": 1,
                              "margin": pytest.approx(0.1, abs=1e-6)}
    sampled = score_logits(_item(0.8), LOGITS, RUN, "folder")
    assert sampled.departures == 0 and sum(sampled.audit.pit) == 3
    probs = (LOGITS / 0.8).softmax(-1)
    assert sampled.audit.p_sum == pytest.approx(float(probs[0, 2] + probs[1, 0] + probs[2, 1]), rel=1e-5)
    assert sampled.audit.p2_sum == pytest.approx(float((probs ** 2).sum()), rel=1e-5)


def _vllm_stand_in(logits: torch.Tensor, prompt_len: int, model: str = "smol"):
    """An OpenAI-compatible server answering as vLLM does with ``prompt_logprobs=1`` (vLLM docs,
    "Extra parameters for completions"): ``choices[0].prompt_logprobs`` holds ``None`` for the first
    prompt token, then per token ``{id: {"logprob", "rank", "decoded_token"}}`` with the token itself
    and the most probable one (rank 1). ``logits`` (N, V): what the target gives at the N positions
    after the first ``prompt_len`` tokens."""
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": model, "object": "model"}]})
        body = json.loads(request.content)
        seen.append(body)
        ids = body["prompt"]
        logprobs = logits.log_softmax(-1)
        entries = [None] + [{} for _ in ids[1:]]
        for i, token in enumerate(ids[prompt_len:]):
            entry, row = entries[prompt_len + i], logprobs[i]
            best = int(row.argmax())
            for tid in {token, best}:
                entry[str(tid)] = {"logprob": float(row[tid]), "rank": int((row > row[tid]).sum()) + 1,
                                   "decoded_token": f"t{tid}"}
        for j in range(1, prompt_len):  # prompt positions: any values, the replay skips them
            entries[j] = {str(ids[j]): {"logprob": -1.0, "rank": 1, "decoded_token": "p"}}
        return httpx.Response(200, json={"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [
            {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length", "prompt_logprobs": entries}]})

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def test_a_server_replay_reads_vllms_prompt_logprobs_as_the_folder_replay_reads_logits():
    client, seen = _vllm_stand_in(LOGITS, prompt_len=2)
    server = ServerTarget("http://stand-in:8000/v1", client=client)
    result = server.score(_item(), RUN)
    local = score_logits(_item(), LOGITS, RUN, "folder")
    assert (result.departures, result.near_ties, result.first_departure) == (2, 1, 1)
    assert result.first_margin == pytest.approx(local.first_margin, abs=1e-5)
    assert result.max_margin == pytest.approx(local.max_margin, abs=1e-5)
    assert result.audit.example["target_argmax"] == 1
    assert seen == [{"model": "smol", "prompt": [5, 6, 2, 0, 1], "max_tokens": 1, "temperature": 0,
                     "prompt_logprobs": 1}]
    sampled = server.score(_item(0.8), RUN)  # counted, not scored: top log-probabilities are no distribution
    assert sampled.audit.tokens == 3 and sampled.audit.pit == () and len(seen) == 1


def _replayed(request_id: str, sampling: str = "greedy", tokens: int = 40, *, source: str = "folder",
              audit: dict | None = None, **fields) -> ReplayResult:
    """A replay result as the scoring builds it: the audit's figures of the replayed tokens, greedy
    departures beyond a near-tie as its mismatches."""
    mismatches = fields.get("departures", 0) - fields.get("near_ties", 0)
    return ReplayResult(RUN, request_id, source, 0.25,
                        LosslessAudit(RUN, 0, request_id, sampling, tokens, mismatches=mismatches, **(audit or {})),
                        **fields)


def _results(kind: str) -> list[ReplayResult]:
    near = [_replayed(f"g{i}", departures=1, near_ties=1, first_departure=7, first_margin=0.01, max_margin=0.01)
            for i in range(2)]
    clean = [_replayed("g9")]
    bug = [_replayed("g5", departures=3, near_ties=1, first_departure=2, first_margin=4.0, max_margin=6.5,
                     audit={"example": {"position": 2, "emitted_token": 9}})]
    return {"clean": clean, "near": near + clean, "bug": near + bug}[kind]


@pytest.mark.parametrize("kind, severity", [("clean", None), ("near", "warning"), ("bug", "error")])
def test_the_doctor_grades_a_replay_by_its_margins(store, kind, severity):
    store.write([RunStart(RUN, "e", "0", "t", "d", {}, host="h"), RankStart(RUN, 0, 1, "h", 1, "cpu"),
                 *_results(kind)])
    report = diagnose(store, RUN)
    divergence = [f for f in report.findings if f.code == "REPLAY_DIVERGENCE"]
    audited = [f for f in report.findings if f.code == "REPLAY_AUDITED"]
    if severity is None:
        assert not divergence and "greedy 40 tokens of 1 requests" in audited[0].message
        return
    (finding,) = divergence
    assert finding.severity == severity and not audited
    (group,) = finding.evidence["groups"]
    assert group["near_ties"] == 2 + (kind == "bug") and group["departed_requests"] == 2 + (kind == "bug")
    assert group["near_tie_requests"] == 2
    if kind == "bug":
        assert group["max_margin"] == 6.5 and finding.evidence["examples"][0]["request_id"] == "g5"
        assert report.exit_code == 1
    else:
        assert "near-ties only" in finding.message and "Nothing is broken" in finding.fix
        assert report.exit_code == 0


def test_replaying_again_keeps_the_latest_figures(store):
    store.write([RunStart(RUN, "e", "0", "t", "d", {}, host="h"), *_results("bug")])
    store.write([_replayed("g5")])
    (row,) = store.query("SELECT departures FROM replay_requests WHERE request_id = 'g5'").rows
    assert row == (0,)


def test_replay_run_scores_the_kept_requests_with_their_settings(store):
    store.write([RunStart(RUN, "e", "0", "t", "d", {}, host="h"),
                 RequestStart(RUN, "r", 0, 2, temperature=0.0), RequestStart(RUN, "unknown", 0, 2),
                 RequestTokens(RUN, 0, "r", (5, 6), (2, 0, 1)), RequestTokens(RUN, 0, "unknown", (5, 6), (1,))])

    class Logits:
        source = "stand-in"

        def score(self, item, run_id, near_tie_margin):
            assert item.prompt_ids == (5, 6) and item.output_ids == (2, 0, 1) and item.greedy
            return score_logits(item, LOGITS, run_id, self.source, near_tie_margin)

    report = replay_run(store, RUN, Logits(), near_tie_margin=0.05)
    assert report.skipped == {"unknown": "its sampling settings were not recorded"}
    (result,) = report.results
    assert (result.departures, result.near_ties) == (2, 0)  # 0.1 is no near-tie under 0.05
    assert diagnose(store, RUN).exit_code == 1


@pytest.mark.parametrize("args, says", [
    (["--target", "/nonexistent/folder"], "not a Hugging Face model folder"),
    (["--run", "nope", "--server", "http://127.0.0.1:9"], "no run 'nope'"),
    (["--server", "http://127.0.0.1:9"], "no request to replay"),
    (["--server", "http://127.0.0.1:9", "--near-tie-margin", "-1"], "must be a number of logits >= 0"),
    (["--target", "x", "--server", "y"], "not allowed with argument"),
])
def test_replay_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    db = str(tmp_path / "s.db")
    with open_store(db) as store:
        store.write([RunStart(RUN, "e", "0", "t", "d", {}, host="h")])
    out = subprocess.run([sys.executable, "-m", "specscope", "replay", "--db", db, *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_replayed_sampled_tokens_face_the_audits_own_tests(store):
    """A sampled group whose replayed tokens are junk fails the audit's junk test in ``v_replay_audit``;
    one scored by a server (no distribution) reads "too few tokens", never passed."""
    junk = _replayed("s1", "T=0.8", audit=dict(rare=30, rare_expected=0.1, p_sum=2.0, p2_sum=12.0, p_var_sum=1.0,
                                               epsilon=1e-4, pit=(0, 0, 0, 0, 0, 0, 0, 0, 0, 40)))
    unscored = _replayed("s2", "T=0.7", source="http://server")
    store.write([RunStart(RUN, "e", "0", "t", "d", {}, host="h"), junk, unscored])
    findings = {f.code: f for f in diagnose(store, RUN).findings}
    divergence = findings["REPLAY_DIVERGENCE"]
    assert divergence.severity == "error" and "not the target's distribution (T=0.8)" in divergence.message
    (group,) = divergence.evidence["groups"]
    assert "junk" in group["failed_tests"] and group["departures"] == 0
    assert "T=0.7 40 tokens of 1 requests (too few tokens)" in findings["REPLAY_AUDITED"].message
