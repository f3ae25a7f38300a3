"""Schema versions of the trace store, as named upgrade steps recorded in ``schema_migrations``.

The sqlite-utils pattern: each step is a plain function of a connection, applied once, in version
order, inside the caller's transaction, and recorded as ``(version, name, applied_wall)``. Opening a
store applies the steps above its recorded version (:func:`upgrade`). Views are dropped and recreated
from :data:`specscope.storage.views.VIEWS` after any step, and whenever one of them is missing.

Adding a version: bump ``schema.SCHEMA_VERSION``, change the tables in ``schema.py``, and append a
step here that brings a store of the previous version to the new shape. Step 1 creates the tables
from ``schema.py`` as they are now, so later steps must check before they alter (a fresh store runs
step 1 and then every later step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope.event_checks import RECOVERED_COLUMNS, SURPRISE_COLUMNS
from specscope.storage import _steps, _summaries, schema
from specscope.storage.views import VIEWS, create_view_sql


@dataclass(frozen=True)
class Migration:
    """One upgrade step: ``apply(connection)`` brings a store from ``version - 1`` to ``version``."""

    version: int
    name: str
    apply: Callable[[Connection], None]


def create_tables(conn: Connection) -> None:
    """Version 1: every table of ``schema.py`` and the ``positions`` helper rows 0..MAX_POSITIONS-1."""
    schema.metadata.create_all(conn)
    conn.execute(schema.positions.insert(), [{"pos": pos} for pos in range(schema.MAX_POSITIONS)])


def add_tensor_contract_index(conn: Connection) -> None:
    """Version 2: ``ix_tensor_events_contract``, the covering index of the dashboard's shape-contract
    queries (replaced by the ``tensor_shapes`` summary in version 8, which drops it again)."""
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_tensor_events_contract ON tensor_events "
                         "(run_id, hook_point, rank, shape, expected_shape, dtype, graph_phase, ts_wall)")


MASKS_INDEX = "CREATE INDEX IF NOT EXISTS ix_verify_steps_masks ON verify_steps (run_id, accepted_mask, proposed, accepted{})"
"""``ix_verify_steps_masks`` of versions 3 to 16 (``, steps`` from version 6 on): covered the views'
grouping by mask until the ``acceptance_masks`` summary took it over (version 8); dropped in version 17."""


def add_position_and_nonfinite_indexes(conn: Connection) -> None:
    """Version 3: ``ix_verify_steps_masks`` (per-position acceptance grouped by mask) and the partial
    ``ix_tensor_events_nonfinite``; views are recreated after the step (new v_position_acceptance)."""
    conn.exec_driver_sql(MASKS_INDEX.format(""))
    next(ix for ix in schema.tensor_events.indexes if ix.name == "ix_tensor_events_nonfinite").create(
        conn, checkfirst=True)


def filterable_views(conn: Connection) -> None:
    """Version 4: no table changes; the views are recreated after the step in a shape whose run (and
    request) filters reach the verify-step indexes, plus ``v_request_position_acceptance``."""


def drop_redundant_tensor_index(conn: Connection) -> None:
    """Version 5: drop ``ix_tensor_events_run_point`` (run_id, hook_point, rank), a prefix of
    ``ix_tensor_events_contract``: every insert paid for a second B-tree that no query needed
    (measured: raw SQLite ingest of the decode event mix +23%)."""
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_tensor_events_run_point")


def weighted_verify_steps(conn: Connection) -> None:
    """Version 6: ``verify_steps.steps`` (verify steps a row stands for; 1 for every existing row) and
    ``ix_verify_steps_masks`` rebuilt with it, so the weighted sums stay covered by the index; the
    views are recreated after the step (sums of ``steps``, ``step_detail``)."""
    columns = {c["name"] for c in sa.inspect(conn).get_columns(schema.verify_steps.name)}
    if "steps" in columns:  # a fresh store: step 1 created the version 6 table and index
        return
    conn.exec_driver_sql("ALTER TABLE verify_steps ADD COLUMN steps INTEGER NOT NULL DEFAULT 1")
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_verify_steps_masks")
    conn.exec_driver_sql(MASKS_INDEX.format(", steps"))


def mixed_graph_mode_view(conn: Connection) -> None:
    """Version 7: no table changes; ``v_run_summary.graph_mode`` is recreated after the step as
    ``'mixed'`` when the run's ranks saw different graph modes (:data:`views.RUN_GRAPH_MODE`)."""


def summary_tables(conn: Connection) -> None:
    """Version 8: the summary tables ``acceptance_masks`` and ``tensor_shapes``, filled from the
    stored rows (``_summaries.rebuild``; one scan of each table), and ``ix_tensor_events_run``
    instead of the 8-column ``ix_tensor_events_contract`` that the shape contract no longer reads;
    the views are recreated after the step over the summaries."""
    schema.metadata.create_all(conn, tables=[schema.acceptance_masks, schema.tensor_shapes])
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_tensor_events_contract")
    next(ix for ix in schema.tensor_events.indexes if ix.name == "ix_tensor_events_run").create(
        conn, checkfirst=True)
    _summaries.rebuild(conn)


def sampling_and_audit(conn: Connection) -> None:
    """Version 9: each request's sampling settings and prompt key (``requests.sampling``,
    ``temperature``, ``top_p``, ``top_k``, ``prompt_key``), the error a rank stopped on
    (``run_ranks.error``), and the losslessness audit's table ``lossless_audit``; the views are
    recreated after the step (``v_lossless_audit``, ``v_sampling_acceptance``)."""
    for table, names in ((schema.requests, ("sampling", "temperature", "top_p", "top_k", "prompt_key")),
                         (schema.run_ranks, ("error",))):
        present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
        for name in names:
            if name not in present:
                column = table.c[name]
                kind = column.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}")
    schema.metadata.create_all(conn, tables=[schema.lossless_audit])


def lost_runs_view(conn: Connection) -> None:
    """Version 10: no table changes; the views are recreated after the step (``v_run_summary`` reads
    a run silent for longer than :data:`views.LOST_AFTER_S` as ``'lost'``)."""


def orphan_runs_view(conn: Connection) -> None:
    """Version 18: no table changes; the views are recreated after the step (``v_run_ids``, and
    ``v_run_summary`` over it: a run whose RunStart was not stored is listed too)."""


def audit_pit(conn: Connection) -> None:
    """Version 11: the losslessness audit's distribution tests: ``lossless_audit.p_var_sum`` and the PIT
    histogram ``pit_0`` .. ``pit_9`` (0 on rows audited before, which the tests skip); the views are
    recreated after the step (``v_lossless_audit``)."""
    present = {c["name"] for c in sa.inspect(conn).get_columns("lossless_audit")}
    for column in schema.lossless_audit.columns:
        if column.name not in present:
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f"ALTER TABLE lossless_audit ADD COLUMN {column.name} {kind} NOT NULL DEFAULT 0")


def token_ids_and_replay(conn: Connection) -> None:
    """Version 12: the token ids of audited requests (``request_tokens``) and the replay against the
    target alone (``replay_requests``); the views are recreated after the step (``v_replay_audit``)."""
    schema.metadata.create_all(conn, tables=[schema.request_tokens, schema.replay_requests])


def audit_surprise(conn: Connection) -> None:
    """Version 14: the losslessness audit's surprise test: ``surprise_sum``, ``entropy_sum``,
    ``surprise_var_sum`` and ``entropy_max`` on ``lossless_audit`` and ``replay_requests`` (0 on rows
    audited before, which add nothing to the test); the views are recreated after the step
    (``v_lossless_audit``, ``v_replay_audit``)."""
    for table in ("lossless_audit", "replay_requests"):
        _add_zero_columns(conn, table, SURPRISE_COLUMNS)


def _add_zero_columns(conn: Connection, table: str, names: tuple[str, ...]) -> None:
    """Add the ``lossless_audit`` columns ``names`` to ``table`` where missing, 0 on every row."""
    present = {c["name"] for c in sa.inspect(conn).get_columns(table)}
    for name in names:
        if name not in present:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} "
                                 f"{schema.lossless_audit.c[name].type.compile(dialect=conn.dialect)} "
                                 "NOT NULL DEFAULT 0")


def audit_recovered(conn: Connection) -> None:
    """Version 15: the losslessness audit's recovered-token check: ``recovered``, ``recovered_as_draft``
    and ``recovered_p_sum`` on ``lossless_audit`` (0 on rows audited before: nothing checked there);
    the views are recreated after the step (``v_lossless_audit``)."""
    _add_zero_columns(conn, "lossless_audit", RECOVERED_COLUMNS)


def request_and_second_summaries(conn: Connection) -> None:
    """Version 16: the per-request summary ``request_accepts`` and the per-second ``step_seconds`` and
    ``draft_input_seconds``, filled from the stored rows (``_summaries.rebuild``), and ``ts_wall`` at
    the end of ``ix_verify_steps_run_rank`` and ``ix_tensor_events_run`` (the raw rows of one second);
    the views are recreated after the step over the summaries (``v_request_acceptance``,
    ``v_sampling_acceptance``, ``v_acceptance_histogram``)."""
    tables = [schema.request_accepts, schema.step_seconds, schema.draft_input_seconds]
    schema.metadata.create_all(conn, tables=tables)
    for table, name in ((schema.verify_steps, "ix_verify_steps_run_rank"), (schema.tensor_events, "ix_tensor_events_run")):
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
        next(ix for ix in table.indexes if ix.name == name).create(conn)
    _summaries.rebuild(conn, tables)


def lean_tensor_events(conn: Connection) -> None:
    """Version 17: less stored per tensor event and verify step, every row kept: ``tensor_events``
    without its serial ``id`` (no reader used it; PostgreSQL drops the column with its key and
    sequence, SQLite copies the rows into the new table in their stored order), ``ix_tensor_events_run``
    on (run, rank, time) without the hook point, and no ``ix_verify_steps_masks``, which no query read
    since the ``acceptance_masks`` summary (version 8). The views go first (SQLite renames the table
    under them) and are recreated after the step."""
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_verify_steps_masks")
    conn.exec_driver_sql("DROP INDEX IF EXISTS ix_tensor_events_run")
    table = schema.tensor_events
    if "id" in {c["name"] for c in sa.inspect(conn).get_columns(table.name)}:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ALTER TABLE tensor_events DROP COLUMN id")
        else:
            _copy_sqlite_table(conn, table, order_by="id")
    next(ix for ix in table.indexes if ix.name == "ix_tensor_events_run").create(conn, checkfirst=True)


def _copy_sqlite_table(conn: Connection, table: sa.Table, order_by: str) -> None:
    """Rebuild SQLite ``table`` as ``schema.py`` defines it now (SQLite cannot drop a key column): its
    rows copied in ``order_by`` order into the new table, whose indexes are built after the copy."""
    drop_views(conn)
    old = f"{table.name}_old"
    conn.exec_driver_sql(f"ALTER TABLE {table.name} RENAME TO {old}")
    for index in sa.inspect(conn).get_indexes(old):  # index names are global in SQLite
        conn.exec_driver_sql(f"DROP INDEX {index['name']}")
    conn.execute(sa.schema.CreateTable(table))
    columns = ", ".join(c.name for c in table.columns)
    conn.exec_driver_sql(f"INSERT INTO {table.name} ({columns}) SELECT {columns} FROM {old} ORDER BY {order_by}")
    conn.exec_driver_sql(f"DROP TABLE {old}")
    for index in table.indexes:
        index.create(conn, checkfirst=True)


WIDE_COUNTERS = {"acceptance_masks": ("steps", "proposed", "accepted"), "tensor_shapes": ("events", "nonfinite"),
                 "run_ranks": ("events_written", "events_dropped", "hook_calls", "hook_errors")}
"""The counters version 13 widened to 64 bits, by table."""


def wide_counters_and_unique_steps(conn: Connection) -> None:
    """Version 13: numbered verify steps stored more than once (same run, request, rank and step,
    ``storage/_steps.py``) kept once, the summaries rebuilt when any went; and the summed counters of
    :data:`WIDE_COUNTERS` as BIGINT on PostgreSQL, where INTEGER refused every write once a (run,
    rank, mask) passed 2**31 - 1 proposed tokens (SQLite's INTEGER holds 64 bits already). The views
    read those columns, so they go first; they are recreated after the step, casting the sums back
    to BIGINT (PostgreSQL's SUM of BIGINT is NUMERIC)."""
    if _steps.delete_duplicates(conn):
        _summaries.rebuild(conn)
    if conn.dialect.name != "postgresql":
        return
    drop_views(conn)
    for table, columns in WIDE_COUNTERS.items():
        alters = ", ".join(f"ALTER COLUMN {column} TYPE BIGINT" for column in columns)
        conn.exec_driver_sql(f"ALTER TABLE {table} {alters}")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create_tables", create_tables),
    Migration(2, "add_tensor_contract_index", add_tensor_contract_index),
    Migration(3, "add_position_and_nonfinite_indexes", add_position_and_nonfinite_indexes),
    Migration(4, "filterable_views", filterable_views),
    Migration(5, "drop_redundant_tensor_index", drop_redundant_tensor_index),
    Migration(6, "weighted_verify_steps", weighted_verify_steps),
    Migration(7, "mixed_graph_mode_view", mixed_graph_mode_view),
    Migration(8, "summary_tables", summary_tables),
    Migration(9, "sampling_and_audit", sampling_and_audit),
    Migration(10, "lost_runs_view", lost_runs_view),
    Migration(11, "audit_pit", audit_pit),
    Migration(12, "token_ids_and_replay", token_ids_and_replay),
    Migration(13, "wide_counters_and_unique_steps", wide_counters_and_unique_steps),
    Migration(14, "audit_surprise", audit_surprise),
    Migration(15, "audit_recovered", audit_recovered),
    Migration(16, "request_and_second_summaries", request_and_second_summaries),
    Migration(17, "lean_tensor_events", lean_tensor_events),
    Migration(18, "orphan_runs_view", orphan_runs_view),
)


@dataclass(frozen=True)
class StoreState:
    """What a database holds, seen before opening it as a store.

    ``version`` is the recorded schema version (0 for an empty database, None when it holds other
    tables but no ``schema_migrations``: not a specscope store).
    """

    version: int | None
    tables: tuple[str, ...]
    missing_views: tuple[str, ...]


def inspect_state(conn: Connection) -> StoreState:
    """Read the schema version and which tables and views exist (current schema on PostgreSQL)."""
    inspector = sa.inspect(conn)
    tables = tuple(sorted(inspector.get_table_names()))
    views = set(inspector.get_view_names())
    missing_views = tuple(name for name in VIEWS if name not in views)
    if schema.schema_migrations.name in tables:
        version = conn.execute(sa.select(sa.func.max(schema.schema_migrations.c.version))).scalar()
        return StoreState(version or 0, tables, missing_views)
    return StoreState(0 if not tables and not views else None, tables, missing_views)


def upgrade(conn: Connection, from_version: int) -> list[Migration]:
    """Apply the steps above ``from_version`` in order, record them, refresh views; return the steps.

    Runs inside the caller's transaction: on any error nothing is applied.
    """
    steps = [step for step in MIGRATIONS if step.version > from_version]
    for step in steps:
        step.apply(conn)
        conn.execute(schema.schema_migrations.insert().values(
            version=step.version, name=step.name, applied_wall=time.time()))
    refresh_views(conn)
    return steps


def drop_views(conn: Connection) -> None:
    """Drop every view of ``VIEWS`` there is (reverse order: later views use earlier ones)."""
    for name in reversed(VIEWS):
        conn.exec_driver_sql(f"DROP VIEW IF EXISTS {name}")


def refresh_views(conn: Connection) -> None:
    """Drop and recreate every view of ``VIEWS``."""
    drop_views(conn)
    for name in VIEWS:
        conn.exec_driver_sql(create_view_sql(name, conn.dialect.name))
