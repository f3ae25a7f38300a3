"""A copy of a SQLite store for a test that changes it while the module's other tests read the original."""

from __future__ import annotations

import sqlite3


def copy_store(source: str, target: str) -> None:
    """Copy ``source`` to ``target`` with SQLite's backup, not as a file: rows committed to the WAL and
    not yet checkpointed into the main file are copied too (a copy of the file alone missed a run's
    token ids in CI)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
