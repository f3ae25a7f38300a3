"""PostgreSQL ingest: COPY against executemany on the same rows, and 8 writer processes at once.

Run: ``python -m benchmarks.pg_ingest [--url URL] [--events N] [--writers W] [--repeat R]``
(``--url`` default: ``$SPECSCOPE_TEST_PG_URL`` or the local test server; each measurement writes
into a fresh schema that is dropped afterwards).

Each rate is the median over R repeats with its min..max; each speed-up is taken within a repeat,
where the two strategies ran one after the other (alternately), so both saw the same machine load, and
reported as the 20% trimmed mean of the repeats' log-ratios with Yuen's 95% interval
(``specscope.paired``).

1. The decode event mix of ``specscope.collector.loadgen`` (per verify step one VerifyStep and six
   TensorEvents) into a fresh store, ``executemany`` (psycopg's executemany of one INSERT, pipelined)
   against ``copy`` (``COPY ... FROM STDIN``):
   - rows: the same prebuilt rows (``storage.group_rows``) through each strategy of
     ``storage.bulk_strategy`` in one transaction: the insert itself (target: 5x, docs/design.md, "Budgets");
   - Store.write: events in batches of 5,000 through ``open_store(bulk=...)``, event-to-row conversion
     and the upserts included: what a collector sees; with the CPU seconds it cost this process and
     the server processes of its sessions (read from ``/proc``: a server on this host only), whose
     sum bounds the speed-up where writers share the CPUs (below).
2. W writer processes (spawned; default 8: 4 ranks of one run and 4 single-rank runs) each pushing
   N / W events through its own Collector and Store into one fresh store at once, with COPY and then
   with executemany (target: COPY 5x executemany under this load); the figure is all events over
   the wall time from the common start to the last flush.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from benchmarks.collector_ingest import MIN_EVENTS, spread
from specscope import events as ev
from specscope.collector.loadgen import make_events, run_writers, writer_layout
from specscope.paired import slowdown
from specscope.storage import INSERT_COLUMNS, bulk_strategy, group_rows, insert_statements, open_store

DEFAULT_URL = os.environ.get("SPECSCOPE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BATCH = 5_000


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


def store_write_costs(url: str, events: list[ev.Event], bulk: str) -> tuple[float, float, float | None]:
    """(wall seconds, this process's CPU seconds, the server's CPU seconds or None) of Store.write over
    batches of BATCH events into a fresh store with ``bulk``."""
    app = f"specscope-bench-{uuid.uuid4().hex[:8]}"
    with fresh_schema(url) as schema_url:
        named = sa.make_url(schema_url).update_query_dict({"application_name": app}).render_as_string(
            hide_password=False)
        with open_store(named, bulk=bulk) as store:
            store.write(events[:1])  # the write session exists before timing starts
            server = _server_cpu_s(url, app)
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(1, len(events), BATCH):
                store.write(events[i:i + BATCH])
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            after = _server_cpu_s(url, app)
    return wall, cpu, None if server is None or after is None else after - server


def _server_cpu_s(url: str, app: str) -> float | None:
    """CPU seconds (user + system) so far of the server processes of the sessions named ``app``; None
    where their ``/proc`` entries cannot be read (a server on another host)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            pids = conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :app"),
                                {"app": app}).scalars().all()
    finally:
        engine.dispose()
    try:
        fields = [open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split() for pid in pids]
    except OSError:
        return None
    return sum(int(f[11]) + int(f[12]) for f in fields) / os.sysconf("SC_CLK_TCK") if pids else None


def time_rows(url: str, events: list[ev.Event], bulk: str) -> float:
    """Seconds for the plain-insert rows of ``events`` through one bulk strategy, one transaction, into
    a fresh store (runs, ranks and requests written first, untimed)."""
    grouped, inserts = group_rows(events), insert_statements("postgresql")
    with fresh_schema(url) as schema_url:
        with open_store(schema_url) as store:
            store.write([e for e in events if e.kind in ("run_start", "rank_start", "request_start")])
        engine = sa.create_engine(schema_url)
        try:
            with engine.begin() as conn:
                insert = bulk_strategy("postgresql", bulk)
                start = time.perf_counter()
                for name in INSERT_COLUMNS:
                    if grouped.get(name):
                        insert(conn, name, inserts[name], grouped[name])
                return time.perf_counter() - start
        finally:
            engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if args.writers < 1 or args.events < MIN_EVENTS * args.writers or args.repeat < 3:
        parser.error(f"--writers must be at least 1, --events at least {MIN_EVENTS:,} per writer (a write worth "
                     "timing), --repeat at least 3 (an interval needs paired repeats)")

    events = make_events(args.events)
    print(f"PostgreSQL ingest of {len(events):,} events (decode mix), {args.repeat} repeats, strategies "
          "alternated: events/s median [min..max]")
    print(f"{'what':<12}{'bulk':<13}{'events/s':>28}{'COPY speed-up (95% CI)':>28}")
    times: dict[str, list[float]] = {"executemany": [], "copy": []}
    for _ in range(args.repeat):  # alternate, so both see the same machine load
        for bulk in times:
            times[bulk].append(time_rows(args.url, events, bulk))
    _report("rows", len(events), times)
    costs: dict[str, list[tuple[float, float, float | None]]] = {"executemany": [], "copy": []}
    for _ in range(args.repeat):
        for bulk in costs:
            costs[bulk].append(store_write_costs(args.url, events, bulk))
    _report("Store.write", len(events), {bulk: [c[0] for c in runs] for bulk, runs in costs.items()})
    _report_cpu(len(events), costs)

    per_writer = args.events // args.writers
    layout = writer_layout(args.writers)
    shared = sum(run_id == "shared" for run_id, _, _ in layout)
    print(f"{args.writers} writer processes at once ({shared} ranks of one run + {len(layout) - shared} single-rank "
          f"runs), each its own Collector and Store, {per_writer:,} events each, {args.repeat} repeats:")
    times = {"executemany": [], "copy": []}
    dropped = 0
    for _ in range(args.repeat):
        for bulk in times:
            with fresh_schema(args.url) as url:
                open_store(url).close()  # created once, untimed; the writers open an existing store
                reports, seconds = run_writers(url, layout, per_writer, BATCH, bulk=bulk)
            times[bulk].append(seconds)
            dropped += sum(r[3] for r in reports)
    _report(f"{args.writers} writers", per_writer * len(layout), times)
    print(f"dropped: {dropped}")


def _report_cpu(events: int, costs: dict[str, list[tuple[float, float, float | None]]]) -> None:
    """Median CPU seconds per 100k events of Store.write, client and server, and the speed-up their
    sums allow where the CPUs are the bottleneck (the writers' load on this machine)."""
    totals = {}
    for bulk, runs in costs.items():
        client = statistics.median(c[1] for c in runs) * 1e5 / events
        servers = [c[2] for c in runs if c[2] is not None]
        server = statistics.median(servers) * 1e5 / events if servers else None
        totals[bulk] = None if server is None else client + server
        print(f"Store.write CPU per 100k events, {bulk}: client {client:.2f} s, server "
              + ("n/a (not on this host)" if server is None else f"{server:.2f} s"))
    if None not in totals.values():
        print(f"CPU-bound ceiling of the COPY speed-up (executemany CPU / COPY CPU): "
              f"{totals['executemany'] / totals['copy']:.1f}x")


def _report(what: str, events: int, times: dict[str, list[float]]) -> None:
    """One line per strategy: events/s, and COPY's speed-up over executemany (executemany's time over
    COPY's, paired by repeat: the trimmed mean of their logs with Yuen's 95% interval,
    ``specscope.paired``)."""
    for bulk, seconds in times.items():
        speed_up = "1x"
        if bulk != "executemany":
            estimate, low, high = slowdown(seconds, times["executemany"]).ratio()
            speed_up = f"{estimate:.1f}x ({low:.1f}x .. {high:.1f}x)"
        print(f"{what:<12}{bulk:<13}{spread([events / s for s in seconds], ',.0f'):>28}{speed_up:>28}")


if __name__ == "__main__":
    main()
