"""What one finished response says of its request's acceptance, per engine (the formats are in
:mod:`specscope.adapters.recorder`'s docstring), as verify-step events: the recorder's parsing, kept
apart from its transport."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specscope.adapters.prometheus_metrics import Window, window_groups
from specscope.events import MAX_COUNT, MAX_PROPOSED, VerifyGroup, VerifyStep
from specscope.metrics import chain_mask

_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")
"""Request fields that cap its generated tokens (OpenAI, llama.cpp; SGLang's sit in ``sampling_params``)."""


@dataclass(frozen=True)
class Reading:
    """One request's acceptance as its response gave it: ``steps`` (VerifyStep / VerifyGroup events),
    ``output`` / ``prompt`` tokens, ``k`` the server's draft tokens per step where it says (vLLM's
    ``num_spec_tokens``; None elsewhere) and ``largest`` the most tokens one step of it drafted
    (0 where only totals came back)."""

    steps: list[VerifyStep | VerifyGroup]
    output: int
    prompt: int
    k: int | None
    largest: int

    @property
    def verify_steps(self) -> int:
        return sum(getattr(s, "steps", 1) for s in self.steps)


def count(value: object) -> int | None:
    """A token count from a JSON value (an int or float, 0 to ``MAX_COUNT``), or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COUNT:
        return None  # NaN fails the comparison too
    return int(value)


def first(*values: object) -> int:
    """The first of ``values`` that is a token count, else 0."""
    return next((c for c in map(count, values) if c is not None), 0)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def read(last: dict[str, Any], drafts: list[tuple[int, int]] | None, request: dict[str, Any], answer_bytes: int,
         *, run_id: str, request_id: str, ts_wall: float, k: int | None) -> Reading | None:
    """The request's acceptance from ``last`` (the response's merged top-level fields), ``drafts``
    (a llama.cpp stream's cumulative counters per change; None when not streamed) and ``k`` (the
    recorder's), or None when the response carries none or counts no engine sends. Plausible counts
    only: each verify step emits at least one token, and a request generates no more tokens than it
    allowed (``max_tokens`` ...) nor than its answer has bytes (every returned token costs one)."""
    ids = {"run_id": run_id, "request_id": request_id, "ts_wall": ts_wall}
    spec = _dict(_dict(last.get("metrics")).get("speculative_decoding"))
    meta = _dict(last.get("meta_info"))
    if spec:
        reading = _vllm(spec, _dict(last.get("usage")), ids)
    elif count(meta.get("spec_verify_ct")):
        reading = _sglang(meta, ids, k)
    else:
        reading = _llamacpp(last, drafts, ids)
    if reading is None or not reading.verify_steps <= reading.output <= min(answer_bytes, _limit(request)):
        return None
    return reading


def _limit(request: dict[str, Any]) -> int:
    """The most tokens the request let the server generate (MAX_COUNT when it set no limit)."""
    fields = [request.get(name) for name in _LIMITS] + [_dict(request.get("sampling_params")).get("max_new_tokens")]
    return min((c for c in map(count, fields) if c is not None), default=MAX_COUNT)


def _per_step(proposed: Sequence[int], accepted: Sequence[int], ids: dict[str, Any]) -> list[VerifyStep]:
    return [VerifyStep(ids["run_id"], ids["request_id"], 0, i, p, a, chain_mask(a, p), ts_wall=ids["ts_wall"])
            for i, (p, a) in enumerate(zip(proposed, accepted))]


def _totals(steps: int, proposed: int, accepted: int, ids: dict[str, Any]) -> list[VerifyGroup]:
    """One group without a mask: exact totals, no per-position figure (the views leave it out of p_i)."""
    return [VerifyGroup(ids["run_id"], ids["request_id"], 0, "", steps, proposed, accepted, ids["ts_wall"])] if steps else []


def _histogram(hist: object, steps: int, proposed: int, accepted: int, ids: dict[str, Any]) -> list[VerifyGroup] | None:
    """Groups of one chain mask each from a histogram of accepted drafts per step (index j: the steps
    that accepted exactly j), exact per position; None unless it is one of these steps'."""
    counts = [count(n) for n in hist] if isinstance(hist, list) and 1 < len(hist) <= MAX_PROPOSED + 1 else []
    if not counts or None in counts or sum(counts) != steps or sum(j * n for j, n in enumerate(counts)) != accepted:
        return None
    if not accepted <= proposed <= steps * MAX_PROPOSED:
        return None
    pos = tuple(sum(counts[i + 1:]) for i in range(len(counts) - 1))  # steps accepting position i
    return window_groups(Window(steps, proposed, accepted, pos), rank=0, **ids)


def _vllm(spec: dict[str, Any], usage: dict[str, Any], ids: dict[str, Any]) -> Reading | None:
    """vLLM's ``metrics.speculative_decoding``: per step (``detailed``), else by its histogram
    (``summary``), else its totals."""
    k = count(spec.get("num_spec_tokens"))
    steps, proposed, accepted = (count(spec.get(name)) for name in
                                 ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens"))
    if None in (steps, proposed, accepted) or accepted > proposed:
        return None
    drafted, taken = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    output, prompt = first(usage.get("completion_tokens")), first(usage.get("prompt_tokens"))
    if _chain_steps(drafted, taken, k) and (len(drafted), sum(drafted), sum(taken)) == (steps, proposed, accepted):
        return Reading(_per_step(drafted, taken, ids), output, prompt, k, max(drafted, default=0))
    groups = _histogram(spec.get("acceptance_histogram"), steps, proposed, accepted, ids)
    if groups is None and not proposed <= steps * MAX_PROPOSED:
        return None
    return Reading(groups if groups is not None else _totals(steps, proposed, accepted, ids), output, prompt, k, 0)


def _chain_steps(drafted: object, taken: object, k: int | None) -> bool:
    """Whether two per-step arrays are one engine's: equal lengths, 0 <= accepted <= drafted <= k."""
    top = MAX_PROPOSED if k is None else min(k, MAX_PROPOSED)
    return (isinstance(drafted, list) and isinstance(taken, list) and len(drafted) == len(taken)
            and all(type(p) is int and type(a) is int and 0 <= a <= p <= top for p, a in zip(drafted, taken)))


def _sglang(meta: dict[str, Any], ids: dict[str, Any], k: int | None) -> Reading | None:
    """SGLang's ``meta_info``: its accepted / proposed counts (``spec_num_correct_drafts`` /
    ``spec_num_proposed_drafts``, earlier ``spec_accept_token_num`` / ``spec_draft_token_num``),
    else derived from its accept length and rate; per position from its histogram where it sends one."""
    steps = count(meta["spec_verify_ct"])
    output, prompt = first(meta.get("completion_tokens")), first(meta.get("prompt_tokens"))
    accepted = _named(meta, "spec_num_correct_drafts", "spec_accept_token_num")
    accepted = max(output - steps, 0) if accepted is None else accepted
    proposed = _named(meta, "spec_num_proposed_drafts", "spec_draft_token_num")
    proposed = _sglang_proposed(accepted, meta.get("spec_accept_rate"), steps, k) if proposed is None else proposed
    if proposed is None or not accepted <= proposed <= steps * MAX_PROPOSED:
        return None
    hist = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))
    groups = _histogram(hist, steps, proposed, accepted, ids)
    return Reading(groups if groups is not None else _totals(steps, proposed, accepted, ids), output, prompt, None, 0)


def _named(meta: dict[str, Any], *names: str) -> int | None:
    return next((c for c in (count(meta.get(name)) for name in names) if c is not None), None)


def _sglang_proposed(accepted: int, rate: object, steps: int, k: int | None) -> int | None:
    """Proposed draft tokens from SGLang's accept rate (accepted / proposed), or ``k`` x steps when
    nothing was accepted; None when no count follows (a rate outside (0, 1], or one so small that
    the count would pass ``MAX_COUNT``)."""
    if accepted == 0:
        return min(steps * (k or 0), MAX_COUNT)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        return None
    proposed = accepted / rate
    return max(round(proposed), accepted) if proposed <= MAX_COUNT else None


def _llamacpp(last: dict[str, Any], drafts: list[tuple[int, int]] | None, ids: dict[str, Any]) -> Reading | None:
    """llama.cpp's ``timings``: per draft from a stream's changes, else the totals."""
    usage, timings = _dict(last.get("usage")), _dict(last.get("timings"))
    output = first(usage.get("completion_tokens"), last.get("tokens_predicted"), timings.get("predicted_n"))
    # a streamed chat answer carries no usage: its prompt is the tokens reused from the cache plus
    # those evaluated
    prompt = first(usage.get("prompt_tokens"), last.get("tokens_evaluated"),
                   first(timings.get("cache_n")) + first(timings.get("prompt_n")))
    deltas = _draft_deltas(drafts) if drafts is not None else None
    if deltas:
        proposed, accepted = zip(*deltas)
        return Reading(_per_step(proposed, accepted, ids), output, prompt, None, max(proposed))
    proposed = count(timings.get("draft_n"))
    if proposed is None:
        return None
    accepted = count(timings.get("draft_n_accepted")) or 0
    if accepted > proposed:
        return None
    # each target step after the first token emits its accepted drafts plus one
    n = max(output - 1 - accepted, 1 if proposed else 0)
    if proposed > n * MAX_PROPOSED:
        return None
    return Reading(_totals(n, proposed, accepted, ids), output, prompt, None, 0)


def _draft_deltas(drafts: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """``(proposed, accepted)`` of each draft from the cumulative counters, or None when a change is
    not one draft (more than ``MAX_PROPOSED`` tokens, fewer accepted than before, more accepted than
    proposed): then only the totals are trusted."""
    deltas = [(p - p0, a - a0) for (p, a), (p0, a0) in zip(drafts, [(0, 0), *drafts])]
    ok = all(0 < p <= MAX_PROPOSED and 0 <= a <= p for p, a in deltas)
    return deltas if ok else None
