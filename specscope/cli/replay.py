"""`specscope replay --db URL [--run ID] (--target FOLDER | --server URL) [--near-tie-margin X] [--json]`:
re-score a stored run's requests with the target served alone (docs/design.md, "Replay against the
target"), store the results and the run's verdict again, and print the replay's findings.

Exit status: 0 no error finding from the replay, 1 a departure beyond a near-tie or a failed sampled
test, 2 unusable input (missing store, unknown run, a run without kept token ids, a target folder
transformers cannot load, a server that does not answer in vLLM's shape: one line on stderr).
"""

from __future__ import annotations

import argparse

from specscope.cli._types import add_db_argument, add_json_argument, run_id
from specscope.findings import finding_lines
from specscope.results import to_json

REPLAY_CODES = ("REPLAY_DIVERGENCE", "REPLAY_AUDITED")


def _margin(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of logits >= 0, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``replay`` subcommand."""
    parser = sub.add_parser(
        "replay", help="re-score a stored run with the target alone (no speculation): where its output departs",
        description="Teacher-force each stored request's prompt + output through the target served alone, one "
                    "forward per request, and report where the output departs from the target's own choice.")
    add_db_argument(parser)
    parser.add_argument("--run", metavar="ID", type=run_id, help="the run, by its id or a unique prefix (default: the newest)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", metavar="FOLDER", help="a local Hugging Face target folder, run with transformers")
    where.add_argument("--server", metavar="URL", help="an OpenAI-compatible server without speculation that "
                       "returns prompt_logprobs (vLLM), e.g. http://127.0.0.1:8000")
    parser.add_argument("--near-tie-margin", type=_margin, default=None, metavar="LOGITS",
                        help="largest logit margin read as a near-tie (numerics), not a bug (default 0.25)")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Replay, store, print; returns 0 / 1 (ConfigError, StoreError, ReplayError: exit 2 via the shell)."""
    from specscope.readmodel import report, store_verdict
    from specscope.replay import NEAR_TIE_MARGIN, ServerTarget, TransformersTarget, replay_run
    from specscope.storage import open_store
    from specscope.storage.runs import newest_run_id, resolve_run_id

    margin = NEAR_TIE_MARGIN if args.near_tie_margin is None else args.near_tie_margin
    with open_store(args.db, create=False) as store:
        with store.connect() as conn:
            run_id = newest_run_id(conn, store.url) if args.run is None else resolve_run_id(conn, args.run, store.url)
        target = ServerTarget(args.server) if args.server else TransformersTarget(args.target)
        replayed = replay_run(store, run_id, target, margin)
        store_verdict(store, run_id)
        findings = [f for f in report(store, run_id).findings if f.code in REPLAY_CODES]
    if args.json:
        print(to_json({"run_id": run_id, "source": target.source, "near_tie_margin": margin,
                       "requests": len(replayed.results), "skipped": replayed.skipped,
                       "findings": [f.to_dict() for f in findings]}))
    else:
        print(f"replayed {len(replayed.results)} requests of run {run_id} against {target.source}"
              + (f" ({len(replayed.skipped)} skipped)" if replayed.skipped else ""))
        for finding in findings:
            print("\n".join(finding_lines(finding)))
    return int(any(f.severity == "error" for f in findings))
