"""Each numbered verify step stored once: a verify step of the same run, request, rank and step number
(``step >= 0``) that arrives again (a producer retrying a batch, a hook firing twice) would count its
drafts twice in every figure (AL, p_i, the summaries). :func:`unstored` keeps the first of a batch and
drops those already stored, in the write's transaction and before its summaries are folded, so the
rows and ``acceptance_masks`` agree; :func:`delete_duplicates` clears a store written before (version
13). Rows numbered -1 (aggregates of ``VerifyGroup``, steps the engine did not number) carry no
identity: every one counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from specscope.storage import schema

PROBE_SIZES = (1, 2, 4, 8, 16, 32, 50)
"""Spans (run, request, first step, last step) one probe takes: a batch's spans go in probes of 50,
the rest in the smallest size that holds them (padded by repeating the last span), so a few prepared
statements serve every batch and a write of a few requests probes a few times, not 50."""


@functools.cache
def probe(spans: int) -> sa.TextClause:
    """Whether any step of each request's span in a batch is stored, for ``spans`` spans: one range
    probe of ``ix_verify_steps_run_req`` (run, request, step) per request, however many steps the run
    holds. The EXISTS sits in the select list and compares a range, which both databases run as a
    probe per row; a join, or equality only, lets PostgreSQL hash the whole table instead, every batch.
    Compiled once per dialect and size to positional parameters (``_dialect.Dialect.step_probe``)."""
    return sa.text(
        "WITH batch (run_id, request_id, first_step, last_step) AS (VALUES "
        + ", ".join(f"(:run_{i}, :request_{i}, :first_{i}, :last_{i})" for i in range(spans))
        + ") SELECT run_id, request_id, EXISTS (SELECT 1 FROM verify_steps v WHERE v.run_id = batch.run_id "
          "AND v.request_id = batch.request_id AND v.step BETWEEN batch.first_step AND batch.last_step) FROM batch")


def _key(row: tuple) -> tuple:
    # rows in INSERT_COLUMNS["verify_steps"] order: run_id, request_id, rank, step, ...
    return row[0], row[1], row[2], row[3]


def unstored(conn: Connection, probe_sql: Callable[[int], str], rows: Sequence[tuple]) -> list[tuple]:
    """``rows`` (verify-step tuples) without numbered steps repeated in the batch (the first is kept) or
    already stored; ``probe_sql(spans)`` is :func:`probe` compiled for the connection's dialect."""
    kept: list[tuple] = []
    seen: set[tuple] = set()  # (run_id, request_id, rank, step) of the batch's numbered steps
    spans: dict[tuple[str, str], list[int]] = {}  # (run_id, request_id) -> [first step, last step]
    for row in rows:
        key = _key(row)
        step = key[3]
        if step is None or step < 0:
            kept.append(row)
        elif key not in seen:
            seen.add(key)
            kept.append(row)
            span = spans.setdefault(key[:2], [step, step])
            if step < span[0]:
                span[0] = step
            elif step > span[1]:
                span[1] = step
    stored = {hit for request in _requests_with_stored_steps(conn, probe_sql, spans)
              for hit in _stored_steps(conn, *request, *spans[request])}
    return [row for row in kept if _key(row) not in stored] if stored else kept


def _requests_with_stored_steps(conn: Connection, probe_sql: Callable[[int], str],
                                spans: dict[tuple[str, str], list[int]]) -> list[tuple[str, str]]:
    """The (run_id, request_id) of ``spans`` with a step stored within their span (rare: a retry)."""
    items = [(*request, *span) for request, span in spans.items()]
    hits = []
    for start in range(0, len(items), PROBE_SIZES[-1]):
        chunk = items[start:start + PROBE_SIZES[-1]]
        size = next(size for size in PROBE_SIZES if size >= len(chunk))
        chunk += chunk[-1:] * (size - len(chunk))
        found = conn.exec_driver_sql(probe_sql(size), tuple(value for item in chunk for value in item))
        hits += [(run_id, request_id) for run_id, request_id, stored in found if stored]
    return list(dict.fromkeys(hits))


def _stored_steps(conn: Connection, run_id: str, request_id: str, first: int, last: int) -> set[tuple]:
    """(run_id, request_id, rank, step) of the stored numbered steps of a request within first..last."""
    c = schema.verify_steps.c
    found = conn.execute(sa.select(c.rank, c.step).where(c.run_id == run_id, c.request_id == request_id,
                                                         c.step.between(first, last)))
    return {(run_id, request_id, rank, step) for rank, step in found}


def delete_duplicates(conn: Connection) -> int:
    """Delete every numbered verify step stored again after its first row (lowest id); the count."""
    steps, first = schema.verify_steps, schema.verify_steps.alias("first")
    again = sa.select(first.c.id).where(
        first.c.run_id == steps.c.run_id, first.c.request_id == steps.c.request_id, first.c.rank == steps.c.rank,
        first.c.step == steps.c.step, first.c.id < steps.c.id).exists()
    return conn.execute(steps.delete().where(steps.c.step >= 0, again)).rowcount
