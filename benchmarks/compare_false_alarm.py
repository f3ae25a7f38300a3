"""How often ``specscope compare`` cries wolf, and whether it catches real regressions, measured on
real reference-engine runs (docs/design.md, "Comparing runs").

Run: ``python -m benchmarks.compare_false_alarm [--splits N] [--cache DIR] [--healthy N] [--faulty N]
[--max-new-tokens T]``. The runs are served once into SQLite stores under ``--cache`` (default
``/tmp/specscope-compare-bench``) and reused while their options stay the same.

1. False alarms: one healthy run over ``--healthy`` held-out prompts, its requests split at random
   into two disjoint halves ``--splits`` times (and into two disjoint quarters: smaller runs), each
   pair compared as two runs over different prompts (two-sample bootstrap). Every flag is a false
   alarm: both halves are the same engine. The rate must stay at or below 5% at the 95% level.
   (Healthy against healthy over the same prompts is not a test here: the reference engine is
   greedy and deterministic, so a rerun gives every request the same acceptance, delta 0.)
2. Regressions: runs over the first ``--faulty`` prompts with a fault (``no-aux-capture``; an
   untrained ``fc``: the shipped head with ``fc.weight`` re-initialised; a RoPE mismatch: the head
   served with ``rope_theta`` 10000 where it was trained with 100000), each
   compared with the healthy run over the same prompts (paired) and with the healthy run's other
   prompts (two-sample).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from specscope.compare import Requests, difference, read_side
from specscope.storage import open_store

CACHE = Path("/tmp/specscope-compare-bench")
REGRESSIONS = ("no-aux-capture", "untrained-fc", "rope-mismatch")
TRAINED_ROPE_THETA = 100000.0
MISMATCHED_ROPE_THETA = 10000.0


def _draft_variant(name: str, cache: Path) -> str | None:
    """A copy of the shipped EAGLE-3 head with one thing broken (None: the shipped head)."""
    if name not in ("untrained-fc", "rope-mismatch"):
        return None
    import torch
    from safetensors.torch import save_file

    from specscope.engine import DEFAULT_DRAFT_DIR
    from specscope.engine.checkpoint import read_state

    folder = cache / f"draft-{name}"
    if folder.exists():
        return str(folder)
    shutil.copytree(DEFAULT_DRAFT_DIR, folder)
    if name == "untrained-fc":
        state = read_state(folder)
        torch.manual_seed(0)
        fresh = torch.nn.Linear(state["fc.weight"].shape[1], state["fc.weight"].shape[0], bias=False)
        state["fc.weight"] = fresh.weight.detach().to(state["fc.weight"].dtype).contiguous()
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        config = json.loads((folder / "config.json").read_text())
        assert config["rope_theta"] == TRAINED_ROPE_THETA, config["rope_theta"]
        config["rope_theta"] = MISMATCHED_ROPE_THETA
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return str(folder)


def served(name: str, requests: int, max_new_tokens: int, cache: Path) -> Requests:
    """The requests of a cached run ``name`` (served now when its store is missing)."""
    from specscope.engine import FAULTS

    path = cache / f"{name}-{requests}x{max_new_tokens}.db"
    if not path.exists():
        from specscope.adapters.reference import DemoOptions, run_demo

        print(f"serving {name}: {requests} requests x {max_new_tokens} tokens -> {path}", flush=True)
        run_demo(DemoOptions(db=str(path), requests=requests, max_new_tokens=max_new_tokens, provenance_every=0,
                             fault=name if name in FAULTS else None, draft_dir=_draft_variant(name, cache)))
    with open_store(str(path), create=False, read_only=True) as store:
        side = read_side(store, None)
    print(f"{name:15} {len(side.requests):3} requests, {side.verify_steps:4} steps, AL "
          f"{side.mean_acceptance_length:.3f}", flush=True)
    return side.requests


def false_alarms(healthy: Requests, size: int, splits: int, rng: np.random.Generator) -> dict:
    flagged = excluded = inconclusive = 0
    for _ in range(splits):
        order = rng.permutation(len(healthy))
        diff = difference(healthy.subset(order[:size]), healthy.subset(order[size:2 * size]), seed=None)
        flagged += diff.verdict in ("regression", "improvement")
        inconclusive += diff.verdict == "inconclusive"
        excluded += diff.ci95[0] > 0 or diff.ci95[1] < 0
    return {"size": size, "splits": splits, "flagged": flagged / splits, "ci_excludes_0": excluded / splits,
            "inconclusive": inconclusive / splits}


def detection(healthy: Requests, faulty: Requests) -> tuple:
    """The faulty run against the healthy run's same prompts (paired) and its other prompts (two-sample)."""
    shared = np.array([healthy.keys.index(k) for k in faulty.keys])
    others = np.setdiff1d(np.arange(len(healthy)), shared)
    return difference(healthy.subset(shared), faulty), difference(healthy.subset(others), faulty)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=4000)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--healthy", type=int, default=46, help="held-out prompts in the healthy run")
    parser.add_argument("--faulty", type=int, default=8, help="prompts in each faulty run")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    healthy = served("healthy", args.healthy, args.max_new_tokens, args.cache)
    print("\nfalse alarms, healthy vs healthy over disjoint random prompt sets (two-sample):")
    print(f"{'requests per side':>18} {'splits':>7} {'flagged':>8} {'CI excludes 0':>14} {'inconclusive':>13}")
    for size in (len(healthy) // 2, len(healthy) // 4):
        row = false_alarms(healthy, size, args.splits, rng)
        print(f"{row['size']:>18} {row['splits']:>7} {row['flagged']:>8.1%} {row['ci_excludes_0']:>14.1%} "
              f"{row['inconclusive']:>13.1%}", flush=True)
    print("\nregressions against the healthy run:")
    print(f"{'fault':15} {'requests':>8} {'AL':>6} | {'delta (paired)':>15} {'95% CI':>18} {'verdict':>11} | "
          f"{'delta (2-sample)':>16} {'95% CI':>18} {'verdict':>11}")
    for name in REGRESSIONS:
        faulty = served(name, args.faulty, args.max_new_tokens, args.cache)
        paired, unpaired = detection(healthy, faulty)
        print(f"{name:15} {len(faulty):>8} {faulty.mean_acceptance_length:>6.3f} | " + " | ".join(
            f"{d.delta:>+15.3f} {f'[{d.ci95[0]:+.3f}, {d.ci95[1]:+.3f}]':>18} {d.verdict:>11}" for d in (paired, unpaired)),
            flush=True)


if __name__ == "__main__":
    main()
