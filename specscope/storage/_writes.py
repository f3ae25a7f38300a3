"""The writing half of :class:`~specscope.storage.Store`: events in, one transaction per call."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from specscope.errors import EventRejected, ReadOnlyViolation, StoreError
from specscope.events import Event, Finding
from specscope.storage import _steps, _summaries, schema
from specscope.storage._dialect import Dialect
from specscope.storage._errors import translate
from specscope.storage._row_checks import bad_value, run_id_refusal
from specscope.storage._rows import STATEMENTS, Counters, counter_rows, group_rows, summary_rows


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``; None when it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


class StoreWrites:
    """Writes of a :class:`~specscope.storage.Store`, which sets these attributes when it opens."""

    url: str
    _write_engine: Engine | None  # None: opened read-only
    _dialect: Dialect
    _bulk_insert: Callable
    _sqlite_path: Path | None
    _file_id: tuple[int, int] | None  # the SQLite file as opened

    def write(self, events: Sequence[Event], *, counters: Counters | None = None) -> None:
        """Write ``events`` and add ``counters`` in ONE transaction: all of it is committed, or nothing.

        ``counters`` maps ``(run_id, rank)`` to ``(events_written, events_dropped)`` increments for
        ``run_ranks`` (a rank row is created if its RankStart is missing). Each event goes where its
        type's route says (``storage/_rows.py``, ``ROUTES``), summary tables included.

        Raises:
            ReadOnlyViolation: the store was opened read-only.
            EventRejected: not a specscope event, or the database refused an event's values.
            StoreError: the database refused the transaction (locked, unreachable, full, read-only).
        """
        self._check_writable()
        try:
            events = list(events)  # read twice: a generator would be spent by the first reading
            refusal = run_id_refusal(events, (run_id for run_id, _ in counters or ()))
            if refusal is not None:  # before the folds, which would fail ordering a bytes run id
                raise EventRejected(f"writing to {self.url}: {refusal}")
            grouped = group_rows(events)
            summaries = summary_rows(grouped)
        except (KeyError, AttributeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            # OverflowError: a value the summary folds cannot take (the second of an infinite
            # ts_wall, a mask of more places than an index holds); rejected, so that the collector
            # sets that event aside instead of losing its batch as a failed store
            raise EventRejected(f"writing to {self.url}: not a specscope event or a malformed one: "
                                f"{type(exc).__name__}: {exc}") from exc
        if counters:
            rows = counter_rows(counters, time.time())
            if rows:
                grouped["counters"] = rows
        if not grouped:
            return
        statements, inserts = self._dialect.statements, self._dialect.inserts
        try:
            with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
                steps = grouped.get("verify_steps")
                if steps:  # a numbered verify step stored again would count twice (storage/_steps.py)
                    kept = _steps.unstored(conn, self._dialect.step_probe, steps)
                    if len(kept) < len(steps):
                        grouped["verify_steps"] = kept
                        summaries = summary_rows(grouped)
                for statement in STATEMENTS:
                    rows = grouped.get(statement.name)
                    if not rows:
                        continue
                    if statement.columns:
                        self._bulk_insert(conn, statement.name, inserts[statement.name], rows)
                    else:
                        conn.execute(statements[statement.name], rows)
                for name, rows in summaries.items():  # in the same transaction as the rows they sum up
                    sql, values = self._dialect.driver_upsert(name, tuple(rows[0]))
                    conn.exec_driver_sql(sql, list(map(values, rows)))
        except EventRejected:
            raise
        except (StoreError, UnicodeError, OverflowError, TypeError, ValueError) as exc:
            # A value no database can hold fails in the driver (a lone surrogate, an int past 64
            # bits, a list where a number goes) as something other than a value error: name it,
            # so that the collector sets that event aside instead of losing the batch.
            bad = bad_value(grouped)
            if bad is None and isinstance(exc, StoreError):
                raise
            raise EventRejected(f"writing to {self.url}: {bad or f'{type(exc).__name__}: {exc}'}") from exc

    def _check_writable(self) -> None:
        """ReadOnlyViolation on a read-only store; StoreError when its SQLite file was deleted or
        replaced since it was opened (the open connections would go on writing to the deleted file,
        every write reporting success and every event lost)."""
        if self._write_engine is None:
            raise ReadOnlyViolation(f"store {self.url} was opened read-only")
        if self._sqlite_path is not None and file_id(self._sqlite_path) != self._file_id:
            raise StoreError(f"writing to {self.url}: the store file was deleted or replaced while open; "
                             "nothing more is written to it (open the store again to start a new one)")

    def touch(self, ranks: Sequence[tuple[str, int]]) -> None:
        """Set ``last_seen_wall`` of these existing ``(run_id, rank)`` rows to now: the collector's
        heartbeat for a live rank with nothing to write, so its run does not read 'lost'.

        Raises ReadOnlyViolation or StoreError as :meth:`write`.
        """
        self._check_writable()
        if not ranks:
            return
        table = schema.run_ranks
        statement = (sa.update(table).where(table.c.run_id == sa.bindparam("b_run_id"),
                                            table.c.rank == sa.bindparam("b_rank"))
                     .values(last_seen_wall=sa.bindparam("b_wall")))
        wall = time.time()
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            conn.execute(statement, [{"b_run_id": run_id, "b_rank": rank, "b_wall": wall}
                                     for run_id, rank in ranks])

    def end_open_ranks(self, run_id: str) -> list[int]:
        """End the ranks of ``run_id`` that have not ended (``ended_wall`` now) and return them: for a
        process that outlives the engine processes it stopped (vLLM's API server SIGKILLs its workers).

        Raises ReadOnlyViolation or StoreError as :meth:`write`.
        """
        self._check_writable()
        table = schema.run_ranks
        open_ranks = sa.and_(table.c.run_id == run_id, table.c.ended_wall.is_(None))
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            ranks = [row.rank for row in conn.execute(sa.select(table.c.rank).where(open_ranks))]
            conn.execute(sa.update(table).where(open_ranks).values(ended_wall=time.time()))
        return sorted(ranks)

    def replace_findings(self, source: str, run_ids: Sequence[str], findings: Sequence[Finding]) -> None:
        """Delete the ``source`` findings (``"doctor"`` / ``"inspect"``) of ``run_ids`` and write
        ``findings`` in ONE transaction, so a reader sees the old set or the new one, never a mix.

        Raises ReadOnlyViolation or StoreError as :meth:`write`.
        """
        self._check_writable()
        try:
            if any(not isinstance(f, Finding) for f in findings):
                raise TypeError("only Finding events can replace findings")
            rows = group_rows(findings).get("findings", [])
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise StoreError(f"writing to {self.url}: not a specscope finding or a malformed one: "
                             f"{type(exc).__name__}: {exc}") from exc
        table = schema.findings
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            self._dialect.lock_runs(conn, list(run_ids))
            if run_ids:
                conn.execute(table.delete().where(table.c.source == source,
                                                  table.c.run_id.in_(list(run_ids))))
            if rows:
                conn.exec_driver_sql(self._dialect.inserts["findings"], rows)

    def rebuild_summaries(self) -> None:
        """Recompute the summary tables from every stored verify step and tensor event, in one
        transaction: needed only after rows were loaded around :meth:`write` (raw SQL, a restored dump).

        Raises ReadOnlyViolation or StoreError as :meth:`write`.
        """
        self._check_writable()
        with translate("writing to", self.url, writing=True), self._write_engine.begin() as conn:
            _summaries.rebuild(conn)
