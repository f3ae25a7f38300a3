"""What every page shares: the store (opened once per session), cached queries, the run picker, the
findings banner and live refresh.

Queries go through :func:`query`, cached for :data:`REFRESH_S` seconds per (store, query, arguments),
so a page that refreshes itself while a run is written reads at most once per interval.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import streamlit as st

from specscope.app import DB_ENV, queries
from specscope.doctor import diagnose
from specscope.errors import SpecscopeError
from specscope.events import Finding
from specscope.storage import Store, open_store

REFRESH_S = 2.0  # refresh period of live pages, and the TTL of cached queries (seconds)
FINISHED_TTL_S = 600.0  # cache lifetime of a finished run's rows (seconds)
RUN_KEY = "run_id"
SEVERITY_ICON = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}
STATE_LABEL = {"running": "live", "finished": "finished", "stale": "stale (no event for > 60 s)"}


def db_url() -> str:
    """The store the dashboard reads, from the :data:`~specscope.app.DB_ENV` environment variable."""
    return os.environ.get(DB_ENV, "")


@st.cache_resource(show_spinner=False)
def _open(url: str) -> Store:
    return open_store(url, create=False, read_only=True)


def store() -> Store:
    """The read-only store; a missing or foreign store, or a newer schema, ends the page with one
    clear message (no traceback)."""
    url = db_url()
    if not url:
        st.error(f"No store given: start the dashboard with `specscope dashboard --db PATH_OR_URL` "
                 f"(or set {DB_ENV}).")
        st.stop()
    try:
        return _open(url)
    except SpecscopeError as exc:
        st.error(f"Cannot open the store: {exc}")
        st.stop()


@st.cache_data(ttl=REFRESH_S, show_spinner=False)
def _cached(url: str, name: str, args: tuple) -> Any:
    return getattr(queries, name)(_open(url), *args)


@st.cache_data(ttl=FINISHED_TTL_S, show_spinner=False)
def _cached_finished(url: str, name: str, args: tuple) -> Any:
    return getattr(queries, name)(_open(url), *args)


def _finished(run_id: Any) -> bool:
    runs = _cached(db_url(), "runs", ())
    return any(run["run_id"] == run_id and run["state"] == "finished" for run in runs)


def query(name: str, *args: Any) -> Any:
    """``specscope.app.queries.<name>(store, *args)``, cached for :data:`REFRESH_S` seconds, or for
    :data:`FINISHED_TTL_S` when the first argument is a finished run (its rows no longer change)."""
    store()
    cached = _cached_finished if args and _finished(args[0]) else _cached
    try:
        return cached(db_url(), name, args)
    except SpecscopeError as exc:
        st.error(f"Reading the store failed: {exc}")
        st.stop()


def _diagnosed(url: str, run_id: str) -> list[Finding]:
    store = _open(url)
    live = diagnose(store, run_id).findings
    inspected = [Finding(row["code"], row["severity"], row["message"], row["evidence"], row["fix"],
                         run_id=row["run_id"], source="inspect", ts_wall=row["ts_wall"])
                 for row in queries.stored_findings(store, run_id, source="inspect")]
    order = {severity: rank for rank, severity in enumerate(("error", "warning", "info"))}
    return sorted(live + inspected, key=lambda f: order.get(f.severity, 3))


_findings_live = st.cache_data(ttl=REFRESH_S, show_spinner=False)(_diagnosed)
_findings_finished = st.cache_data(ttl=FINISHED_TTL_S, show_spinner=False)(_diagnosed)


def findings(run_id: str) -> list[Finding]:
    """The doctor's findings for ``run_id`` (computed from the store, cached like :func:`query`)
    plus the stored checkpoint-inspection findings of that run; errors first."""
    store()
    cached = _findings_finished if _finished(run_id) else _findings_live
    try:
        return cached(db_url(), run_id)
    except SpecscopeError as exc:
        st.error(f"The doctor could not read run {run_id}: {exc}")
        return []


def error_count(run: dict[str, Any]) -> int:
    """Error findings of a run: the doctor's and the stored ones, whichever names more."""
    return max(run["error_findings"], sum(f.severity == "error" for f in findings(run["run_id"])))


def when(wall: float | None) -> str:
    """Wall-clock seconds since the epoch as local ``YYYY-MM-DD HH:MM:SS`` ('' for None)."""
    if wall is None:
        return ""
    return datetime.fromtimestamp(wall, tz=timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def run_label(run: dict[str, Any]) -> str:
    """One line naming a run in pickers: errors marker, engine, fault, start, state."""
    errors = error_count(run)
    marker = f"[{errors} error{'s' if errors > 1 else ''}] " if errors else ""
    fault = f" [{run['fault']}]" if run["fault"] else ""
    return (f"{marker}{run['engine']}{fault} · {when(run['started_wall'])} · "
            f"{STATE_LABEL[run['state']]} · {run['run_id'][:12]}")


def run_picker() -> str:
    """Sidebar select box of the store's runs (newest first, so the app opens on the latest run);
    returns the selected run id, kept in ``st.session_state['run_id']`` (a plain key, not the
    widget's, so the choice survives page switches). Each page calls it first."""
    runs = query("runs")
    labels = {run["run_id"]: run_label(run) for run in runs}
    ids = list(labels)
    current = st.session_state.get(RUN_KEY)
    index = ids.index(current) if current in labels else 0
    chosen = st.sidebar.selectbox("Run", ids, index=index, format_func=labels.__getitem__)
    st.session_state[RUN_KEY] = chosen
    st.sidebar.caption(f"store: `{db_url()}`")
    return chosen


def findings_banner(items: list[Finding], *, limit: int | None = None) -> None:
    """Errors in red and warnings in orange, each ``CODE — message`` on one line; info findings are
    counted, not shown. A run without errors or warnings gets a green line."""
    shown = [f for f in items if f.severity in ("error", "warning")]
    for finding in shown[:limit]:
        box = st.error if finding.severity == "error" else st.warning
        box(f"**{finding.code}** — {finding.message}", icon=SEVERITY_ICON[finding.severity])
    if limit is not None and len(shown) > limit:
        st.caption(f"{len(shown) - limit} more on the Findings page")
    if not shown:
        infos = len(items)
        st.success("No error or warning findings" + (f" ({infos} info)" if infos else ""),
                   icon=":material/check_circle:")


def live(body: Callable[[], None], state: str) -> None:
    """Run ``body`` as a fragment that reruns itself every REFRESH_S seconds while the run is being
    written (``state == 'running'``); a finished or stale run renders once."""
    st.fragment(body, run_every=REFRESH_S if state == "running" else None)()


def state_badge(state: str) -> None:
    """A coloured badge for a run's state: live (green), finished (grey), stale (orange)."""
    color = {"running": "green", "finished": "gray", "stale": "orange"}[state]
    st.badge(STATE_LABEL[state], color=color)


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    """A number for a metric tile ('—' for None)."""
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"
