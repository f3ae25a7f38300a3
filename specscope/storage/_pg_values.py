"""How a user query's PostgreSQL values become Python: as psycopg reads them (from text, see
:mod:`.user_query`), except where psycopg cannot or reads them wrong.

- ``date``, ``timestamp``, ``timestamptz``: psycopg refuses a value outside Python's range
  (``infinity``, a BC date, year 10000 and later), which would fail the whole query; such a value is
  kept as PostgreSQL writes it.
- ``interval``: ``timedelta`` has no months (psycopg reads ``'1 mon'`` as 30 days) and psycopg's parse
  wraps around past 32 bits of days (``'-178000000 years'`` as -545490560 days): every interval is
  kept as PostgreSQL writes it.
- containers (arrays, ``json`` / ``jsonb``, records, ranges and multiranges, the ``*vector`` types):
  kept as PostgreSQL writes them (``{1,2,3}``, ``{"a": 1}``), so a value takes about its text's size
  in memory, which the result cap bounds. Read as Python objects, a ``numeric[]`` took 56 times its
  text (a Decimal of about 112 bytes per 2-byte element: 2 GB for 16 MB of text, found by an attack
  trial), a JSON list of small objects tens of times. SQLite's JSON is text too.
"""

from __future__ import annotations

from typing import Any

_AS_WRITTEN_WHEN_OUT_OF_RANGE = ("date", "timestamp", "timestamptz")
_CONTAINERS = frozenset({"json", "jsonb", "record", "int2vector", "oidvector"})


def register_value_readers(connection: Any) -> None:
    """Install the readers above on ``connection`` (a psycopg connection used for one user query)."""
    import psycopg
    from psycopg.adapt import Loader
    from psycopg.pq import Format
    from psycopg.types.multirange import MultirangeInfo
    from psycopg.types.range import RangeInfo
    from psycopg.types.string import TextLoader

    adapters = connection.adapters
    for name in _AS_WRITTEN_WHEN_OUT_OF_RANGE:
        base = adapters.get_loader(adapters.types[name].oid, Format.TEXT)

        class AsWrittenWhenOutOfRange(Loader):
            _base = base

            def __init__(self, oid: int, context: Any = None) -> None:
                super().__init__(oid, context)
                self._reader = self._base(oid, context)

            def load(self, data: Any) -> Any:
                try:
                    return self._reader.load(data)
                except psycopg.DataError:
                    return bytes(data).decode()

        adapters.register_loader(name, AsWrittenWhenOutOfRange)
    adapters.register_loader("interval", TextLoader)
    for info in adapters.types:
        if info.array_oid:
            adapters.register_loader(info.array_oid, TextLoader)
        if info.name in _CONTAINERS or isinstance(info, (RangeInfo, MultirangeInfo)):
            adapters.register_loader(info.oid, TextLoader)
