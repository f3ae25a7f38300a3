"""The :class:`Tracer`: a rank's lifecycle (start, status, close), its counters and event emission;
the requests it follows are :mod:`._requests`, the audit :mod:`._audit`, the hooks :mod:`._state`."""

from __future__ import annotations

import atexit
import dataclasses
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from specscope import event_checks as checks
from specscope.errors import ConfigError, InvalidEvent
from specscope.events import (
    Event,
    RankStart,
    RankStatus,
    RunConfig,
    RunStart,
    Sink,
)
from specscope.instrumentation._audit import DEFAULT_AUDIT_EVERY, Auditor
from specscope.instrumentation._audit import Slot as AuditSlot
from specscope.instrumentation._context import capture_probe, default_device, process_context
from specscope.instrumentation._request_ids import RequestIds
from specscope.instrumentation._requests import Requests
from specscope.instrumentation._sampling import SamplingConfig
from specscope.instrumentation._state import HookState
from specscope.instrumentation._token_ids import DEFAULT_TOKEN_REQUESTS, TokenRecorder

CLOSE_FLUSH_TIMEOUT_S = 5.0  # longest Tracer.close() waits for the sink (seconds): a bound on shutdown
ERROR_CHARS = 2000  # of the error a crashed rank stopped on, kept with its final status


class Tracer:
    """Observes one engine process (rank) and sends what it sees to ``sink``, which it does not own.

    Create one per rank, attach it with :func:`~specscope.instrumentation.instrument`, report requests
    and verify steps from CPU-side values, and ``close()`` it (or use it as a context manager). The
    first call that records anything starts the run: rank and world size are read from
    ``torch.distributed`` (or ``rank`` / ``world_size``, given together, where the engine numbers its
    ranks itself) and a :class:`RankStart` and :class:`RunStart` go out. A :class:`RankStatus` goes
    out every ``status_interval_s`` and at close; a process exiting without ``close()`` is closed at
    interpreter exit, crashed if an uncaught exception ended it.

    ``run_id``: default a uuid4 hex, the same on every rank. ``sampling``: a :class:`SamplingConfig`,
    or any of its fields as keywords (not both). ``device``: default the draft's, else the current
    CUDA device, else ``"cpu"``. ``step_sample``: the share of requests (by a hash of the id) whose
    verify steps are stored one row each; the others as per-mask sums. ``audit_every``: audit every
    n-th verify step (:meth:`record_audit`; 0 = off). ``token_requests``: while the audit is on, the
    first that many requests keep their token ids for a replay (:mod:`._token_ids`; 0 = none).
    ``compiled``: the engine runs the models through torch.compile. Raises ConfigError for a bad
    value of any of these.
    """

    def __init__(self, sink: Sink, *, engine: str, engine_version: str, target_model: str,
                 draft_model: str, config: RunConfig, run_id: str | None = None,
                 fault: str | None = None, sampling: SamplingConfig | None = None,
                 sample_every: int | None = None, first_calls: int | None = None,
                 value_stats: bool | None = None, provenance_every: int | None = None,
                 status_interval_s: float = 5.0, device: str | None = None,
                 step_sample: float = 1.0, rank: int | None = None,
                 world_size: int | None = None, audit_every: int = DEFAULT_AUDIT_EVERY,
                 compiled: bool = False, token_requests: int = DEFAULT_TOKEN_REQUESTS) -> None:
        if run_id is not None and not isinstance(run_id, str):
            raise ConfigError(f"run_id must be a string, got {type(run_id).__name__}")
        self.sink = sink
        self.run_id = run_id or uuid.uuid4().hex
        try:  # here, not when the first hook starts the run: its RunStart would be dropped there
            checks.check_names("tracer", run_id=self.run_id, engine=engine, engine_version=engine_version,
                               fault=fault, device=device)
        except InvalidEvent as exc:
            raise ConfigError(str(exc)) from None
        self.config = config
        self.sampling = _sampling(sampling, first_calls=first_calls, sample_every=sample_every,
                                  value_stats=value_stats, provenance_every=provenance_every)
        self._requests = Requests(self._emit, self.run_id, step_sample)
        self._request_ids = RequestIds()
        self.device = device
        self._run = dict(engine=engine, engine_version=engine_version, target_model=target_model,
                         draft_model=draft_model, fault=fault)
        if (rank is None) != (world_size is None) or (rank is not None and not 0 <= rank < world_size):
            raise ConfigError(f"give rank and world_size together, 0 <= rank < world_size; got {rank}, {world_size}")
        self._given_rank = None if rank is None else (int(rank), int(world_size))
        self.hook_state = HookState(sink, self.run_id, 0, self.sampling, capture_probe())
        self.auditor = Auditor(self._emit, self.run_id, 0, audit_every)
        self.tokens = TokenRecorder(self.run_id, token_requests if audit_every else 0)
        self.compiled = compiled
        self._resolve_context()
        self._started = self._closed = False
        self._status_interval_s = status_interval_s
        self._next_status = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Resolve rank / world size, emit :class:`RankStart` and :class:`RunStart` once (idempotent)."""
        if self._started:
            return
        self._started = True
        self._resolve_context()
        self._next_status = time.monotonic() + self._status_interval_s
        self._announce()
        atexit.register(self._close_at_exit)

    def _resolve_context(self) -> None:
        context = process_context()
        self.host, self.pid, self.rank, self.world_size = (
            context.host, context.pid, context.rank, context.world_size)
        if self._given_rank is not None:  # the engine's own numbering (e.g. vLLM's world group)
            self.rank, self.world_size = self._given_rank
        self.hook_state.rank = self.auditor.rank = self._requests.rank = self.rank

    def _announce(self) -> None:
        self._emit(RankStart(self.run_id, self.rank, self.world_size, self.host, self.pid,
                             self.device or default_device()))
        config = {**self.config.to_dict(), "step_sample": self._requests.step_sample}
        self._emit(RunStart(self.run_id, config=config, world_size=self.world_size,
                            host=self.host, rank=self.rank, **self._run))

    def close(self, error: str | None = None) -> None:
        """Remove every hook, send the final :class:`RankStatus` (``finished=True``; with ``error``, the
        error the engine stopped on: the rank crashed), flush the sink (waiting at most
        :data:`CLOSE_FLUSH_TIMEOUT_S`). Idempotent; never raises."""
        if self._closed:
            return
        self.start()
        atexit.unregister(self._close_at_exit)
        self.hook_state.remove()
        self._closed = True
        self._requests.flush()
        self._read_replays(final=True)
        try:
            self.auditor.drain(wait=True)
        except Exception as exc:  # noqa: BLE001 - observing must not break the engine's shutdown
            self._hook_failed("audit", exc)
        self.status(finished=True, error=error)
        try:
            self.sink.flush(CLOSE_FLUSH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - observing must not break the engine's shutdown
            self._hook_failed("sink.flush", exc)

    def pause(self) -> None:
        """Take the hooks out of the modules :func:`~specscope.instrumentation.instrument` hooked until
        :meth:`resume`: each runs its own ``forward`` again, at no cost (a hook another wrapper has
        covered since passes through instead). A tracer of a compiled engine (``compiled``) leaves
        its wrappers in place, passing through: the engine's graphs were traced through them (vLLM's
        compiled target crashed when they were taken out), and the ``specscope::observe`` op those
        graphs call finds no observer and returns. The run, its counters and the request /
        verify-step calls the engine makes stay as they are. Idempotent."""
        self.hook_state.suspend(in_place=self.compiled)

    def resume(self) -> None:
        """Put back the hooks :meth:`pause` took out; nothing once closed. Idempotent."""
        self.hook_state.resume()

    def set_audit(self, audit_every: int | None = None, token_requests: int | None = None) -> None:
        """Change the audit of a live tracer from its next verify step: every ``audit_every``-th step
        (0: off), and the token ids of the next ``token_requests`` requests to finish (as the
        constructor's arguments; None leaves either as it is). Token ids are kept only while the
        audit is on: turning it off ends the token budget. Raises ConfigError for a bad value."""
        if audit_every is not None:
            self.auditor.set_every(audit_every)
        if token_requests is not None:
            self.tokens.set_left(token_requests)
        if not self.auditor.every:
            self.tokens.set_left(0)

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        self.close(error=_crash(exc))

    def _close_at_exit(self) -> None:
        # The interpreter sets sys.last_value when the main thread dies of an uncaught exception,
        # before atexit runs: that engine crashed, it did not finish.
        self.close(error=_crash(getattr(sys, "last_value", None)))

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (its hooks are removed)."""
        return self._closed

    @property
    def step_sample(self) -> float:
        """The share of requests whose verify steps are stored one row each."""
        return self._requests.step_sample

    @property
    def instrumented(self) -> bool:
        """True once :func:`~specscope.instrumentation.instrument` installed hooks."""
        return self.hook_state.installed

    @property
    def hook_calls(self) -> int:
        """Hook calls so far (every call, sampled or not)."""
        return self.hook_state.calls

    @property
    def hook_errors(self) -> int:
        """Hook and sink failures so far (counted, never raised into the engine)."""
        return self.hook_state.errors

    @property
    def graph_mode(self) -> str:
        """What the hooks saw: :attr:`RankStatus.graph_mode <specscope.events.RankStatus>`."""
        state = self.hook_state
        if state.replay_calls:
            return "cuda_graph"
        captured = state.capture_calls
        if captured == 0:
            return "compiled" if self.compiled else "eager"
        return "capture_only" if captured == self.hook_calls else "mixed"

    def status(self, finished: bool = False, error: str | None = None) -> RankStatus:
        """Emit and return the current :class:`RankStatus` (after a new :class:`RankStart` when
        ``torch.distributed`` came up since the rank was read); ``error`` only with ``finished``."""
        if self.world_size == 1 and self._started:
            before = (self.rank, self.world_size)
            self._resolve_context()
            if (self.rank, self.world_size) != before:
                self._announce()
        if not finished:
            self._read_replays(final=False)
        event = RankStatus(self.run_id, self.rank, self.hook_calls, self.hook_errors,
                           self.graph_mode, finished, error if finished else None)
        self._emit(event)
        return event

    # -- requests and verify steps (CPU-side values only, never a device sync) -----------------

    def start_request(self, request_id: str, prompt_tokens: int, *, temperature: float | None = None,
                      top_p: float | None = None, top_k: int | None = None,
                      prompt: str | Sequence[int] | None = None) -> None:
        """A request entered the engine: its prompt length in tokens, its sampling as the engine
        applies it (``temperature`` 0 = greedy; None = not known), optionally the prompt (token ids or
        text; its :func:`~specscope.events.prompt_key` is stored, its ids kept for a replay within
        ``token_requests``). Never raises: a bad value drops the call, counted in ``hook_errors``."""
        self.start()
        try:
            request_id = self._request_ids.start(str(request_id))
            self._requests.start(request_id, prompt_tokens, temperature, top_p, top_k, prompt)
            self.tokens.start(request_id, prompt)
        except Exception as exc:  # noqa: BLE001 - a wrong call is counted, never raised into the engine
            self._hook_failed("start_request", exc)
            return
        self.hook_state.new_step(request_id, 0)

    # -- losslessness audit (docs/design.md, "Losslessness audit") -----------------------------

    def audit_due(self) -> bool:
        """Count one verify step (or verify batch); True when the engine should hand this one to
        :meth:`record_audit` (every ``audit_every``-th; never when 0)."""
        return self.auditor.due()

    def record_audit(self, logits: Any, emitted: Any, temperature: Any, slots: Sequence[AuditSlot],
                     top_k: Any = None, top_p: Any = None, drafted: Any = None, all_greedy: bool = False,
                     rows: Any = None) -> None:
        """Audit one verify step's emitted tokens against the target (tensors on the engine's device:
        ``logits`` (N, V) at each slot's position before temperature, ``emitted`` (N,) with -1 for an
        empty slot, ``temperature`` (N,), optional ``top_k`` / ``top_p`` (N,) and ``drafted`` (N,): the
        draft token verified at each slot, -1 at the bonus slot; ``slots`` names each row's request,
        sampling group and position, a request's slots in position order; ``all_greedy``: every
        temperature is 0, known on the host, which spares the sampled slots' passes over the vocabulary;
        ``rows`` (N,): the row of ``logits`` each slot reads, where ``logits`` holds the verifier's rows
        as they are, uncopied). Hand over the step as the
        verifier returned it, before any cut at the end of sequence or the token budget: a step whose last
        slot is a draft position reads as a rejection there (the recovered-token check). Computed on the device,
        copied asynchronously, stored as :class:`~specscope.events.LosslessAudit` events; never raises
        into the engine."""
        try:
            if self._request_ids.renamed():
                slots = [dataclasses.replace(slot, request_id=self._request_ids.stored(slot.request_id))
                         for slot in slots]
            self.auditor.submit(logits, emitted, temperature, slots, top_k, top_p, drafted, all_greedy, rows)
        except Exception as exc:  # noqa: BLE001 - observing must not change what the engine does
            self._hook_failed("record_audit", exc)

    def record_verify(self, request_id: str, proposed: int, accepted: int,
                      accepted_mask: str | Sequence[int | bool] | None = None,
                      draft_s: float | None = None, verify_s: float | None = None,
                      emitted: Sequence[str] | None = None, emitted_ids: Sequence[int] | None = None) -> None:
        """One verify step of a started request: ``proposed`` / ``accepted`` draft tokens,
        ``accepted_mask`` (``'1101'`` or bools, position 0 first; None = chain prefix), phase wall
        times (s), and the emitted tokens' text or ids. Python values only: a tensor would sync the
        device. Never raises: a step the :class:`VerifyStep` checks refuse, or of a request never
        started, is dropped and counted in ``hook_errors``."""
        self.start()
        try:
            request_id = self._request_ids.stored(str(request_id))
            steps = self._requests.verify(request_id, proposed, accepted, accepted_mask, draft_s, verify_s,
                                         emitted, emitted_ids)
        except Exception as exc:  # noqa: BLE001 - a wrong call is counted, never raised into the engine
            self._hook_failed("record_verify", exc)
            return
        self.hook_state.new_step(request_id, steps)
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + self._status_interval_s
            self._requests.flush()
            self.status()

    def finish_request(self, request_id: str, output_tokens: int, text: str | None = None,
                       output_ids: Sequence[int] | None = None) -> None:
        """A request finished with ``output_tokens`` generated (bonus tokens included), and its
        ``text`` or ``output_ids``. Never raises: a request not started or already finished, or a bad
        count, drops the call (counted in ``hook_errors``); the first finish is the one stored."""
        self.start()
        try:
            engine_id = str(request_id)
            request_id = self._request_ids.stored(engine_id)
            self._requests.finish(request_id, output_tokens, text, output_ids)
            self._request_ids.finish(engine_id)
            tokens = self.tokens.finish(request_id, self.rank, output_ids)
        except Exception as exc:  # noqa: BLE001 - a wrong call is counted, never raised into the engine
            self._hook_failed("finish_request", exc)
            return
        if tokens is not None:
            self._emit(tokens)
        if self.hook_state.request == request_id:
            self.hook_state.request = self.hook_state.step = None

    # -- CUDA-graph replays (docs/design.md, "Where the engines let us in") ---------------------

    def _read_replays(self, final: bool) -> None:
        """Decode what replayed CUDA graphs wrote into the static buffer since the last read: the
        copy started by the previous status if it has landed (no sync), or, ``final``, a fresh copy
        waited for (at close)."""
        replay = self.hook_state.replay
        if replay is None:
            return
        try:
            if final:
                replay.drain()
            else:
                replay.poll()
        except Exception as exc:  # noqa: BLE001 - observing must not change what the engine does
            self._hook_failed("replay buffer", exc)

    # -- events -------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self.hook_state.emit(event)

    def _hook_failed(self, point: str, exc: Exception) -> None:
        self.hook_state.failed(point, exc)


def _crash(exc: BaseException | None) -> str | None:
    """The final status's error for an engine that stopped on ``exc``: an Exception crashed it; None,
    or a KeyboardInterrupt / SystemExit (a stop asked for), did not."""
    if not isinstance(exc, Exception):
        return None
    try:
        return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
    except Exception:  # noqa: BLE001 - an exception whose str() fails still crashed the engine
        return type(exc).__name__


def _sampling(sampling: SamplingConfig | None, **fields: int | bool | None) -> SamplingConfig:
    """``sampling``, or a :class:`SamplingConfig` of the given keyword fields (None: its default)."""
    given = {name: value for name, value in fields.items() if value is not None}
    if sampling is None:
        return SamplingConfig(**given)
    if given:
        raise ConfigError(f"pass sampling= or {', '.join(sorted(given))}=, not both")
    return sampling
