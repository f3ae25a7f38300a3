"""One stored request re-scored by the target alone (docs/design.md, "Replay against the target").

The target's view of each output position comes teacher-forced from one forward over prompt +
output: either full logits (transformers), or, from a server, the log-probabilities of the emitted
token and of the target's own first choice there (the difference of two log-probabilities is the
difference of the logits). Greedy requests: each position whose emitted token is not the target's
argmax is a departure, with its logit margin (best logit minus the emitted token's); a margin within
``near_tie_margin`` is the numerics of a batch shape (a (k+1)-token verify forward is not
bit-identical to a one-token forward), beyond it a bug. Sampled requests, with full logits: the
audit's own per-token judgement (:class:`specscope.instrumentation.Auditor`, every token), so the
same tests in SQL (``v_replay_audit``) judge the replayed distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specscope.events import LosslessAudit, ReplayResult
from specscope.instrumentation import Auditor, AuditSlot

NEAR_TIE_MARGIN = 0.25
"""Largest logit margin (target's best logit minus the emitted token's) still read as a near-tie. A
bf16 forward of another batch shape moves logits by up to about 0.1 (one bf16 ulp of a logit near 16
is 0.125); float32 by about 1e-4. A bug (the draft's token emitted, another request's settings) leaves
margins of whole logits."""


@dataclass(frozen=True)
class ReplayInput:
    """A stored request as a replay reads it: its sampling settings (``temperature`` 0 = greedy) and
    token ids."""

    request_id: str
    sampling: str
    temperature: float
    top_p: float | None
    top_k: int | None
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def departures(margins: Sequence[float], near_tie_margin: float) -> dict:
    """The :class:`~specscope.events.ReplayResult` fields of a greedy request's per-position margins
    (0: the emitted token is the target's argmax, ties included)."""
    departed = [(i, m) for i, m in enumerate(margins) if m > 0]
    if not departed:
        return {"departures": 0, "near_ties": 0}
    first, first_margin = departed[0]
    return {"departures": len(departed), "near_ties": sum(m <= near_tie_margin for _, m in departed),
            "first_departure": first, "first_margin": float(first_margin),
            "max_margin": float(max(m for _, m in departed))}


def _greedy(item: ReplayInput, margins: Sequence[float], argmax: Callable[[int], int], run_id: str, source: str,
            near_tie_margin: float) -> ReplayResult:
    """A greedy request's result from its per-position margins; ``argmax(i)``: the target's choice at i."""
    found = departures(margins, near_tie_margin)
    example = None
    if found["departures"]:
        i = found["first_departure"]
        example = {"position": i, "emitted_token": item.output_ids[i], "target_argmax": argmax(i),
                   "margin": found["first_margin"]}
    audit = LosslessAudit(run_id, 0, item.request_id, item.sampling, len(item.output_ids),
                          mismatches=found["departures"] - found["near_ties"], example=example)
    return ReplayResult(run_id, item.request_id, source, near_tie_margin, audit, **found)


def score_logits(item: ReplayInput, logits: torch.Tensor, run_id: str, source: str,
                 near_tie_margin: float = NEAR_TIE_MARGIN, seed: int = 0) -> ReplayResult:
    """Judge ``item`` by the target's ``logits`` (N, V) at its N >= 1 output positions (row i: the
    logits that predict output token i, before temperature)."""
    logits = logits.float()
    emitted = torch.tensor(item.output_ids, dtype=torch.long, device=logits.device)  # (N,)
    if item.greedy:
        margins = logits.max(dim=-1).values - logits.gather(-1, emitted[:, None])[:, 0]  # (N,)
        return _greedy(item, margins.tolist(), lambda i: int(logits[i].argmax()), run_id, source, near_tie_margin)
    n = len(item.output_ids)
    audits: list[LosslessAudit] = []
    auditor = Auditor(audits.append, run_id, 0, every=1, seed=seed)
    auditor.submit(logits, emitted, torch.full((n,), item.temperature),
                   [AuditSlot(item.request_id, item.sampling, i) for i in range(n)],
                   None if item.top_k is None else torch.full((n,), item.top_k),
                   None if item.top_p is None else torch.full((n,), item.top_p))
    auditor.drain(wait=True)
    (audit,) = audits  # one request, one sampling group: one event
    return ReplayResult(run_id, item.request_id, source, near_tie_margin, audit)


def score_margins(item: ReplayInput, margins: Sequence[float] | None, argmax: Sequence[int], run_id: str,
                  source: str, near_tie_margin: float = NEAR_TIE_MARGIN) -> ReplayResult:
    """Judge ``item`` by its per-position margins alone (a server's log-probabilities; ``argmax``: the
    target's first choice at each position). Sampled requests are counted, not scored: a server
    returns a few log-probabilities per position, not the distribution the sampled tests need."""
    if item.greedy and margins is not None:
        return _greedy(item, margins, argmax.__getitem__, run_id, source, near_tie_margin)
    audit = LosslessAudit(run_id, 0, item.request_id, item.sampling, len(item.output_ids))
    return ReplayResult(run_id, item.request_id, source, near_tie_margin, audit)
