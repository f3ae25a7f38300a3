"""The hooks' shared state: the one object a tracer's hooks read and write on the hot path.

A :class:`~specscope.instrumentation.Tracer` makes one :class:`HookState` and hands it to the hooks
(:mod:`specscope.instrumentation._hooks` bind it into their closures at instrument time). The tracer
reads its counters and tells it where request / verify-step boundaries are; nothing else reaches into
either object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from specscope.events import Event, ProvenanceEvent, TensorEvent
from specscope.instrumentation._sampling import CallCount, SamplingConfig, value_stats

if TYPE_CHECKING:
    from specscope.instrumentation._provenance import Provenance
    from specscope.instrumentation._replay import ReplayRecorder

logger = logging.getLogger("specscope")


class Removable(Protocol):
    """A hook's handle (:class:`~specscope.instrumentation._forward.ForwardTap`)."""

    def remove(self) -> None: ...

    def suspend(self, in_place: bool = False) -> None: ...

    def resume(self) -> None: ...


class HookState:
    """Counters, sampling, request tags and the guarded sink of one tracer's hooks.

    ``sink``: where events go (``emit(event)``, never blocking); ``run_id`` / ``rank``: stamped on
    every event; ``sampling``: which calls become events; ``capturing``: a cheap ``() -> bool``, is a
    CUDA graph being captured (``_context.capture_probe``; None where CUDA is unavailable).
    Counters: :attr:`calls` (hook calls, summed from the wrappers' :class:`CallCount` when read,
    plus ``replay_calls``), ``errors`` (hook or sink failures), ``capture_calls`` (hook calls under
    graph capture) and ``replay_calls`` (observed calls replayed from CUDA graphs, decoded from the
    static buffer of ``replay``, a :class:`~specscope.instrumentation._replay.ReplayRecorder` or
    None), plain ints.
    Request tags: ``request`` / ``step`` (the request the engine last reported; exact at batch size 1).
    ``target_fed``: set by a target forward (or, without target hooks, by a request / verify-step
    boundary), consumed by the next draft call.
    """

    __slots__ = ("sink", "run_id", "rank", "capturing", "value_stats", "errors", "capture_calls", "replay_calls",
                 "replay", "request", "step", "target_fed", "sees_target", "provenance", "installed", "_sampling", "_counts",
                 "_handles", "_failed_points")

    def __init__(self, sink: object, run_id: str, rank: int, sampling: SamplingConfig,
                 capturing: Callable[[], bool] | None) -> None:
        self.sink = sink
        self.run_id, self.rank = run_id, rank
        self.capturing = capturing
        self.value_stats = sampling.value_stats
        self.errors = self.capture_calls = self.replay_calls = 0
        self.replay: ReplayRecorder | None = None
        self._sampling = sampling
        self._counts: list[CallCount] = []
        self.request: str | None = None
        self.step: int | None = None
        # Engines differ in when they report a verify step relative to the draft extend that follows
        # it, so a hooked target forward is the only reliable mark of a target-fed draft call.
        self.target_fed = self.sees_target = self.installed = False
        self.provenance: Provenance | None = None
        self._handles: list[Removable] = []
        self._failed_points: set[str] = set()

    # -- wiring (instrument time / close) -------------------------------------------------------

    def count(self, bodies: int) -> CallCount:
        """A new :class:`CallCount` for a wrapper that runs ``bodies`` hook bodies per module call;
        its calls are part of :attr:`calls` from now on."""
        count = CallCount(self._sampling, bodies)
        self._counts.append(count)
        return count

    @property
    def calls(self) -> int:
        """Hook calls so far: every body call, sampled or not (module calls x bodies, summed over
        the wrappers, removed ones included), and the replayed calls read from the static buffer."""
        return sum(count.calls * count.bodies for count in self._counts) + self.replay_calls

    def install(self, handles: Sequence[Removable], provenance: Provenance | None,
                sees_target: bool) -> None:
        """Take ownership of the installed hooks' handles (removed by :meth:`remove`)."""
        self._handles.extend(handles)
        self.provenance, self.sees_target, self.installed = provenance, sees_target, True

    def remove(self) -> None:
        """Remove every installed hook, the last installed first (a module hooked twice is wrapped
        twice: unwrapping in reverse restores it whole). Idempotent."""
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()

    def suspend(self, in_place: bool = False) -> None:
        """Take every installed hook out until :meth:`resume` (the last installed first, as
        :meth:`remove`); ``in_place``: leave each wrapper where it is, passing through. Idempotent."""
        for handle in reversed(self._handles):
            handle.suspend(in_place)

    def resume(self) -> None:
        """Put back what :meth:`suspend` took out (the first installed first). Idempotent."""
        for handle in self._handles:
            handle.resume()

    # -- boundaries reported by the engine (tracer API) ------------------------------------------

    def new_step(self, request: str, step: int) -> None:
        """The engine reported ``request`` at ``step``; without target hooks the next draft call is
        target-fed."""
        self.request, self.step = request, step
        self.target_fed = self.target_fed or not self.sees_target

    def target_forward(self) -> None:
        """A target forward began (lowest hooked layer): the next draft call is target-fed."""
        self.target_fed = True
        if self.provenance is not None and self.provenance.due:
            self.provenance.new_target_forward()

    # -- sink -------------------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Send ``event`` to the sink; a failing sink is counted (:meth:`failed`), never raised."""
        try:
            self.sink.emit(event)
        except Exception as exc:  # noqa: BLE001 - a failing sink must not reach the engine
            self.failed("sink.emit", exc)

    def failed(self, point: str, exc: Exception) -> None:
        """Count a failure at ``point`` (a hook point or ``sink.*``); log the first one per point."""
        self.errors += 1
        if point not in self._failed_points:
            self._failed_points.add(point)
            logger.warning("specscope: hook %s failed (%s: %s); later failures there are only counted",
                           point, type(exc).__name__, exc)

    # -- hot path ---------------------------------------------------------------------------------

    def record(self, name: str, index: int, tensor: torch.Tensor, expected_width: int | None,
               capturing: bool) -> None:
        """Emit the :class:`TensorEvent` of ``tensor`` (any shape) at hook point ``name`` in the
        sampled call ``index``; ``expected_width``: the last dimension the contract expects (None:
        no expectation). Reads values only when ``value_stats`` is on (a device sync)."""
        shape = tuple(tensor.shape)
        expected = None if expected_width is None else (-1,) * (len(shape) - 1) + (expected_width,)
        absmax = mean = nonfinite = None
        if self.value_stats and not capturing:
            absmax, mean, nonfinite = value_stats(tensor)
        self.emit(TensorEvent(
            self.run_id, self.rank, name, index, shape, str(tensor.dtype).removeprefix("torch."),
            str(tensor.device), expected, absmax, mean, nonfinite, self.request, self.step,
            "capture" if capturing else "eager"))

    def check_provenance(self, hidden: torch.Tensor, call_index: int) -> None:
        """Match a target-fed draft input ``(..., W)`` against the last target forward's fingerprints
        (on sampled calls; synchronises the device then) and emit a :class:`ProvenanceEvent`."""
        provenance = self.provenance
        received = provenance.check(hidden)
        if received is not None:
            self.emit(ProvenanceEvent(self.run_id, self.rank, call_index, provenance.configured,
                                      received, int(hidden.shape[-1]), self.request, self.step))
