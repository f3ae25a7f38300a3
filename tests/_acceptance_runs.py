"""Synthetic runs for the acceptance-distribution views and the drift / outlier rules: requests
whose verify steps accept given numbers of drafts at given wall times, written through the real Store.
Time is driven through the events' timestamps (a run "hours long" costs nothing to write)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specscope.events import Event, RankStart, RankStatus, RequestEnd, RequestStart, RunConfig, RunStart, VerifyStep
from specscope.storage import Store

K = 4
T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Req:
    """One request: ``accepted`` drafts per verify step (k = :data:`K` proposed each), starting at
    ``start`` seconds after the run began, one step every ``step_s`` seconds."""

    accepted: Sequence[int]
    start: float = 0.0
    temperature: float = 0.0
    prompt_tokens: int = 24
    text: str | None = None
    step_s: float = 0.05


def run_events(run_id: str, requests: Iterable[Req], k: int = K) -> list[Event]:
    """A one-rank run serving ``requests`` (ids ``r0``, ``r1``, ... in order), finished at its last step."""
    config = RunConfig(aux_layer_ids_configured=(2, 15, 27), aux_layer_ids_resolved=(2, 15, 27),
                       target_hidden_size=576, expected_fused_width=1728, k=k, num_target_layers=30,
                       dtype="float32").to_dict()
    events: list[Event] = [RunStart(run_id, "synthetic", "0", "target", "draft", config, ts_wall=T0),
                           RankStart(run_id, 0, 1, "host", 1, "cpu", ts_wall=T0)]
    end = T0
    for i, req in enumerate(requests):
        rid, t = f"r{i}", T0 + req.start
        events.append(RequestStart(run_id, rid, 0, req.prompt_tokens, temperature=req.temperature,
                                   top_p=1.0, top_k=0, ts_wall=t))
        for step, accepted in enumerate(req.accepted):
            t += req.step_s
            events.append(VerifyStep(run_id, rid, 0, step, k, accepted, ts_wall=t))
        emitted = sum(a + 1 for a in req.accepted)
        events.append(RequestEnd(run_id, rid, 0, emitted, len(req.accepted), text=req.text, ts_wall=t))
        end = max(end, t)
    events.append(RankStatus(run_id, 0, 0, 0, finished=True, ts_wall=end))
    return events


def write_run(store: Store, run_id: str, requests: Iterable[Req], k: int = K) -> str:
    """Write :func:`run_events` to ``store``; returns ``run_id``."""
    store.write(run_events(run_id, requests, k))
    return run_id
