"""One side of a comparison read from its store: the run, its acceptance and its requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specscope.compare._stats import Requests
from specscope.storage import Store
from specscope.storage import queries as q
from specscope.storage.runs import newest_run_id, resolve_run_id

UNPAIRED = "\x00"  # prefixes the key of a request without a prompt key: no other run's request has it


@dataclass(frozen=True)
class Side:
    """One run as compared: its identity and acceptance (docs/design.md, "Acceptance figures"), its
    requests with verify steps and each one's sampling group (``events.sampling_label``: acceptance
    under sampling is lower by design, so runs are compared within a group)."""

    store: str
    run_id: str
    engine: str
    fault: str | None
    verify_steps: int
    mean_acceptance_length: float | None
    acceptance_rate: float | None
    per_position_acceptance: list[float]
    requests: Requests
    groups: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "run_id": self.run_id, "engine": self.engine, "fault": self.fault,
                "requests": len(self.requests), "verify_steps": self.verify_steps,
                "mean_acceptance_length": self.mean_acceptance_length, "acceptance_rate": self.acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance}


def read_side(store: Store, run_id: str | None) -> Side:
    """The run ``run_id`` (an id or a unique prefix of one; None: the store's newest run) of ``store``.

    Raises:
        ConfigError: no such run, an ambiguous prefix, or an empty store.
        StoreError: the store cannot be read.
    """
    with store.connect() as conn:
        run_id = newest_run_id(conn, store.url) if run_id is None else resolve_run_id(conn, run_id, store.url)
        (run,) = q.fetch(conn, q.RUN, run_id=run_id)
        positions = q.fetch(conn, q.POSITION_ACCEPTANCE, run_id=run_id)
        rows = q.fetch(conn, q.COMPARE_REQUESTS, run_id=run_id)
    groups = tuple(row["sampling"] for row in rows)
    # a request pairs with one of the same prompt and sampling group; without a prompt key, with none
    requests = Requests(tuple(row["request_id"] for row in rows),
                        tuple(f"{row['sampling']}:{row['prompt_key']}" if row["prompt_key"] is not None
                              else f"{UNPAIRED}{run_id}:{row['request_id']}" for row in rows),
                        np.array([row["accepted"] for row in rows], dtype=float),
                        np.array([row["verify_steps"] for row in rows], dtype=float))
    return Side(store.url, run_id, run["engine"], run["fault"], run["verify_steps"], run["mean_acceptance_length"],
                run["acceptance_rate"], [row["acceptance"] for row in positions], requests, groups)
