"""One scrape of every endpoint of ``specscope watch``: fetched concurrently, each fetched and read
(:func:`~specscope.adapters.prometheus_metrics.read_exposition`) within its time limit, with its body
capped as sent and as decompressed; what a server sends is untrusted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from specscope.adapters.prometheus_metrics import Exposition, read_exposition

STOP_POLL_S = 0.1
"""How often a scrape waiting on endpoints checks whether the watch was stopped (seconds)."""

STOPPED = asyncio.CancelledError("stopped")
"""The answer of an endpoint whose scrape a stopped watch cut short."""


@dataclass(frozen=True)
class Limits:
    """What one endpoint's scrape may cost: ``timeout_s`` seconds from connect to its last line read,
    ``max_bytes`` of body (as sent and as decompressed), ``max_series`` series."""

    timeout_s: float
    max_bytes: int
    max_series: int


def normalize_endpoint(endpoint: str) -> str:
    """``host:port`` -> ``http://host:port/metrics``; a URL with a path is kept as given.

    Raises:
        ValueError: no host, a scheme other than http / https, or a port that is not one.
    """
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    shown = public_endpoint(url)
    if not parts.hostname:
        raise ValueError(f"endpoint {shown!r} names no host")
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"endpoint {shown!r}: Prometheus endpoints are http:// or https://, not {parts.scheme}://")
    try:
        parts.port  # noqa: B018 - urllib checks the port only when it is read
    except ValueError as exc:
        raise ValueError(f"endpoint {shown!r}: {exc}") from None
    return url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def public_endpoint(endpoint: str) -> str:
    """``endpoint`` as stored with a run: without user, password and query (tokens stay out of the
    store, where every reader of it would see them)."""
    parts = urlsplit(endpoint)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def fetch_all(endpoints: Sequence[str], limits: Limits,
              stop: threading.Event | None) -> list[Exposition | BaseException]:
    """Each endpoint's exposition, or why there is none (an exception; :data:`STOPPED` for one that
    ``stop`` cut short). Runs its own event loop: call it from synchronous code."""
    return asyncio.run(_fetch_all(endpoints, limits, stop))


async def _fetch_all(endpoints: Sequence[str], limits: Limits,
                     stop: threading.Event | None) -> list[Exposition | BaseException]:
    async with httpx.AsyncClient(timeout=limits.timeout_s) as client:
        tasks = [asyncio.ensure_future(_scrape(client, e, limits, stop)) for e in endpoints]
        pending = set(tasks)
        while pending and not (stop is not None and stop.is_set()):
            _, pending = await asyncio.wait(pending, timeout=None if stop is None else STOP_POLL_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [STOPPED if task.cancelled() else task.exception() or task.result() for task in tasks]


async def _scrape(client: httpx.AsyncClient, endpoint: str, limits: Limits,
                  stop: threading.Event | None) -> Exposition:
    """Fetch and read one endpoint within ``limits.timeout_s`` in all. The text is read in a thread,
    so that a slow read holds neither the other endpoints nor a stop; that thread ends itself at the
    same deadline, or when ``stop`` is set."""
    deadline = time.monotonic() + limits.timeout_s
    body = await asyncio.wait_for(_fetch(client, endpoint, limits.max_bytes), limits.timeout_s)
    try:
        return await asyncio.to_thread(read_exposition, body, max_series=limits.max_series, deadline=deadline,
                                       stop=stop)
    except TimeoutError:
        if stop is not None and stop.is_set():  # a stop, not a gap: the task reads as cut short
            raise asyncio.CancelledError from None
        raise


async def _fetch(client: httpx.AsyncClient, endpoint: str, max_bytes: int) -> str:
    """One endpoint's body as text, within ``max_bytes`` (the caller bounds its time).

    Raises:
        httpx.HTTPError, ValueError: no usable answer (a gap).
    """
    async with client.stream("GET", endpoint) as response:
        response.raise_for_status()
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ValueError(f"body of {declared} bytes is over the {max_bytes}-byte cap")
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes or response.num_bytes_downloaded > max_bytes:
                raise ValueError(f"body over the {max_bytes}-byte cap")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")
