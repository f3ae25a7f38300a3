"""Per-request acceptance of servers specscope cannot hook, read from what they return to the client.

:class:`ResponseRecorder` is an ``httpx`` transport: give it to the client that talks to the server
(``openai.OpenAI(base_url=..., http_client=httpx.Client(transport=ResponseRecorder(collector)))``, or
any ``httpx.Client``), and each completion request becomes a request of one run in the store, through
the sink (a :class:`~specscope.collector.Collector`). The client sees the server's responses unchanged.

What each engine returns (docs/design.md, "Where the engines let us in"; parsed by
:mod:`specscope.adapters._responses`):

- vLLM (``/v1/completions``, ``/v1/chat/completions``) served with
  ``--per-request-spec-decode-metrics detailed``: ``metrics.speculative_decoding`` with
  ``per_step_drafted`` / ``per_step_accepted`` (one entry per verify step): every verify step stored
  with its chain mask, exactly; at ``summary``, its ``acceptance_histogram`` (steps that accepted
  exactly j drafts): exact per-request and per-position sums; its ``num_spec_tokens`` is the run's k.
  Streamed, vLLM sends them only on the final usage chunk: ask for it with
  ``stream_options={"include_usage": True}`` (or serve with ``--enable-force-include-usage``).
- llama.cpp (``/completion``, ``/v1/completions``, ``/v1/chat/completions``): ``timings.draft_n`` (draft
  tokens proposed) and ``timings.draft_n_accepted``, cumulative over the request. Streamed, with
  ``timings_per_token`` (which the recorder adds to a streamed request's body), every chunk carries
  them: each change is one draft, so every verify step is stored with its proposed and accepted
  tokens and its chain mask, exactly what the server's ``spec_decode_*`` counters count. Not
  streamed, only the totals come back: one row with the request's proposed and accepted tokens
  (exact) and, as its verify steps, the target steps after the first token (generated tokens - 1 -
  accepted: each step emits its accepted drafts plus one), which also counts steps that drafted
  nothing; no per-position figures, and the views leave such rows out of p_i, so a run that mixes
  plain and streamed requests reads the streamed ones' p_i. A streamed chat answer's prompt length is
  ``timings.cache_n + prompt_n`` (it carries no usage). llama.cpp does not say its k (``--draft-max``).
- SGLang (native ``/generate``; untested against a live server, read from its documented
  ``meta_info``): ``spec_verify_ct`` (verify steps), ``spec_num_correct_drafts`` /
  ``spec_num_proposed_drafts`` (earlier ``spec_accept_token_num`` / ``spec_draft_token_num``: accepted
  and proposed drafts) and ``spec_correct_drafts_histogram`` (earlier ``spec_accept_histogram``; steps
  that accepted exactly j drafts: per-position sums). Without the counts, accepted = completion tokens
  - verify steps (``spec_accept_length`` = completion tokens / verify steps, bonus included) and
  proposed = accepted / ``spec_accept_rate``, or ``k`` x steps when nothing was accepted and ``k`` is
  given.

The run's k is the server's where it says (vLLM), else the ``k`` given; a server that reports another
k, or drafts more tokens in one step than the run's k, is logged once.
Responses without these fields (an error, another endpoint, a server without speculation), with
counts no engine sends (more accepted than proposed; an SGLang rate outside (0, 1]; more verify steps
than generated tokens, or more generated tokens than the request allowed or than its answer has bytes:
each step emits a token and each token returned costs at least a byte, so one reply claiming
``tokens_predicted`` 2^31-1 stores nothing rather than 2.1e9 verify steps), in an encoding
other than gzip / deflate, or over a cap below are passed through unrecorded, and so is a request
whose body is streamed (an upload the recorder cannot read without consuming it). A stream whose
counters change by something that is not one draft (more than ``MAX_PROPOSED`` tokens, fewer
accepted than before) is recorded by its totals, as a plain response.
What a server sends is untrusted: nothing the recorder does raises into the client (a failure of its
own is logged once and counted in ``errors``), and what it parses is capped (``MAX_RECORDED_BYTES``
per response, ``MAX_BODY_BYTES`` per plain answer or request body, ``MAX_LINE_BYTES`` and
``MAX_LINES`` per stream).

Prompt keys (``requests.prompt_key``, which ``specscope compare`` pairs by): a prompt sent as token ids
is keyed by its ids and a text prompt by its text, as the vLLM plugin and the tracer key them, so runs
of different engines over the same token ids pair; chat messages are keyed by their JSON.

Run metadata: ``engine``, ``engine_version``, ``target_model`` (default: the response's ``model``),
``draft_model``, ``k``; the run starts with the first recorded request and its
rank is marked finished by :meth:`ResponseRecorder.close`.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from specscope import event_checks as checks
from specscope.adapters import _responses
from specscope.errors import ConfigError, InvalidEvent
from specscope.events import (
    MAX_COUNT,
    RankStart,
    RankStatus,
    RequestEnd,
    RequestStart,
    RunStart,
    Sink,
    prompt_key,
)

_PATHS = ("/completion", "/completions", "/chat/completions", "/generate")
MAX_RECORDED_BYTES = 64 << 20
"""A response longer than this (as sent or as decoded) is passed through unrecorded; the recorder reads
no further (a llama.cpp stream with per-token timings sends about 0.5 KiB a token)."""
MAX_BODY_BYTES = 8 << 20
"""A plain (not streamed) answer or a request body longer than this is passed through unrecorded (the
recorder keeps it whole to parse it)."""
MAX_LINE_BYTES = 1 << 20
"""A streamed line longer than this is skipped unparsed (llama.cpp's lines are well under 4 KiB)."""
MAX_LINES = 1 << 18
"""A stream of more lines than this is passed through unrecorded past them (llama.cpp sends two a
token: one data line, one blank), so the cost of parsing it stays bounded."""
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_INFLATE_STEP = 1 << 20  # bytes inflated per call: what one read of a compressed answer costs in memory
logger = logging.getLogger("specscope")


@dataclass
class _Seen:
    """What one request's response said: the last values of each field, per-chunk draft counters."""

    started: float
    streamed: bool
    body: bytearray = field(default_factory=bytearray)
    line: bytearray = field(default_factory=bytearray)
    line_cut: bool = False  # the current line passed MAX_LINE_BYTES: skipped up to its newline
    sent: int = 0  # bytes read so far as sent
    decoded: int = 0  # and as decoded
    lines: int = 0  # streamed lines read
    unrecorded: bool = False  # over a cap or undecodable: passed through, not recorded
    drafts: list[tuple[int, int]] = field(default_factory=list)  # cumulative (proposed, accepted) per change
    last: dict[str, Any] = field(default_factory=dict)  # merged top-level fields of the chunks
    request: dict[str, Any] = field(default_factory=dict)  # the request's body as sent

    def take(self, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        for key in ("id", "model", "usage", "timings", "meta_info", "metrics", "tokens_predicted", "tokens_evaluated"):
            if obj.get(key) is not None:
                self.last[key] = obj[key]
        timings = obj.get("timings")
        proposed = _responses.count(timings.get("draft_n")) if isinstance(timings, dict) else None
        if proposed is not None and proposed > (self.drafts[-1][0] if self.drafts else 0):
            self.drafts.append((proposed, _responses.count(timings.get("draft_n_accepted")) or 0))


class _Tap(httpx.SyncByteStream):
    """Passes the response's bytes through unchanged, reading a copy as they go (decoded per
    ``encoding``, within the caps); ``done`` at close. Nothing here raises into the client: a failure of
    the recorder's own goes to ``failed``."""

    def __init__(self, stream: httpx.SyncByteStream, seen: _Seen, encoding: str, done: Any, failed: Any) -> None:
        self._stream, self._seen, self._done, self._failed = stream, seen, done, failed
        wbits = _DECODERS.get(encoding)
        self._decoder = zlib.decompressobj(wbits) if wbits else None
        seen.unrecorded = encoding not in ("", "identity") and wbits is None

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            if not self._seen.unrecorded:
                try:
                    self._read(chunk)
                except Exception as exc:  # noqa: BLE001 - the client's bytes come first
                    self._seen.unrecorded = True
                    self._failed(exc)
            yield chunk

    def _read(self, chunk: bytes) -> None:
        seen = self._seen
        seen.sent += len(chunk)
        if seen.sent > MAX_RECORDED_BYTES:
            self._drop()
        elif self._decoder is None:
            self._decoded(chunk)
        while self._decoder is not None and chunk and not seen.unrecorded:
            try:  # a step at a time: a small bomb inflates no further than the caps
                out = self._decoder.decompress(chunk, _INFLATE_STEP)
            except zlib.error:
                self._drop()
                return
            chunk = self._decoder.unconsumed_tail
            self._decoded(out)

    def _decoded(self, data: bytes) -> None:
        seen = self._seen
        seen.decoded += len(data)
        if seen.decoded > (MAX_RECORDED_BYTES if seen.streamed else MAX_BODY_BYTES):
            self._drop()
        elif seen.streamed:
            self._lines(data)
        else:
            seen.body.extend(data)

    def _drop(self) -> None:
        """Over a cap or undecodable: the rest passes through unread, the request unrecorded."""
        self._seen.unrecorded = True
        self._seen.body.clear()
        self._seen.line.clear()

    def _lines(self, chunk: bytes) -> None:
        """Each complete line of a streamed answer to the parser, a line over MAX_LINE_BYTES skipped."""
        seen = self._seen
        first, *ends = chunk.split(b"\n")
        self._extend(first)
        for part in ends:
            if not seen.line_cut:
                _take_line(seen, bytes(seen.line))
            seen.line.clear()
            seen.line_cut = False
            seen.lines += 1
            if seen.lines > MAX_LINES:
                self._drop()
                return
            self._extend(part)

    def _extend(self, part: bytes) -> None:
        seen = self._seen
        if seen.line_cut:
            return
        if len(seen.line) + len(part) > MAX_LINE_BYTES:
            seen.line.clear()
            seen.line_cut = True
        else:
            seen.line.extend(part)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            try:
                if not self._seen.unrecorded:
                    if self._seen.streamed:
                        _take_line(self._seen, bytes(self._seen.line))  # a last line without its newline
                    else:
                        self._seen.take(_json(bytes(self._seen.body)))
                    self._done(self._seen)
            except Exception as exc:  # noqa: BLE001 - closing the client's response must not fail
                self._failed(exc)


def _take_line(seen: _Seen, line: bytes) -> None:
    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
        seen.take(_json(line[5:]))


def _json(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        return None


class ResponseRecorder(httpx.BaseTransport):
    """An ``httpx`` transport that records each completion request's acceptance (see the module doc)
    into ``sink``, passing requests to ``transport`` (default ``httpx.HTTPTransport()``)."""

    def __init__(self, sink: Sink, *, run_id: str | None = None, engine: str = "llama.cpp",
                 engine_version: str = "", target_model: str | None = None, draft_model: str = "",
                 k: int | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self.sink = sink
        self.run_id = run_id or f"recorded-{uuid.uuid4().hex[:12]}"
        try:  # here, not at the first response: its RunStart would be refused there
            checks.check_names("response recorder", run_id=self.run_id, engine=engine, engine_version=engine_version)
        except InvalidEvent as exc:
            raise ConfigError(str(exc)) from None
        self._run = dict(engine=engine, engine_version=engine_version, draft_model=draft_model)
        self._target_model, self._k = target_model, k
        self._run_k: int | None = None  # the k the run stored
        self._k_warned = False
        self._transport = transport or httpx.HTTPTransport()
        self._lock = threading.Lock()
        self._started = self._closed = False
        self.recorded = 0
        self.errors = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            planned = self._plan(request)
        except Exception as exc:  # noqa: BLE001 - the request goes out as the client sent it
            self._failed(exc)
            planned = None
        if planned is None:
            return self._transport.handle_request(request)
        request, seen = planned
        response = self._transport.handle_request(request)
        if response.status_code != 200:
            return response
        encoding = response.headers.get("content-encoding", "").strip().lower()
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Tap(response.stream, seen, encoding, self._record, self._failed),
                              extensions=response.extensions, request=request)

    def _plan(self, request: httpx.Request) -> tuple[httpx.Request, _Seen] | None:
        """The request to send and its record, or None for one the recorder leaves alone (not a
        completion, a body that is streamed, too long or not a JSON object)."""
        if request.method != "POST" or not request.url.path.endswith(_PATHS):
            return None
        if not isinstance(request.stream, httpx.ByteStream):
            return None  # an upload streamed from a file or generator: reading it would consume it
        content = request.read()
        body = _json(content) if len(content) <= MAX_BODY_BYTES else None
        if not isinstance(body, dict):
            return None
        streamed = bool(body.get("stream"))
        if streamed and not body.get("timings_per_token"):
            request = _with_body(request, {**body, "timings_per_token": True})
        return request, _Seen(time.time(), streamed, request=body)

    def _failed(self, exc: BaseException) -> None:
        """A failure of the recorder's own: counted; the first one logged."""
        with self._lock:
            self.errors += 1
            first = self.errors == 1
        if first:
            logger.warning("specscope response recorder: %s: %s (request passed through unrecorded; "
                           "further failures are only counted)", type(exc).__name__, exc)

    def close(self) -> None:
        """Mark the run's rank finished (if a request was recorded) and close the inner transport."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        try:
            if started:
                self.sink.emit(RankStatus(self.run_id, 0, 0, 0, "eager", finished=True))
        except Exception as exc:  # noqa: BLE001 - closing the client must not fail for the recorder
            self._failed(exc)
        self._transport.close()

    def _record(self, seen: _Seen) -> None:
        now = time.time()
        rid = f"{self.run_id}-{uuid.uuid4().hex[:12]}"
        reading = _responses.read(seen.last, seen.drafts if seen.streamed else None, seen.request, seen.decoded,
                                  run_id=self.run_id, request_id=rid, ts_wall=now, k=self._k)
        if reading is None:
            return  # no acceptance figures, or counts no engine sends
        with self._lock:
            if not self._started:
                self._started = True
                # the server's k where it says (vLLM), else the one given
                self._run_k = self._k if reading.k is None else reading.k
                model = self._target_model or str(seen.last.get("model") or "")
                config = {"source": "responses", "k": self._run_k}
                host = socket.gethostname()
                self.sink.emit(RankStart(self.run_id, 0, 1, host, 0, "server", ts_wall=seen.started))
                self.sink.emit(RunStart(self.run_id, target_model=model, config=config, host=host,
                                        ts_wall=seen.started, **self._run))
            self.sink.emit(RequestStart(self.run_id, rid, 0, reading.prompt, *_sampling(seen.request),
                                        ts_wall=seen.started))
            for event in reading.steps:
                self.sink.emit(event)
            self.sink.emit(RequestEnd(self.run_id, rid, 0, reading.output, reading.verify_steps, ts_wall=now))
            self.recorded += 1
            warning = None if self._k_warned else self._k_warning(reading)
            self._k_warned = warning is not None
        if warning:
            logger.warning("specscope response recorder: %s", warning)

    def _k_warning(self, reading: _responses.Reading) -> str | None:
        """What is wrong with the run's k by this request, if anything (said once per recorder)."""
        if reading.k is not None and self._k is not None and reading.k != self._k:
            return (f"k={self._k} was given, but the server drafts {reading.k} per step (num_spec_tokens): "
                    f"the run stores k={self._run_k}")
        if self._run_k is not None and max(reading.largest, reading.k or 0) > self._run_k:
            return (f"the server drafted {max(reading.largest, reading.k or 0)} tokens in one step, more than the "
                    f"run's k={self._run_k}: give the server's own (llama.cpp --draft-max, SGLang "
                    "--speculative-num-steps) as ResponseRecorder(k=)")
        return None


def _sampling(body: dict[str, Any]) -> tuple[float | None, float | None, int | None, str | None]:
    """``(temperature, top_p, top_k, prompt key)`` as the request asked (None where it left the server's
    default: the recorder cannot know it); the key from the prompt as sent (module doc)."""
    def number(name: str, kind: type) -> Any:
        value = body.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return kind(value) if ok else None

    prompt = body.get("messages", body.get("prompt", body.get("text")))
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt)):
        key = prompt_key(prompt)
    else:
        key = None if prompt is None else prompt_key(json.dumps(prompt, sort_keys=True, ensure_ascii=False))
    return number("temperature", float), number("top_p", float), number("top_k", int), key


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _with_body(request: httpx.Request, body: dict[str, Any]) -> httpx.Request:
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode(),
                         extensions=request.extensions)
