"""The requests a :class:`~specscope.instrumentation.Tracer` follows: each one's verify-step count,
and whether its steps are stored one row each or, sampled out by ``step_sample``, as exact per-mask
sums (:class:`~specscope.events.VerifyGroup`) sent when the request ends or the status ticks.

Each call builds its event before changing anything, so a call the event's checks refuse leaves the
requests as they were (the tracer counts it in ``hook_errors``)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

from specscope.errors import ConfigError
from specscope.events import Event, RequestEnd, RequestStart, VerifyGroup, VerifyStep, prompt_key


class Requests:
    def __init__(self, emit: Callable[[Event], None], run_id: str, step_sample: float) -> None:
        if not 0.0 <= step_sample <= 1.0:
            raise ConfigError(f"step_sample must be between 0 and 1 (a share of requests), got {step_sample!r}")
        self._emit = emit
        self.run_id = run_id
        self.rank = 0  # the tracer's, once resolved
        self.step_sample = step_sample
        self._steps: dict[str, int] = {}  # request id -> verify steps so far
        self._groups: dict[str, dict[str, list[int]]] = {}  # sampled out: id -> mask -> [steps, proposed, accepted]

    def start(self, request_id: str, prompt_tokens: Any, temperature: Any, top_p: Any, top_k: Any,
              prompt: str | Sequence[int] | None) -> None:
        event = RequestStart(self.run_id, request_id, self.rank, _whole(prompt_tokens), _number(temperature, float),
                             _number(top_p, float), _number(top_k, int), None if prompt is None else prompt_key(prompt))
        self._steps.setdefault(request_id, 0)  # started again under way: its steps go on from where they are
        self._emit(event)

    def verify(self, request_id: str, proposed: Any, accepted: Any, accepted_mask: str | Sequence[int | bool] | None,
               draft_s: float | None, verify_s: float | None, emitted: Sequence[str] | None,
               emitted_ids: Sequence[int] | None) -> int:
        """Record one verify step; the request's step count after it."""
        if request_id not in self._steps:
            raise LookupError(f"request {request_id!r} was never started (call start_request first)")
        step = self._steps[request_id]
        if accepted_mask is not None and not isinstance(accepted_mask, str):
            accepted_mask = "".join("1" if bit else "0" for bit in accepted_mask)
        event = VerifyStep(self.run_id, request_id, self.rank, step, int(proposed), int(accepted),
                           accepted_mask, draft_s, verify_s, None if emitted is None else tuple(emitted),
                           emitted_ids=None if emitted_ids is None else tuple(emitted_ids))
        self._steps[request_id] = step + 1
        if self._step_detail(request_id):
            self._emit(event)
        else:
            group = self._groups.setdefault(request_id, {}).setdefault(event.mask(), [0, 0, 0])
            group[0] += 1
            group[1] += event.proposed
            group[2] += event.accepted
        return step + 1

    def finish(self, request_id: str, output_tokens: Any, text: str | None, output_ids: Sequence[int] | None) -> None:
        if request_id not in self._steps:
            raise LookupError(f"request {request_id!r} was never started or is already finished")
        event = RequestEnd(self.run_id, request_id, self.rank, _whole(output_tokens), self._steps[request_id], text,
                           output_ids=None if output_ids is None else tuple(output_ids))
        del self._steps[request_id]
        self.flush(request_id)
        self._emit(event)

    def flush(self, request_id: str | None = None) -> None:
        """Send the aggregated steps of ``request_id`` (None: of every request) as VerifyGroup events."""
        for rid in [request_id] if request_id is not None else list(self._groups):
            for mask, (steps, proposed, accepted) in self._groups.pop(rid, {}).items():
                self._emit(VerifyGroup(self.run_id, rid, self.rank, mask, steps, proposed, accepted))

    def _step_detail(self, request_id: str) -> bool:
        """crc32 of the id below ``step_sample`` of 2**32: the same answer on every rank and in every
        process, unlike ``hash``."""
        # surrogatepass: an id holding a lone surrogate hashes too (the store refuses it, quarantined alone)
        return self.step_sample >= 1.0 or zlib.crc32(request_id.encode(errors="surrogatepass")) < (
            self.step_sample * 2**32)


def _number(value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (a tensor or numpy scalar too), None kept."""
    return None if value is None else kind(value)


def _whole(value: object) -> int:
    """``value`` as an int when it is a whole number (an int, or a float / numpy scalar without a
    fraction); ValueError / TypeError otherwise (NaN, 2.5, a string)."""
    number = int(value)
    if number != value:
        raise ValueError(f"{value!r} is not a whole number")
    return number
