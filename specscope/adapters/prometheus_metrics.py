"""Each serving engine's Prometheus speculative-decoding metrics, converted to specscope's one
definition of acceptance (docs/design.md, "Acceptance figures": AL = 1 + accepted / verify steps,
rate = accepted / proposed, p_i = steps with position i accepted / verify steps).

A scrape is parsed with ``prometheus_client.parser.text_string_to_metric_families`` into one
:class:`Reading` per series (an engine's metrics for one model and one rank label set): cumulative
counters by role, the per-position counters, and gauges. Two readings of a series give a
:class:`Window` of verify steps, proposed and accepted draft tokens and per-position accepted counts,
which :func:`window_groups` turns into :class:`~specscope.events.VerifyGroup` rows the store's views
weigh like the steps they stand for.

Engines and their conventions (metric names from each engine's source):

- vLLM (``vllm/v1/spec_decode/metrics.py``): counters ``vllm:spec_decode_num_drafts`` (verify steps),
  ``..._num_draft_tokens`` (proposed), ``..._num_accepted_tokens`` (accepted),
  ``..._num_accepted_tokens_per_pos{position}`` (position 0 first); labels ``model_name``,
  ``engine``. vLLM's AL = 1 + accepted / num_drafts is ours.
- llama.cpp server: the same counters with the prefix ``llamacpp:``.
- SGLang: gauges ``sglang:spec_accept_length`` (completion tokens per verify step, bonus included) and
  ``sglang:spec_accept_rate`` (accepted / (verify steps x (num_draft_tokens - 1))), counter
  ``sglang:spec_verify_calls_total``; labels ``tp_rank``, ``pp_rank``, ``dp_rank``. The gauges are
  values over SGLang's recent window, not cumulative: a stored window takes its verify steps from the
  counter's increase and accepted = (accept_length - 1) x steps, proposed = accepted / accept_rate
  from the gauges read at the window's end. That is exact only when the scrape interval matches
  SGLang's logging window; SGLang exposes no per-position figures (p_i stays unknown).
- TensorRT-LLM: counters ``trtllm_spec_decode_num_draft_tokens_total`` (proposed),
  ``..._num_accepted_tokens_total`` (accepted), per-position ``..._drafted_tokens_total`` and
  ``..._accepted_tokens_total`` with label ``token_position``, gauge ``..._acceptance_length``.
  Verify steps are the drafted tokens at the first position (every step drafts it); without the
  per-position counters, accepted / (acceptance_length - 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from specscope.events import VerifyGroup
from specscope.metrics import chain_mask

# Roles of a series' metrics: counters ("steps", "proposed", "accepted", "accepted_pos",
# "drafted_pos") and gauges ("accept_length", "accept_rate").
COUNTER_ROLES = ("steps", "proposed", "accepted")
POSITION_ROLES = ("accepted_pos", "drafted_pos")

MAX_VALUE = float(2**53)
"""Largest value a reading may hold: above it a float no longer counts whole tokens, and the store's
64-bit integers are in reach of a crafted exposition."""


@dataclass(frozen=True)
class Convention:
    """One engine's metric names (without ``_total``) by role, and its label meanings.

    ``metrics``: role -> metric name; ``position_label``: the label of per-position counters;
    ``model_label``: the label naming the served model (None: the engine has none).
    """

    engine: str
    metrics: Mapping[str, str]
    position_label: str = "position"
    model_label: str | None = None


def _prefixed(prefix: str, **names: str) -> dict[str, str]:
    return {role: prefix + name for role, name in names.items()}


_VLLM_NAMES = dict(steps="num_drafts", proposed="num_draft_tokens", accepted="num_accepted_tokens",
                   accepted_pos="num_accepted_tokens_per_pos")
CONVENTIONS: tuple[Convention, ...] = (
    Convention("vllm", _prefixed("vllm:spec_decode_", **_VLLM_NAMES), model_label="model_name"),
    Convention("llama.cpp", _prefixed("llamacpp:spec_decode_", **_VLLM_NAMES)),
    Convention("sglang", _prefixed("sglang:spec_", steps="verify_calls", accept_length="accept_length",
                                   accept_rate="accept_rate"), model_label="model_name"),
    Convention("tensorrt-llm", _prefixed("trtllm_spec_decode_", proposed="num_draft_tokens",
                                         accepted="num_accepted_tokens", drafted_pos="drafted_tokens",
                                         accepted_pos="accepted_tokens",
                                         accept_length="acceptance_length"),
               position_label="token_position", model_label="model_name"),
)


@dataclass(frozen=True)
class Reading:
    """One series at one scrape: ``values`` role -> value (counters cumulative, gauges as read),
    ``positions`` role -> {position: cumulative count}; positions numbered from 0 in the engine's
    order (TensorRT-LLM's first ``token_position`` becomes 0)."""

    engine: str
    model: str
    labels: tuple[tuple[str, str], ...]  # the rank's labels (model and position labels removed)
    values: dict[str, float] = field(default_factory=dict)
    positions: dict[str, dict[int, float]] = field(default_factory=dict)


def parse_exposition(text: str) -> list[Reading]:
    """Readings of every recognised speculative-decoding series in a Prometheus text exposition.

    Sample names are matched with ``_total`` removed (counters are exposed with it, the families
    without), ``_created`` samples are skipped.

    Raises:
        ValueError: the text is not the Prometheus exposition format (prometheus_client's parser), or
            holds none of the metrics of :data:`CONVENTIONS`.
    """
    by_name = {name: (conv, role) for conv in CONVENTIONS for role, name in conv.metrics.items()}
    readings: dict[tuple, Reading] = {}
    position_values: dict[tuple, dict[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = sample.name.removesuffix("_total")
            if name not in by_name:
                continue
            conv, role = by_name[name]
            labels = {_printable(k): _printable(v) for k, v in sample.labels.items()}
            model = labels.pop(conv.model_label, "") if conv.model_label else ""
            position = labels.pop(conv.position_label, None) if role in POSITION_ROLES else None
            key = (conv.engine, model, tuple(sorted(labels.items())))
            reading = readings.setdefault(key, Reading(conv.engine, model, key[2]))
            if role in POSITION_ROLES:
                if position is None:
                    raise ValueError(f"{sample.name} has no {conv.position_label!r} label")
                position_values.setdefault(key, {}).setdefault(role, {})[position] = float(sample.value)
            else:
                reading.values[role] = float(sample.value)
    if not readings:
        raise ValueError("no speculative-decoding metrics of vLLM, SGLang, TensorRT-LLM or llama.cpp")
    for key, roles in position_values.items():
        for role, values in roles.items():
            ordered = sorted(values, key=_position_order)
            readings[key].positions[role] = {i: values[p] for i, p in enumerate(ordered)}
    return list(readings.values())


def _printable(text: str) -> str:
    """Label text as stored: what a scraped server sends reaches the store, and PostgreSQL refuses
    NUL in text; control characters and NUL become U+FFFD."""
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text)


def check_reading(reading: Reading) -> None:
    """Refuse a reading no engine produces: a value that is not finite, negative, or above
    :data:`MAX_VALUE`.

    Raises:
        ValueError: names the first such value.
    """
    named = [*reading.values.items(),
             *((f"{role}[{i}]", v) for role, values in reading.positions.items() for i, v in values.items())]
    for name, value in named:
        if not (math.isfinite(value) and 0.0 <= value <= MAX_VALUE):
            raise ValueError(f"{reading.engine} {name} = {value!r} is not a count (finite, 0 to 2**53)")


def _position_order(position: str) -> tuple[int, str]:
    return (int(position), "") if position.lstrip("-").isdigit() else (1 << 30, position)


class IncompleteReading(ValueError):
    """A reading lacks a counter its series' previous reading had, with no reset (a cut-off answer):
    the series waits for a complete reading."""


@dataclass(frozen=True)
class Window:
    """Acceptance of one series between two scrapes, in specscope's definition: ``steps`` verify
    steps, ``proposed`` / ``accepted`` draft tokens, ``accepted_pos`` per-position accepted steps
    (position 0 first; empty when the engine gives none)."""

    steps: int
    proposed: int
    accepted: int
    accepted_pos: tuple[int, ...] = ()


def is_reset(previous: Reading, current: Reading) -> bool:
    """Whether the series restarted between two readings: one of its counters went down, or a
    per-position counter it had is gone (a restarted llama.cpp server creates them at its first
    draft). A restart resets every counter of the series, so the whole window counts from 0."""
    counters = [(previous.values.get(role), current.values.get(role)) for role in COUNTER_ROLES]
    for role in POSITION_ROLES:
        now = current.positions.get(role, {})
        counters += [(before, now.get(i, -1.0)) for i, before in previous.positions.get(role, {}).items()]
    return any(before is not None and after is not None and after < before for before, after in counters)


def window(previous: Reading | None, current: Reading) -> Window:
    """The :class:`Window` between two readings of one series (``previous`` None: the baseline scrape,
    an empty window). A counter that ``previous`` lacks was created since, at 0 (llama.cpp creates its
    per-position counters at the first draft); a reset (:func:`is_reset`) counts every counter of the
    series from 0, as Prometheus ``rate()`` counts a reset.

    Raises:
        ValueError: the window is not one an engine produces (more accepted than proposed tokens, or a
            position accepted more often than there were steps); :class:`IncompleteReading` when
            ``current`` lacks a counter ``previous`` had without a reset.
    """
    if previous is None:
        return Window(0, 0, 0)
    if is_reset(previous, current):
        previous = Reading(current.engine, current.model, current.labels)
    missing = [role for role in COUNTER_ROLES if role in previous.values and role not in current.values]
    if missing:  # counted as absent, its next reading would count whole again
        raise IncompleteReading(f"{current.engine} reading lacks {', '.join(missing)}, which the previous one had "
                         "(a cut-off answer?): the series waits for a complete reading")

    def delta(role: str) -> float | None:
        if role not in current.values:
            return None
        return current.values[role] - previous.values.get(role, 0.0)

    def deltas(role: str) -> tuple[float, ...]:
        now, before = current.positions.get(role, {}), previous.positions.get(role, {})
        return tuple(now[i] - before.get(i, 0.0) for i in sorted(now))

    accepted_pos, drafted_pos = deltas("accepted_pos"), deltas("drafted_pos")
    steps, proposed, accepted = delta("steps"), delta("proposed"), delta("accepted")
    length, rate = current.values.get("accept_length"), current.values.get("accept_rate")
    if steps is None and drafted_pos:
        steps = drafted_pos[0]  # TensorRT-LLM: every verify step drafts the first position
    if accepted is None and steps is not None and length is not None:
        accepted = max(length - 1.0, 0.0) * steps  # SGLang: accept length includes the bonus token
    if steps is None and accepted is not None and length is not None and length > 1.0:
        steps = accepted / (length - 1.0)
    if proposed is None and accepted is not None and rate:
        proposed = accepted / rate
    result = Window(round(steps or 0), round(proposed or 0), round(accepted or 0),
                    tuple(round(a) for a in accepted_pos))
    if (proposed is not None and result.accepted > result.proposed) or any(
            a > result.steps for a in result.accepted_pos if steps is not None):
        raise ValueError(f"{current.engine} window is not an engine's: {result}")
    return result


def window_groups(w: Window, *, run_id: str, request_id: str, rank: int, ts_wall: float) -> list[VerifyGroup]:
    """The window as VerifyGroup rows, one per accepted mask.

    With per-position counts of a chain (steps >= p_0 >= p_1 >= ..., their sum = accepted), the
    steps that accepted exactly j drafts are ``p_{j-1} - p_j`` (``p_{-1}`` = steps, ``p_k`` = 0), each
    group with mask ``'1' * j + '0' * (k - j)``: the views then compute the engine's own AL, rate and
    p_i exactly. Proposed tokens are spread at the window's mean per step, no group proposing fewer
    than it accepted nor more than k per step (beyond k x steps in all, the rest goes to the largest
    group). Without per-position counts, or counts that are not a chain's, one group with an empty
    mask (no per-position figure). Empty windows give no row.
    """
    if w.steps <= 0:
        return []
    pos, k = w.accepted_pos, len(w.accepted_pos)
    chain = bool(pos) and sum(pos) == w.accepted and all(
        a >= b for a, b in zip((w.steps, *pos), (*pos, 0)))
    if not chain:
        return [VerifyGroup(run_id, request_id, rank, "", w.steps, w.proposed, w.accepted, ts_wall)]
    counts = [a - b for a, b in zip((w.steps, *pos), (*pos, 0))]  # counts[j]: steps accepting j drafts
    # each group drafts the window's mean per step, within [its accepted, k] per step; the rounding
    # rest goes to the largest groups first (more than k per step, if any, to the largest)
    per_step = w.proposed / w.steps
    proposed = [max(n * j, min(n * k, int(n * per_step))) for j, n in enumerate(counts)]
    rest = w.proposed - sum(proposed)
    for j in sorted(range(len(counts)), key=lambda j: counts[j], reverse=True):
        room = counts[j] * k - proposed[j] if rest > 0 else proposed[j] - counts[j] * j
        move = min(room, abs(rest))
        proposed[j] += move if rest > 0 else -move
        rest -= move if rest > 0 else -move
    proposed[counts.index(max(counts))] += rest
    return [VerifyGroup(run_id, request_id, rank, chain_mask(j, k), n, proposed[j], n * j, ts_wall)
            for j, n in enumerate(counts) if n > 0]
