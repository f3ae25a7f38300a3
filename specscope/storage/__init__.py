"""The trace store (docs/design.md, "Components and data flow"): SQLite by default, PostgreSQL through a SQLAlchemy URL.

``open_store(path_or_url)`` returns a :class:`Store`: ``write(events, counters=...)`` (one transaction
per call), read-only ``connect()`` / ``query(sql)`` / ``fetch(named query)``. Tables: :mod:`.schema`
(with the summary tables kept by writes: :mod:`._summaries`); views and the acceptance formulas:
:mod:`.views`; every statement specscope itself reads with: :mod:`.queries`; upgrade steps:
:mod:`.migrations`. The write path's parts, for measuring them apart (``benchmarks/``): the rows
``write`` inserts (:func:`group_rows`, plain inserts in :data:`INSERT_COLUMNS` order), their
statements (:func:`insert_statements`) and how they reach the database (:func:`bulk_strategy`).
"""

from specscope.storage._bulk import bulk_strategy
from specscope.storage._dialect import insert_statements
from specscope.storage._guard import DEFAULT_MAX_RESULT_BYTES, DEFAULT_QUERY_TIMEOUT_S, MAX_QUERY_TIMEOUT_S
from specscope.storage._open import open_store, store_file
from specscope.storage._rows import INSERT_COLUMNS, group_rows
from specscope.storage._time_limit import read_time_limit
from specscope.storage.schema import SCHEMA_VERSION
from specscope.storage.store import QueryResult, Store

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "DEFAULT_QUERY_TIMEOUT_S", "INSERT_COLUMNS", "MAX_QUERY_TIMEOUT_S",
           "SCHEMA_VERSION", "QueryResult", "Store", "bulk_strategy", "group_rows", "insert_statements",
           "open_store", "read_time_limit", "store_file"]
