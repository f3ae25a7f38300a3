"""The reference engine, measured side by side in one process on the held-out prompts.

Run: ``python -m benchmarks.engine_decode [--prompts N] [--max-new-tokens T] [--k K] [--rounds R]
[--pairs P] [--overhead-batch B] [--budget-s S] [--overhead-only]``.

1. Acceptance at k (docs/design.md, "Acceptance figures"): mean acceptance length, acceptance rate, per-position
   acceptance, over every held-out prompt (healthy) and the first ``fault_prompts`` under each fault.
2. Decode speed: speculative decoding vs the target's own greedy decoding (tokens/s), the same
   prompts and token counts, alternating so machine load hits both alike.
3. Instrumentation overhead: the same speculative decode of a batch of ``overhead_batch`` prompts with
   a specscope Tracer at default settings (shape sampling, no value statistics, no provenance, the
   audit every 4th step) writing through a Collector into a temporary SQLite store vs not
   instrumented: one engine and one Tracer, paused (``Tracer.pause``: no hook in the models, no
   tracer on the engine) for the bare batches; ``pairs`` ABBA pairs, with an A/A calibration of the
   same rounds (:mod:`specscope.paired`: the figure is reported when the A/A interval lies within
   +-0.5%).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

from specscope import metrics
from specscope.collector import Collector
from specscope.engine import ENGINE_NAME, ENGINE_VERSION, FAULTS, Engine, heldout_prompts, load_target
from specscope.instrumentation import Tracer, instrument
from specscope.paired import AA, Interval, compare, report, timed


def acceptance(engine: Engine, prompts: list[str], max_new: int) -> dict:
    results = engine.generate(prompts, max_new_tokens=max_new)
    accepted = [a for r in results for a in r.accepted]
    proposed = [p for r in results for p in r.proposed]
    return {"al": metrics.mean_acceptance_length(accepted), "rate": metrics.acceptance_rate(accepted, proposed),
            "pos": metrics.per_position_acceptance(map(metrics.chain_mask, accepted, proposed)), "steps": len(accepted),
            "tokens": sum(len(r.token_ids) for r in results)}


def _timed(fn) -> float:
    start = time.perf_counter()
    tokens = fn()
    return tokens / (time.perf_counter() - start)


def speed(engine: Engine, prompts: list[str], max_new: int, rounds: int) -> tuple[float, float]:
    """Median tokens/s of (speculative, target-only greedy) over alternating rounds."""
    spec, greedy = [], []
    for _ in range(rounds):
        spec.append(_timed(lambda: sum(len(r.token_ids) for r in engine.generate(prompts, max_new))))
        greedy.append(_timed(lambda: sum(len(engine.greedy(p, max_new)) for p in prompts)))
    return statistics.median(spec), statistics.median(greedy)


def overhead(engine: Engine, prompts: list[str], max_new: int, pairs: int,
             budget_s: float | None = None) -> dict[str, Interval]:
    """Instrumented vs bare decode of the same batch, on one engine with one Tracer switched per batch:
    A/A (paused vs paused) and paused vs observed, in the interleaved ABBA pairs of
    :func:`specscope.paired.compare`. Each batch is timed until the collector has stored what it
    recorded; every batch must decode the same tokens (checked)."""
    target_id, draft_id = engine.model_ids
    with tempfile.TemporaryDirectory() as tmp, Collector(str(Path(tmp) / "bench.db")) as collector, \
            Tracer(collector, engine=ENGINE_NAME, engine_version=ENGINE_VERSION, target_model=target_id,
                   draft_model=draft_id, config=engine.run_config()) as tracer:
        instrument(tracer, draft=engine.draft, target=engine.target)
        reference = []
        batches = itertools.count()

        def side(observed: bool):
            def run() -> float:
                if observed:
                    tracer.resume()
                else:
                    tracer.pause()
                engine.tracer = tracer if observed else None
                results = []
                names = [f"batch{next(batches)}-{i}" for i in range(len(prompts))]  # each request new to the tracer
                seconds = timed(lambda: (results.extend(engine.generate(prompts, max_new, names)), collector.flush()))
                ids = [r.token_ids for r in results]
                reference[:] = reference or ids
                if ids != reference:
                    raise RuntimeError("a batch decoded other tokens than the first: the sides are not comparable")
                return seconds
            return run

        side(True)(), side(False)()  # warm both states
        try:
            return compare({AA: (side(False), side(False)), "instrumented vs bare": (side(False), side(True))},
                           pairs, budget_s)
        finally:
            engine.tracer = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts, healthy (default all)")
    parser.add_argument("--fault-prompts", type=int, default=12, help="held-out prompts per fault")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds for the timings")
    parser.add_argument("--speed-prompts", type=int, default=4, help="prompts per timing round")
    parser.add_argument("--pairs", type=int, default=24, help="ABBA pairs per comparison for the overhead")
    parser.add_argument("--overhead-batch", type=int, default=4, help="requests per batch for the overhead")
    parser.add_argument("--budget-s", type=float, default=None, help="overhead: start no round after this many s")
    parser.add_argument("--overhead-only", action="store_true", help="skip acceptance and speed (3.)")
    args = parser.parse_args(argv)
    target = load_target()
    prompts = heldout_prompts()[: args.prompts]
    if args.overhead_only:
        _print_overhead(Engine(target=target, k=args.k), prompts, args)
        return
    print(f"held-out prompts: {len(prompts)}, max_new_tokens {args.max_new_tokens}, k={args.k}\n")
    print(f"{'fault':<16} {'AL':>6} {'rate':>6} {'steps':>6}  per-position acceptance")
    for fault in [None, *FAULTS]:
        subset = prompts if fault is None else prompts[: args.fault_prompts]
        row = acceptance(Engine(target=target, fault=fault, k=args.k), subset, args.max_new_tokens)
        pos = " ".join(f"{p:.2f}" for p in row["pos"])
        print(f"{fault or 'healthy':<16} {row['al']:6.3f} {row['rate']:6.3f} {row['steps']:6d}  {pos}", flush=True)
    engine = Engine(target=target, k=args.k)
    few = prompts[: args.speed_prompts]
    spec, greedy = speed(engine, few, args.max_new_tokens, args.rounds)
    print(f"\ndecode tokens/s (median of {args.rounds}): speculative {spec:.1f}, target-only greedy "
          f"{greedy:.1f}, speed-up x{spec / greedy:.2f}")
    _print_overhead(engine, prompts, args)


def _print_overhead(engine: Engine, prompts: list[str], args: argparse.Namespace) -> None:
    batch = prompts[: args.overhead_batch]
    results = overhead(engine, batch, args.max_new_tokens, args.pairs, args.budget_s)
    print(f"instrumented decode vs bare ({results[AA].n} ABBA pairs of {len(batch)}-request batches, "
          f"{args.max_new_tokens} tokens; load average {os.getloadavg()[0]:.2f}); B's time over A's:")
    for line in report(results):
        print(line)


if __name__ == "__main__":
    main()
