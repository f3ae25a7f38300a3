"""A SQLite store whose writers have closed is whole in its one file: SQLite folds the WAL back only
when the last connection closes, and a read-only reader (the dashboard, the doctor, the exporter)
cannot, so a writer that closed while one was reading left its last transactions in the ``-wal``
file alone, and a copy of the store file lost them (a cold trial copied `make demo`'s store and lost
a run)."""

from __future__ import annotations

import shutil

import _traces as T

from specscope.collector import Collector
from specscope.storage import open_store

COUNTS = "SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM verify_steps), (SELECT COUNT(*) FROM run_ranks)"


def test_a_store_copied_after_its_writers_closed_holds_every_run(tmp_path):
    db, copy = tmp_path / "store.db", tmp_path / "copy.db"
    with open_store(str(db)) as first:
        T.healthy().write(first)
    with open_store(str(db), read_only=True) as reader:  # the dashboard, open throughout
        reader.query("SELECT COUNT(*) FROM runs")
        with open_store(str(db)) as store, Collector(store, flush_interval_s=60) as collector:
            for event in T.no_aux_capture("broken").events():
                collector.emit(event)
            assert collector.flush(60)
        shutil.copy(db, copy)  # the file alone, while the reader still has the store open
        expected = reader.query(COUNTS).rows
    assert expected[0][0] == 2
    with open_store(str(copy), read_only=True) as copied:
        assert copied.query(COUNTS).rows == expected
        assert copied.query("SELECT run_id FROM runs ORDER BY run_id").rows == [("broken",), ("healthy",)]
