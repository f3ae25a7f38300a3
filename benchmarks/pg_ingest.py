"""PostgreSQL ingest: COPY against executemany on the same rows, and 8 writer processes at once.

Run: ``python -m benchmarks.pg_ingest [--url URL] [--events N] [--writers W] [--repeat R]``
(``--url`` default: ``$SPECSCOPE_TEST_PG_URL`` or the local test server; each measurement writes
into a fresh schema that is dropped afterwards).

1. The decode event mix of ``benchmarks/collector_ingest.py`` (per verify step one VerifyStep and six
   TensorEvents) into a fresh store, ``executemany`` (psycopg's executemany of one INSERT, pipelined)
   against ``copy`` (``COPY ... FROM STDIN``), run alternately R times each, medians compared:
   - rows: the same prebuilt rows (``_rows.group_rows``) through each strategy of
     ``storage/_bulk.py`` in one transaction: the insert itself (target: 5x, docs/design.md, "Budgets");
   - Store.write: events in batches of 5,000 through ``open_store(bulk=...)``, event-to-row conversion
     and the upserts included: what a collector sees.
2. W writer processes (spawned; default 8: 4 ranks of one run and 4 single-rank runs) each pushing
   N / W events through its own Collector into one store at once, with COPY; the figure is all
   events over the wall time from the common start to the last flush, beside one writer alone.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import sqlalchemy as sa

from benchmarks.collector_ingest import make_events
from specscope import events as ev
from specscope.collector import Collector
from specscope.storage import _bulk, open_store
from specscope.storage._rows import INSERT_COLUMNS, group_rows
from specscope.storage.store import _insert_sql

DEFAULT_URL = os.environ.get("SPECSCOPE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BATCH = 5_000


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
               done: mp.queues.Queue | None = None) -> int:
    """One writer process: build the rank's events, open the store, report on ``ready``, wait for
    ``start``, emit them all through a Collector into the store at ``url``, flush, close. Puts
    ``(run_id, rank, events, dropped, finished_perf_counter)`` on ``done``; returns the event count."""
    events = rank_events(run_id, rank, world_size, n)
    with open_store(url) as store:
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
                timeout_s: float = 600) -> tuple[list[tuple], float]:
    """Spawn one :func:`write_rank` process per layout entry, start them together; return their
    reports and the wall seconds from the start to the last writer's flush.

    Raises:
        RuntimeError: a writer failed or did not finish within ``timeout_s`` (e.g. a deadlock).
    """
    ctx = mp.get_context("spawn")
    ready, start, done = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=write_rank, args=(url, run_id, rank, world, n, batch_size, ready, start, done))
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


@contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    """A URL of a new, empty PostgreSQL schema (search_path), dropped on exit."""
    schema = f"specscope_bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        yield sa.make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


def time_store_write(url: str, events: list[ev.Event], bulk: str) -> float:
    """Seconds for Store.write over batches of BATCH events into a fresh store with ``bulk``."""
    with fresh_schema(url) as schema_url, open_store(schema_url, bulk=bulk) as store:
        start = time.perf_counter()
        for i in range(0, len(events), BATCH):
            store.write(events[i:i + BATCH])
        return time.perf_counter() - start


def time_rows(url: str, events: list[ev.Event], bulk: str) -> float:
    """Seconds for the plain-insert rows of ``events`` through one bulk strategy, one transaction, into
    a fresh store (runs, ranks and requests written first, untimed)."""
    grouped, inserts = group_rows(events), _insert_sql("postgresql")
    with fresh_schema(url) as schema_url:
        with open_store(schema_url) as store:
            store.write([e for e in events if e.kind in ("run_start", "rank_start", "request_start")])
        engine = sa.create_engine(schema_url)
        try:
            with engine.begin() as conn:
                start = time.perf_counter()
                for name in INSERT_COLUMNS:
                    if grouped.get(name):
                        _bulk.STRATEGIES[bulk](conn, name, inserts[name], grouped[name])
                return time.perf_counter() - start
        finally:
            engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    events = make_events(args.events)
    print(f"PostgreSQL ingest of {len(events):,} events (decode mix), median of {args.repeat}, "
          "strategies alternated")
    print(f"{'what':<12}{'bulk':<14}{'seconds':>10}{'events/s':>12}{'copy speed-up':>15}")
    for what, timer in (("rows", time_rows), ("Store.write", time_store_write)):
        times: dict[str, list[float]] = {"executemany": [], "copy": []}
        for _ in range(args.repeat):  # alternate, so both see the same machine load
            for bulk in times:
                times[bulk].append(timer(args.url, events, bulk))
        med = {bulk: statistics.median(t) for bulk, t in times.items()}
        for bulk, seconds in med.items():
            ratio = f"{med['executemany'] / seconds:.1f}x"
            print(f"{what:<12}{bulk:<14}{seconds:>10.3f}{len(events) / seconds:>12,.0f}{ratio:>15}")

    per_writer = args.events // args.writers
    layout = writer_layout(args.writers)
    with fresh_schema(args.url) as url:
        _, alone = run_writers(url, layout[:1], per_writer, BATCH)
    with fresh_schema(args.url) as url:
        reports, together = run_writers(url, layout, per_writer, BATCH)
    total = sum(r[2] for r in reports)
    shared = sum(run_id == "shared" for run_id, _, _ in layout)
    print(f"{args.writers} writer processes at once ({shared} ranks of one run + {len(layout) - shared} "
          f"single-rank runs), Collector -> COPY, {per_writer:,} events each: {together:.2f} s, "
          f"{total / together:,.0f} events/s; one writer alone: {alone:.2f} s, {per_writer / alone:,.0f} "
          f"events/s; dropped: {sum(r[3] for r in reports)}")

if __name__ == "__main__":
    main()
