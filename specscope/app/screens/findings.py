"""Findings: the doctor's findings for the selected run with their evidence and fixes, then the
checkpoint inspection (inspect findings and load reports: dropped, missing and renamed keys)."""

import json

import streamlit as st

from specscope.app import queries, widgets

run_id = widgets.run_picker()
summary = widgets.query(queries.run_summary, run_id)
st.title("Findings")


def body() -> None:
    items = widgets.findings(run_id)
    runtime = [f for f in items if f.source != "inspect"]
    inspected = [f for f in items if f.source == "inspect"]
    st.subheader(f"Runtime (doctor): {len(runtime)} finding(s)")
    if not runtime:  # CHECKS_SKIPPED / NOT_OBSERVED are findings: nothing here means all was checked
        st.success("The doctor checked everything and found nothing in this run.",
                   icon=":material/check_circle:")
    for finding in runtime:
        show(finding)
    st.subheader(f"Checkpoint inspection: {len(inspected)} finding(s)")
    for finding in inspected:
        show(finding)
    st.subheader("Checkpoint loads")
    reports = widgets.query(queries.load_reports, run_id)
    if not reports:
        st.caption("No load report recorded: this run's loader was not observed (embedded API: "
                   "`check_load`; the vLLM plugin records a load vLLM refused as the run's error).")
    else:
        st.caption("What each load did with the checkpoint's keys; the doctor judges them (WEIGHTS_DROPPED, "
                   "listed above when a load dropped or missed a key, strict and non-strict loads alike).")
    for report in reports:
        st.markdown(f"Rank {report['rank']} · {widgets.code(report['module'])} ← {widgets.code(report['source'])} · "
                    f"{'strict' if report['strict'] else 'non-strict'} · {report['loaded']} keys loaded")
        for col, key, label in zip(st.columns(3), ("unexpected", "missing", "renamed"),
                                   ("dropped (unexpected)", "missing", "renamed")):
            values = report[key]
            col.markdown(f"**{label}**: {len(values)}")
            if values:
                col.code("\n".join(" → ".join(v) if isinstance(v, list) else v for v in values[:50]),
                         language=None)


def show(finding) -> None:
    icon = widgets.SEVERITY_ICON.get(finding.severity, "")
    with st.expander(f"{icon} **{finding.code}** [{finding.severity}] — {widgets.inert(finding.message)}",
                     expanded=finding.severity == "error"):
        st.markdown(f"**Fix:** {finding.fix}")
        st.code(json.dumps(finding.evidence, indent=1, default=str), language="json")


widgets.live(body, summary["state"])
