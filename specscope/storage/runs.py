"""Naming a run of a store: an exact run id or a unique prefix of one (as the dashboard shows them),
or the store's newest run. The doctor, ``specscope compare`` and the dashboard's links resolve here."""

from __future__ import annotations

import reprlib

import sqlalchemy as sa

from specscope.errors import ConfigError
from specscope.storage import queries as q
from specscope.storage.queries import fetch

_KNOWN_SHOWN = 20
_SHOWN = reprlib.Repr()  # a run id echoed in an error, shortened: a pasted page is not a run id
_SHOWN.maxstring = 80


def resolve_run_id(conn: sa.Connection, run_id: str, url: str) -> str:
    """The stored run id equal to ``run_id``, else the one run id starting with it (``url`` names the
    store in errors). Run ids with stored rows but no stored RunStart count too (``v_run_ids``).

    Raises:
        ConfigError: ``run_id`` is empty (every run id starts with it), no run id equals or starts
            with it (the message names the known run ids), or several start with it (named).
    """
    if fetch(conn, q.RUN_META, run_id=run_id) or fetch(conn, q.RUN_ID, run_id=run_id):  # runs first: one seek
        return run_id  # the empty run id too, in a store written before writes refused it
    if not run_id:
        raise ConfigError(f"an empty run id names no run of {url}: give a run id or a unique prefix of one; "
                          f"{_known_runs(conn)}")
    matches = [row["run_id"] for row in fetch(conn, q.RUN_IDS_STARTING, prefix=run_id, limit=_KNOWN_SHOWN + 1)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigError(f"no run {_SHOWN.repr(run_id)} in {url}; {_known_runs(conn)}")
    shown = ", ".join(matches[:_KNOWN_SHOWN]) + (" and more" if len(matches) > _KNOWN_SHOWN else "")
    raise ConfigError(f"run id prefix {_SHOWN.repr(run_id)} is ambiguous in {url}: it starts {shown}; "
                      "give more characters")


def newest_run_id(conn: sa.Connection, url: str) -> str:
    """The id of the run started last. Raises ConfigError when the store holds no run."""
    rows = fetch(conn, q.NEWEST_RUNS, limit=1)
    if not rows:
        raise ConfigError(f"{url} holds no run")
    return rows[0]["run_id"]


def _known_runs(conn: sa.Connection) -> str:
    ids = [row["run_id"] for row in fetch(conn, q.KNOWN_RUN_IDS)]
    if not ids:
        return "the store holds no run"
    more = f" and {len(ids) - _KNOWN_SHOWN} more" if len(ids) > _KNOWN_SHOWN else ""
    return f"known runs: {', '.join(map(str, ids[:_KNOWN_SHOWN]))}{more}"  # str: a bytes id kept by an older store
