"""What the dashboard reads, shaped for its pages: each function runs named queries of
:mod:`specscope.storage.queries` (where every statement lives; the formulas are in the views of
:mod:`specscope.storage.views`) on an open read-only Store and returns plain lists of dicts, already
aggregated by the database, with JSON columns parsed. Run-level figures come from the summary
tables, so the cost of a page does not grow with a run's verify steps or tensor events except for the
per-request pages and acceptance over time (``python -m benchmarks.dashboard_queries``). Time columns
are wall-clock seconds since the Unix epoch (``*_wall``) or durations (``*_s``). Every function raises
:class:`~specscope.errors.StoreError` when the database refuses the query.
"""

from __future__ import annotations

import json
from typing import Any

from specscope import metrics, points, readmodel
from specscope.compare import compare
from specscope.errors import ConfigError, StoreError
from specscope.storage import Store
from specscope.storage import queries as q
from specscope.storage.runs import resolve_run_id

Row = dict[str, Any]

runs = readmodel.summaries  # the run picker's rows: one per run, newest first, with its state
run_summary = readmodel.summary  # one run as in ``runs``; None when it does not exist
distributions = readmodel.distributions  # histogram, per-request AL percentiles, windows, by output position


def acceptance_over_time(store: Store, run_id: str, buckets: int = 120) -> list[Row]:
    """Acceptance length over wall time in ``buckets`` slices of the run's lifetime
    (:data:`specscope.storage.queries.ACCEPTANCE_OVER_TIME`)."""
    return store.fetch(q.ACCEPTANCE_OVER_TIME, run_id=run_id, buckets=buckets)


def position_acceptance(store: Store, run_id: str) -> list[Row]:
    """Per-position acceptance of a run: ``position`` (0 = first draft token), ``accepted_steps``,
    ``verify_steps``, ``acceptance`` (p_i)."""
    return store.fetch(q.POSITION_ACCEPTANCE, run_id=run_id)


def what_if_k(store: Store, run_id: str) -> list[Row]:
    """Per k' = 1 .. the run's k: ``k``, ``mean_acceptance_length`` the run's verify steps give cut to
    k' drafts, ``tokens_per_s`` predicted from its draft / verify times (None without them)
    (:func:`specscope.metrics.what_if_k`)."""
    (times,) = store.fetch(q.RUN_STEP_TIMES, run_id=run_id, limit=q.TIMED_STEPS)
    return metrics.what_if_k(store.fetch(q.RUN_MASKS, run_id=run_id), times)


def comparison(store: Store, candidate_run: str, base_run: str) -> Row:
    """``candidate_run`` against ``base_run`` (:func:`specscope.compare.compare`, its JSON form: both
    sides, ``delta``, ``ci95``, ``verdict``, ``paired``, ``moved``...), or ``{"error": message}`` when
    the two cannot be compared (a run with fewer than two requests with verify steps)."""
    try:
        return compare(store, store, base_run, candidate_run).to_dict()
    except ConfigError as exc:
        return {"error": str(exc)}


def linked_run(store: Store, run_id: str) -> Row:
    """The run a link names by its id or a unique prefix of one (the short ids the pages show):
    ``{"run_id": whole id}``, or ``{"error": message}`` naming why none (no such run, several)."""
    try:
        with store.connect() as conn:
            return {"run_id": resolve_run_id(conn, run_id, store.url)}
    except (ConfigError, StoreError) as exc:  # StoreError: text the database cannot compare (NUL)
        return {"error": str(exc)}


# -- requests ------------------------------------------------------------------------------------

def requests(store: Store, run_id: str, order: str = "start", limit: int = 500) -> list[Row]:
    """Requests of a run from ``v_request_acceptance``: tokens, verify steps, AL, rate, duration (s),
    ``step_detail`` (1: per-step rows kept; 0: sampled out, exact aggregates only), ``sampling``
    (the request's sampling label) and ``text`` (what it generated; None when not recorded).

    ``order``: one of :data:`specscope.storage.queries.REQUEST_ORDERS` (start ascending; the others
    worst first: lowest AL, longest duration, most steps). At most ``limit`` rows.

    Raises:
        ValueError: unknown ``order``.
    """
    if order not in q.REQUEST_ORDERS:
        raise ValueError(f"unknown request order {order!r}; choose one of {', '.join(q.REQUEST_ORDERS)}")
    return store.fetch(q.REQUESTS, run_id=run_id, order=order, limit=limit)


def sampling_acceptance(store: Store, run_id: str) -> list[Row]:
    """Acceptance of each sampling group of a run (``v_sampling_acceptance``): ``sampling`` (the
    label, e.g. ``greedy`` or ``T=0.8``; None: not reported), ``requests``, ``verify_steps``,
    ``mean_acceptance_length``, ``acceptance_rate``."""
    return store.fetch(q.SAMPLING_ACCEPTANCE, run_id=run_id)


def request_steps(store: Store, run_id: str, request_id: str, limit: int = 5000) -> list[Row]:
    """Verify steps of one request in order: ``step``, ``proposed``, ``accepted``, ``accepted_mask``,
    ``draft_s``, ``verify_s`` (s), ``emitted`` (decoded tokens: accepted drafts, then the bonus
    token; None when not recorded). Empty for a request sampled out of step detail (its aggregate rows,
    ``step`` -1, are not steps)."""
    rows = store.fetch(q.REQUEST_STEPS, run_id=run_id, request_id=request_id, limit=limit)
    for row in rows:
        row["emitted"] = None if row["emitted"] is None else json.loads(row["emitted"])
    return rows


def request_positions(store: Store, run_id: str, request_id: str) -> list[Row]:
    """Per-position acceptance p_i of one request; same columns as :func:`position_acceptance`
    (denominator: the request's verify steps)."""
    return store.fetch(q.REQUEST_POSITIONS, run_id=run_id, request_id=request_id)


def marked_tokens(steps: list[Row]) -> list[Row]:
    """The generated text token by token, from :func:`request_steps` rows: ``token``, ``step`` and
    ``source``: ``'draft'`` for an accepted draft token, ``'target'`` for the bonus token the target
    chose itself. The first ``accepted`` emitted tokens of a step are drafts, the last is the bonus
    (a step cut by the token budget or EOS may emit fewer)."""
    marked = []
    for row in steps:
        for index, token in enumerate(row["emitted"] or ()):
            source = "draft" if index < row["accepted"] else "target"
            # str(): a store written before VerifyStep checked ``emitted`` may hold token ids
            marked.append({"token": str(token), "step": row["step"], "source": source})
    return marked


# -- ranks (GPUs) --------------------------------------------------------------------------------

def ranks(store: Store, run_id: str) -> list[Row]:
    """One row per rank of a run: device, host, pid, graph mode, hook calls / errors, events written /
    dropped, and the rank's acceptance (verify steps, AL, rate, tokens/s)."""
    return store.fetch(q.RANKS, run_id=run_id)


# -- tensors -------------------------------------------------------------------------------------

def tensor_contract(store: Store, run_id: str) -> list[Row]:
    """The shape contract of a run: one row per rank, hook point, shape, expected shape, dtype and
    graph phase, with ``events`` (recorded events, a sample of the hook calls), ``first_wall`` /
    ``last_wall``, ``width`` / ``expected_width`` (last dimension, elements; expected None where no
    contract is known) and ``width_mismatch`` (bool). Read from the ``tensor_shapes`` summary; hook
    points in :func:`specscope.points.order` (``layers.2`` before ``layers.15``), then rank and time."""
    rows = store.fetch(q.TENSOR_CONTRACT, run_id=run_id)
    for row in rows:
        row["width_mismatch"] = bool(row["width_mismatch"])
    # SQL orders text: layers.15 < layers.2. The sort is stable, so rank and time order hold.
    return sorted(rows, key=lambda row: points.order(row["hook_point"]))


def draft_input_widths(contract: list[Row], fused_width: int | None) -> list[Row]:
    """The draft's hidden-state inputs from :func:`tensor_contract` rows: every draft hook point that
    carries a width expectation (``draft.forward:hidden_states``, whatever the argument is called, and
    ``draft.model.fc:input`` where the engine fuses before the draft forward, as vLLM does), merged
    over sequence lengths: one row per rank and point, ``call`` (``'target-fed'``: expected the fused
    width; ``'chained'``: expected the draft hidden size), ``hook_point``, ``width``,
    ``expected_width`` and dtype, with ``events``, ``first_wall`` / ``last_wall``,
    ``width_mismatch`` and ``shapes`` (the distinct shapes merged)."""
    merged: dict[tuple, Row] = {}
    for row in contract:
        if not row["hook_point"].startswith(points.DRAFT_PREFIX) or row["expected_width"] is None:
            continue
        call = _call(row["expected_width"], fused_width)
        key = (row["rank"], row["hook_point"], call, row["width"], row["expected_width"], row["dtype"])
        if key not in merged:
            merged[key] = {"rank": row["rank"], "hook_point": row["hook_point"], "call": call, "width": row["width"],
                           "expected_width": row["expected_width"], "dtype": row["dtype"],
                           "width_mismatch": row["width_mismatch"], "events": 0, "shapes": 0,
                           "first_wall": row["first_wall"], "last_wall": row["last_wall"]}
        out = merged[key]
        out["events"] += row["events"]
        out["shapes"] += 1
        out["first_wall"] = min(out["first_wall"], row["first_wall"])
        out["last_wall"] = max(out["last_wall"], row["last_wall"])
    return list(merged.values())


def _call(expected_width: int, fused_width: int | None) -> str:
    """A draft call's kind by its expected input width: ``'target-fed'`` (the fused width) or
    ``'chained'`` (the draft's own hidden size)."""
    return "target-fed" if fused_width is not None and expected_width == fused_width else "chained"


def draft_inputs_over_time(store: Store, run_id: str, fused_width: int | None, buckets: int = 60) -> list[Row]:
    """The draft's inputs with a width contract per slice of the run's lifetime
    (:data:`specscope.storage.queries.DRAFT_INPUTS_OVER_TIME`: ``rank``, ``hook_point``, ``width``,
    ``expected_width``, ``slice``, ``t_s``, ``events``), each with ``call`` as in
    :func:`draft_input_widths` and ``width_mismatch``. A slice without a row had no sampled call."""
    rows = store.fetch(q.DRAFT_INPUTS_OVER_TIME, run_id=run_id, buckets=buckets)
    for row in rows:
        row["call"] = _call(row["expected_width"], fused_width)
        row["width_mismatch"] = row["width"] != row["expected_width"]
    return rows


def capture_layers(config: dict[str, Any], contract: list[Row]) -> list[Row]:
    """Configured capture layers (``config['aux_layer_ids_resolved']``) against the
    ``target.layers.{i}:input`` hook points that recorded events (:func:`tensor_contract` rows), per
    rank that recorded any hook point: ``layer``, ``rank``, ``configured``, ``events`` (summed over
    shapes), ``fired``. A rank whose target never ran a layer gets its own row, so one silent rank
    of several is not hidden by the others."""
    events: dict[tuple[int, int], int] = {}
    for row in contract:
        index = points.capture_layer(row["hook_point"])
        if index is not None:
            events[index, row["rank"]] = events.get((index, row["rank"]), 0) + row["events"]
    configured = set(config.get("aux_layer_ids_resolved") or ())
    ranks = sorted({row["rank"] for row in contract}) or [None]
    return [{"layer": layer, "rank": rank, "configured": layer in configured,
             "events": events.get((layer, rank), 0), "fired": events.get((layer, rank), 0) > 0}
            for layer in sorted(configured | {layer for layer, _ in events}) for rank in ranks]


def provenance(store: Store, run_id: str) -> list[Row]:
    """Which target layers the draft received (fingerprints), grouped: ``rank``, ``configured`` and
    ``received`` (lists; None = no layer matched, ``num_target_layers`` = the final norm output),
    ``matches`` (bool), ``width``, ``checks`` (sampled draft calls), first / last wall time."""
    rows = store.fetch(q.PROVENANCE, run_id=run_id)
    for row in rows:
        row["configured"], row["received"] = json.loads(row["configured"]), json.loads(row["received"])
        row["matches"] = bool(row["matches"])
    return rows


def graph_phases(contract: list[Row]) -> dict[str, int]:
    """Events recorded per graph phase (``'eager'`` / ``'capture'``) from :func:`tensor_contract`."""
    phases: dict[str, int] = {}
    for row in contract:
        phases[row["graph_phase"]] = phases.get(row["graph_phase"], 0) + row["events"]
    return phases


# -- checkpoint loading --------------------------------------------------------------------------

def load_reports(store: Store, run_id: str) -> list[Row]:
    """Checkpoint load reports of a run: ``rank``, ``module``, ``source``, ``strict``, ``loaded`` and
    the key lists ``missing``, ``unexpected`` (dropped) and ``renamed`` (``[checkpoint key, name]``)."""
    rows = store.fetch(q.LOAD_REPORTS, run_id=run_id)
    for row in rows:
        for key in ("missing", "unexpected", "renamed"):
            row[key] = json.loads(row[key])
        row["strict"] = bool(row["strict"])
    return rows
