"""The response recorder against what a hostile or broken server (or client) sends: it never raises into
the httpx caller, passes every byte through unchanged, records only counts an engine can send, reads
gzip-encoded answers, and caps what it parses. The server is an ``httpx.MockTransport`` (no sockets:
hypothesis runs hundreds of exchanges)."""

from __future__ import annotations

import gzip
import json
import time
import zlib

import httpx
import pytest
from _list_sink import ListSink
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specscope.adapters.recorder import MAX_RECORDED_BYTES, ResponseRecorder
from specscope.events import MAX_COUNT, MAX_PROPOSED, RequestEnd, RequestStart, VerifyGroup, VerifyStep, prompt_key

URL = "http://server.test/completion"


def exchange(answer: httpx.Response | bytes, body: dict | None = None, *, stream: bool = True,
             content: object = None) -> tuple[ListSink, ResponseRecorder, bytes, list[bytes]]:
    """One request through a recorder whose server answers ``answer``: ``(sink, recorder, the bytes the
    client read, the request bodies the server got)``."""
    got: list[bytes] = []

    def serve(request: httpx.Request) -> httpx.Response:
        got.append(request.read())
        return answer if isinstance(answer, httpx.Response) else httpx.Response(200, content=iter([answer]))

    sink = ListSink()
    recorder = ResponseRecorder(sink, k=4, transport=httpx.MockTransport(serve))
    with httpx.Client(transport=recorder) as client:
        kwargs = {"content": content} if content is not None else {"json": body or {"prompt": "x", "stream": stream}}
        with client.stream("POST", URL, **kwargs) as response:
            read = b"".join(response.iter_raw())
    recorder.close()
    return sink, recorder, read, got


def sse(chunks: list[dict]) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode()


def split(data: bytes, cuts: list[int]) -> httpx.Response:
    """``data`` sent in pieces cut at ``cuts`` (as a server's writes arrive)."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return httpx.Response(200, content=iter([data[a:b] for a, b in zip(bounds, bounds[1:])]))


def valid(sink: ListSink) -> None:
    """Every recorded request is one an engine can send: counts within the store's bounds."""
    for group in sink.of(VerifyGroup):
        assert 0 <= group.accepted <= group.proposed <= MAX_COUNT and 0 < group.steps <= MAX_COUNT
    for end in sink.of(RequestEnd):
        assert 0 <= end.verify_steps <= MAX_COUNT
    assert len(sink.of(RequestStart)) == len(sink.of(RequestEnd))


counters = st.tuples(st.integers(-5, 300), st.integers(-5, 300))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(counters, max_size=12), st.lists(st.integers(0, 10_000), max_size=6))
def test_any_streamed_counters_never_raise_and_record_only_real_drafts(changes, cuts) -> None:
    """Cumulative ``draft_n`` / ``draft_n_accepted`` in any order (jumps past MAX_PROPOSED, accepted
    going down, negative values), cut anywhere: the client reads every byte; a stream whose changes are
    each one draft is recorded step by step, exactly; any other is recorded by its totals or not at all."""
    chunks = [{"content": "t", "timings": {"draft_n": p, "draft_n_accepted": a}} for p, a in changes]
    chunks.append({"content": "", "stop": True, "tokens_predicted": len(changes) + 1, "tokens_evaluated": 3,
                   "timings": changes[-1] and {"draft_n": changes[-1][0], "draft_n_accepted": changes[-1][1]}
                   if changes else {}})
    data = sse(chunks)
    sink, recorder, read, _ = exchange(split(data, cuts))
    assert read == data and recorder.errors == 0
    valid(sink)
    seen, drafts = (0, 0), []
    for p, a in changes:  # what llama.cpp's chunks mean: each rise of draft_n is one draft
        a = max(a, 0)  # a count below 0 is no count: read as none accepted
        if p > seen[0]:
            drafts.append((p - seen[0], a - seen[1]))
            seen = (p, a)
    one_draft_each = drafts and all(0 < p <= MAX_PROPOSED and 0 <= a <= p for p, a in drafts)
    steps = sink.of(VerifyStep)
    if one_draft_each:
        assert [(s.proposed, s.accepted) for s in steps] == drafts
    else:
        assert steps == []


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.booleans(), st.text(max_size=3)),
       st.integers(0, 2**40), st.integers(0, 2**40))
def test_any_sglang_rate_never_raises(rate, completion, verify) -> None:
    """``spec_accept_rate`` 1e-320 made proposed = accepted / rate overflow (OverflowError into the
    client); now a rate outside (0, 1] or a count past the store's records nothing."""
    answer = {"text": "x", "meta_info": {"completion_tokens": completion, "spec_verify_ct": verify,
                                         "spec_accept_rate": rate}}
    sink, recorder, read, _ = exchange(json.dumps(answer).encode(), {"text": "x"})
    assert json.loads(read) == json.loads(json.dumps(answer)) and recorder.errors == 0
    valid(sink)


def test_a_tiny_sglang_rate_records_nothing() -> None:
    answer = {"meta_info": {"completion_tokens": 40, "spec_verify_ct": 16, "spec_accept_rate": 1e-320}}
    sink, recorder, _, _ = exchange(json.dumps(answer).encode(), {"text": "x"})
    assert sink.events == [] and recorder.errors == 0


def test_a_streamed_upload_passes_through_unrecorded() -> None:
    """A body from a generator cannot be read without consuming it: sent as is, nothing recorded."""
    body = b'{"prompt": "x", "stream": false}'
    answer = json.dumps({"timings": {"draft_n": 3, "draft_n_accepted": 1, "predicted_n": 4}}).encode()
    sink, recorder, read, got = exchange(answer, content=iter([body[:5], body[5:]]))
    assert got == [body] and read == answer and sink.events == [] and recorder.errors == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("stream", [True, False])
def test_compressed_answers_are_recorded_as_plain_ones(encoding, stream) -> None:
    chunks = [{"content": "a", "timings": {"draft_n": 4, "draft_n_accepted": 2}},
              {"content": "b", "timings": {"draft_n": 8, "draft_n_accepted": 3}},
              {"content": "", "tokens_predicted": 6, "timings": {"draft_n": 8, "draft_n_accepted": 3}}]
    plain = sse(chunks) if stream else json.dumps(chunks[-1]).encode()
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    answer = httpx.Response(200, headers={"Content-Encoding": encoding}, content=iter([packed[:7], packed[7:]]))
    sink, recorder, read, _ = exchange(answer, stream=stream)
    assert read == packed and recorder.errors == 0
    if stream:
        assert [(s.proposed, s.accepted) for s in sink.of(VerifyStep)] == [(4, 2), (4, 1)]
    else:
        assert [(g.steps, g.proposed, g.accepted) for g in sink.of(VerifyGroup)] == [(2, 8, 3)]


def bomb(size: int) -> bytes:
    """``size`` zero bytes, gzip-compressed (about a thousandth of that)."""
    packer = zlib.compressobj(1, wbits=16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("encoding,content", [("gzip", b"not gzip at all"), ("br", b"\x1b\x00"),
                                              ("gzip", bomb(MAX_RECORDED_BYTES * 2))])
def test_undecodable_or_oversized_compressed_answers_pass_through_unrecorded(stream, encoding, content) -> None:
    """A bomb (128 MiB inflated from 128 KiB) is inflated a step at a time only up to the cap."""
    answer = httpx.Response(200, headers={"Content-Encoding": encoding}, content=iter([content]))
    started = time.process_time()
    sink, recorder, read, _ = exchange(answer, stream=stream)
    assert read == content and sink.events == [] and recorder.errors == 0
    assert time.process_time() - started < 4.0


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("filler", [b"x", b"data: {}\n"])
def test_a_64_mib_answer_is_passed_through_quickly_and_unrecorded(stream, filler) -> None:
    """64 MiB without a newline (the line buffer was copied whole per chunk: 14 s) or of tiny lines:
    the recorder reads at most MAX_RECORDED_BYTES, each line at most MAX_LINE_BYTES."""
    piece = filler * ((64 << 10) // len(filler))
    answer = httpx.Response(200, content=iter([piece] * ((64 << 20) // len(piece))))
    started = time.process_time()
    sink, recorder, read, _ = exchange(answer, stream=stream)
    spent = time.process_time() - started
    assert len(read) == len(piece) * ((64 << 20) // len(piece)) and sink.events == [] and recorder.errors == 0
    assert spent < 4.0, f"{spent:.1f} s of CPU for 64 MiB"


def test_a_failing_sink_is_counted_not_raised(caplog) -> None:
    class Broken(ListSink):
        def emit(self, event) -> None:
            raise RuntimeError("store gone")

    answer = json.dumps({"tokens_predicted": 4, "timings": {"draft_n": 3, "draft_n_accepted": 1}}).encode()
    recorder = ResponseRecorder(Broken(), transport=httpx.MockTransport(lambda r: httpx.Response(200, content=answer)))
    with httpx.Client(transport=recorder) as client:
        for _ in range(2):
            assert client.post(URL, json={"prompt": "x"}).content == answer
    assert recorder.errors == 3 and recorder.recorded == 0  # two requests, then the run's end at close
    assert sum("store gone" in r.getMessage() for r in caplog.records) == 1  # logged once


@pytest.mark.parametrize("prompt", [[1, 2, 3], "plain text"])
def test_token_and_text_prompts_are_keyed_as_the_engines_key_them(prompt) -> None:
    """The vLLM plugin keys a request by its prompt token ids, the tracer by ids or text: the recorder
    keys the same prompt the same way, so runs of different engines pair in ``specscope compare``."""
    answer = json.dumps({"tokens_predicted": 4, "timings": {"draft_n": 3, "draft_n_accepted": 1}}).encode()
    sink, _, _, _ = exchange(answer, {"prompt": prompt})
    (start,) = sink.of(RequestStart)
    assert start.prompt_key == prompt_key(prompt)


@pytest.mark.parametrize(("body", "predicted"), [
    ({"prompt": "x"}, MAX_COUNT),  # 2^31-1 tokens in a reply of a hundred bytes: 2.1e9 verify steps
    ({"prompt": "x", "n_predict": 16}, 17),  # more than the request allowed
    ({"prompt": "x", "max_tokens": 16}, 17),
])
def test_more_tokens_than_a_reply_can_carry_records_nothing(body, predicted) -> None:
    answer = json.dumps({"content": "hi", "tokens_predicted": predicted,
                         "timings": {"predicted_n": predicted, "draft_n": 3, "draft_n_accepted": 1}}).encode()
    sink, recorder, read, _ = exchange(answer, body)
    assert read == answer and sink.events == [] and recorder.errors == 0


def test_vllm_steps_that_disagree_with_their_totals_fall_back_to_the_histogram() -> None:
    """Per-step arrays whose sums are not the totals (or that draft more than k) are not trusted; the
    histogram, consistent with the totals, still gives exact per-position sums."""
    spec = {"acceptance_histogram": [1, 1, 1], "num_spec_steps": 3, "num_accepted_draft_tokens": 3,
            "num_draft_tokens": 6, "num_spec_tokens": 2, "per_step_accepted": [0, 1, 9], "per_step_drafted": [2, 2, 9]}
    answer = json.dumps({"usage": {"prompt_tokens": 2, "completion_tokens": 7},
                         "metrics": {"speculative_decoding": spec}}).encode()
    sink, recorder, _, _ = exchange(answer, {"prompt": "x"})
    assert sink.of(VerifyStep) == [] and recorder.errors == 0
    assert sorted((g.accepted_mask, g.steps) for g in sink.of(VerifyGroup)) == [("00", 1), ("10", 1), ("11", 1)]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["acceptance_histogram", "num_spec_steps", "num_accepted_draft_tokens",
                                        "num_draft_tokens", "num_spec_tokens", "per_step_accepted", "per_step_drafted"]),
                       st.one_of(st.integers(-2, 2**32), st.floats(), st.lists(st.integers(-2, 70), max_size=6),
                                 st.text(max_size=2))),
       st.integers(0, 2**32))
def test_any_vllm_metrics_never_raise(spec, completion) -> None:
    answer = json.dumps({"usage": {"completion_tokens": completion}, "metrics": {"speculative_decoding": spec}}).encode()
    sink, recorder, _, _ = exchange(answer, {"prompt": "x"})
    assert recorder.errors == 0
    valid(sink)
