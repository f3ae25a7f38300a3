"""Each serving engine's Prometheus speculative-decoding metrics, converted to specscope's one
definition of acceptance (docs/design.md, "Acceptance figures": AL = 1 + accepted / verify steps,
rate = accepted / proposed, p_i = steps with position i accepted / verify steps).

A scrape is parsed (:func:`read_exposition`, each sample line of these metrics alone, within a time
limit and a number of series) with ``prometheus_client.parser.text_string_to_metric_families`` into one
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
import threading
import time
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


MAX_SERIES = 256
"""Most series one exposition gives (an engine's rank label sets times its models): a real server has
a few; more are dropped, said in :attr:`Exposition.dropped`, so a crafted answer cannot cost a run
(and a verdict at the watch's end) per label."""

MAX_LINE = 4096
"""Longest sample line read (characters): prometheus_client's parser is quadratic in a line's length
(a 3.5 MB line of escaped quotes parses for minutes); a real one is a few hundred."""

_NAMES = {name: (conv, role) for conv in CONVENTIONS for role, name in conv.metrics.items()}
_PREFIXES = tuple(_NAMES)


@dataclass(frozen=True)
class Exposition:
    """What one exposition gave: ``readings`` (one per series), and ``dropped``, one phrase per kind
    of thing left unread (series over :data:`MAX_SERIES`, over-long or malformed sample lines)."""

    readings: list[Reading]
    dropped: tuple[str, ...] = ()


def read_exposition(text: str, *, max_series: int = MAX_SERIES, deadline: float | None = None,
                    stop: threading.Event | None = None) -> Exposition:
    """The readings of every recognised speculative-decoding series in a Prometheus text exposition,
    at most ``max_series``, read by ``deadline`` (``time.monotonic()``) unless ``stop`` is set first.

    Only sample lines of :data:`CONVENTIONS`' metrics are parsed, each alone (with
    ``prometheus_client.parser``): a line that is no sample costs only itself. Sample names are matched
    with ``_total`` removed (counters are exposed with it, the families without), ``_created`` samples
    are skipped.

    Raises:
        ValueError: the text holds none of the metrics of :data:`CONVENTIONS`.
        TimeoutError: ``deadline`` passed or ``stop`` was set before the text was read.
    """
    readings: dict[tuple, Reading] = {}
    positions: dict[tuple, dict[str, dict[str, float]]] = {}
    over: set[tuple] = set()
    long = malformed = 0
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(_PREFIXES):
            continue
        if (deadline is not None and time.monotonic() > deadline) or (stop is not None and stop.is_set()):
            raise TimeoutError("stopped" if stop is not None and stop.is_set()
                               else "the exposition was not read within the time limit")
        if len(line) > MAX_LINE:
            long += 1
            continue
        try:
            (family,) = text_string_to_metric_families(line)
            (sample,) = family.samples
        except Exception:  # noqa: BLE001 - a crafted line may trip the parser any way: that line only
            malformed += 1
            continue
        name = sample.name.removesuffix("_total")
        if sample.name.endswith("_created") or name not in _NAMES:
            continue
        conv, role = _NAMES[name]
        labels = {_printable(k): _printable(v) for k, v in sample.labels.items()}
        model = labels.pop(conv.model_label, "") if conv.model_label else ""
        position = labels.pop(conv.position_label, None) if role in POSITION_ROLES else None
        key = (conv.engine, model, tuple(sorted(labels.items())))
        if key not in readings and len(readings) >= max_series:
            over.add(key)
            continue
        reading = readings.setdefault(key, Reading(conv.engine, model, key[2]))
        if role not in POSITION_ROLES:
            reading.values[role] = float(sample.value)
        elif position is None:
            malformed += 1
        else:
            positions.setdefault(key, {}).setdefault(role, {})[position] = float(sample.value)
    dropped = [f"{len(over)} series over the {max_series} kept (one: {_series_name(min(over))})"] if over else []
    dropped += [f"{long} sample line(s) over {MAX_LINE} characters"] if long else []
    dropped += [f"{malformed} malformed sample line(s)"] if malformed else []
    if not readings:
        raise ValueError("no speculative-decoding metrics of vLLM, SGLang, TensorRT-LLM or llama.cpp"
                         + "".join(f"; dropped {d}" for d in dropped))
    for key, roles in positions.items():
        for role, values in roles.items():
            ordered = sorted(values, key=_position_order)
            readings[key].positions[role] = {i: values[p] for i, p in enumerate(ordered)}
    return Exposition(list(readings.values()), tuple(dropped))


def parse_exposition(text: str) -> list[Reading]:
    """:func:`read_exposition`'s readings, with no time limit (for a check against an engine's own
    counters)."""
    return read_exposition(text).readings


def _series_name(key: tuple) -> str:
    engine, model, labels = key
    return " ".join([engine, *([f"model {model!r}"] if model else []), *(f"{k}={v}" for k, v in labels)])[:120]


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
    if proposed is None and result.accepted > 0:  # SGLang without its accept_rate gauge
        raise ValueError(f"{current.engine} reading gives {result.accepted} accepted draft tokens and no count "
                         "of proposed ones")
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
