"""Attach to a running engine without editing its source and record what flows between target and
draft and what gets accepted (docs/design.md, "The failure", "Event model", "Where the engines let us in").

- :class:`Tracer`: one per engine process (rank); request / verify statistics from CPU-side values;
  ``close()`` removes every hook.
- :func:`instrument`: hook the draft forward, the target's capture layers and named modules.
- :func:`check_load`: what a loader does with a checkpoint's keys (missing / dropped / renamed).
- :class:`SamplingConfig`: which hook calls become events (``Tracer(sampling=...)``).
- :class:`AuditSlot`, :func:`token_stats`: the losslessness audit's slots and per-token judgement
  (``Tracer.audit_due`` / ``Tracer.record_audit``); :class:`Auditor`, the part of a Tracer that
  schedules audits and turns judged slots into events; :func:`truncate`, the top-k / top-p rule the
  judgement samples by (vLLM's).
- :mod:`specscope.points`: hook-point names (``draft.forward:hidden_states``,
  ``target.layers.{i}:input``, ...), built and parsed in one place.

Events go to a sink: any object with ``emit(event)`` (never blocking), ``flush()`` and ``close()``,
e.g. :class:`specscope.collector.Collector`.
"""

from specscope.events import Sink
from specscope.instrumentation._audit import Auditor, token_stats
from specscope.instrumentation._audit import Slot as AuditSlot
from specscope.instrumentation._instrument import instrument
from specscope.instrumentation._loadcheck import check_load
from specscope.instrumentation._sampling import SamplingConfig
from specscope.instrumentation._truncate import truncate
from specscope.instrumentation.tracer import Tracer

__all__ = ["AuditSlot", "Auditor", "SamplingConfig", "Sink", "Tracer", "check_load", "instrument", "token_stats",
           "truncate"]
