"""The trace store's schema: SQLAlchemy Core tables (docs/design.md, "Event model") and the SQL views every
reader uses (dashboard, doctor, ``specscope query``). Acceptance formulas (docs/design.md, "Acceptance figures") are
defined here once, in SQL:

- mean acceptance length (AL) = 1 + accepted / verify_steps (tokens per verify step, bonus included;
  NULL when a run/request has no verify step);
- acceptance rate = accepted / proposed (NULL when nothing was proposed);
- per-position acceptance p_i = verify steps whose draft at position i was accepted / verify steps.

A ``verify_steps`` row may stand for several verify steps (column ``steps``): every sum above counts
``steps``, so exact per-request, per-rank and per-position aggregates hold whether a request kept its
per-step rows or only one aggregate row per distinct accepted mask.

Time columns ``*_wall`` are wall-clock seconds since the Unix epoch; ``*_s`` are durations in seconds.
Shapes are stored as text ``"1x5x1728"`` plus the last dimension as an integer ``width``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)

from specscope.event_checks import MAX_HOST, MAX_NAME, MAX_REQUEST_ID, SURPRISE_COLUMNS
from specscope.events import PIT_BINS

SCHEMA_VERSION = 18

metadata = MetaData()

schema_migrations = Table(
    "schema_migrations", metadata,
    Column("version", Integer, primary_key=True),
    Column("name", String(128), nullable=False),
    Column("applied_wall", Float, nullable=False),
)

runs = Table(
    "runs", metadata,
    Column("run_id", String(MAX_NAME), primary_key=True),
    Column("engine", String(MAX_NAME), nullable=False),
    Column("engine_version", String(MAX_NAME), nullable=False),
    Column("target_model", Text, nullable=False),
    Column("draft_model", Text, nullable=False),
    Column("fault", String(MAX_NAME)),
    Column("config", Text, nullable=False),  # JSON of RunConfig.to_dict()
    Column("world_size", Integer, nullable=False),
    Column("host", String(MAX_HOST), nullable=False),
    Column("started_wall", Float, nullable=False),
)

run_ranks = Table(
    "run_ranks", metadata,
    Column("run_id", String(MAX_NAME), primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("world_size", Integer, nullable=False),
    Column("host", String(MAX_HOST), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("device", String(MAX_NAME), nullable=False),
    Column("started_wall", Float, nullable=False),
    Column("last_seen_wall", Float, nullable=False),
    Column("ended_wall", Float),
    Column("events_written", BigInteger, nullable=False, default=0),
    Column("events_dropped", BigInteger, nullable=False, default=0),
    Column("hook_calls", BigInteger, nullable=False, default=0),
    Column("hook_errors", BigInteger, nullable=False, default=0),
    Column("graph_mode", String(16), nullable=False, default="eager"),
    Column("error", Text),  # the error the rank stopped on (set with ended_wall: it crashed)
)

requests = Table(
    "requests", metadata,
    Column("run_id", String(MAX_NAME), primary_key=True),
    Column("request_id", String(MAX_REQUEST_ID), primary_key=True),
    Column("rank", Integer, nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("output_tokens", Integer),
    Column("verify_steps", Integer),
    Column("text", Text),
    Column("started_wall", Float, nullable=False),
    Column("finished_wall", Float),
    # sampling settings as the engine applied them (NULL: not reported); ``sampling`` is their label
    # (``events.sampling_label``), the group acceptance and the losslessness audit are split by
    Column("sampling", String(64)),
    Column("temperature", Float),
    Column("top_p", Float),
    Column("top_k", Integer),
    Column("prompt_key", String(64)),  # events.prompt_key: the same prompt, the same key in every run
)

verify_steps = Table(
    "verify_steps", metadata,
    # the order rows were stored in: the schema-13 upgrade keeps the first of a step stored twice
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("request_id", String(MAX_REQUEST_ID), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("proposed", Integer, nullable=False),
    Column("accepted", Integer, nullable=False),
    Column("accepted_mask", String(64), nullable=False),  # '1100': position 0 first
    Column("draft_s", Float),
    Column("verify_s", Float),
    Column("emitted", Text),  # JSON list of decoded tokens: accepted drafts, then the bonus token
    Column("ts_wall", Float, nullable=False),
    # Verify steps the row stands for: 1 for a per-step row; n for an aggregate row
    # of n steps of one request that share ``accepted_mask`` (``step`` = -1, ``proposed`` /
    # ``accepted`` summed over the n steps, ``emitted`` NULL). Aggregates come from requests sampled
    # out of step detail and from watched servers (``specscope watch``); the views weight by it.
    Column("steps", Integer, nullable=False, server_default=text("1")),
    Index("ix_verify_steps_run_req", "run_id", "request_id", "step"),
    # ts_wall (version 16): the raw steps of a second that straddles a slice boundary (step_seconds)
    Index("ix_verify_steps_run_rank", "run_id", "rank", "ts_wall"),
)

# Append-only and the most rows of a store (six per verify step in the decode mix): no serial key,
# which no reader needs and every insert would pay for (a sequence and a B-tree on PostgreSQL; SQLite
# keeps its implicit rowid), and one index over every row (version 17).
tensor_events = Table(
    "tensor_events", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("hook_point", String(255), nullable=False),
    Column("call_index", Integer, nullable=False),
    Column("shape", String(128), nullable=False),
    Column("width", Integer),
    Column("dtype", String(32), nullable=False),
    Column("device", String(MAX_NAME), nullable=False),
    Column("expected_shape", String(128)),
    Column("expected_width", Integer),
    Column("absmax", Float),
    Column("mean", Float),
    Column("nonfinite", Integer),
    Column("request_id", String(MAX_REQUEST_ID)),
    Column("step", Integer),
    Column("graph_phase", String(16), nullable=False),
    Column("ts_wall", Float, nullable=False),
    # The raw events of a rank in a second that straddles a slice boundary (draft_input_seconds; version
    # 16), and per-run lookups by rank and time. No hook point (version 17): its text made every insert
    # compare strings down the B-tree and widened each entry, and a second's events of one rank are few;
    # the rank keeps the writers of a run's ranks on their own leaf pages.
    Index("ix_tensor_events_run", "run_id", "rank", "ts_wall"),
    # The doctor's non-finite check reads only the rare rows with inf/nan.
    Index("ix_tensor_events_nonfinite", "run_id", "hook_point", sqlite_where=text("nonfinite > 0"),
          postgresql_where=text("nonfinite > 0")),
)

# -- summaries -----------------------------------------------------------------------------------
# Aggregates of the two high-volume tables, kept by ``Store.write`` in the same transaction as the
# rows they summarise (``storage/_summaries.py``): the run-level views and the shape contract read a
# few rows per run here instead of scanning a run's verify steps / tensor events (the dashboard's
# 0.5 s page budget on 1M steps / 5M events, docs/design.md "Budgets"). Rows loaded around the Store
# (raw SQL) are summarised by ``Store.rebuild_summaries``.

acceptance_masks = Table(
    "acceptance_masks", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("accepted_mask", String(64), nullable=False),
    # BigInteger (version 13): a watched server's counters pass 2**31 - 1 for one mask within days
    Column("steps", BigInteger, nullable=False),  # verify steps with this mask (sum of verify_steps.steps)
    Column("proposed", BigInteger, nullable=False),
    Column("accepted", BigInteger, nullable=False),
    Column("first_wall", Float, nullable=False),
    Column("last_wall", Float, nullable=False),
    Column("step_detail", Integer, nullable=False),  # 1: some row is a per-step row (step >= 0)
    PrimaryKeyConstraint("run_id", "rank", "accepted_mask"),
)

# Per request (version 16): the per-request views (v_request_acceptance, v_sampling_acceptance, the
# acceptance histogram and the per-request AL spread) and the doctor's drift and outlier rules read a
# few rows per request here instead of every verify step of the run.
request_accepts = Table(
    "request_accepts", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("request_id", String(MAX_REQUEST_ID), nullable=False),
    # draft tokens each of these steps accepted (0..k): rows whose steps share an accepted mask, or
    # that proposed nothing; -1 (_summaries.UNKNOWN_DRAFTS) where not known (totals without a mask)
    Column("accepted_drafts", Integer, nullable=False),
    Column("steps", BigInteger, nullable=False),  # sum of verify_steps.steps
    Column("proposed", BigInteger, nullable=False),
    Column("accepted", BigInteger, nullable=False),
    Column("position0_steps", BigInteger, nullable=False),  # steps whose first draft was accepted
    Column("drafts", Integer, nullable=False),  # most drafts one step proposed (0 where not known)
    Column("first_wall", Float, nullable=False),
    Column("last_wall", Float, nullable=False),
    Column("step_detail", Integer, nullable=False),  # 1: some row is a per-step row (step >= 0)
    PrimaryKeyConstraint("run_id", "request_id", "accepted_drafts"),
)

# By wall-clock second (version 16): the views of a run over time (acceptance over time, the draft's
# inputs over time) count a second's rows at once when the whole second falls in one slice of the run,
# and read the raw rows of the few seconds that straddle a slice boundary (queries._sliced).
step_seconds = Table(
    "step_seconds", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("wall_second", BigInteger, nullable=False),  # floor(ts_wall)
    Column("steps", BigInteger, nullable=False),  # sum of verify_steps.steps
    Column("accepted", BigInteger, nullable=False),
    Column("first_wall", Float, nullable=False),
    Column("last_wall", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "rank", "wall_second"),
)

draft_input_seconds = Table(  # tensor_events at draft.* hook points with an expected width
    "draft_input_seconds", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("hook_point", String(255), nullable=False),
    Column("width", Integer, nullable=False),  # -1 (_summaries.NO_WIDTH) for a tensor without one
    Column("expected_width", Integer, nullable=False),
    Column("wall_second", BigInteger, nullable=False),  # floor(ts_wall)
    Column("events", BigInteger, nullable=False),
    Column("first_wall", Float, nullable=False),
    Column("last_wall", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "rank", "hook_point", "width", "expected_width", "wall_second"),
)

tensor_shapes = Table(
    "tensor_shapes", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("hook_point", String(255), nullable=False),
    Column("shape", String(128), nullable=False),
    Column("dtype", String(32), nullable=False),
    Column("device", String(MAX_NAME), nullable=False),
    # '' where no contract is known (NULL in tensor_events): a NULL in a key would never conflict
    Column("expected_shape", String(128), nullable=False),
    Column("graph_phase", String(16), nullable=False),
    Column("width", Integer),
    Column("expected_width", Integer),
    Column("events", BigInteger, nullable=False),  # BigInteger: sums over a run's lifetime (version 13)
    Column("first_call", Integer, nullable=False),
    Column("last_call", Integer, nullable=False),
    Column("first_wall", Float, nullable=False),
    Column("last_wall", Float, nullable=False),
    Column("nonfinite", BigInteger, nullable=False),  # sum of tensor_events.nonfinite (NULL as 0)
    PrimaryKeyConstraint("run_id", "rank", "hook_point", "shape", "dtype", "device", "expected_shape",
                         "graph_phase"),
)

provenance = Table(
    "provenance", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("call_index", Integer, nullable=False),
    Column("configured", Text, nullable=False),  # JSON list of ints
    Column("received", Text, nullable=False),  # JSON list of ints / nulls
    Column("matches", Boolean, nullable=False),
    Column("width", Integer, nullable=False),
    Column("request_id", String(MAX_REQUEST_ID)),
    Column("step", Integer),
    Column("ts_wall", Float, nullable=False),
    Index("ix_provenance_run", "run_id"),
)

load_reports = Table(
    "load_reports", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("module", String(255), nullable=False),
    Column("source", Text, nullable=False),
    Column("strict", Boolean, nullable=False),
    Column("loaded", Integer, nullable=False),
    Column("missing", Text, nullable=False),  # JSON list of parameter names
    Column("unexpected", Text, nullable=False),  # JSON list of checkpoint keys
    Column("renamed", Text, nullable=False),  # JSON list of [checkpoint key, parameter name]
    Column("ts_wall", Float, nullable=False),
)

positions = Table(  # 0..MAX_POSITIONS-1: lets per-position views stay plain, portable SQL
    "positions", metadata,
    Column("pos", Integer, primary_key=True, autoincrement=False),
)
MAX_POSITIONS = 64

lossless_audit = Table(  # one row per request and audited batch of verify steps (events.LosslessAudit)
    "lossless_audit", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("request_id", String(MAX_REQUEST_ID), nullable=False),
    Column("sampling", String(64), nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("mismatches", Integer, nullable=False),
    Column("rare", Integer, nullable=False),
    Column("rare_expected", Float, nullable=False),
    Column("p_sum", Float, nullable=False),
    Column("p2_sum", Float, nullable=False),
    Column("epsilon", Float, nullable=False),
    Column("example", Text),  # JSON object: the first violating token, NULL when none
    Column("ts_wall", Float, nullable=False),
    # the distribution tests' figures (version 11): 0 on rows audited before them, which they skip
    Column("p_var_sum", Float, nullable=False, server_default="0"),
    *(Column(f"pit_{b}", Integer, nullable=False, server_default="0") for b in range(PIT_BINS)),
    # the surprise test's figures (version 14): 0 on rows audited before it, which add nothing to it
    *(Column(name, Float, nullable=False, server_default="0") for name in SURPRISE_COLUMNS),
    # the recovered-token check's figures (version 15): 0 on rows audited before it (nothing checked)
    Column("recovered", Integer, nullable=False, server_default="0"),
    Column("recovered_as_draft", Integer, nullable=False, server_default="0"),
    Column("recovered_p_sum", Float, nullable=False, server_default="0"),
    Index("ix_lossless_audit_run", "run_id", "sampling"),
)

request_tokens = Table(  # one row per request whose token ids were kept (events.RequestTokens; version 12)
    "request_tokens", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("request_id", String(MAX_REQUEST_ID), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("prompt_ids", Text, nullable=False),  # JSON list of token ids
    Column("output_ids", Text, nullable=False),  # JSON list of token ids
    Column("output_truncated", Boolean, nullable=False),
    Column("ts_wall", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "request_id"),
)

replay_requests = Table(  # one row per replayed request, the last replay's (events.ReplayResult; version 12)
    "replay_requests", metadata,
    Column("run_id", String(MAX_NAME), nullable=False),
    Column("request_id", String(MAX_REQUEST_ID), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("sampling", String(64), nullable=False),
    Column("source", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("departures", Integer, nullable=False),
    Column("near_ties", Integer, nullable=False),
    Column("mismatches", Integer, nullable=False),  # departures beyond a near-tie (lossless_audit's meaning)
    Column("first_departure", Integer),
    Column("first_margin", Float),
    Column("max_margin", Float),
    Column("near_tie_margin", Float, nullable=False),
    Column("rare", Integer, nullable=False),
    Column("rare_expected", Float, nullable=False),
    Column("p_sum", Float, nullable=False),
    Column("p2_sum", Float, nullable=False),
    Column("p_var_sum", Float, nullable=False),
    Column("epsilon", Float, nullable=False),
    *(Column(f"pit_{b}", Integer, nullable=False) for b in range(PIT_BINS)),
    *(Column(name, Float, nullable=False, server_default="0") for name in SURPRISE_COLUMNS),  # version 14
    Column("example", Text),  # JSON object: the first departing or rare token, NULL when none
    Column("ts_wall", Float, nullable=False),
    PrimaryKeyConstraint("run_id", "request_id"),
)

findings = Table(
    "findings", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(MAX_NAME)),
    Column("source", String(16), nullable=False),  # 'doctor' | 'inspect'
    Column("code", String(64), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("evidence", Text, nullable=False),  # JSON object
    Column("fix", Text, nullable=False),
    Column("ts_wall", Float, nullable=False),
    Index("ix_findings_run", "run_id"),
)
