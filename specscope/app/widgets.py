"""What every page shares: the store (opened once per session), cached queries, the run picker, the
findings banner and live refresh.

Queries go through :func:`query`, cached for :data:`REFRESH_S` seconds per (store, query, arguments),
so a page that refreshes itself while a run is written reads at most once per interval.
"""

from __future__ import annotations

import atexit
import logging
import os
import reprlib
import types
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

import streamlit as st

from specscope import readmodel
from specscope.app import DB_ENV, queries, trace_threshold
from specscope.errors import SpecscopeError
from specscope.events import Finding, unhooked
from specscope.results import markdown_code as code
from specscope.results import markdown_prose as inert
from specscope.storage import Store, open_store

logger = logging.getLogger("specscope")

REFRESH_S = 2.0  # refresh period of live pages, and the TTL of cached queries (seconds)
FINISHED_TTL_S = 600.0  # cache lifetime of a finished run's rows (seconds)
RUN_KEY = "run_id"
PICKER_KEY = "run_picker"  # the select box's own state
LINK_PARAM = "run"  # the open run in the page's address: ?run=<run id>
LINKED_KEY = "linked_run"  # the run this session last put in the address
# A run id named in a warning: whole (a uuid's 32 hex digits and more), cut only where an address
# could carry any length.
_IDS = reprlib.Repr()
_IDS.maxstring = 200
SEVERITY_ICON = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}
UNOBSERVED_TITLE = {"NOT_OBSERVED": "Not observed", "CHECKS_SKIPPED": "Not checked"}
UNOBSERVED_CODES = tuple(UNOBSERVED_TITLE)  # findings naming what could not be checked
STATE_LABEL = {"running": "live", "finished": "finished", "crashed": "crashed", "stale": "stale", "lost": "lost"}
STATE_HELP = {"running": "events are arriving", "finished": "every rank ended",
              "crashed": "a rank stopped on an error",
              "stale": f"not finished, and not heard from for more than {readmodel.STALE_AFTER_S:g} s",
              "lost": f"not finished, and not heard from for more than {readmodel.LOST_AFTER_S:g} s: "
                      "its processes are gone"}
STATE_COLOR = {"running": "green", "finished": "gray", "crashed": "red", "stale": "orange", "lost": "red"}


def db_url() -> str:
    """The store the dashboard reads, from the :data:`~specscope.app.DB_ENV` environment variable."""
    return os.environ.get(DB_ENV, "")


def _slow_statements(threshold_s: float):
    def trace(sql: str, parameters: Any, seconds: float) -> None:
        if seconds >= threshold_s:
            logger.warning("specscope dashboard: %.1f ms %s %s", seconds * 1000, " ".join(sql.split()),
                           parameters)
    return trace


@st.cache_resource(show_spinner=False)
def _open(url: str) -> Store:
    threshold = trace_threshold()
    opened = open_store(url, create=False, read_only=True,
                        tracer=None if threshold is None else _slow_statements(threshold))
    atexit.register(opened.close)  # Streamlit ends on SIGTERM / SIGINT by returning from its main
    return opened


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


# streamlit hashes no function objects: a cached read is keyed by its query's qualified name.
_BY_NAME = {types.FunctionType: lambda read: f"{read.__module__}.{read.__qualname__}"}


@st.cache_data(ttl=REFRESH_S, show_spinner=False, hash_funcs=_BY_NAME)
def _cached(url: str, read: Callable[..., Any], args: tuple) -> Any:
    return read(_open(url), *args)


@st.cache_data(ttl=FINISHED_TTL_S, show_spinner=False, hash_funcs=_BY_NAME)
def _cached_finished(url: str, read: Callable[..., Any], args: tuple) -> Any:
    return read(_open(url), *args)


def _state(run_id: Any) -> str | None:
    runs = _cached(db_url(), queries.runs, ())
    return next((run["state"] for run in runs if run["run_id"] == run_id), None)


def _finished(run_id: Any) -> bool:
    return _state(run_id) in readmodel.ENDED


def query(read: Callable[..., Any], *args: Any, fresh: bool = False) -> Any:
    """``read(store, *args)``, one of :mod:`specscope.app.queries`, cached for :data:`REFRESH_S`
    seconds, or for :data:`FINISHED_TTL_S` when the first argument is a finished run (its rows no
    longer change); ``fresh``: read now, past the cache."""
    store()
    cached = _cached_finished if args and _finished(args[0]) else _cached
    try:
        return read(_open(db_url()), *args) if fresh else cached(db_url(), read, args)
    except SpecscopeError as exc:
        st.error(f"Reading the store failed: {exc}")
        st.stop()


@st.cache_resource(show_spinner=False)
def _reader(url: str) -> readmodel.RunReader:
    return readmodel.RunReader(_open(url))


@st.cache_data(ttl=REFRESH_S, show_spinner=False)
def _verdict(url: str, run_id: str, state: str | None) -> list[Finding]:
    return _reader(url).findings(run_id, state)


def findings(run_id: str) -> list[Finding]:
    """The verdict on ``run_id`` (:class:`specscope.readmodel.RunReader`: the doctor's findings plus
    the run's stored checkpoint findings, errors first; an ended run's computed once, a live run's at
    most every :data:`REFRESH_S` seconds)."""
    store()
    try:
        return _verdict(db_url(), run_id, _state(run_id))
    except SpecscopeError as exc:
        st.error(f"The doctor could not read run {code(run_id)}: {inert(exc)}")
        return []


def counts(run: dict[str, Any], diagnosed: bool = False) -> dict[str, int]:
    """Error and warning findings of a run (``{"error": n, "warning": n}``): of its verdict
    (:func:`findings`) when ``diagnosed``, else those last stored with it (``v_run_summary``: an
    ended run's verdict, stored when it ended; one query for every run, so listing runs never runs
    the doctor per run)."""
    if diagnosed:
        return readmodel.counts(findings(run["run_id"]))
    return {"error": run["error_findings"], "warning": run["warning_findings"]}


def counts_said(found: dict[str, int]) -> str:
    """:func:`counts` in words ("2 errors, 1 warning"); '' when there is none."""
    return ", ".join(f"{n} {severity}{'s' if n > 1 else ''}" for severity, n in found.items() if n)


def when(wall: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Wall-clock seconds since the epoch as local time in ``fmt`` (default ``YYYY-MM-DD HH:MM:SS``;
    '' for None). Narrow places drop the year (``%m-%d %H:%M``)."""
    if wall is None:
        return ""
    return datetime.fromtimestamp(wall, tz=timezone.utc).astimezone().strftime(fmt)


def graph_mode(config: dict[str, Any], mode: str | None) -> str:
    """A run's or rank's graph mode as the pages show it: "not hooked" for a run recorded from outside
    its engine (whose producers report 'eager' for want of any), else ``mode`` ('—' when unknown)."""
    return "not hooked" if unhooked(config) is not None else mode or "—"


def short_ids(run_ids: Iterable[str], at_least: int = 8) -> dict[str, str]:
    """Each run id cut to its shortest prefix of at least ``at_least`` characters that no other of
    ``run_ids`` shares (``specscope doctor --run`` takes it): ``llamacpp-d…`` and ``llamacpp-n…`` for
    two runs a fixed 8-character cut would both show as ``llamacpp``. In sorted order only the
    neighbours can share more."""
    ids = sorted(set(run_ids))
    shared = [len(os.path.commonprefix(pair)) for pair in zip(ids, ids[1:])]
    return {rid: rid[:max(at_least, 1 + max(shared[i - 1] if i else 0, shared[i] if i < len(shared) else 0))]
            for i, rid in enumerate(ids)}


def run_label(run: dict[str, Any], short: str, diagnosed: bool = False) -> str:
    """One line naming a run in pickers: error / warning counts (:func:`counts`), engine, fault,
    start (month-day, local time to the minute), the state unless finished, and ``short``, the run id's
    unique prefix (:func:`short_ids`). :func:`run_details` says the rest."""
    said = counts_said(counts(run, diagnosed))
    marker = f"[{said}] " if said else ""
    fault = f" [{run['fault']}]" if run["fault"] else ""
    state = "" if run["state"] == "finished" else f" · {STATE_LABEL[run['state']]}"
    return (f"{marker}{run['engine']}{fault} · {when(run['started_wall'], '%m-%d %H:%M')}{state} · "
            f"{short}")


def run_details(run: dict[str, Any]) -> str:
    """Markdown of what a run's picker label leaves out: its state's meaning (with the error a crashed
    run ended on) and the whole run id."""
    error = f": {code(run['error'])}" if run["state"] == "crashed" and run.get("error") else ""
    return f"{STATE_LABEL[run['state']]} ({STATE_HELP[run['state']]}{error}) · run {code(run['run_id'])}"


def _picked() -> None:
    st.session_state[RUN_KEY] = st.session_state[PICKER_KEY]


def run_picker() -> str:
    """The run picker at the top of the page (newest run first, so the app opens on the latest run)
    with the picked run named in full beside it; returns the selected run id, kept in
    ``st.session_state['run_id']`` (a plain key, not the widget's, so the choice survives page
    switches, which drop a widget's state) and in the address as ``?run=<run id>``, which a new
    session opens on (a link to a run). Each page calls it first. The open run is labelled with
    the doctor's counts (the page shows its findings anyway), the others with their stored counts.
    On the page, not in a sidebar: the page then has the window's full width for its tables.

    The select box has a key: Streamlit then identifies it by the key alone (1.4x on), not by its
    labels, which change with the selection; without one every other pick made a new widget that
    came back on the previous run."""
    runs = query(queries.runs)
    ids = [run["run_id"] for run in runs]
    # The address names the open run. Where it names another run than this session last put there,
    # it changed under the session: a link opened, or Back / Forward (Streamlit reruns the page with
    # the address it went back to, and a page switch keeps the address's parameters).
    linked = st.query_params.get(LINK_PARAM)
    if linked is not None and linked != st.session_state.get(LINKED_KEY):
        # not listed: a prefix (a short id copied off a page), or a run younger than the cached list
        found = {"run_id": linked} if linked in ids else query(queries.linked_run, linked, fresh=True)
        if found.get("run_id") is not None and found["run_id"] not in ids:
            _cached.clear()  # the cached list is older than the run: every read of the page must see it
            runs = query(queries.runs, fresh=True)
            ids = [run["run_id"] for run in runs]
        if found.get("run_id") in ids:
            st.session_state[RUN_KEY] = found["run_id"]
        else:
            why = found.get("error", "it has rows but neither a RunStart nor a rank row; "
                                     "only specscope doctor reads it")
            st.warning(f"The link names run {code(_IDS.repr(linked))}, which this dashboard cannot open "
                       f"({inert(why)}); showing the run in the picker below.")
    current = st.session_state.get(RUN_KEY)
    if current not in ids:  # first view, or the open run was deleted
        if current is not None:
            st.warning(f"Run {code(_IDS.repr(current))}, open until now, is no longer in this store; "
                       "showing the newest run.")
        current = ids[0]
    # RUN_KEY is the truth (a pick reaches it through the callback, before this run); the select box
    # is set from it on every run, since a page switch drops the box's own state.
    st.session_state[RUN_KEY] = st.session_state[PICKER_KEY] = current
    if linked != current:  # (a new entry in the browser's history, except while going back)
        st.query_params[LINK_PARAM] = current
    st.session_state[LINKED_KEY] = current
    short = short_ids(ids, at_least=12)
    labels = {run["run_id"]: run_label(run, short[run["run_id"]], diagnosed=run["run_id"] == current)
              for run in runs}
    box, details = st.columns([2, 1], vertical_alignment="bottom")
    chosen = box.selectbox("Run", ids, key=PICKER_KEY, format_func=labels.__getitem__, on_change=_picked)
    details.caption(run_details(next(run for run in runs if run["run_id"] == chosen))
                    + f" · store `{db_url()}`")
    return chosen


def _title(finding: Finding) -> str:
    origin = " (checkpoint inspection)" if finding.source == "inspect" else ""
    return f"**{finding.code}**{origin} — {inert(finding.message)}"


def findings_banner(items: list[Finding], *, limit: int | None = None,
                    ok: str = "No error or warning findings") -> None:
    """Errors in red and warnings in orange, each ``CODE — message`` on one line (checkpoint findings
    labelled as such); what the doctor could not check (CHECKS_SKIPPED) in blue; other info findings
    are counted, not shown. The green ``ok`` line only when there is no error, no warning and nothing
    unobserved."""
    shown = [f for f in items if f.severity in ("error", "warning")]
    for finding in shown[:limit]:
        box = st.error if finding.severity == "error" else st.warning
        box(_title(finding), icon=SEVERITY_ICON[finding.severity])
    if limit is not None and len(shown) > limit:
        st.caption(f"{len(shown) - limit} more on the Findings page")
    skipped = [f for f in items if f.code in UNOBSERVED_CODES and f.severity == "info"]
    for finding in skipped:
        st.info(f"**{UNOBSERVED_TITLE[finding.code]}** — {inert(finding.message)}", icon=":material/visibility_off:")
    if not shown and not skipped:
        infos = len(items)
        st.success(ok + (f" ({infos} info)" if infos else ""),
                   icon=":material/check_circle:")


def live(body: Callable[[], None], state: str) -> None:
    """Run ``body`` as a fragment that reruns itself every REFRESH_S seconds while the run is being
    written (``state == 'running'``); a run in any other state renders once."""
    st.fragment(body, run_every=REFRESH_S if state == "running" else None)()


def state_badge(state: str) -> None:
    """A coloured badge for a run's state, one short word (its meaning on hover): live (green),
    finished (grey), crashed and lost (red), stale (orange)."""
    st.badge(STATE_LABEL[state], color=STATE_COLOR[state], help=STATE_HELP[state])


def shape_text(shape: str | None) -> str:
    """A stored shape for people: ``"1x5x1728"`` -> ``"1×5×1728"``; an expected shape, whose
    leading dimensions are free (-1), ``"-1x-1x1728"`` -> ``"…×1728"``; None -> ``""``."""
    if shape is None:
        return ""
    dims = shape.split("x") if shape else []
    free = 0
    while free < len(dims) - 1 and dims[free] == "-1":
        free += 1
    return "×".join((["…"] if free else []) + dims[free:])


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    """A number for a metric tile ('—' for None)."""
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"
