"""The trace store (docs/design.md, "Components and data flow"): SQLite by default, PostgreSQL through a SQLAlchemy URL.

``open_store(path_or_url)`` returns a :class:`Store`: ``write(events, counters=...)`` (one transaction
per call), read-only ``connect()`` / ``query(sql)`` / ``runs()``. Tables: :mod:`.schema`; views and the
acceptance formulas: :mod:`.views`; upgrade steps: :mod:`.migrations`.
"""

from specscope.storage._guard import DEFAULT_MAX_RESULT_BYTES, DEFAULT_QUERY_TIMEOUT_S
from specscope.storage.schema import SCHEMA_VERSION
from specscope.storage.store import QueryResult, Store, open_store

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "DEFAULT_QUERY_TIMEOUT_S", "SCHEMA_VERSION", "QueryResult", "Store",
           "open_store"]
