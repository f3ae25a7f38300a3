"""Event dataclasses: what the instrumentation records and the collector writes (docs/design.md, "Event model").

Every event names its ``run_id`` and the torch.distributed ``rank`` that produced it, and carries
``ts_wall`` (wall clock, seconds since the Unix epoch, ``time.time()``) so events from several
processes line up. Durations are in seconds (``*_s``). Tensor shapes are tuples of ints; widths are
the size of the last dimension. Events are plain frozen dataclasses; the sink (collector), the store
and any exporter are separate objects that consume them (the vLLM ``SpecDecodingStats`` pattern).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from specscope.errors import ConfigError, InvalidEvent
from specscope.metrics import chain_mask

Shape = tuple[int, ...]
MAX_PROPOSED = 64  # draft tokens per verify step the store holds a mask for (verify_steps.accepted_mask)
MAX_COUNT = 2**31 - 1
"""Largest count a store's INTEGER column holds on every database (PostgreSQL's int4): larger values
are refused at the boundary, never wrapped by a binary COPY."""
PIT_BINS = 10
"""Equal-width bins of the losslessness audit's PIT histogram (``LosslessAudit.pit``)."""


UNHOOKED_SOURCES = {"prometheus": "watched through its Prometheus endpoint",
                    "responses": "recorded from the server's responses"}
"""``RunStart.config["source"]`` of runs recorded from outside the engine, and how: no hooks, so the
acceptance is exact and no tensor, graph mode or capture layer is observed."""


def unhooked(config: dict) -> str | None:
    """How a run with this ``RunStart.config`` was recorded from outside its engine, or None when the
    engine itself was hooked (:data:`UNHOOKED_SOURCES`)."""
    return UNHOOKED_SOURCES.get(config.get("source"))


def now() -> float:
    """Wall clock in seconds since the Unix epoch, the clock every ``ts_wall`` uses."""
    return time.time()


@dataclass(frozen=True, slots=True)
class RunStart:
    """A run: one engine process group's lifetime. Written by every rank; the first one wins.

    ``config`` holds the speculative-decoding contract (see :class:`RunConfig`), stored as JSON.
    """

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


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The contract between target and draft that runtime checks compare observations against.

    - ``aux_layer_ids_configured``: ids as written in the draft config (``None`` = engine default).
    - ``aux_layer_ids_resolved``: physical capture points, "hidden state entering layer i"
      (HF ``hidden_states[i]``; SGLang ``llama.py`` captures before layer i, vLLM the same).
    - ``target_hidden_size``: width of one target hidden state (elements).
    - ``expected_fused_width``: ``len(aux ids) * target_hidden_size`` = ``fc.in_features``; a method
      without aux capture (prompt lookup, n-gram, MTP, a draft model) has no aux ids and width 0.
    - ``k``: draft tokens proposed per verify step (vLLM ``num_speculative_tokens``);
      ``num_draft_tokens`` follows SGLang and counts the root token too (``k + 1`` for a chain).
    - ``aux_layer_ids_active``: the capture layers the engine reports active once the target is loaded
      (vLLM: the target's ``EagleModelMixin.aux_hidden_state_layers``); ``()`` = none active, ``None`` =
      the engine does not say.
    - ``model_runner``: which of the engine's model runners served, where it has several and
      specscope attaches to only some (vLLM 0.32: ``"v1"`` or ``"v2"``, ``VllmConfig.
      use_v2_model_runner``); ``None`` = the engine has one.
    """

    aux_layer_ids_resolved: tuple[int, ...]
    target_hidden_size: int
    expected_fused_width: int
    k: int
    num_target_layers: int
    aux_layer_ids_configured: tuple[int, ...] | None = None
    topk: int = 1
    num_draft_tokens: int | None = None
    dtype: str = "float32"
    aux_layer_ids_active: tuple[int, ...] | None = None
    model_runner: str | None = None

    def __post_init__(self) -> None:
        """Check the contract is self-consistent (the user's own call, not the engine's hot path).

        Raises:
            ConfigError: a value of the wrong type or out of range, ``expected_fused_width`` other
                than ``len(aux_layer_ids_resolved) * target_hidden_size``, or an aux layer id outside
                the target's hidden states ``0 .. num_target_layers``.
        """
        for name in ("target_hidden_size", "expected_fused_width", "k", "num_target_layers", "topk"):
            value = getattr(self, name)
            # no aux capture (prompt lookup, n-gram, MTP, draft models): no capture layers, width 0
            least = 0 if name == "expected_fused_width" and not self.aux_layer_ids_resolved else 1
            if not _is_int(value) or value < least:
                raise ConfigError(f"RunConfig.{name} must be an int >= {least}, got {value!r}")
        if self.num_draft_tokens is not None and (not _is_int(self.num_draft_tokens) or self.num_draft_tokens < 1):
            raise ConfigError(f"RunConfig.num_draft_tokens must be an int >= 1 or None, got {self.num_draft_tokens!r}")
        if not isinstance(self.dtype, str):
            raise ConfigError(f"RunConfig.dtype must be a string such as 'bfloat16', got {self.dtype!r}")
        if self.model_runner is not None and not isinstance(self.model_runner, str):
            raise ConfigError(f"RunConfig.model_runner must be a string such as 'v2' or None, got {self.model_runner!r}")
        for name in ("aux_layer_ids_resolved", "aux_layer_ids_configured"):
            ids = getattr(self, name)
            if ids is None and name == "aux_layer_ids_configured":
                continue
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__") or not all(_is_int(i) for i in ids):
                raise ConfigError(f"RunConfig.{name} must be a sequence of ints, got {ids!r}")
            outside = [i for i in ids if not 0 <= i <= self.num_target_layers]
            if outside:
                raise ConfigError(f"RunConfig.{name} {list(ids)}: {outside} outside the target's hidden "
                                  f"states 0..{self.num_target_layers} (num_target_layers={self.num_target_layers})")
        fused = len(self.aux_layer_ids_resolved) * self.target_hidden_size
        if self.expected_fused_width != fused:
            raise ConfigError(
                f"RunConfig.expected_fused_width={self.expected_fused_width} contradicts "
                f"{len(self.aux_layer_ids_resolved)} aux layers x target_hidden_size {self.target_hidden_size} "
                f"= {fused} (fc.in_features of an EAGLE-3 draft)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``num_draft_tokens`` defaults to ``k + 1`` (SGLang's convention)."""
        return {
            "aux_layer_ids_configured": None if self.aux_layer_ids_configured is None
            else list(self.aux_layer_ids_configured),
            "aux_layer_ids_resolved": list(self.aux_layer_ids_resolved),
            "target_hidden_size": self.target_hidden_size,
            "expected_fused_width": self.expected_fused_width,
            "k": self.k,
            "topk": self.topk,
            "num_draft_tokens": self.num_draft_tokens if self.num_draft_tokens is not None else self.k + 1,
            "num_target_layers": self.num_target_layers,
            "dtype": self.dtype,
            "aux_layer_ids_active": None if self.aux_layer_ids_active is None
            else list(self.aux_layer_ids_active),
            "model_runner": self.model_runner,
        }


@dataclass(frozen=True, slots=True)
class RankStart:
    """One engine process (rank) of a run came up. ``device`` is e.g. ``cpu`` or ``cuda:0``."""

    kind: ClassVar[str] = "rank_start"
    run_id: str
    rank: int
    world_size: int
    host: str
    pid: int
    device: str
    ts_wall: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class RankStatus:
    """Counters the tracer owns, sent periodically and at close (``finished=True``).

    ``graph_mode``: ``"eager"`` (hooks saw every call), ``"compiled"`` (the models ran through
    torch.compile: the capture layers were observed through specscope's op in the graph),
    ``"cuda_graph"`` (CUDA graphs were replayed and their calls read from the static buffer the
    captured graphs write), ``"capture_only"`` (hooks fired only while a CUDA graph was captured,
    replays are invisible) or ``"mixed"``. ``hook_calls`` counts hook
    invocations, ``hook_errors`` exceptions caught inside hooks (never raised into the engine).
    ``error``: with ``finished``, the engine stopped on this error (the rank crashed) instead of
    shutting down.
    """

    kind: ClassVar[str] = "rank_status"
    run_id: str
    rank: int
    hook_calls: int
    hook_errors: int
    graph_mode: str = "eager"
    finished: bool = False
    error: str | None = None
    ts_wall: float = field(default_factory=now)


@dataclass(frozen=True, slots=True)
class RequestStart:
    """A request entered the engine. ``prompt_tokens``: prompt length in tokens.

    Sampling settings as the engine applies them, None where the engine does not say: ``temperature``
    (0 = greedy), ``top_p`` (1 = off), ``top_k`` (0 or -1 = off); ``sampling`` is their label
    (:func:`sampling_label`), the group acceptance and the losslessness audit are split by.
    ``prompt_key``: a stable hash of the prompt (:func:`prompt_key`), so runs that served the same
    prompts can be compared request by request.
    """

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
        """Raises InvalidEvent: ``prompt_tokens`` not an int >= 0."""
        _check_counts("request start", prompt_tokens=self.prompt_tokens)

    @property
    def sampling(self) -> str | None:
        """The request's sampling group (None: settings unknown)."""
        return sampling_label(self.temperature, self.top_p, self.top_k)


def sampling_label(temperature: float | None, top_p: float | None = None, top_k: int | None = None
                   ) -> str | None:
    """The one name of a sampling group: ``'greedy'`` (temperature 0: top-p / top-k do not matter),
    else ``'T=0.8'`` followed by ``' top_p=0.9'`` / ``' top_k=50'`` where they truncate; None when the
    temperature is unknown."""
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
    """A stable 16-hex-digit key of a prompt (its token ids, or its text where ids are not at hand):
    the same prompt gives the same key in every run and process."""
    body = prompt if isinstance(prompt, str) else ",".join(str(int(t)) for t in prompt)
    return hashlib.sha1(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RequestEnd:
    """A request finished. ``output_tokens`` counts generated tokens (bonus tokens included);
    ``text`` is what it generated, or ``output_ids`` its token ids for the collector to decode off the
    engine thread (``Collector(tokenizer=)``)."""

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
        """Raises InvalidEvent: ``output_tokens`` or ``verify_steps`` not an int >= 0, or ``output_ids``
        not a tuple of token ids."""
        _check_counts("request end", output_tokens=self.output_tokens, verify_steps=self.verify_steps)
        ids = self.output_ids
        if ids is not None and (not isinstance(ids, tuple) or not all(_is_int(i) and 0 <= i <= MAX_COUNT for i in ids)):
            raise InvalidEvent(f"request end: output_ids must be a tuple of token ids, got {repr(ids)[:80]}")


@dataclass(frozen=True, slots=True)
class VerifyStep:
    """One verify step of one request (docs/design.md, "Acceptance figures").

    - ``proposed``: draft tokens the target verified in this step (tokens).
    - ``accepted``: draft tokens accepted (tokens); the step emits ``accepted + 1`` tokens (bonus).
    - ``accepted_mask``: per-position acceptance as a string of ``'0'``/``'1'``, position 0 first
      (``None`` = a chain's prefix, derived as ``'1' * accepted + '0' * (proposed - accepted)``).
    - ``draft_s`` / ``verify_s``: wall time of the draft and verify phases (seconds), when known.
    - ``emitted``: decoded text of the emitted tokens, accepted drafts first, bonus token last;
      ``emitted_ids``: their token ids instead, for the collector to decode off the engine thread.
    """

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
        """The one check of a verify step's figures, for every producer (tracer, adapters, tests).

        Raises:
            InvalidEvent: ``proposed`` outside ``0..MAX_PROPOSED``, ``accepted`` outside
                ``0..proposed``, a mask that is not ``'0'``/``'1'``, not ``proposed`` long, or
                whose count of ``'1'`` differs from ``accepted``, or ``emitted`` that is not a tuple
                of at most ``accepted + 1`` strings (fewer when EOS or the token budget cut the step).
        """
        if not (_is_int(self.proposed) and _is_int(self.accepted) and _is_int(self.step)):
            raise InvalidEvent(f"verify step: proposed, accepted and step must be ints, got "
                               f"{self.proposed!r}, {self.accepted!r}, {self.step!r}")
        if not 0 <= self.step <= MAX_COUNT and self.step != -1:
            raise InvalidEvent(f"verify step: step={self.step} outside 0..{MAX_COUNT}")
        if not 0 <= self.proposed <= MAX_PROPOSED:
            raise InvalidEvent(f"verify step: proposed={self.proposed} outside 0..{MAX_PROPOSED}")
        if not 0 <= self.accepted <= self.proposed:
            raise InvalidEvent(f"verify step: accepted={self.accepted} outside 0..proposed={self.proposed}")
        emitted = self.emitted
        if emitted is not None and (not isinstance(emitted, tuple) or len(emitted) > self.accepted + 1
                                    or not all(isinstance(token, str) for token in emitted)):
            shown = repr(emitted)
            raise InvalidEvent(f"verify step: emitted must be a tuple of at most accepted + 1 = "
                               f"{self.accepted + 1} decoded tokens (str), got {shown[:80]}")
        ids = self.emitted_ids
        if ids is not None and (not isinstance(ids, tuple) or len(ids) > self.accepted + 1
                                or not all(_is_int(i) and 0 <= i <= MAX_COUNT for i in ids)):
            raise InvalidEvent(f"verify step: emitted_ids must be a tuple of at most accepted + 1 = "
                               f"{self.accepted + 1} token ids, got {repr(ids)[:80]}")
        mask = self.accepted_mask
        if mask is None:
            return
        if not isinstance(mask, str) or len(mask) != self.proposed or mask.strip("01"):
            raise InvalidEvent(f"verify step: accepted_mask {mask!r} is not {self.proposed} characters "
                               "of '0'/'1' (one per proposed draft token)")
        if mask.count("1") != self.accepted:
            raise InvalidEvent(f"verify step: accepted_mask {mask!r} accepts {mask.count('1')} "
                               f"position(s) but accepted={self.accepted}")

    def mask(self) -> str:
        """The per-position mask, derived from ``accepted`` for a chain when not given."""
        if self.accepted_mask is not None:
            return self.accepted_mask
        return chain_mask(self.accepted, self.proposed)


@dataclass(frozen=True, slots=True)
class VerifyGroup:
    """``steps`` verify steps of one request aggregated into one record: every step shares
    ``accepted_mask`` (``'1'``/``'0'`` per draft position, position 0 first; ``""`` when the source
    gives no per-position data), ``proposed`` / ``accepted`` are their sums (tokens).

    Written instead of per-step :class:`VerifyStep` events where step detail is not kept: requests
    the tracer sampled out of step detail (one group per distinct mask, exact per-request and
    per-position sums), and servers observed through their Prometheus counters (``specscope watch``:
    one group per scrape interval, rank and mask). Stored as a ``verify_steps`` row with ``step`` -1
    whose ``steps`` column the acceptance views sum.
    """

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
        """Raises InvalidEvent: a count not an int in ``0..MAX_COUNT``, ``accepted > proposed``, more
        than ``MAX_PROPOSED`` proposed per step (none without a step), or a mask of other characters than
        ``'0'``/``'1'``, longer than ``MAX_PROPOSED`` or whose accepted positions times ``steps`` are not
        ``accepted``."""
        _check_counts("verify group", steps=self.steps, proposed=self.proposed, accepted=self.accepted)
        if (max(self.steps, self.proposed) > MAX_COUNT or self.accepted > self.proposed
                or self.proposed > self.steps * MAX_PROPOSED):
            raise InvalidEvent(f"verify group: steps={self.steps}, proposed={self.proposed}, accepted={self.accepted}: "
                               f"counts go up to {MAX_COUNT}, accepted cannot exceed proposed, nor proposed "
                               f"{MAX_PROPOSED} per step")
        mask = self.accepted_mask
        if not isinstance(mask, str) or mask.strip("01") or len(mask) > MAX_PROPOSED:
            raise InvalidEvent(f"verify group: accepted_mask {mask!r:.80} is not a string of at most {MAX_PROPOSED} '0'/'1'")
        if mask and self.accepted != self.steps * mask.count("1"):
            raise InvalidEvent(f"verify group: {self.steps} steps of mask {mask!r} accept {self.steps * mask.count('1')} "
                               f"drafts, not {self.accepted}")


@dataclass(frozen=True, slots=True)
class TensorEvent:
    """A tensor seen at a hook point, e.g. ``draft.forward:hidden_states`` or ``target.layers.15:input``.

    Shapes and dtypes are read from tensor metadata (no device sync). ``absmax``, ``mean`` and
    ``nonfinite`` (count of inf/nan elements) read values, force a device sync, and are only set on
    sampled calls when value statistics were asked for. ``expected_shape`` holds the contract where one
    is known (``-1`` for a dimension that is free). ``graph_phase`` is ``"eager"``, ``"capture"`` (seen while a CUDA graph was captured) or
    ``"replay"`` (decoded from the buffer replayed graphs write: the shape captured, the call index
    the count of calls so far).
    """

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
class ProvenanceEvent:
    """Which target layers the draft's aux hidden states really came from, on one sampled draft call.

    ``configured``: physical capture points of the run config. ``received``: for each target-width
    chunk of the draft input, the layer whose hidden state matched by fingerprint (``None`` = no match;
    the final norm output is reported as ``num_target_layers``). ``width``: draft input width seen.
    """

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
class LoadReport:
    """What a loader did with a checkpoint's keys for one module.

    ``missing``: module parameters the checkpoint did not provide (they keep their init).
    ``unexpected``: checkpoint keys the loader does not map (dropped). ``renamed``: checkpoint key ->
    parameter name for keys the loader renames (e.g. ``midlayer.`` -> ``layers.0.``).
    ``strict``: whether the loader raises on missing/unexpected keys (when False, they are silent).
    """

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


@dataclass(frozen=True, slots=True)
class LosslessAudit:
    """The losslessness audit of one request's emitted tokens on audited verify steps (docs/design.md,
    "Losslessness audit"): each emitted token is checked against the target's own processed
    distribution at its position.

    - ``tokens``: emitted tokens audited (accepted drafts, recovered and bonus tokens).
    - ``mismatches``: greedy requests only: audited tokens whose target logit is below the row's
      maximum (the target would have emitted another token; ties are no mismatch).
    - ``rare``: sampled requests only: audited tokens whose target probability is below ``epsilon``;
      ``rare_expected``: the sum over those tokens' positions of the target's probability mass below
      ``epsilon`` (what a lossless engine emits there on average).
    - ``p_sum`` / ``p2_sum`` / ``p_var_sum``: sums of the emitted tokens' target probabilities, of
      each row's sum of squared probabilities (the emitted probability's expected value) and of its
      variance: mean probability observed vs expected.
    - ``pit``: sampled requests only: counts of the tokens' randomized PIT in :data:`PIT_BINS`
      equal bins of [0, 1) (uniform for a lossless engine); empty when none was scored.
    - ``example``: the first violating token (position, emitted and target tokens, probability).
    """

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
    ts_wall: float = field(default_factory=now)

    def __post_init__(self) -> None:
        """The one check of an audit's figures (what the views sum and the bound reads).

        Raises:
            InvalidEvent: ``tokens`` not an int >= 1, ``mismatches`` / ``rare`` not ints in
                ``0..tokens``, a sum or ``epsilon`` not a finite number >= 0, or ``example`` not a dict.
        """
        if not (_is_int(self.tokens) and 1 <= self.tokens <= MAX_COUNT):
            raise InvalidEvent(f"lossless audit: tokens must be an int in 1..{MAX_COUNT}, got {self.tokens!r}")
        for name in ("mismatches", "rare"):
            value = getattr(self, name)
            if not (_is_int(value) and 0 <= value <= self.tokens):
                raise InvalidEvent(f"lossless audit: {name}={value!r} outside 0..tokens={self.tokens}")
        for name in ("rare_expected", "p_sum", "p2_sum", "p_var_sum", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise InvalidEvent(f"lossless audit: {name} must be a finite number >= 0, got {value!r}")
        if self.example is not None and not isinstance(self.example, dict):
            raise InvalidEvent(f"lossless audit: example must be a dict or None, got {type(self.example).__name__}")
        pit = self.pit
        if not (isinstance(pit, tuple) and len(pit) in (0, PIT_BINS) and all(_is_int(n) and n >= 0 for n in pit)
                and sum(pit) <= self.tokens):
            raise InvalidEvent(f"lossless audit: pit must be () or {PIT_BINS} counts >= 0 summing to at most "
                               f"tokens={self.tokens}, got {pit!r}")


@dataclass(frozen=True, slots=True)
class Finding:
    """A diagnosis (docs/design.md, "Finding codes"): stable ``code``, ``severity`` in error / warning / info,
    one-line ``message``, ``evidence`` (observed vs expected values, numbers where possible) and ``fix``.
    ``source`` is ``"doctor"`` or ``"inspect"``; ``run_id`` is ``None`` for a standalone inspection.
    A finding about one rank names it in ``evidence["rank"]`` (the Prometheus exporter's ``rank``
    label reads it there).
    """

    kind: ClassVar[str] = "finding"
    code: str
    severity: str
    message: str
    evidence: dict[str, Any]
    fix: str
    run_id: str | None = None
    source: str = "doctor"
    ts_wall: float = field(default_factory=now)

    def to_dict(self) -> dict[str, Any]:
        """The machine format of docs/design.md, "Finding codes" (``run_id`` added for runtime findings)."""
        out = {"code": self.code, "severity": self.severity, "message": self.message,
               "evidence": self.evidence, "fix": self.fix}
        if self.run_id is not None:
            out["run_id"] = self.run_id
        return out


SEVERITIES = ("error", "warning", "info")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_counts(what: str, **counts: Any) -> None:
    for name, value in counts.items():
        if not _is_int(value) or value < 0:
            raise InvalidEvent(f"{what}: {name} must be an int >= 0, got {value!r}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as every store (and a UTF-8 page) takes it: NUL removed, lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text.replace("\x00", ""))


def by_severity(findings) -> list[Finding]:
    """Findings sorted errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))

Event = (RunStart | RankStart | RankStatus | RequestStart | RequestEnd | VerifyStep | VerifyGroup | TensorEvent
         | ProvenanceEvent | LoadReport | LosslessAudit | Finding)
