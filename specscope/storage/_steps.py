"""Each numbered verify step stored once: a verify step of the same run, request, rank and step number
(``step >= 0``) that arrives again (a producer retrying a batch, a hook firing twice) would count its
drafts twice in every figure (AL, p_i, the summaries). :func:`unstored` keeps the first of a batch and
drops those already stored, in the write's transaction and before its summaries are folded, so the
rows and ``acceptance_masks`` agree; :func:`delete_duplicates` clears a store written before (version
13). Rows numbered -1 (aggregates of ``VerifyGroup``, steps the engine did not number) carry no
identity: every one counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope.storage import schema

_LOOKUP_KEYS = 500  # (request, rank, step) triples per lookup: well under SQLite's 32,766 parameters


def _key(row: tuple) -> tuple:
    # rows in INSERT_COLUMNS["verify_steps"] order: run_id, request_id, rank, step, ...
    return row[0], row[1], row[2], row[3]


def unstored(conn: Connection, rows: Sequence[tuple]) -> list[tuple]:
    """``rows`` (verify-step tuples) without numbered steps repeated in the batch (the first is kept) or
    already stored. The lookup reads ``ix_verify_steps_run_req`` (run, request, step)."""
    kept: list[tuple] = []
    seen: dict[str, set[tuple]] = {}  # run_id -> (request_id, rank, step) of the batch
    for row in rows:
        run_id, request_id, rank, step = _key(row)
        if step is None or step < 0:
            kept.append(row)
            continue
        keys = seen.setdefault(run_id, set())
        if (request_id, rank, step) not in keys:
            keys.add((request_id, rank, step))
            kept.append(row)
    stored: set[tuple] = set()
    c = schema.verify_steps.c
    for run_id, keys in seen.items():
        ordered = list(keys)
        for start in range(0, len(ordered), _LOOKUP_KEYS):
            chunk = ordered[start:start + _LOOKUP_KEYS]
            found = conn.execute(sa.select(c.request_id, c.rank, c.step).where(
                c.run_id == run_id, c.step >= 0, sa.tuple_(c.request_id, c.rank, c.step).in_(chunk)))
            stored.update((run_id, *row) for row in found)
    return [row for row in kept if _key(row) not in stored] if stored else kept


def delete_duplicates(conn: Connection) -> int:
    """Delete every numbered verify step stored again after its first row (lowest id); the count."""
    steps, first = schema.verify_steps, schema.verify_steps.alias("first")
    again = sa.select(first.c.id).where(
        first.c.run_id == steps.c.run_id, first.c.request_id == steps.c.request_id, first.c.rank == steps.c.rank,
        first.c.step == steps.c.step, first.c.id < steps.c.id).exists()
    return conn.execute(steps.delete().where(steps.c.step >= 0, again)).rowcount
