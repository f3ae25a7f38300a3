"""PostgreSQL ingest: COPY against executemany on the same rows, and 8 writer processes at once.

Run: ``python -m benchmarks.pg_ingest [--url URL] [--events N] [--writers W] [--repeat R]``
(``--url`` default: ``$SPECSCOPE_TEST_PG_URL`` or the local test server; each measurement writes
into a fresh schema that is dropped afterwards).

1. The decode event mix of ``specscope.collector.loadgen`` (per verify step one VerifyStep and six
   TensorEvents) into a fresh store, ``executemany`` (psycopg's executemany of one INSERT, pipelined)
   against ``copy`` (``COPY ... FROM STDIN``), run alternately R times each, medians compared:
   - rows: the same prebuilt rows (``storage.group_rows``) through each strategy of
     ``storage.bulk_strategy`` in one transaction: the insert itself (target: 5x, docs/design.md, "Budgets");
   - Store.write: events in batches of 5,000 through ``open_store(bulk=...)``, event-to-row conversion
     and the upserts included: what a collector sees.
2. W writer processes (spawned; default 8: 4 ranks of one run and 4 single-rank runs) each pushing
   N / W events through its own Collector into one store at once, with COPY; the figure is all
   events over the wall time from the common start to the last flush, beside one writer alone.
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

from specscope import events as ev
from specscope.collector.loadgen import make_events, run_writers, writer_layout
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
