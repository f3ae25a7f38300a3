"""The reference target and EAGLE-3 draft behind a real vLLM OpenAI-compatible server
(``vllm.entrypoints.openai.api_server``) in a child process, and one timed chat completion against
it: what ``tests/test_vllm.py`` scrapes (``compiled``: vLLM's default compiled mode). Needs vLLM in
this interpreter; the specscope plugin records when ``env`` sets ``SPECSCOPE_DB``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: Path, draft: Path, env: dict[str, str], log: Path, compiled: bool = False,
                 options: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """A vLLM OpenAI-compatible server on a free loopback port (``options``: more of vLLM's serve
    options); returns (process, base URL) once ``/health`` answers. Raises RuntimeError if it exits
    or takes over 5 minutes."""
    port = _free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
               "--dtype", "float32", "--max-model-len", "1024", *(() if compiled else ("--enforce-eager",)),
               "--host", "127.0.0.1",
               "--port", str(port), "--kv-cache-memory-bytes", str(1 << 30), "--seed", "0",
               "--speculative-config",
               f'{{"method": "eagle3", "model": "{draft}", "num_speculative_tokens": 4}}', *options]
    process = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.terminate()
    raise RuntimeError(f"vLLM server did not come up in 5 minutes; see {log}")


def complete(url: str, model: str, prompt: str, max_new: int) -> tuple[float, list[str]]:
    """Tokens/s of one greedy chat completion, and its text (for the same-output check)."""
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_new,
        "temperature": 0, "ignore_eos": True})
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    body = response.json()
    return body["usage"]["completion_tokens"] / elapsed, body["choices"][0]["message"]["content"]
