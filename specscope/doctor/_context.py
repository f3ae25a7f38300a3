"""What the rules read about one run: its metadata and config, and per-run SQL aggregates.

Every query filters on ``run_id`` and aggregates in SQL (the store may hold millions of verify steps
and tensor events); results are small (a row per rank, hook point, width or distinct provenance
answer) and cached on the context, so rules that share a query run it once. Hook-point prefixes are
matched as ranges (``'draft.forward:' <= hook_point < 'draft.forward;'``, ``;`` being the character
after ``:``) so the (run_id, hook_point, rank) prefix of ``ix_tensor_events_contract`` serves them on
SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cached_property
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope import points
from specscope.errors import StoreError

# Hook-point prefixes as ranges: ';' and '/' are the characters after ':' and '.'.
DRAFT_FORWARD = (points.point(points.DRAFT_FORWARD, ""), points.DRAFT_FORWARD + ";")
DRAFT = (points.DRAFT_PREFIX, points.DRAFT_PREFIX[:-1] + "/")  # the fused input: draft.forward or draft.<fc>
TARGET = ("target.", "target/")

_SQL = {
    "acceptance": "SELECT (SELECT COUNT(*) FROM requests WHERE run_id = :run_id) AS requests, "
                  "verify_steps, proposed, accepted, mean_acceptance_length, acceptance_rate "
                  "FROM v_run_acceptance WHERE run_id = :run_id",
    "requests": "SELECT COUNT(*) FROM requests WHERE run_id = :run_id",
    "positions": "SELECT position, acceptance FROM v_position_acceptance WHERE run_id = :run_id "
                 "ORDER BY position",
    "rank_acceptance": "SELECT rank, verify_steps, mean_acceptance_length FROM v_rank_acceptance "
                       "WHERE run_id = :run_id ORDER BY rank",
    "rank_status": "SELECT rank, events_written, events_dropped, hook_calls, hook_errors, graph_mode "
                   "FROM run_ranks WHERE run_id = :run_id ORDER BY rank",
    "fed_widths": "SELECT hook_point, rank, shape, expected_shape, COUNT(*) AS events "
                  "FROM tensor_events WHERE run_id = :run_id AND hook_point >= :lo AND hook_point < :hi "
                  "AND expected_shape IS NOT NULL GROUP BY hook_point, rank, shape, expected_shape",
    "any_event": "SELECT 1 FROM tensor_events WHERE run_id = :run_id AND hook_point >= :lo "
                 "AND hook_point < :hi LIMIT 1",
    "point_events": "SELECT hook_point, COUNT(*) AS events FROM tensor_events "
                    "WHERE run_id = :run_id AND hook_point IN :points GROUP BY hook_point",
    "provenance": "SELECT rank, received, COUNT(*) AS samples FROM provenance WHERE run_id = :run_id "
                  "GROUP BY rank, received ORDER BY rank, samples DESC, received",
    "nonfinite": "SELECT hook_point, SUM(nonfinite) AS elements, COUNT(*) AS events, "
                 "MIN(ts_wall) AS first_wall FROM tensor_events WHERE run_id = :run_id "
                 "AND nonfinite > 0 GROUP BY hook_point ORDER BY first_wall, hook_point",
    "contract_widths": "SELECT hook_point, rank, shape, expected_shape FROM tensor_events "
                       "WHERE run_id = :run_id AND expected_shape IS NOT NULL "
                       "GROUP BY hook_point, rank, shape, expected_shape",
    "load_reports": "SELECT rank, module, source, strict, loaded, missing, unexpected FROM load_reports "
                    "WHERE run_id = :run_id AND (missing <> '[]' OR unexpected <> '[]') ORDER BY id",
}
_STATEMENTS = {name: sa.text(sql) for name, sql in _SQL.items()}
_STATEMENTS["point_events"] = _STATEMENTS["point_events"].bindparams(
    sa.bindparam("points", expanding=True))


def number(value: Any) -> Any:
    """PostgreSQL returns NUMERIC for some aggregates: plain int / float for evidence and JSON."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def parse_json(text: str, what: str, run_id: str) -> Any:
    """A JSON column value; malformed JSON in the store is a StoreError naming the run and column."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"run {run_id}: malformed JSON in {what}: {exc}") from exc


def last_dim(shape: str | None) -> int | None:
    """Width from a stored shape text (``"1x5x1728"`` -> 1728; ``""`` for a 0-d tensor -> None)."""
    return int(shape.rsplit("x", 1)[-1]) if shape else None


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
    rule reads it.
    """

    def __init__(self, conn: Connection, run_id: str, engine: str, fault: str | None,
                 config: dict[str, Any]) -> None:
        self.conn = conn
        self.run_id = run_id
        self.engine = engine
        self.fault = fault
        self.config = config

    def rows(self, name: str, **params: Any) -> list[sa.Row]:
        """Rows of the named per-run query of :data:`_SQL`."""
        return list(self.conn.execute(_STATEMENTS[name], {"run_id": self.run_id, **params}))

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
        rows = self.rows("acceptance")
        if not rows:  # no verify step: v_run_acceptance has no row for the run
            requests = self.conn.execute(_STATEMENTS["requests"], {"run_id": self.run_id}).scalar()
            return Acceptance(int(requests), 0, 0, 0, None, None)
        row = rows[0]
        return Acceptance(int(row.requests), int(row.verify_steps), int(number(row.proposed)),
                          int(number(row.accepted)), float(row.mean_acceptance_length),
                          _float(row.acceptance_rate))

    @cached_property
    def per_position(self) -> list[float]:
        """p_i for i = 0.. (``v_position_acceptance``); empty without verify steps."""
        return [float(row.acceptance) for row in self.rows("positions")]

    @cached_property
    def rank_acceptance(self) -> list[sa.Row]:
        """``(rank, verify_steps, mean_acceptance_length)`` per rank with verify steps."""
        return self.rows("rank_acceptance")

    @cached_property
    def rank_status(self) -> list[sa.Row]:
        """``run_ranks`` counters per rank."""
        return self.rows("rank_status")

    # -- tensors and provenance --------------------------------------------------------------------

    @cached_property
    def fed_widths(self) -> list[Widths]:
        """Recorded target-fed draft inputs (expected width = the fused width) per hook point, rank
        and observed width: ``draft.forward:hidden_states`` where the draft fuses (SGLang, the
        reference engine), ``draft.model.fc:input`` where the engine fuses first (vLLM)."""
        if self.fused_width is None:
            return []
        lo, hi = DRAFT
        return [w for w in self.widths("fed_widths", lo=lo, hi=hi) if w.expected_width == self.fused_width]

    def widths(self, name: str, **params: Any) -> list[Widths]:
        """A ``(hook_point, rank, shape, expected_shape[, events])`` query regrouped by width. Shapes,
        not the ``width`` columns, so ``ix_tensor_events_contract`` covers the scan (no table reads)."""
        counts: dict[Widths, int] = {}
        for row in self.rows(name, **params):
            key = Widths(row.hook_point, row.rank, last_dim(row.shape), last_dim(row.expected_shape))
            counts[key] = counts.get(key, 0) + int(getattr(row, "events", 1))
        return [replace(key, events=events) for key, events in counts.items()]

    @cached_property
    def draft_ran(self) -> bool:
        """Any ``draft.forward:*`` event recorded."""
        return self._any(DRAFT_FORWARD)

    @cached_property
    def target_observed(self) -> bool:
        """Any ``target.*`` event recorded (the target was instrumented at all)."""
        return self._any(TARGET)

    def _any(self, bounds: tuple[str, str]) -> bool:
        return bool(self.rows("any_event", lo=bounds[0], hi=bounds[1]))

    @cached_property
    def capture_events(self) -> dict[int, int]:
        """Recorded ``target.layers.{i}:input`` events per configured capture layer i (0 = none)."""
        layers = self.capture_layers
        if not layers:
            return {}
        names = {points.target_layer_input(i): i for i in layers}
        counts = {names[row.hook_point]: int(row.events)
                  for row in self.rows("point_events", points=list(names))}
        return {i: counts.get(i, 0) for i in layers}

    @cached_property
    def provenance(self) -> list[tuple[int, tuple[int | None, ...], int]]:
        """``(rank, received, samples)`` per rank and distinct provenance answer."""
        return [(row.rank, tuple(parse_json(row.received, "provenance.received", self.run_id)),
                 int(row.samples)) for row in self.rows("provenance")]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)

