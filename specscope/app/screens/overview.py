"""Overview: the selected run's findings first, then its acceptance figures, acceptance length over
time (all ranks, and per window and rank), per position and for each smaller k; optionally against a second run (the verdict of
``specscope compare``, the open run as the candidate, then both side by side); all runs below."""

import streamlit as st

from specscope.app import charts, queries, widgets

run_id = widgets.run_picker()
runs = widgets.query(queries.runs)
by_id = {run["run_id"]: run for run in runs}
short, labelled = widgets.short_ids(by_id), widgets.short_ids(by_id, at_least=12)
others = [rid for rid in by_id if rid != run_id]
compare = st.columns([2, 1])[0].selectbox(
    "Compare side by side with", [None, *others], key="compare",
    format_func=lambda rid: "—" if rid is None else widgets.run_label(by_id[rid], labelled[rid]))


STRIP_RUNS = 6  # newest runs named in the verdict strip at the top; the Runs table below has them all


def verdict_strip() -> None:
    """One line naming the newest runs with their verdict in colour, so a healthy and a faulty run are
    told apart on the first screen whichever is open. Each is the doctor's verdict (an ended run's
    computed once per dashboard): a run whose verdict was never stored (written without the
    collector's run-end callback, or without its RunStart) would read green from the stored counts."""
    parts = []
    for r in runs[:STRIP_RUNS]:
        found = widgets.counts(r, diagnosed=True)
        said = widgets.counts_said(found) or "no finding"
        colour = "red" if found["error"] else "orange" if found["warning"] else "green"
        name = (widgets.inert(r["engine"]) + (f" {widgets.inert(r['fault'])}" if r["fault"] else "")
                + f" {widgets.code(short[r['run_id']])}")
        parts.append(("▶ " if r["run_id"] == run_id else "") + f":{colour}[**{said}**] {name}")
    more = f" · {len(runs) - STRIP_RUNS} more in Runs below" if len(runs) > STRIP_RUNS else ""
    st.markdown("Runs: " + " · ".join(parts) + more)


def panel(rid: str, narrow: bool) -> None:
    summary = widgets.query(queries.run_summary, rid)
    config = summary["config"]
    head, badge = st.columns([5, 1])
    head.subheader(widgets.inert(summary["engine"])
                   + (f" · fault {widgets.code(summary['fault'])}" if summary["fault"] else ""))
    with badge:
        widgets.state_badge(summary["state"])
    models = (f"{widgets.inert(summary['target_model'])} + draft {widgets.inert(summary['draft_model'])}"
              if summary["run_start"] else "no RunStart stored: engine, models and contract unknown")
    st.caption(f"run {widgets.code(rid)} · {models} · started {widgets.when(summary['started_wall'])} · "
               f"{summary['world_size']} rank(s) · mode {widgets.graph_mode(config, summary['graph_mode'])}")
    widgets.findings_banner(widgets.findings(rid), limit=4 if narrow else 6)
    tiles = [("Accept length", widgets.fmt(summary["mean_acceptance_length"]),
              "tokens per verify step, bonus included (1 + accepted / steps)"),
             ("Accept rate", widgets.fmt(None if summary["acceptance_rate"] is None
                                             else 100 * summary["acceptance_rate"], 1, " %"),
              "accepted / proposed draft tokens"),
             ("Tokens/s", widgets.fmt(summary["tokens_per_s"], 1),
              "emitted tokens per second of wall time from the first verify step to the last, all ranks together"),
             ("Verify steps", f"{summary['verify_steps']:,}", None),
             ("Requests", f"{summary['requests']:,}", None),
             ("Dropped", f"{summary['events_dropped']:,}", "events the collector could not keep (dropped)")]
    per_row = 3 if narrow else 6
    for start in range(0, len(tiles), per_row):
        for col, (label, value, help_text) in zip(st.columns(per_row), tiles[start:start + per_row]):
            col.metric(label, value, help=help_text, border=True)
    st.plotly_chart(charts.acceptance_over_time(widgets.query(queries.acceptance_over_time, rid), config.get("k")),
                    key=f"al-{rid}")
    windows = widgets.query(queries.distributions, rid, ("acceptance_windows",))["acceptance_windows"]
    st.plotly_chart(charts.acceptance_windows(windows, config.get("k")), key=f"win-{rid}")
    st.plotly_chart(charts.positions(widgets.query(queries.position_acceptance, rid)), key=f"pos-{rid}")
    what_if = widgets.query(queries.what_if_k, rid)
    st.plotly_chart(charts.what_if_k(what_if), key=f"k-{rid}")
    if what_if and what_if[0]["tokens_per_s"] is not None:
        # The tile counts wall time over every rank; the prediction counts one stream's draft and verify
        # time only, so the two differ on multi-rank runs and by the time spent between steps.
        st.caption("Predicted tokens/s: one stream, draft and verify time only (AL / (k × draft time per "
                   "token + verify time per step)); the Tokens/s tile counts wall time over all ranks.")


VERDICT_BOX = {"regression": st.error, "lossy": st.error, "improvement": st.success, "inconclusive": st.warning,
               "no change": st.info}


def verdict(candidate: str, base: str) -> None:
    """The difference in acceptance length of the open run against ``base`` with its interval and
    verdict, per-position acceptance of both, and the requests whose acceptance moved most."""
    result = widgets.query(queries.comparison, candidate, base)
    st.subheader("Did acceptance change?")
    if "error" in result:
        st.warning(f"These runs cannot be compared: {widgets.inert(result['error'])}")
        return
    # the figures of what decided the verdict: one sampling group's where the groups were judged
    group = result["groups"].get(result["decided_by"][0]) if result["groups"] else None
    diff = group or result
    low, high = diff["ci95"]
    how = (f"paired over {diff['matched_requests']} requests with the same prompt" if diff["paired"]
           else f"two-sample over {diff['base_requests']} + {diff['candidate_requests']} requests")
    where = f" in sampling group {result['decided_by'][0]}" if group else ""
    lossy = (f"the candidate fails its losslessness audit ({result['lossless_violations'][0]}); acceptance "
             f"alone reads {result['acceptance_verdict']}: " if result["lossless_violations"] else "")
    VERDICT_BOX[result["verdict"]](
        f"**{result['verdict']}**: {lossy}acceptance length {widgets.fmt(result['base']['mean_acceptance_length'], 3)} "
        f"→ {widgets.fmt(result['candidate']['mean_acceptance_length'], 3)}, difference{where} {diff['delta']:+.3f} "
        f"(95% CI {low:+.3f} … {high:+.3f}), {how}")
    st.caption(f"Base: run {widgets.code(base[:12])} · candidate: the open run {widgets.code(candidate[:12])}. "
               f"The rule: {result['rule']}. "
               "Intervals are bootstrapped over requests; `specscope compare` gives the same verdict.")
    chart, moved = st.columns([3, 2])
    chart.plotly_chart(charts.positions_compared(result["base"]["per_position_acceptance"],
                                                 result["candidate"]["per_position_acceptance"]), key="pos-compared")
    with moved:
        st.markdown("**Requests that moved most**")
        if result["moved"]:
            two_places = st.column_config.NumberColumn(format="%.2f")  # as `specscope compare` prints them
            st.dataframe([{"request": m["candidate_request_id"], "base AL": m["base_acceptance_length"],
                           "candidate AL": m["candidate_acceptance_length"], "difference": m["delta"]}
                          for m in result["moved"]], hide_index=True,
                         column_config={name: two_places for name in ("base AL", "candidate AL", "difference")})
        else:
            st.caption("The runs served different prompts: no request to set against another.")


def body() -> None:
    verdict_strip()
    if compare is None:
        panel(run_id, narrow=False)
    else:
        verdict(run_id, compare)
        for col, rid in zip(st.columns(2), (run_id, compare)):
            with col:
                panel(rid, narrow=True)
    st.subheader("Runs")
    st.caption("▶ marks the open run. Errors and warnings: the doctor's for the open run, the stored "
               "ones for the others. Started: month-day and local time. Models: target + draft, short names.")
    rows = []
    for r in runs:
        found = widgets.counts(r, diagnosed=r["run_id"] == run_id)
        rows.append({"open": "▶" if r["run_id"] == run_id else "", "run": short[r["run_id"]],
                     "started": widgets.when(r["started_wall"], "%m-%d %H:%M:%S"),
                     "state": widgets.STATE_LABEL[r["state"]],
                     "errors": found["error"], "warnings": found["warning"], "fault": r["fault"] or "",
                     "engine": r["engine"], "ranks": r["world_size"], "requests": r["requests"],
                     "models": f"{_last(r['target_model'])} + {_last(r['draft_model'])}"})
    narrow = {name: st.column_config.Column(width=60) for name in ("errors", "warnings", "ranks")}
    st.dataframe(rows, hide_index=True, column_config={
        **narrow, "open": st.column_config.TextColumn("", width=30),
        "run": st.column_config.TextColumn(width=90, help="the run id's shortest unique prefix (8 characters or "
                                                         "more): specscope doctor --run takes it"),
        "requests": st.column_config.NumberColumn(width=70)})


def _last(model: str | None) -> str:
    """A model id's last segment, without a note in parentheses (the run's own line above has the
    full ids): ``HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)`` -> ``SmolLM2-135M-Instruct``."""
    return (model or "—").split(" (", 1)[0].rstrip("/").rsplit("/", 1)[-1]


states = {by_id[rid]["state"] for rid in (run_id, compare) if rid is not None}
widgets.live(body, "running" if "running" in states else "finished")
