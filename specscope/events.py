"""Events: what the instrumentation records and the collector writes (docs/design.md, "Event model").

Plain frozen dataclasses sharing one protocol (:class:`EventBase`); the sink, the store and any
exporter are separate objects consuming them. ``ts_wall`` is the wall clock (``time.time()``, so
processes line up), durations are seconds (``*_s``), shapes tuples of ints. Adding an event type:
its dataclass here (in :data:`Event`) and its route in ``storage/_rows.py``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from specscope import event_checks as checks
from specscope.event_checks import MAX_COUNT, MAX_PROPOSED, PIT_BINS, SEVERITIES, storable_text
from specscope.metrics import chain_mask
from specscope.run_config import UNHOOKED_SOURCES, RunConfig, unhooked

__all__ = ["MAX_COUNT", "MAX_PROPOSED", "PIT_BINS", "SEVERITIES", "UNHOOKED_SOURCES", "Event", "EventBase",
           "Finding", "LoadReport", "LosslessAudit", "ProvenanceEvent", "RankStart", "RankStatus", "RequestEnd",
           "ReplayResult", "RequestStart", "RequestTokens", "RunConfig", "RunStart", "Shape", "Sink", "TensorEvent", "VerifyGroup", "VerifyStep",
           "by_severity", "now", "prompt_key", "sampling_label", "storable_text", "unhooked"]

Shape = tuple[int, ...]


def now() -> float:
    """Wall clock in seconds since the Unix epoch, the clock every ``ts_wall`` uses."""
    return time.time()


class EventBase:
    """What every event has: the ``kind`` it is named by, the ``run_id`` and ``rank`` it is counted
    under (a ``run_ranks`` row), and ``ts_wall``."""

    __slots__ = ()
    kind: ClassVar[str]
    run_id: str | None
    rank: int
    ts_wall: float


class Sink(Protocol):
    """Where events go (e.g. ``specscope.collector.Collector``); ``emit`` never blocks."""

    def emit(self, event: Event) -> None: ...
    def flush(self, timeout_s: float | None = None) -> bool: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RunStart(EventBase):
    """A run: one engine process group's lifetime. Every rank writes it; the first one wins.
    ``config`` is the contract (:meth:`RunConfig.to_dict`), stored as JSON."""

    kind: ClassVar[str] = "run_start"
    run_id: str
    engine: str
    engine_version: str
    target_model: str
    draft_model: str
    config: dict[str, Any]
    fault: str | None = None
    world_size: int = 1
    host: str = ""
    rank: int = 0
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_run_start(self)


@dataclass(frozen=True, slots=True)
class RankStart(EventBase):
    """One engine process (rank) of a run came up on ``device`` (e.g. ``cpu``, ``cuda:0``)."""

    kind: ClassVar[str] = "rank_start"
    run_id: str
    rank: int
    world_size: int
    host: str
    pid: int
    device: str
    ts_wall: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class RankStatus(EventBase):
    """The tracer's counters, sent periodically and at close (``finished``; with ``error``, the rank crashed
    on it). ``hook_errors``: exceptions caught inside hooks. ``graph_mode``: ``"eager"``, ``"compiled"``
    (torch.compile; capture layers seen through specscope's op), ``"cuda_graph"`` (replays read from the
    buffer the captured graphs write), ``"capture_only"`` (replays invisible) or ``"mixed"``."""

    kind: ClassVar[str] = "rank_status"
    run_id: str
    rank: int
    hook_calls: int
    hook_errors: int
    graph_mode: str = "eager"
    finished: bool = False
    error: str | None = None
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_rank_status(self)


@dataclass(frozen=True, slots=True)
class RequestStart(EventBase):
    """A request entered the engine with ``prompt_tokens`` tokens. Sampling as the engine applies it,
    None where it does not say: ``temperature`` (0 = greedy), ``top_p`` (1 = off), ``top_k`` (0 or -1
    = off). ``prompt_key``: :func:`prompt_key` of the prompt, to compare runs request by request."""

    kind: ClassVar[str] = "request_start"
    run_id: str
    request_id: str
    rank: int
    prompt_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    prompt_key: str | None = None
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_counts("request start", prompt_tokens=self.prompt_tokens)

    @property
    def sampling(self) -> str | None:
        """The request's sampling group (None: settings unknown)."""
        return sampling_label(self.temperature, self.top_p, self.top_k)


def sampling_label(temperature: float | None, top_p: float | None = None, top_k: int | None = None
                   ) -> str | None:
    """The one name of a sampling group: ``'greedy'`` (temperature 0), else ``'T=0.8'`` with
    ``' top_p=0.9'`` / ``' top_k=50'`` where they truncate; None when the temperature is unknown."""
    if temperature is None:
        return None
    if temperature == 0:
        return "greedy"
    label = f"T={temperature:g}"
    if top_p is not None and top_p < 1:
        label += f" top_p={top_p:g}"
    if top_k is not None and top_k > 0:
        label += f" top_k={top_k}"
    return label


def prompt_key(prompt: str | Sequence[int]) -> str:
    """A stable 16-hex-digit key of a prompt (its token ids, or its text), the same in every process."""
    body = prompt if isinstance(prompt, str) else ",".join(str(int(t)) for t in prompt)
    return hashlib.sha1(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RequestEnd(EventBase):
    """A request finished with ``output_tokens`` generated (bonus tokens included): ``text``, or its
    ``output_ids`` for the collector to decode off the engine thread."""

    kind: ClassVar[str] = "request_end"
    run_id: str
    request_id: str
    rank: int
    output_tokens: int
    verify_steps: int
    text: str | None = None
    ts_wall: float = field(default_factory=now)
    output_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        checks.check_request_end(self)


@dataclass(frozen=True, slots=True)
class VerifyStep(EventBase):
    """One verify step of one request (docs/design.md, "Acceptance figures"): ``proposed`` draft
    tokens verified, ``accepted`` of them (the step emits ``accepted + 1``). ``accepted_mask``: '0'/'1'
    per position, position 0 first (None = a chain's prefix). ``draft_s`` / ``verify_s``: phase wall
    times. ``emitted``: the emitted tokens' text, bonus last, or ``emitted_ids`` to decode later."""

    kind: ClassVar[str] = "verify_step"
    run_id: str
    request_id: str
    rank: int
    step: int
    proposed: int
    accepted: int
    accepted_mask: str | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    emitted: tuple[str, ...] | None = None
    ts_wall: float = field(default_factory=now)
    emitted_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        checks.check_verify_step(self)

    def mask(self) -> str:
        """The per-position mask, derived from ``accepted`` for a chain when not given."""
        if self.accepted_mask is not None:
            return self.accepted_mask
        return chain_mask(self.accepted, self.proposed)


@dataclass(frozen=True, slots=True)
class VerifyGroup(EventBase):
    """``steps`` verify steps of one request sharing ``accepted_mask`` (``""``: no per-position data),
    with ``proposed`` / ``accepted`` summed: requests sampled out of step detail, and servers watched
    through their Prometheus counters. Stored as a ``verify_steps`` row with ``step`` -1."""

    kind: ClassVar[str] = "verify_group"
    run_id: str
    request_id: str
    rank: int
    accepted_mask: str
    steps: int
    proposed: int
    accepted: int
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_verify_group(self)


@dataclass(frozen=True, slots=True)
class TensorEvent(EventBase):
    """A tensor seen at a hook point (``draft.forward:hidden_states``, ``target.layers.15:input``).
    Shape and dtype come from metadata; ``absmax`` / ``mean`` / ``nonfinite`` read values (a device
    sync), only on sampled calls when asked. ``expected_shape``: the contract (-1 = free).
    ``graph_phase``: ``"eager"``, ``"capture"`` or ``"replay"`` (read from a replayed graph's buffer)."""

    kind: ClassVar[str] = "tensor"
    run_id: str
    rank: int
    hook_point: str
    call_index: int
    shape: Shape
    dtype: str
    device: str
    expected_shape: Shape | None = None
    absmax: float | None = None
    mean: float | None = None
    nonfinite: int | None = None
    request_id: str | None = None
    step: int | None = None
    graph_phase: str = "eager"
    ts_wall: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class ProvenanceEvent(EventBase):
    """Which target layers a sampled draft call's aux hidden states came from: for each target-width
    chunk of the draft input (``width`` wide), the layer matched by fingerprint (None = no match; the
    final norm is ``num_target_layers``), beside the ``configured`` capture points."""

    kind: ClassVar[str] = "provenance"
    run_id: str
    rank: int
    call_index: int
    configured: tuple[int, ...]
    received: tuple[int | None, ...]
    width: int
    request_id: str | None = None
    step: int | None = None
    ts_wall: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class LoadReport(EventBase):
    """What a loader did with a checkpoint's keys for one module: parameters left ``missing``,
    ``unexpected`` keys dropped, keys ``renamed`` (checkpoint key -> parameter), and whether it is
    ``strict`` (raises on missing / unexpected keys instead of dropping them silently)."""

    kind: ClassVar[str] = "load_report"
    run_id: str
    rank: int
    module: str
    source: str
    strict: bool
    loaded: int
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_load_report(self)


@dataclass(frozen=True, slots=True)
class LosslessAudit(EventBase):
    """One request's audited tokens against the target (docs/design.md, "Losslessness audit"): greedy
    ``mismatches``; sampled ``rare`` (``rare_expected``), ``p_sum`` / ``p2_sum`` / ``p_var_sum``, ``pit``,
    ``event_checks.SURPRISE_COLUMNS`` and ``RECOVERED_COLUMNS``; ``example``: the first violation."""

    kind: ClassVar[str] = "lossless_audit"
    run_id: str
    rank: int
    request_id: str
    sampling: str
    tokens: int
    mismatches: int = 0
    rare: int = 0
    rare_expected: float = 0.0
    p_sum: float = 0.0
    p2_sum: float = 0.0
    epsilon: float = 0.0
    example: dict[str, Any] | None = None
    p_var_sum: float = 0.0
    pit: tuple[int, ...] = ()
    surprise_sum: float = 0.0
    entropy_sum: float = 0.0
    surprise_var_sum: float = 0.0
    entropy_max: float = 0.0
    recovered: int = 0
    recovered_as_draft: int = 0
    recovered_p_sum: float = 0.0
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_lossless_audit(self)


@dataclass(frozen=True, slots=True)
class RequestTokens(EventBase):
    """A request's token ids, for a replay (docs/design.md, "Replay against the target")."""
    kind: ClassVar[str] = "request_tokens"
    run_id: str
    rank: int
    request_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_truncated: bool = False
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_request_tokens(self)


@dataclass(frozen=True, slots=True)
class ReplayResult(EventBase):
    """A request re-scored by the target alone (docs/design.md, "Replay against the target")."""
    kind: ClassVar[str] = "replay_result"
    run_id: str
    request_id: str
    source: str
    near_tie_margin: float
    audit: LosslessAudit  # the audit's judgement of the replayed tokens
    departures: int = 0
    near_ties: int = 0
    first_departure: int | None = None
    first_margin: float | None = None
    max_margin: float | None = None
    rank: int = 0
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_replay_result(self)


@dataclass(frozen=True, slots=True)
class Finding(EventBase):
    """A diagnosis (docs/design.md, "Finding codes"): ``severity`` in :data:`SEVERITIES`, ``evidence``
    observed vs expected. ``source``: ``"doctor"`` or ``"inspect"``; ``run_id`` None for a standalone
    inspection. A finding about one rank names it in ``evidence["rank"]``."""

    kind: ClassVar[str] = "finding"
    rank: ClassVar[int] = 0  # counted with the run's rank 0
    code: str
    severity: str
    message: str
    evidence: dict[str, Any]
    fix: str
    run_id: str | None = None
    source: str = "doctor"
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        checks.check_finding(self)

    def to_dict(self) -> dict[str, Any]:
        """The machine format of docs/design.md, "Finding codes" (with ``run_id`` for runtime findings)."""
        out = {"code": self.code, "severity": self.severity, "message": self.message,
               "evidence": self.evidence, "fix": self.fix}
        if self.run_id is not None:
            out["run_id"] = self.run_id
        return out


def by_severity(findings) -> list[Finding]:
    """Findings sorted errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


Event = (RunStart | RankStart | RankStatus | RequestStart | RequestEnd | VerifyStep | VerifyGroup | TensorEvent
         | ProvenanceEvent | LoadReport | LosslessAudit | RequestTokens | ReplayResult | Finding)
