"""What the rules read about one run: its metadata and config, and per-run aggregates from the named
queries of :mod:`specscope.storage.queries` (run- and rank-level acceptance and the shape contract
come from the store's summary tables: a few rows per run whatever its size). Results are cached on
the context, so rules that share a query run it once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from types import SimpleNamespace
from typing import Any

from sqlalchemy.engine import Connection

from specscope import points
from specscope.errors import StoreError
from specscope.metrics import what_if_k
from specscope.storage import queries as q
from specscope.storage.queries import Query, records


def parse_json(text: str, what: str, run_id: str) -> Any:
    """A JSON column value; malformed JSON in the store is a StoreError naming the run and column."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"run {run_id}: malformed JSON in {what}: {exc}") from exc


@dataclass(frozen=True)
class Widths:
    """Recorded events of one hook point and rank with one observed and expected width."""

    hook_point: str
    rank: int
    width: int | None
    expected_width: int | None
    events: int = 0


@dataclass(frozen=True)
class Acceptance:
    """Acceptance figures of a run (docs/design.md, "Acceptance figures"; from ``v_run_acceptance``);
    AL and rate are None without verify steps / proposals."""

    requests: int
    verify_steps: int
    proposed: int
    accepted: int
    mean_acceptance_length: float | None
    acceptance_rate: float | None


class RunContext:
    """One run as the rules see it, over an open read-only connection.

    ``config`` is the run's :meth:`specscope.events.RunConfig.to_dict` (fields may be absent for
    other adapters: rules that need one skip the run then). ``fault`` is display metadata only: no
    rule reads it. ``run_start``: False for a run with stored rows but no stored RunStart
    (``queries.ORPHAN_RUN_IDS``), opened with an unknown engine and an empty config.
    """

    def __init__(self, conn: Connection, run_id: str, engine: str, fault: str | None,
                 config: dict[str, Any], *, run_start: bool = True) -> None:
        self.conn = conn
        self.run_id = run_id
        self.engine = engine
        self.fault = fault
        self.config = config
        self.run_start = run_start

    def rows(self, query: Query, **params: Any) -> list[SimpleNamespace]:
        """Rows of a per-run named query (``run_id`` bound to this run), columns as attributes."""
        return records(self.conn, query, run_id=self.run_id, **params)

    # -- the contract ---------------------------------------------------------------------------

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """Physical capture points ("hidden state entering layer i"), as configured for the run."""
        return tuple(int(i) for i in self.config.get("aux_layer_ids_resolved") or ())

    @property
    def active_capture_layers(self) -> tuple[int, ...] | None:
        """Capture layers the engine reported active after loading the target (``()`` = none), or
        None when the engine does not report them (only the vLLM plugin does)."""
        active = self.config.get("aux_layer_ids_active")
        return None if active is None else tuple(int(i) for i in active)

    @property
    def hidden_size(self) -> int | None:
        """Target hidden size H (elements)."""
        return self.config.get("target_hidden_size")

    @property
    def fused_width(self) -> int | None:
        """Expected width of the draft's target-fed input: n_aux x H (elements)."""
        return self.config.get("expected_fused_width")

    @property
    def num_target_layers(self) -> int | None:
        return self.config.get("num_target_layers")

    # -- acceptance -------------------------------------------------------------------------------

    @cached_property
    def acceptance(self) -> Acceptance:
        # not v_run_summary: a run stored with neither its RunStart nor a rank row has no row there
        (row,) = self.rows(q.RUN_ACCEPTANCE)
        return Acceptance(int(row.requests), int(row.verify_steps), int(row.proposed or 0),
                          int(row.accepted or 0), _float(row.mean_acceptance_length),
                          _float(row.acceptance_rate))

    @cached_property
    def per_position(self) -> list[float]:
        """p_i for i = 0.. (``v_position_acceptance``); empty without verify steps."""
        return [float(row.acceptance) for row in self.rows(q.POSITION_ACCEPTANCE)]

    @cached_property
    def sampling_acceptance(self) -> list[SimpleNamespace]:
        """Acceptance per sampling group (``v_sampling_acceptance``)."""
        return self.rows(q.SAMPLING_ACCEPTANCE)

    @cached_property
    def request_series(self) -> list[SimpleNamespace]:
        """The run's requests with verify steps, oldest first (``queries.REQUEST_SERIES``): what the
        drift and outlier rules judge."""
        return self.rows(q.REQUEST_SERIES)

    @cached_property
    def request_groups(self) -> dict[str, list[SimpleNamespace]]:
        """:attr:`request_series` per sampling group, oldest first in each: greedy and sampled requests
        accept differently by design, so the rules across requests judge each group alone."""
        groups: dict[str, list[SimpleNamespace]] = {}
        for row in self.request_series:
            groups.setdefault(row.sampling, []).append(row)
        return groups

    @cached_property
    def distributions(self) -> dict[str, list[dict[str, Any]]]:
        """The run's acceptance distributions (:data:`specscope.storage.queries.DISTRIBUTIONS`), rows
        without their ``run_id``."""
        return {name: [{k: v for k, v in vars(row).items() if k != "run_id"} for row in self.rows(query)]
                for name, query in q.DISTRIBUTIONS.items()}

    @cached_property
    def lossless_audit(self) -> list[SimpleNamespace]:
        """The losslessness audit per sampling group (``v_lossless_audit``); empty when not audited."""
        return self.rows(q.LOSSLESS_AUDIT)

    @cached_property
    def replay_audit(self) -> list[SimpleNamespace]:
        """The replay against the target alone per sampling group (``v_replay_audit``); empty when
        the run was not replayed."""
        return self.rows(q.REPLAY_AUDIT)

    @cached_property
    def what_if_k(self) -> list[dict[str, Any]]:
        """AL and predicted tokens/s at each k' up to the run's (:func:`specscope.metrics.what_if_k`)."""
        (times,) = self.rows(q.RUN_STEP_TIMES, limit=q.TIMED_STEPS)
        return what_if_k([vars(row) for row in self.rows(q.RUN_MASKS)], vars(times))

    @cached_property
    def rank_acceptance(self) -> list[SimpleNamespace]:
        """``(rank, verify_steps, mean_acceptance_length)`` per rank with verify steps."""
        return self.rows(q.RANK_ACCEPTANCE)

    @cached_property
    def rank_status(self) -> list[SimpleNamespace]:
        """``run_ranks`` counters per rank (``events_written``, ``events_dropped``, ``hook_calls``,
        ``hook_errors``, ``graph_mode``)."""
        return self.rows(q.RANKS)

    # -- tensors and provenance --------------------------------------------------------------------

    @cached_property
    def contract(self) -> list[SimpleNamespace]:
        """The run's shape contract (``queries.TENSOR_CONTRACT``): per hook point, rank, shape,
        expected shape, dtype and graph phase, its ``events``, ``width`` and ``expected_width``."""
        return self.rows(q.TENSOR_CONTRACT)

    @cached_property
    def contract_widths(self) -> list[Widths]:
        """Recorded events per hook point with a width contract, rank, observed and expected width."""
        counts: dict[Widths, int] = {}
        for row in self.contract:
            if row.expected_width is not None:
                key = Widths(row.hook_point, row.rank, row.width, row.expected_width)
                counts[key] = counts.get(key, 0) + int(row.events)
        return [replace(key, events=events) for key, events in counts.items()]

    @cached_property
    def fed_widths(self) -> list[Widths]:
        """Recorded target-fed draft inputs (expected width = the fused width) per hook point, rank
        and observed width: ``draft.forward:hidden_states`` where the draft fuses (SGLang, the
        reference engine), ``draft.model.fc:input`` where the engine fuses first (vLLM)."""
        if self.fused_width is None:
            return []
        return [w for w in self.contract_widths
                if w.hook_point.startswith(points.DRAFT_PREFIX) and w.expected_width == self.fused_width]

    @cached_property
    def draft_ran(self) -> bool:
        """Any ``draft.forward:*`` event recorded."""
        prefix = points.point(points.DRAFT_FORWARD, "")
        return any(row.hook_point.startswith(prefix) for row in self.contract)

    @cached_property
    def target_observed(self) -> bool:
        """Any ``target.*`` event recorded (the target was instrumented at all)."""
        return any(row.hook_point.startswith(points.TARGET_PREFIX) for row in self.contract)

    @cached_property
    def capture_events(self) -> dict[int, int]:
        """Recorded ``target.layers.{i}:input`` events per configured capture layer i (0 = none)."""
        events = {i: 0 for i in self.capture_layers}
        for row in self.contract:
            index = points.capture_layer(row.hook_point)
            if index in events:
                events[index] += int(row.events)
        return events

    @cached_property
    def nonfinite(self) -> list[SimpleNamespace]:
        """Hook points whose recorded value statistics counted inf/nan (``queries.NONFINITE``)."""
        return self.rows(q.NONFINITE)

    @cached_property
    def load_problems(self) -> list[SimpleNamespace]:
        """Checkpoint loads that left parameters missing or dropped keys, ``missing`` and
        ``unexpected`` parsed (lists of names)."""
        problems = []
        for row in self.rows(q.LOAD_REPORTS):
            row.missing = self._keys(row.missing, "load_reports.missing")
            row.unexpected = self._keys(row.unexpected, "load_reports.unexpected")
            if row.missing or row.unexpected:
                problems.append(row)
        return problems

    def _keys(self, text: str, what: str) -> list[str]:
        """A JSON list of checkpoint keys; anything else (a store written by another tool) is a
        StoreError naming the run and column, not a failure of the rules that match keys as text."""
        keys = parse_json(text, what, self.run_id)
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
            raise StoreError(f"run {self.run_id}: {what} holds {str(keys)[:80]}, not a list of keys")
        return keys

    @cached_property
    def provenance(self) -> list[tuple[int, tuple[int | None, ...], int]]:
        """``(rank, received, samples)`` per rank and distinct provenance answer."""
        samples: dict[tuple[int, tuple], int] = {}
        for row in self.rows(q.PROVENANCE):
            key = (row.rank, tuple(parse_json(row.received, "provenance.received", self.run_id)))
            samples[key] = samples.get(key, 0) + int(row.checks)
        return sorted(((rank, received, n) for (rank, received), n in samples.items()),
                      key=lambda item: (item[0], -item[2], json.dumps(item[1])))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)

