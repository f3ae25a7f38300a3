"""PostgreSQL ingest: COPY against executemany on the same rows, and 8 writer processes at once.

Run: ``python -m benchmarks.pg_ingest [--url URL] [--events N] [--writers W] [--repeat R]``
(``--url`` default: ``$SPECSCOPE_TEST_PG_URL`` or the local test server; each measurement writes
into a fresh schema that is dropped afterwards).

Each figure is the median over R repeats with its min..max; each ratio is taken within a repeat,
where the two strategies ran one after the other (alternately), so both saw the same machine load.

1. The decode event mix of ``specscope.collector.loadgen`` (per verify step one VerifyStep and six
   TensorEvents) into a fresh store, ``executemany`` (psycopg's executemany of one INSERT, pipelined)
   against ``copy`` (``COPY ... FROM STDIN``):
   - rows: the same prebuilt rows (``storage.group_rows``) through each strategy of
     ``storage.bulk_strategy`` in one transaction: the insert itself (target: 5x, docs/design.md, "Budgets");
   - Store.write: events in batches of 5,000 through ``open_store(bulk=...)``, event-to-row conversion
     and the upserts included: what a collector sees.
2. W writer processes (spawned; default 8: 4 ranks of one run and 4 single-rank runs) each pushing
   N / W events through its own Collector and Store into one fresh store at once, with COPY and then
   with executemany (target: COPY 5x executemany under this load); the figure is all events over
   the wall time from the common start to the last flush.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from benchmarks.collector_ingest import spread
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
    print(f"PostgreSQL ingest of {len(events):,} events (decode mix), {args.repeat} repeats, strategies "
          "alternated: median [min..max]")
    print(f"{'what':<12}{'bulk':<13}{'events/s':>28}{'copy speed-up':>22}")
    for what, timer in (("rows", time_rows), ("Store.write", time_store_write)):
        times: dict[str, list[float]] = {"executemany": [], "copy": []}
        for _ in range(args.repeat):  # alternate, so both see the same machine load
            for bulk in times:
                times[bulk].append(timer(args.url, events, bulk))
        _report(what, len(events), times)

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


def _report(what: str, events: int, times: dict[str, list[float]]) -> None:
    """One line per strategy: events/s and COPY's speed-up over executemany, within each repeat."""
    for bulk, seconds in times.items():
        ratios = [many / s for many, s in zip(times["executemany"], seconds)]
        print(f"{what:<12}{bulk:<13}{spread([events / s for s in seconds], ',.0f'):>28}"
              f"{spread(ratios, '.1f') + 'x':>22}")


if __name__ == "__main__":
    main()
