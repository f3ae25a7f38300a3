"""How a named query runs: :class:`Query` (its SQL and parameters) and :func:`fetch` / :func:`records`,
which check the parameters and give PostgreSQL's NUMERIC as Python numbers. The queries themselves are
in :mod:`specscope.storage.queries`."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection


@dataclass(frozen=True)
class Query:
    """A named read statement: ``sql`` is portable SQLite / PostgreSQL text with ``:name``
    parameters; ``expanding`` names the list-valued ones (``IN :runs``)."""

    name: str
    sql: str
    expanding: tuple[str, ...] = ()

    @cached_property
    def statement(self) -> sa.TextClause:
        """The compiled ``sqlalchemy.text`` statement."""
        return sa.text(self.sql).bindparams(*(sa.bindparam(name, expanding=True) for name in self.expanding))

    @cached_property
    def params(self) -> frozenset[str]:
        """Names of the parameters the statement takes."""
        return frozenset(self.statement.compile().params)


def _number(value: Any) -> Any:
    # PostgreSQL returns NUMERIC (Decimal) for SUM of integers and some ratios
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def fetch(conn: Connection, query: Query, **params: Any) -> list[dict[str, Any]]:
    """Rows of ``query`` over ``conn`` as dicts; NUMERIC values as int (integral) or float.

    Raises:
        TypeError: ``query`` is not a :class:`Query` (for SQL of your own, use ``Store.query``).
        ValueError: ``params`` miss a parameter of the query or name one it does not take.
        sqlalchemy.exc.SQLAlchemyError: the database refused it (a Store's connection turns this
            into :class:`~specscope.errors.StoreError`).
    """
    if not isinstance(query, Query):
        raise TypeError(f"fetch takes a named query of specscope.storage.queries, not {type(query).__name__}; "
                        "for SQL of your own use Store.query(sql)")
    missing, unknown = query.params - params.keys(), params.keys() - query.params
    if missing or unknown:
        raise ValueError(f"query {query.name}: missing parameters {sorted(missing)}, "
                         f"unknown parameters {sorted(unknown)}")
    return [{key: _number(value) for key, value in row.items()}
            for row in conn.execute(query.statement, params).mappings()]


def records(conn: Connection, query: Query, **params: Any) -> list[SimpleNamespace]:
    """:func:`fetch`, each row's columns as attributes (``row.run_id``). Same errors."""
    return [SimpleNamespace(**row) for row in fetch(conn, query, **params)]
