"""``specscope generate``: run the reference engine on one prompt and print the acceptance figures."""

from __future__ import annotations

import argparse

from specscope import metrics
from specscope.cli._types import int_in, positive_int
from specscope.engine.faults import FAULTS, SAMPLED_PATH_FAULTS
from specscope.storage.schema import MAX_POSITIONS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate with the reference EAGLE-3 engine and print acceptance",
                       description="Chain speculative decoding (greedy, lossless) on SmolLM2-135M-Instruct "
                                   "with the reference EAGLE-3 draft; prints the text and the acceptance "
                                   "figures of docs/design.md ('Acceptance figures').")
    p.add_argument("--prompt", required=True, help="user message (the chat template is applied)")
    p.add_argument("--k", type=int_in(1, MAX_POSITIONS), default=4,
                   help=f"draft tokens per verify step (1-{MAX_POSITIONS}; default 4)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--fault", choices=sorted(set(FAULTS) - set(SAMPLED_PATH_FAULTS)), default=None,
                   help="reproduce a serving failure (greedy decoding: the sampled path's faults do not apply)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specscope.engine import Engine

    engine = Engine(fault=args.fault, k=args.k)
    result = engine.generate([args.prompt], max_new_tokens=args.max_new_tokens)[0]
    positions = metrics.per_position_acceptance(map(metrics.chain_mask, result.accepted, result.proposed))
    print(result.text)
    print()
    print(f"fault:                       {args.fault or 'none'}")
    print(f"generated tokens:            {len(result.token_ids)} in {result.duration_s:.2f} s "
          f"({len(result.token_ids) / result.duration_s:.1f} tokens/s)")
    print(f"verify steps:                {len(result.accepted)}")
    print(f"mean acceptance length:      {_fmt(result.mean_acceptance_length)} tokens/step (k={args.k})")
    print(f"acceptance rate:             {_fmt(result.acceptance_rate)}")
    print(f"per-position acceptance:     {' '.join(f'{p:.2f}' for p in positions)}")
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
