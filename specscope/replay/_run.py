"""Replay a stored run's requests against the target alone and store the results (docs/design.md,
"Replay against the target")."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from specscope.errors import ConfigError
from specscope.events import ReplayResult
from specscope.replay._score import NEAR_TIE_MARGIN, ReplayInput
from specscope.storage import Store
from specscope.storage import queries as q


class Target(Protocol):
    """The target served alone (:class:`TransformersTarget`, :class:`ServerTarget`)."""

    source: str

    def score(self, item: ReplayInput, run_id: str, near_tie_margin: float = NEAR_TIE_MARGIN) -> ReplayResult: ...


@dataclass
class ReplayReport:
    """What one replay did: the results stored, and the requests it could not judge (``skipped``:
    request id -> why)."""

    run_id: str
    results: list[ReplayResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def inputs(store: Store, run_id: str) -> tuple[list[ReplayInput], dict[str, str]]:
    """The run's requests whose token ids were kept, and those that cannot be replayed, with why."""
    items, skipped = [], {}
    for row in store.fetch(q.REPLAY_INPUTS, run_id=run_id):
        output = tuple(json.loads(row["output_ids"]))
        if row["temperature"] is None:
            skipped[row["request_id"]] = "its sampling settings were not recorded"
        elif not output:
            skipped[row["request_id"]] = "it emitted no token"
        else:
            items.append(ReplayInput(row["request_id"], row["sampling"], float(row["temperature"]), row["top_p"],
                                     row["top_k"], tuple(json.loads(row["prompt_ids"])), output))
    return items, skipped


def replay_run(store: Store, run_id: str, target: Target, near_tie_margin: float = NEAR_TIE_MARGIN,
               progress: Callable[[ReplayResult], None] | None = None) -> ReplayReport:
    """Score every kept request of ``run_id`` with ``target`` (one forward each) and store the results
    (``replay_requests``: a request replayed again keeps the latest figures).

    Raises:
        ConfigError: the run kept no token ids (the audit was off, or it was recorded before they
            were kept), or ``near_tie_margin`` is negative.
        ReplayError: the target could not score a request.
    """
    if not near_tie_margin >= 0:
        raise ConfigError(f"near-tie margin must be >= 0 logits, got {near_tie_margin!r}")
    items, skipped = inputs(store, run_id)
    if not items:
        why = "; ".join(f"{k}: {v}" for k, v in list(skipped.items())[:3])
        raise ConfigError(f"run {run_id} has no request to replay: no token ids were kept for it (they are "
                          f"kept while the losslessness audit is on, schema 12 and later){'; ' + why if why else ''}")
    report = ReplayReport(run_id, skipped=skipped)
    for item in items:
        result = target.score(item, run_id, near_tie_margin)
        report.results.append(result)
        if progress is not None:
            progress(result)
    store.write(report.results)
    return report
