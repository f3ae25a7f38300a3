"""Every dashboard page on a large store, side by side with a baseline revision: docs/design.md,
"Budgets" asks < 0.5 s per page on 1M verify steps and 5M tensor events with 500 runs in the store.

Run: ``python -m benchmarks.dashboard_queries [--steps N] [--repeat R] [--baseline REV | --no-baseline]``.

The store (SQLite, cached under the temp dir per generator version, schema version and size) holds
:data:`RUNS` runs: 4 large ones of 1, 2, 4 and 8 ranks sharing almost all rows, and 496 small ones of
one 100-step request (every 5th with a stored error finding, for the run picker's labels); 100-step
requests, per verify step one row (chain of k=4, realistic masks and emitted-token JSON) and 5 tensor
events (the target-fed and a chained draft input, three capture layers), plus provenance checks every
64 steps. Rows go in with driver ``executemany`` of INSERTs compiled by SQLAlchemy from ``schema.py``
(then ``Store.rebuild_summaries``, schema version 8 on). A page's time is the sum of the medians of
every call it makes uncached (:func:`pages`: the run picker's run list and the doctor's findings on
every page, then the page's own queries), on the 1-rank large run (237,600 verify steps, 1.19M
tensor events) through a read-only Store.

The baseline is another git revision of ``specscope/`` (default :data:`BASELINE`, the code before the
summary tables) run by this same file in a child process on its own store, built by this generator
from the same seed: both columns come from one invocation on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa

import specscope
from specscope import events as ev
from specscope.app import queries
from specscope.doctor import checkpoint_findings, diagnose
from specscope.storage import Store, open_store, schema

GENERATOR_VERSION = 4
WORLD_SIZES = (1, 2, 4, 8)
RUNS = 500  # the 4 large runs of WORLD_SIZES and RUNS - 4 small ones (one 1-rank request each)
STEPS_PER_REQUEST = 100
K = 4
HIDDEN, FUSED = 576, 1728
AUX = (2, 15, 27)
CHUNK = 200_000
TOKENS = ("the", " model", " speculative", " decoding", ",", " draft", " token", ".", " and", " a")


def _run_events(index: int, world_size: int, t0: float) -> list:
    run_id = f"bench-{index}"
    config = ev.RunConfig(aux_layer_ids_resolved=AUX, target_hidden_size=HIDDEN,
                          expected_fused_width=FUSED, k=K, num_target_layers=30).to_dict()
    out: list = [ev.RunStart(run_id, "bench-engine", "1.0", "target", "draft", config,
                             world_size=world_size, host="bench", ts_wall=t0)]
    for rank in range(world_size):
        out.append(ev.RankStart(run_id, rank, world_size, "bench", 1000 + rank, f"cuda:{rank}", ts_wall=t0))
        out.append(ev.RankStatus(run_id, rank, 10**6, 0, "eager", finished=True, ts_wall=t0 + 3600))
    return out


def _steps(run_id: str, world_size: int, steps: int, t0: float, rng: random.Random) -> Iterator[tuple]:
    dt = 3600.0 / steps
    for i in range(steps):
        request, step = divmod(i, STEPS_PER_REQUEST)
        accepted = min(K, int(rng.expovariate(0.5)))
        emitted = json.dumps([rng.choice(TOKENS) for _ in range(accepted + 1)])
        yield (run_id, f"req-{request}", request % world_size, step, K, accepted,
               "1" * accepted + "0" * (K - accepted), 0.004, 0.011, emitted, t0 + i * dt)


def _tensors(run_id: str, world_size: int, steps: int, t0: float) -> Iterator[tuple]:
    dt = 3600.0 / steps
    points = [("draft.forward:hidden_states", FUSED, FUSED), ("draft.forward:hidden_states", HIDDEN, HIDDEN)]
    points += [(f"target.layers.{i}:input", HIDDEN, HIDDEN) for i in AUX]
    for i in range(steps):
        request, step = divmod(i, STEPS_PER_REQUEST)
        rank = request % world_size
        for j, (point, width, expected) in enumerate(points):
            yield (run_id, rank, point, 5 * i + j, f"1x1x{width}", width, "bfloat16", f"cuda:{rank}",
                   f"-1x-1x{expected}", expected, None, None, None, f"req-{request}", step, "eager",
                   t0 + i * dt)


def _provenance(run_id: str, world_size: int, steps: int, t0: float) -> Iterator[tuple]:
    dt = 3600.0 / steps
    aux = json.dumps(list(AUX))
    for i in range(0, steps, 64):
        request, step = divmod(i, STEPS_PER_REQUEST)
        yield (run_id, request % world_size, i, aux, aux, True, FUSED, f"req-{request}", step, t0 + i * dt)


def _insert_sql(table: sa.Table, columns: tuple[str, ...]) -> str:
    dialect = sa.dialects.sqlite.pysqlite.SQLiteDialect_pysqlite()
    return str(table.insert().compile(dialect=dialect, column_keys=list(columns), for_executemany=True))


def _bulk(engine: sa.Engine, table: sa.Table, columns: tuple[str, ...], rows: Iterator[tuple]) -> None:
    sql = _insert_sql(table, columns)
    chunk: list[tuple] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == CHUNK:
            with engine.begin() as conn:
                conn.exec_driver_sql(sql, chunk)
            chunk = []
    if chunk:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql, chunk)


def _layout(steps: int) -> list[tuple[int, int]]:
    """``(world_size, verify steps)`` of every run: :data:`RUNS` - 4 small runs of one request, the
    rest of ``steps`` split evenly over the 4 large runs of :data:`WORLD_SIZES`."""
    small = RUNS - len(WORLD_SIZES)
    large = (steps - small * STEPS_PER_REQUEST) // len(WORLD_SIZES)
    return [(world_size, large) for world_size in WORLD_SIZES] + [(1, STEPS_PER_REQUEST)] * small


def _stored_finding(run_id: str, index: int) -> ev.Finding:
    """A doctor finding for the run picker's labels: every 5th small run collapsed, the others healthy."""
    return ev.Finding("ACCEPT_COLLAPSE", "error", "acceptance collapsed", {"mean_acceptance_length": 1.02},
                      "see docs", run_id=run_id, ts_wall=1_700_000_000.0 + index)


def build(path: Path, steps: int) -> None:
    """Write the benchmark store at ``path`` (a SQLite file): :data:`RUNS` runs (:func:`_layout`),
    ``steps`` verify steps and 5x as many tensor events in total."""
    rng = random.Random(0)
    layout = _layout(steps)
    with open_store(str(path)) as store:
        for index, (world_size, run_steps) in enumerate(layout):
            run_id, t0 = f"bench-{index}", 1_700_000_000.0 + index * 7200
            store.write(_run_events(index, world_size, t0))
            requests = [ev.RequestStart(run_id, f"req-{r}", r % world_size, 200, ts_wall=t0 + r)
                        for r in range(run_steps // STEPS_PER_REQUEST)]
            ends = [ev.RequestEnd(run_id, e.request_id, e.rank, STEPS_PER_REQUEST * 2,
                                  STEPS_PER_REQUEST, ts_wall=e.ts_wall + 30) for e in requests]
            store.write(requests + ends)
        collapsed = [f"bench-{i}" for i in range(len(WORLD_SIZES), len(layout), 5)]
        store.replace_findings("doctor", collapsed,
                               [_stored_finding(run_id, i) for i, run_id in enumerate(collapsed)])
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        for index, (world_size, run_steps) in enumerate(layout):
            run_id, t0 = f"bench-{index}", 1_700_000_000.0 + index * 7200
            _bulk(engine, schema.verify_steps, _STEP_COLUMNS, _steps(run_id, world_size, run_steps, t0, rng))
            _bulk(engine, schema.tensor_events, _TENSOR_COLUMNS, _tensors(run_id, world_size, run_steps, t0))
            _bulk(engine, schema.provenance, _PROVENANCE_COLUMNS,
                  _provenance(run_id, world_size, run_steps, t0))
        with open_store(str(path)) as store:
            rebuild = getattr(store, "rebuild_summaries", None)  # schema version 8 on: rows went around write()
            if rebuild is not None:
                rebuild()
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


_STEP_COLUMNS = ("run_id", "request_id", "rank", "step", "proposed", "accepted", "accepted_mask",
                 "draft_s", "verify_s", "emitted", "ts_wall")
_TENSOR_COLUMNS = ("run_id", "rank", "hook_point", "call_index", "shape", "width", "dtype", "device",
                   "expected_shape", "expected_width", "absmax", "mean", "nonfinite", "request_id", "step",
                   "graph_phase", "ts_wall")
_PROVENANCE_COLUMNS = ("run_id", "rank", "call_index", "configured", "received", "matches", "width",
                       "request_id", "step", "ts_wall")


def cached_store(steps: int) -> Path:
    """The benchmark store for ``steps`` verify steps, built once under the temp dir."""
    # the schema version too: a store cached by an older specscope would need an upgrade (read-only here)
    path = (Path(tempfile.gettempdir())
            / f"specscope-dashboard-bench-v{GENERATOR_VERSION}-s{schema.SCHEMA_VERSION}-{steps}.db")
    if not path.exists():
        partial = path.with_suffix(".partial")
        for stale in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            stale.unlink(missing_ok=True)
        started = time.perf_counter()
        build(partial, steps)
        partial.rename(path)
        print(f"built {path} in {time.perf_counter() - started:.0f} s")
    return path


def pages(store: Store, run_id: str) -> dict[str, list[tuple[str, Callable[[], object]]]]:
    """``page -> [(call, function)]``: every call a page makes on a cold cache, with its arguments."""
    request_id = queries.requests(store, run_id, limit=1)[0]["request_id"]
    common = [("runs (run picker)", lambda: queries.runs(store)),
              ("doctor findings", lambda: diagnose(store, run_id).findings + checkpoint_findings(store, run_id)),
              ("run_summary", lambda: queries.run_summary(store, run_id))]
    return {
        "Overview": common + [("acceptance_over_time", lambda: queries.acceptance_over_time(store, run_id)),
                              ("acceptance_windows",
                               lambda: queries.distributions(store, run_id, ("acceptance_windows",))),
                              ("position_acceptance", lambda: queries.position_acceptance(store, run_id)),
                              ("what_if_k", lambda: queries.what_if_k(store, run_id))],
        "Requests": common + [("requests", lambda: queries.requests(store, run_id)),
                              ("sampling_acceptance", lambda: queries.sampling_acceptance(store, run_id)),
                              ("histogram, spread, by output position", lambda: queries.distributions(
                                  store, run_id, ("acceptance_histogram", "request_acceptance",
                                                  "acceptance_by_output_position"))),
                              ("request_steps", lambda: queries.request_steps(store, run_id, request_id)),
                              ("request_positions", lambda: queries.request_positions(store, run_id, request_id))],
        "GPUs": common + [("ranks", lambda: queries.ranks(store, run_id)),
                          ("tensor_contract", lambda: queries.tensor_contract(store, run_id))],
        "Tensors": common + [("tensor_contract", lambda: queries.tensor_contract(store, run_id)),
                             ("draft_inputs_over_time", lambda: queries.draft_inputs_over_time(store, run_id, FUSED)),
                             ("ranks", lambda: queries.ranks(store, run_id)),
                             ("provenance", lambda: queries.provenance(store, run_id))],
        "Findings": common + [("load_reports", lambda: queries.load_reports(store, run_id))],
        "SQL": common[:2],
    }


def measure(db: str, run_id: str, repeat: int) -> dict[str, dict[str, float]]:
    """``page -> {call: median seconds}`` over ``repeat`` rounds."""
    with open_store(db, create=False, read_only=True) as store:
        out: dict[str, dict[str, float]] = {}
        for page, calls in pages(store, run_id).items():
            out[page] = {}
            for name, call in calls:
                times = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - started)
                out[page][name] = statistics.median(times)
    return out


BASELINE = "8348170"
"""The last revision before the summary tables (schema version 7): its run-level views scanned a
run's verify steps, the shape contract its tensor events, and the doctor ran both again."""


def _baseline(rev: str, steps: int, repeat: int, run_id: str) -> dict[str, dict[str, float]]:
    """:func:`measure` in a child process running revision ``rev``'s ``specscope/`` (``git archive``
    into a temporary directory, the child's working directory and first on its path: ``-m`` puts the
    working directory before everything) with this benchmark file."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "specscope"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(root)])}
        child = subprocess.run([sys.executable, "-m", "benchmarks.dashboard_queries", "--json", "--no-baseline",
                                "--steps", str(steps), "--repeat", str(repeat), "--run", run_id],
                               env=env, cwd=tree, check=True, capture_output=True, text=True)
    result = json.loads(child.stdout.splitlines()[-1])
    if not result["specscope"].startswith(tree):
        raise RuntimeError(f"the baseline child imported {result['specscope']}, not revision {rev}")
    return result["pages"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="an existing store to time instead of the generated one (no baseline)")
    parser.add_argument("--run", default="bench-0", help="run id to time (default: the 1-rank large run)")
    parser.add_argument("--steps", type=int, default=1_000_000, help="verify steps in the generated store")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="git revision to time side by side")
    parser.add_argument("--no-baseline", action="store_true", help="time this checkout only")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the baseline child's output
    args = parser.parse_args(argv)
    db = args.db or str(cached_store(args.steps))
    now = measure(db, args.run, args.repeat)
    if args.json:
        print(json.dumps({"specscope": str(Path(specscope.__file__).parent), "pages": now}))
        return
    before = None if args.no_baseline or args.db else _baseline(args.baseline, args.steps, args.repeat, args.run)
    with open_store(db, create=False, read_only=True) as store:
        counts = store.query("SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM verify_steps), "
                             "(SELECT COUNT(*) FROM tensor_events)")[1][0]
    print(f"store {db}: {counts[0]:,} runs, {counts[1]:,} verify steps, {counts[2]:,} tensor events; "
          f"run {args.run}; medians of {args.repeat}, uncached")
    head = f"{'page':<10} {'call':<38} {'now ms':>8}" + (f" {'baseline ms':>12}" if before else "")
    print(head)
    for page, calls in now.items():
        for name, seconds in calls.items():
            line = f"{page:<10} {name:<38} {seconds * 1e3:>8.1f}"
            if before:
                line += f" {before[page].get(name, float('nan')) * 1e3:>12.1f}"
            print(line)
    print("\nper page (sum of its calls):")
    for page, calls in now.items():
        total = sum(calls.values())
        line = f"  {page:<10} now {total * 1e3:6.0f} ms" + (" (budget 500 ms: over)" if total > 0.5 else "")
        if before:
            old = sum(before[page].values())
            line += f"   baseline {args.baseline} {old * 1e3:6.0f} ms   x{old / total:.1f} faster"
        print(line)


if __name__ == "__main__":
    main()
