"""Sustained ingest of the collector into SQLite, against raw ``sqlite3`` on the same rows (docs/design.md, "Budgets").

Run: ``python -m benchmarks.collector_ingest [--events N] [--batch-size B] [--repeat R]``.

The mix is :func:`specscope.collector.loadgen.make_events`, what an instrumented EAGLE-3 decode
produces. Events are built before timing (that is the engine's cost, not the collector's).

Four ways into a fresh store file with the full schema (indexes included), run in turn R times (so
each repeat's four see the same machine load); each rate is the median over the repeats with its
min..max; each share of the floor is the floor's time over the path's within a repeat, as the 20%
trimmed mean of their logs with Yuen's 95% interval (``specscope.paired``: this machine's speed moves
by tens of percent from second to second, so a single repeat says little):

- ``raw sqlite3``: prebuilt row tuples, ``executemany`` per table, ONE transaction, on a connection
  with the store's own settings (WAL, ``synchronous = NORMAL``): the floor.
- ``raw, batches of B``: the same, one transaction per batch of B events: what committing in the
  collector's batches costs SQLite itself (a commit, and a WAL checkpoint every 1,000 pages), before
  any Python of the collector's.
- ``Store.write``: events -> rows -> executemany, one transaction per batch of B events.
- ``Collector``: ``emit()`` on this thread, writes on the collector's thread, until ``flush()``
  returns; capacity = N so nothing is dropped. Also reports the engine-thread cost of ``emit()``.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from specscope import events as ev
from specscope.collector import Collector
from specscope.collector.loadgen import RUN, make_events
from specscope.paired import slowdown
from specscope.storage import group_rows, insert_statements, open_store

T = TypeVar("T")
MIN_EVENTS = 1_000


def _fresh_store(folder: Path, name: str) -> str:
    path = str(folder / f"{name}.db")
    open_store(path).close()
    return path


def run_raw(events: list[ev.Event], folder: Path, batch_size: int | None = None) -> float:
    """Seconds to insert the plain-insert rows of ``events`` with sqlite3 executemany, in one
    transaction, or one per ``batch_size`` events. (Runs, ranks and requests, under 1% of the mix, go
    through Store.write untimed; the rows are made before timing.)"""
    path = _fresh_store(folder, "raw")
    size = batch_size or len(events)
    batches = [group_rows(events[i:i + size]) for i in range(0, len(events), size)]
    with open_store(path) as store:
        store.write([e for e in events if e.kind in ("run_start", "rank_start", "request_start")])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")
    statements = insert_statements("sqlite")
    start = time.perf_counter()
    for grouped in batches:
        conn.execute("BEGIN")
        for name, sql in statements.items():
            if grouped.get(name):
                conn.executemany(sql, grouped[name])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def run_store(events: list[ev.Event], folder: Path, batch_size: int) -> float:
    """Seconds for Store.write over batches of ``batch_size`` events."""
    with open_store(_fresh_store(folder, "store")) as store:
        start = time.perf_counter()
        for i in range(0, len(events), batch_size):
            store.write(events[i:i + batch_size], counters={(RUN, 0): (batch_size, 0)})
        return time.perf_counter() - start


def run_collector(events: list[ev.Event], folder: Path, batch_size: int) -> tuple[float, float, int]:
    """(seconds until flush() returned, seconds spent in emit(), events dropped)."""
    collector = Collector(_fresh_store(folder, "collector"), capacity=len(events), batch_size=batch_size)
    emit = collector.emit
    start = time.perf_counter()
    for event in events:
        emit(event)
    emitted = time.perf_counter()
    if not collector.flush(timeout_s=600):
        raise RuntimeError("collector flush failed")
    done = time.perf_counter()
    collector.close()
    return done - start, emitted - start, collector.dropped


def share_of_floor(floor: list[float], seconds: list[float]) -> str:
    """The floor's time over ``seconds``, paired by repeat: ``"73% (69% .. 77%)"``."""
    estimate, low, high = slowdown(floor, seconds).ratio()
    # a lower bound that underflows to 0 (a few repeats that disagree wildly) leaves the share unbounded
    return f"{1 / estimate:.0%} ({1 / high:.0%} .. {1 / low if low > 0 else math.inf:.0%})"


def _fresh(fn: Callable[[Path], T]) -> T:
    """``fn`` of a new temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="specscope-bench-") as folder:
        return fn(Path(folder))


def spread(values: list[float], fmt: str) -> str:
    """``median [min..max]`` of ``values``, each formatted with ``fmt``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} [{low:{fmt}}..{high:{fmt}}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    if args.events < MIN_EVENTS or args.batch_size < 1 or args.repeat < 3:
        parser.error(f"--events must be at least {MIN_EVENTS:,} (a write worth timing), --batch-size at least 1, "
                     "--repeat at least 3 (an interval needs paired repeats)")
    events = make_events(args.events)
    n = len(events)
    share = {kind: sum(e.kind == kind for e in events) / n for kind in ("tensor", "verify_step")}

    batched = f"raw, batches of {args.batch_size:,}"
    runs: dict[str, list[float]] = {"raw sqlite3": [], batched: [], "Store.write": [], "Collector": []}
    emits: list[float] = []
    drops: list[int] = []
    for _ in range(args.repeat):
        runs["raw sqlite3"].append(_fresh(lambda folder: run_raw(events, folder)))
        runs[batched].append(_fresh(lambda folder: run_raw(events, folder, args.batch_size)))
        runs["Store.write"].append(_fresh(lambda folder: run_store(events, folder, args.batch_size)))
        total, emit_s, dropped = _fresh(lambda folder: run_collector(events, folder, args.batch_size))
        runs["Collector"].append(total)
        emits.append(emit_s)
        drops.append(dropped)

    print(f"collector ingest into SQLite {sqlite3.sqlite_version}: {n} events "
          f"({share['tensor']:.0%} TensorEvent, {share['verify_step']:.0%} VerifyStep), "
          f"batch {args.batch_size}, {args.repeat} repeats: events/s median [min..max]; share of raw "
          "sqlite3 (its time over the path's, same repeat): trimmed mean (95% CI)")
    print(f"{'path':<26}{'events/s':>30}{'share of raw':>28}")
    for name, seconds in runs.items():
        of_raw = "100%" if name == "raw sqlite3" else share_of_floor(runs["raw sqlite3"], seconds)
        print(f"{name:<26}{spread([n / s for s in seconds], ',.0f'):>30}{of_raw:>28}")
    print(f"emit() on the engine thread: {statistics.median(emits) / n * 1e6:.2f} µs/event; "
          f"dropped: {max(drops)}; target (docs/design.md, 'Budgets'): 200,000 events/s")


if __name__ == "__main__":
    main()
