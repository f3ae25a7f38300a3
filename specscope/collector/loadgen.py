"""Synthetic ingest load, for measuring the write path and holding it to its promises (benchmarks
``collector_ingest`` / ``pg_ingest``, tests ``test_pg_copy`` / ``test_pg_concurrent``).

The decode mix (:func:`make_events`) is what an instrumented EAGLE-3 decode produces: per verify step
one VerifyStep and six TensorEvents (draft input, fc input/output, three target capture layers), plus
a request start / end every 64 steps. :func:`run_writers` pushes it from several processes at once,
each through its own :class:`~specscope.collector.Collector` into one store.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace

from specscope import events as ev
from specscope.collector import Collector
from specscope.storage import open_store

RUN = "bench"
HOOKS = (("draft.forward:hidden_states", (1, 1, 1728), (1, -1, 1728)),
         ("draft.fc:input", (1, 1, 1728), (1, -1, 1728)),
         ("draft.fc:output", (1, 1, 576), (1, -1, 576)),
         ("target.layers.2:input", (1, 1, 576), None),
         ("target.layers.15:input", (1, 1, 576), None),
         ("target.layers.27:input", (1, 1, 576), None))


def make_events(n: int) -> list[ev.Event]:
    """About ``n`` events of the decode mix (the module docstring), all of run :data:`RUN`, rank 0."""
    events: list[ev.Event] = [
        ev.RunStart(run_id=RUN, engine="reference", engine_version="0", target_model="t",
                    draft_model="d", config={"k": 4}),
        ev.RankStart(run_id=RUN, rank=0, world_size=1, host="h", pid=1, device="cpu")]
    step = call = 0
    while len(events) < n:
        request = f"req-{step // 64}"
        if step % 64 == 0:
            events.append(ev.RequestStart(run_id=RUN, request_id=request, rank=0, prompt_tokens=40))
        events.append(ev.VerifyStep(run_id=RUN, request_id=request, rank=0, step=step % 64, proposed=4,
                                    accepted=step % 5, draft_s=0.004, verify_s=0.011))
        for hook, shape, expected in HOOKS:
            events.append(ev.TensorEvent(run_id=RUN, rank=0, hook_point=hook, call_index=call,
                                         shape=shape, dtype="float32", device="cpu",
                                         expected_shape=expected, request_id=request, step=step % 64))
            call += 1
        if step % 64 == 63:
            events.append(ev.RequestEnd(run_id=RUN, request_id=request, rank=0, output_tokens=190,
                                        verify_steps=64))
        step += 1
    return events[:n]


def rank_events(run_id: str, rank: int, world_size: int, n: int) -> list[ev.Event]:
    """About ``n`` events of the decode mix for one rank of ``run_id`` (request ids carry the rank, so
    ranks of one run never share a request)."""
    out = []
    for event in make_events(n):
        changes = {"run_id": run_id, "rank": rank}
        if hasattr(event, "world_size"):
            changes["world_size"] = world_size
        if getattr(event, "request_id", None) is not None:
            changes["request_id"] = f"r{rank}-{event.request_id}"
        out.append(replace(event, **changes))
    return out


def writer_layout(writers: int) -> list[tuple[str, int, int]]:
    """``(run_id, rank, world_size)`` per writer: half the writers are ranks of one run, the other
    half single-rank runs."""
    shared = max(1, writers // 2)
    return ([("shared", r, shared) for r in range(shared)]
            + [(f"solo-{i}", 0, 1) for i in range(writers - shared)])


def write_rank(url: str, run_id: str, rank: int, world_size: int, n: int, batch_size: int,
               ready: mp.queues.Queue | None = None, start: mp.synchronize.Event | None = None,
               done: mp.queues.Queue | None = None, bulk: str | None = None) -> int:
    """One writer process: build the rank's events, open the store (``bulk``: its bulk-insert
    strategy, ``storage.bulk_strategy``), report on ``ready``, wait for
    ``start``, emit them all through a Collector into the store at ``url``, flush, close. Puts
    ``(run_id, rank, events, dropped, finished_perf_counter)`` on ``done``; returns the event count."""
    events = rank_events(run_id, rank, world_size, n)
    with open_store(url, bulk=bulk) as store:
        collector = Collector(store, capacity=len(events), batch_size=batch_size, flush_interval_s=0.05)
        if ready is not None and start is not None:
            ready.put(rank)
            start.wait()
        for event in events:
            collector.emit(event)
        if not collector.flush(timeout_s=600):
            raise RuntimeError(f"writer {run_id}/{rank}: flush failed")
        collector.close()
    if done is not None:
        done.put((run_id, rank, len(events), collector.dropped, time.perf_counter()))
    return len(events)


def run_writers(url: str, layout: list[tuple[str, int, int]], n: int, batch_size: int,
                timeout_s: float = 600, bulk: str | None = None) -> tuple[list[tuple], float]:
    """Spawn one :func:`write_rank` process per layout entry (each writing with ``bulk``), start them
    together; return their reports and the wall seconds from the start to the last writer's flush.

    Raises:
        RuntimeError: a writer failed or did not finish within ``timeout_s`` (e.g. a deadlock).
    """
    ctx = mp.get_context("spawn")
    ready, start, done = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=write_rank, args=(url, run_id, rank, world, n, batch_size, ready, start, done, bulk))
             for run_id, rank, world in layout]
    for proc in procs:
        proc.start()
    reports = []
    try:
        for _ in procs:  # every writer built its events and opened the store: those are untimed
            ready.get(timeout=timeout_s)
        t0 = time.perf_counter()
        start.set()
        for _ in procs:
            reports.append(done.get(timeout=timeout_s))
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    if any(proc.exitcode != 0 for proc in procs) or len(reports) != len(procs):
        raise RuntimeError(f"writers failed: exit codes {[p.exitcode for p in procs]}")
    return reports, max(r[4] for r in reports) - t0
