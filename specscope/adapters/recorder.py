"""Per-request acceptance of servers specscope cannot hook, read from what they return to the client.

:class:`ResponseRecorder` is an ``httpx`` transport: give it to the client that talks to the server
(``openai.OpenAI(base_url=..., http_client=httpx.Client(transport=ResponseRecorder(collector)))``, or
any ``httpx.Client``), and each completion request becomes a request of one run in the store, through
the sink (a :class:`~specscope.collector.Collector`). The client sees the server's responses unchanged.

What each engine returns (docs/design.md, "Where the engines let us in"):

- llama.cpp (``/completion``, ``/v1/completions``, ``/v1/chat/completions``): ``timings.draft_n`` (draft
  tokens proposed) and ``timings.draft_n_accepted``, cumulative over the request. Streamed, with
  ``timings_per_token`` (which the recorder adds to a streamed request's body), every chunk carries
  them: each change is one draft, so every verify step is stored with its proposed and accepted
  tokens and its chain mask, exactly what the server's ``spec_decode_*`` counters count. Not
  streamed, only the totals come back: one row with the request's proposed and accepted tokens
  (exact) and, as its verify steps, the target steps after the first token (generated tokens - 1 -
  accepted: each step emits its accepted drafts plus one), which also counts steps that drafted
  nothing; no per-position figures.
- SGLang (native ``/generate``): ``meta_info.spec_verify_ct`` (verify steps) and
  ``spec_accept_length`` = completion tokens / verify steps, bonus included, so accepted = completion
  tokens - verify steps; proposed = accepted / ``spec_accept_rate`` (SGLang's rate divides by steps x
  (num_draft_tokens - 1)), or ``k`` x steps when nothing was accepted and ``k`` is given.

Responses without these fields (an error, another endpoint, a server without speculation) are passed
through unrecorded. Run metadata: ``engine``, ``engine_version``, ``target_model`` (default: the
response's ``model``), ``draft_model``, ``k``; the run starts with the first recorded request and its
rank is marked finished by :meth:`ResponseRecorder.close`.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from specscope.events import (
    Event,
    RankStart,
    RankStatus,
    RequestEnd,
    RequestStart,
    RunStart,
    VerifyGroup,
    VerifyStep,
    prompt_key,
)
from specscope.metrics import chain_mask

_PATHS = ("/completion", "/completions", "/chat/completions", "/generate")
MAX_RECORDED_BYTES = 8 << 20
"""A non-streamed body longer than this is passed through unrecorded (the recorder keeps it to parse)."""


class Sink(Protocol):
    def emit(self, event: Event) -> None: ...


@dataclass
class _Seen:
    """What one request's response said: the last values of each field, per-chunk draft counters."""

    started: float
    streamed: bool
    body: bytearray = field(default_factory=bytearray)
    line: bytearray = field(default_factory=bytearray)
    drafts: list[tuple[int, int]] = field(default_factory=list)  # cumulative (proposed, accepted) per change
    last: dict[str, Any] = field(default_factory=dict)  # merged top-level fields of the chunks
    request: dict[str, Any] = field(default_factory=dict)  # the request's body as sent

    def take(self, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        for key in ("id", "model", "usage", "timings", "meta_info", "tokens_predicted", "tokens_evaluated"):
            if obj.get(key) is not None:
                self.last[key] = obj[key]
        timings = obj.get("timings")
        if isinstance(timings, dict) and _count(timings.get("draft_n")) is not None:
            now = (_count(timings["draft_n"]), _count(timings.get("draft_n_accepted")) or 0)
            if now[0] > (self.drafts[-1][0] if self.drafts else 0):
                self.drafts.append(now)


def _count(value: object) -> int | None:
    """A token count from a JSON value, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return int(value)


class _Tap(httpx.SyncByteStream):
    """Passes the response's bytes through unchanged, reading them as they go; ``done`` at close."""

    def __init__(self, stream: httpx.SyncByteStream, seen: _Seen, done: Any) -> None:
        self._stream, self._seen, self._done = stream, seen, done

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._read(chunk)
            yield chunk

    def _read(self, chunk: bytes) -> None:
        seen = self._seen
        if not seen.streamed:
            if len(seen.body) + len(chunk) <= MAX_RECORDED_BYTES:
                seen.body.extend(chunk)
            else:
                seen.body = bytearray(b"\0")  # too long to keep: unparseable, unrecorded
            return
        seen.line.extend(chunk)
        *lines, rest = bytes(seen.line).split(b"\n")
        seen.line = bytearray(rest[:MAX_RECORDED_BYTES])
        for line in lines:
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                seen.take(_json(line[5:]))

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            if not self._seen.streamed:
                self._seen.take(_json(bytes(self._seen.body)))
            self._done(self._seen)


def _json(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return None


class ResponseRecorder(httpx.BaseTransport):
    """An ``httpx`` transport that records each completion request's acceptance (see the module doc)
    into ``sink``, passing requests to ``transport`` (default ``httpx.HTTPTransport()``)."""

    def __init__(self, sink: Sink, *, run_id: str | None = None, engine: str = "llama.cpp",
                 engine_version: str = "", target_model: str | None = None, draft_model: str = "",
                 k: int | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self.sink = sink
        self.run_id = run_id or f"recorded-{uuid.uuid4().hex[:12]}"
        self._run = dict(engine=engine, engine_version=engine_version, draft_model=draft_model)
        self._target_model, self._k = target_model, k
        self._transport = transport or httpx.HTTPTransport()
        self._lock = threading.Lock()
        self._started = self._closed = False
        self.recorded = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = _json(request.content) if request.method == "POST" and request.url.path.endswith(_PATHS) else None
        if not isinstance(body, dict):
            return self._transport.handle_request(request)
        streamed = bool(body.get("stream"))
        if streamed and not body.get("timings_per_token"):
            request = _with_body(request, {**body, "timings_per_token": True})
        seen = _Seen(time.time(), streamed, request=body)
        response = self._transport.handle_request(request)
        if response.status_code != 200:
            return response
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Tap(response.stream, seen, self._record),  # type: ignore[arg-type]
                              extensions=response.extensions, request=request)

    def close(self) -> None:
        """Mark the run's rank finished (if a request was recorded) and close the inner transport."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._started:
                self.sink.emit(RankStatus(self.run_id, 0, 0, 0, "eager", finished=True))
        self._transport.close()

    def _record(self, seen: _Seen) -> None:
        events = self._events(seen)
        if not events:
            return
        with self._lock:
            if not self._started:
                self._started = True
                model = self._target_model or str(seen.last.get("model") or "")
                config = {"source": "responses", "k": self._k}
                host = socket.gethostname()
                self.sink.emit(RankStart(self.run_id, 0, 1, host, 0, "server", ts_wall=seen.started))
                self.sink.emit(RunStart(self.run_id, target_model=model, config=config, host=host,
                                        ts_wall=seen.started, **self._run))
            for event in events:
                self.sink.emit(event)
            self.recorded += 1

    def _events(self, seen: _Seen) -> list[Event]:
        """The request's events, or none when the response carried no acceptance figures."""
        last, now = seen.last, time.time()
        usage = last.get("usage") if isinstance(last.get("usage"), dict) else {}
        timings = last.get("timings") if isinstance(last.get("timings"), dict) else {}
        meta = last.get("meta_info") if isinstance(last.get("meta_info"), dict) else {}
        rid = f"{self.run_id}-{uuid.uuid4().hex[:12]}"
        steps: list[Event]
        if seen.streamed and seen.drafts:
            deltas = zip(seen.drafts, [(0, 0), *seen.drafts])
            steps = [VerifyStep(self.run_id, rid, 0, i, p - p0, a - a0, chain_mask(a - a0, p - p0), ts_wall=now)
                     for i, ((p, a), (p0, a0)) in enumerate(deltas)]
            output = _first(usage.get("completion_tokens"), last.get("tokens_predicted"), timings.get("predicted_n"))
            prompt = _first(usage.get("prompt_tokens"), last.get("tokens_evaluated"))
        elif _count(timings.get("draft_n")) is not None:
            proposed, accepted = _count(timings["draft_n"]), _count(timings.get("draft_n_accepted")) or 0
            output = _first(usage.get("completion_tokens"), last.get("tokens_predicted"), timings.get("predicted_n"))
            prompt = _first(usage.get("prompt_tokens"), last.get("tokens_evaluated"))
            n = max(output - 1 - accepted, 1 if proposed else 0)
            steps = [VerifyGroup(self.run_id, rid, 0, "", n, proposed, min(accepted, proposed), now)] if n else []
        elif _count(meta.get("spec_verify_ct")):
            n = _count(meta["spec_verify_ct"])
            output = _first(meta.get("completion_tokens"))
            prompt = _first(meta.get("prompt_tokens"))
            accepted = max(output - n, 0)
            rate = meta.get("spec_accept_rate")
            proposed = (round(accepted / rate) if isinstance(rate, (int, float)) and rate > 0
                        else n * (self._k or 0))
            steps = [VerifyGroup(self.run_id, rid, 0, "", n, max(proposed, accepted), accepted, now)]
        else:
            return []
        verify_steps = sum(getattr(s, "steps", 1) for s in steps)
        return [RequestStart(self.run_id, rid, 0, prompt, *_sampling(seen.request), ts_wall=seen.started), *steps,
                RequestEnd(self.run_id, rid, 0, output, verify_steps, ts_wall=now)]


def _sampling(body: dict[str, Any]) -> tuple[float | None, float | None, int | None, str | None]:
    """``(temperature, top_p, top_k, prompt key)`` as the request asked (None where it left the server's
    default: the recorder cannot know it); the key from the messages or prompt as sent."""
    def number(name: str, kind: type) -> Any:
        value = body.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return kind(value) if ok else None

    prompt = body.get("messages", body.get("prompt", body.get("text")))
    key = None if prompt is None else prompt_key(json.dumps(prompt, sort_keys=True, ensure_ascii=False))
    return number("temperature", float), number("top_p", float), number("top_k", int), key


def _first(*values: object) -> int:
    """The first of ``values`` that is a token count, else 0."""
    return next((c for c in map(_count, values) if c is not None), 0)


def _with_body(request: httpx.Request, body: dict[str, Any]) -> httpx.Request:
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode(),
                         extensions=request.extensions)
