"""The :class:`Tracer`: run identity, counters, request / verify statistics and event emission."""

from __future__ import annotations

import atexit
import logging
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from specscope.events import (
    Event,
    LoadReport,
    ProvenanceEvent,
    RankStart,
    RankStatus,
    RequestEnd,
    RequestStart,
    RunConfig,
    RunStart,
    TensorEvent,
    VerifyGroup,
    VerifyStep,
)
from specscope.errors import ConfigError
from specscope.instrumentation._context import capture_probe, default_device, process_context
from specscope.instrumentation._sampling import SamplingConfig, value_stats

if TYPE_CHECKING:
    from specscope.instrumentation._sampling import TensorPoint
    from specscope.instrumentation._provenance import Provenance

logger = logging.getLogger("specscope")

CLOSE_FLUSH_TIMEOUT_S = 5.0  # longest Tracer.close() waits for the sink (seconds): a bound on shutdown


class Sink(Protocol):
    """Where events go (e.g. ``specscope.collector.Collector``). ``emit`` must never block."""

    def emit(self, event: Event) -> None: ...
    def flush(self, timeout_s: float | None = None) -> bool: ...
    def close(self) -> None: ...


class Tracer:
    """Observes one engine process (rank) and sends what it sees to ``sink``.

    Create one per rank, attach it with :func:`~specscope.instrumentation.instrument`, report requests
    and verify steps from CPU-side values, and ``close()`` it (or use it as a context manager) to
    remove every hook. The first of ``instrument`` / ``start_request`` / ``record_verify`` /
    ``check_load`` / ``close`` starts the run: rank and world size are read from ``torch.distributed``
    then (not at construction), and a :class:`RankStart` and a :class:`RunStart` go out (every rank
    sends one; the store keeps the first). :class:`RankStatus` goes out every ``status_interval_s``
    seconds (checked in ``record_verify``) and at close with ``finished=True``; a process that exits
    without ``close()`` is closed at interpreter exit (``atexit``), so its final status still goes
    out. When ``torch.distributed`` is initialised after the run started, the next status notices it,
    takes the real rank and world size and sends a new :class:`RankStart` (events sent before that
    stay under the rank they were sent with).

    Arguments: ``run_id`` (default: a uuid4 hex; give all ranks the same one), run metadata
    (``engine``, ``engine_version``, ``target_model``, ``draft_model``, ``config``: the target/draft
    contract, ``fault``), sampling (:class:`SamplingConfig` fields), ``device`` (default: the draft's
    device, else the current CUDA device, else ``"cpu"``), ``rank`` / ``world_size`` (default: from
    ``torch.distributed`` at start, and again if it comes up later; give both where the engine numbers
    its ranks itself, e.g. vLLM's world group). The tracer does not own the sink: ``close`` flushes it,
    its owner closes it. Raises :class:`ConfigError` for bad sampling values or rank.
    """

    def __init__(self, sink: Sink, *, engine: str, engine_version: str, target_model: str,
                 draft_model: str, config: RunConfig, run_id: str | None = None,
                 fault: str | None = None, sample_every: int = 64, first_calls: int = 8,
                 value_stats: bool = False, provenance_every: int = 0,
                 status_interval_s: float = 5.0, device: str | None = None,
                 step_sample: float = 1.0, rank: int | None = None,
                 world_size: int | None = None) -> None:
        self.sink = sink
        self.run_id = run_id or uuid.uuid4().hex
        self.config = config
        self.sampling = SamplingConfig(first_calls=first_calls, sample_every=sample_every,
                                       value_stats=value_stats, provenance_every=provenance_every)
        if not 0.0 <= step_sample <= 1.0:
            raise ConfigError(f"step_sample must be between 0 and 1 (a share of requests), got {step_sample!r}")
        self.step_sample = step_sample
        # Sampled-out requests: request id -> accepted mask -> [steps, proposed, accepted].
        self._groups: dict[str, dict[str, list[int]]] = {}
        self.device = device
        self._run = dict(engine=engine, engine_version=engine_version, target_model=target_model,
                         draft_model=draft_model, fault=fault)
        if (rank is None) != (world_size is None) or (rank is not None and not 0 <= rank < world_size):
            raise ConfigError(f"give rank and world_size together, 0 <= rank < world_size; got {rank}, {world_size}")
        self._given_rank = None if rank is None else (int(rank), int(world_size))
        self._resolve_context()
        self._first_calls, self._sample_every = first_calls, sample_every  # plain attrs: hot path
        # Counters bumped inline by the hooks (see _hooks.guarded).
        self.hook_calls = 0
        self.hook_errors = 0
        self._capture_calls = 0
        self._capturing = capture_probe()
        self._failed_points: set[str] = set()
        self._handles: list[RemovableHandle] = []
        self._started = self._closed = self.instrumented = False
        self._status_interval_s = status_interval_s
        self._next_status = 0.0
        # Request tags: the request the engine last reported on this rank (exact at batch size 1).
        self._steps: dict[str, int] = {}
        self._request: str | None = None
        self._step: int | None = None
        # Set by a target forward (when the target is hooked; else by start_request / record_verify),
        # consumed by the next draft call. Engines differ in when they report a verify step relative
        # to the draft extend that follows it, so a hooked target forward is the only reliable mark.
        self._target_fed = False
        self._sees_target = False
        self._provenance: Provenance | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Resolve rank / world size, emit :class:`RankStart` and :class:`RunStart` once (idempotent)."""
        if self._started:
            return
        self._started = True
        self._resolve_context()
        self._next_status = time.monotonic() + self._status_interval_s
        self._announce()
        atexit.register(self.close)

    def _resolve_context(self) -> None:
        context = process_context()
        self.host, self.pid, self.rank, self.world_size = (
            context.host, context.pid, context.rank, context.world_size)
        if self._given_rank is not None:  # the engine's own numbering (e.g. vLLM's world group)
            self.rank, self.world_size = self._given_rank

    def _announce(self) -> None:
        self._emit(RankStart(self.run_id, self.rank, self.world_size, self.host, self.pid,
                             self.device or default_device()))
        config = {**self.config.to_dict(), "step_sample": self.step_sample}
        self._emit(RunStart(self.run_id, config=config, world_size=self.world_size,
                            host=self.host, rank=self.rank, **self._run))

    def close(self) -> None:
        """Remove every hook, send the final :class:`RankStatus` (``finished=True``), flush the sink
        (waiting at most :data:`CLOSE_FLUSH_TIMEOUT_S`). Idempotent; never raises."""
        if self._closed:
            return
        self.start()
        atexit.unregister(self.close)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._closed = True
        self._flush_groups()
        self.status(finished=True)
        try:
            self.sink.flush(CLOSE_FLUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - observing must not break the engine's shutdown
            self._hook_failed("sink.flush", exc)

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def graph_mode(self) -> str:
        """``"eager"``, ``"capture_only"`` (hooks only fired under CUDA-graph capture) or ``"mixed"``."""
        if self._capture_calls == 0:
            return "eager"
        return "capture_only" if self._capture_calls == self.hook_calls else "mixed"

    def status(self, finished: bool = False) -> RankStatus:
        """Emit and return the current :class:`RankStatus` (after a new :class:`RankStart` when
        ``torch.distributed`` came up since the rank was read)."""
        if self.world_size == 1 and self._started:
            before = (self.rank, self.world_size)
            self._resolve_context()
            if (self.rank, self.world_size) != before:
                self._announce()
        event = RankStatus(self.run_id, self.rank, self.hook_calls, self.hook_errors,
                           self.graph_mode, finished)
        self._emit(event)
        return event

    # -- wiring (delegates) ------------------------------------------------------------------

    def instrument(self, **kwargs: Any) -> Tracer:
        """Same as :func:`specscope.instrumentation.instrument` with this tracer."""
        from specscope.instrumentation._instrument import instrument
        return instrument(self, **kwargs)

    def check_load(self, module_or_param_names: Any, checkpoint: Any, **kwargs: Any) -> LoadReport:
        """Same as :func:`specscope.instrumentation.check_load` with this tracer."""
        from specscope.instrumentation._loadcheck import check_load
        return check_load(self, module_or_param_names, checkpoint, **kwargs)

    def _adopt(self, handles: Sequence[RemovableHandle]) -> None:
        self._handles.extend(handles)

    # -- requests and verify steps (CPU-side values only, never a device sync) -----------------

    def start_request(self, request_id: str, prompt_tokens: int) -> None:
        """A request entered the engine; its prompt length in tokens. Without target hooks, the next draft
        call counts as target-fed."""
        self.start()
        request_id = str(request_id)
        self._steps[request_id] = 0
        self._request, self._step = request_id, 0
        self._target_fed = self._target_fed or not self._sees_target
        self._emit(RequestStart(self.run_id, request_id, self.rank, int(prompt_tokens)))

    def record_verify(self, request_id: str, proposed: int, accepted: int,
                      accepted_mask: str | Sequence[int | bool] | None = None,
                      draft_s: float | None = None, verify_s: float | None = None,
                      emitted: Sequence[str] | None = None) -> None:
        """One verify step of ``request_id``: ``proposed`` / ``accepted`` draft tokens (tokens).

        ``accepted_mask``: ``'1101'`` or a sequence of bools/ints, position 0 first (None = chain
        prefix); ``draft_s`` / ``verify_s``: phase wall times (s); ``emitted``: decoded tokens.
        Python values only: pass no tensors (reading one would sync the device). The step index is
        counted per request by the tracer; without target hooks, the next draft call counts as
        target-fed.

        Never raises into the engine: a step of a request never started (:meth:`start_request`), or
        one whose figures contradict each other (``accepted > proposed``, a mask of the wrong length
        or with another count of accepted positions: the checks of :class:`VerifyStep`), is dropped,
        counted in ``hook_errors`` and logged once (``record_verify``).
        """
        self.start()
        try:
            request_id = str(request_id)
            if request_id not in self._steps:
                raise LookupError(f"request {request_id!r} was never started (call start_request first)")
            step = self._steps[request_id]
            if accepted_mask is not None and not isinstance(accepted_mask, str):
                accepted_mask = "".join("1" if bit else "0" for bit in accepted_mask)
            event = VerifyStep(self.run_id, request_id, self.rank, step, int(proposed), int(accepted),
                               accepted_mask, draft_s, verify_s, None if emitted is None else tuple(emitted))
        except Exception as exc:  # noqa: BLE001 - a wrong call is counted, never raised into the engine
            self._hook_failed("record_verify", exc)
            return
        self._steps[request_id] = step + 1
        if self._step_detail(request_id):
            self._emit(event)
        else:
            group = self._groups.setdefault(request_id, {}).setdefault(event.mask(), [0, 0, 0])
            group[0] += 1
            group[1] += event.proposed
            group[2] += event.accepted
        self._request, self._step = request_id, step + 1
        self._target_fed = self._target_fed or not self._sees_target
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + self._status_interval_s
            self._flush_groups()
            self.status()

    def finish_request(self, request_id: str, output_tokens: int, text: str | None = None) -> None:
        """A request finished with ``output_tokens`` generated tokens (bonus tokens included)."""
        self.start()
        request_id = str(request_id)
        steps = self._steps.pop(request_id, 0)
        self._flush_groups(request_id)
        if self._request == request_id:
            self._request = self._step = None
        self._emit(RequestEnd(self.run_id, request_id, self.rank, int(output_tokens), steps, text))

    def _step_detail(self, request_id: str) -> bool:
        """Whether ``request_id`` keeps per-step rows: crc32 of the id below ``step_sample`` of 2**32
        (the same answer on every rank and in every process, unlike ``hash``)."""
        return self.step_sample >= 1.0 or zlib.crc32(request_id.encode()) < self.step_sample * 2**32

    def _flush_groups(self, request_id: str | None = None) -> None:
        """Send the aggregated steps of ``request_id`` (None: of every request) as VerifyGroup events."""
        ids = [request_id] if request_id is not None else list(self._groups)
        for rid in ids:
            for mask, (steps, proposed, accepted) in self._groups.pop(rid, {}).items():
                self._emit(VerifyGroup(self.run_id, rid, self.rank, mask, steps, proposed, accepted))

    # -- called from hooks ----------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        try:
            self.sink.emit(event)
        except Exception as exc:  # noqa: BLE001 - a failing sink must not reach the engine
            self._hook_failed("sink.emit", exc)

    def _hook_failed(self, point: str, exc: Exception) -> None:
        self.hook_errors += 1
        if point not in self._failed_points:
            self._failed_points.add(point)
            logger.warning("specscope: hook %s failed (%s: %s); later failures there are only counted",
                           point, type(exc).__name__, exc)

    def _target_forward(self) -> None:
        self._target_fed = True
        if self._provenance is not None and self._provenance.due:
            self._provenance.new_target_forward()

    def _observe(self, point: TensorPoint, tensor: torch.Tensor, expected_width: int | None,
                 capturing: bool) -> None:
        """Hot path: count the call at ``point``; emit a :class:`TensorEvent` on sampled calls
        (first calls, a new signature, every Nth call). Reads tensor metadata only."""
        signature = (tensor.shape, tensor.dtype, tensor.device, expected_width)
        index = point.calls
        point.calls = index + 1
        if signature in point.seen:
            if index >= self._first_calls and index % self._sample_every:
                return
        else:
            point.remember(signature)
        shape = tuple(tensor.shape)
        expected = None if expected_width is None else (-1,) * (len(shape) - 1) + (expected_width,)
        absmax = mean = nonfinite = None
        if self.sampling.value_stats and not capturing:
            absmax, mean, nonfinite = value_stats(tensor)
        self._emit(TensorEvent(
            self.run_id, self.rank, point.name, index, shape, str(tensor.dtype).removeprefix("torch."),
            str(tensor.device), expected, absmax, mean, nonfinite, self._request, self._step,
            "capture" if capturing else "eager"))

    def _check_provenance(self, hidden: torch.Tensor, call_index: int) -> None:
        provenance = self._provenance
        received = provenance.check(hidden)
        if received is not None:
            self._emit(ProvenanceEvent(self.run_id, self.rank, call_index, provenance.configured,
                                       received, int(hidden.shape[-1]), self._request, self._step))
