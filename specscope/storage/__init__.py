"""The trace store (docs/design.md, "Components and data flow"): SQLite by default, PostgreSQL through a SQLAlchemy URL.

``open_store(path_or_url)`` returns a :class:`Store`: ``write(events, counters=...)`` (one transaction
per call), read-only ``connect()`` / ``query(sql)`` / ``fetch(named query)``. Tables: :mod:`.schema`
(with the summary tables kept by writes: :mod:`._summaries`); views and the acceptance formulas:
:mod:`.views`; every statement specscope itself reads with: :mod:`.queries`; upgrade steps:
:mod:`.migrations`.
"""

from specscope.storage._guard import DEFAULT_MAX_RESULT_BYTES, DEFAULT_QUERY_TIMEOUT_S, MAX_QUERY_TIMEOUT_S
from specscope.storage.schema import SCHEMA_VERSION
from specscope.storage.store import QueryResult, Store, open_store, store_file

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "DEFAULT_QUERY_TIMEOUT_S", "MAX_QUERY_TIMEOUT_S", "SCHEMA_VERSION",
           "QueryResult", "Store", "open_store", "store_file"]
