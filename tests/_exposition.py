"""Prometheus endpoints of serving engines for the watch tests: a real HTTP server on 127.0.0.1 (in a
thread) serving an exposition the test changes between scrapes, and each engine's exposition.

vLLM's is produced the way vLLM produces it (``prometheus_client`` counters named as in
``vllm/v1/spec_decode/metrics.py``, labels ``model_name`` / ``engine``, rendered by
``generate_latest``); SGLang, TensorRT-LLM and llama.cpp are written from their documented names.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, generate_latest


class MetricsServer:
    """``/metrics`` on 127.0.0.1: answers ``body`` (text or bytes) with ``status`` and extra ``headers``
    (set them between scrapes); ``trickle_s`` > 0 sends the body one byte per ``trickle_s`` seconds, as a
    hostile or stuck server would. A POST to any path gets the same answer; its body is kept in
    ``posted``."""

    def __init__(self) -> None:
        self.body: str | bytes = ""
        self.status = 200
        self.headers: dict[str, str] = {}
        self.trickle_s = 0.0
        self.posted: list[bytes] = []
        self._closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = server.body
                data = body.encode() if isinstance(body, str) else body
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                if not server.trickle_s:
                    self.send_header("Content-Length", str(len(data)))
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if not server.trickle_s:
                    self.wfile.write(data)
                    return
                for i in range(len(data)):
                    if server._closed.wait(server.trickle_s):
                        return
                    try:
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                    except OSError:  # the scraper gave up
                        return

            def do_POST(self) -> None:  # noqa: N802 - a completion endpoint answering the crafted body
                server.posted.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.do_GET()

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@dataclass
class ChainCounters:
    """Cumulative counters of a chain drafter with ``k`` drafts per step, fed step by step."""

    k: int
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_pos = self.per_pos or [0] * self.k

    def add(self, accepted_per_step: Sequence[int]) -> None:
        for a in accepted_per_step:
            self.steps += 1
            self.proposed += self.k
            self.accepted += a
            for i in range(a):
                self.per_pos[i] += 1


def vllm_exposition(model: str, engines: dict[str, ChainCounters]) -> str:
    """What vLLM's ``SpecDecodingProm`` exposes for these per-engine counters."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    drafts, tokens, accepted = (Counter(name, doc, labels, registry=registry) for name, doc in (
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")))
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                      [*labels, "position"], registry=registry)
    for engine, c in engines.items():
        drafts.labels(model, engine).inc(c.steps)
        tokens.labels(model, engine).inc(c.proposed)
        accepted.labels(model, engine).inc(c.accepted)
        for pos, n in enumerate(c.per_pos):
            per_pos.labels(model, engine, str(pos)).inc(n)
    return generate_latest(registry).decode()


def llamacpp_exposition(c: ChainCounters) -> str:
    """llama.cpp server's ``/metrics`` in vLLM's scheme (``llamacpp:`` prefix, no labels)."""
    lines = []
    for name, value in (("num_drafts", c.steps), ("num_draft_tokens", c.proposed),
                        ("num_accepted_tokens", c.accepted)):
        lines += [f"# TYPE llamacpp:spec_decode_{name} counter", f"llamacpp:spec_decode_{name} {value}"]
    lines.append("# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos counter")
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos{{position="{i}"}} {n}'
              for i, n in enumerate(c.per_pos)]
    return "\n".join(lines) + "\n"


def trtllm_exposition(model: str, c: ChainCounters) -> str:
    """TensorRT-LLM's counters (``token_position`` numbered from 1 here, as a 1-based engine would)."""
    lab = f'model_name="{model}"'
    al = 1 + c.accepted / c.steps if c.steps else 0
    lines = ["# TYPE trtllm_spec_decode_num_draft_tokens_total counter",
             f"trtllm_spec_decode_num_draft_tokens_total{{{lab}}} {c.proposed}",
             "# TYPE trtllm_spec_decode_num_accepted_tokens_total counter",
             f"trtllm_spec_decode_num_accepted_tokens_total{{{lab}}} {c.accepted}",
             "# TYPE trtllm_spec_decode_acceptance_length gauge",
             f"trtllm_spec_decode_acceptance_length{{{lab}}} {al}",
             "# TYPE trtllm_spec_decode_drafted_tokens_total counter"]
    lines += [f'trtllm_spec_decode_drafted_tokens_total{{{lab},token_position="{i + 1}"}} {c.steps}'
              for i in range(c.k)]
    lines.append("# TYPE trtllm_spec_decode_accepted_tokens_total counter")
    lines += [f'trtllm_spec_decode_accepted_tokens_total{{{lab},token_position="{i + 1}"}} {n}'
              for i, n in enumerate(c.per_pos)]
    return "\n".join(lines) + "\n"


def sglang_exposition(ranks: dict[int, tuple[float, float, int]], model: str = "m") -> str:
    """SGLang's gauges and verify counter per tp_rank: ``(accept_length, accept_rate, verify_calls)``."""
    lines = []
    for index, (name, kind) in enumerate((("sglang:spec_accept_length", "gauge"),
                                          ("sglang:spec_accept_rate", "gauge"),
                                          ("sglang:spec_verify_calls_total", "counter"))):
        lines.append(f"# TYPE {name} {kind}")
        lines += [f'{name}{{model_name="{model}",tp_rank="{tp}",pp_rank="0",dp_rank="0"}} {values[index]}'
                  for tp, values in ranks.items()]
    return "\n".join(lines) + "\n"
