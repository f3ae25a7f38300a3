"""Requests: per-request acceptance (the histogram of accepted drafts per verify step, the spread of
per-request AL, and AL by position in the output), and one request in detail (accepted per step, per-position
acceptance, the generated text with each token marked draft-accepted or target-produced)."""

import streamlit as st

from specscope.app import charts, queries, widgets
from specscope.storage.queries import REQUEST_ORDERS

run_id = widgets.run_picker()
summary = widgets.query(queries.run_summary, run_id)
k = summary["config"].get("k")
ALL_ROWS = 25  # up to this many requests the table shows every row, no inner scroll
# REQUEST_ACCEPT_OUTLIER's evidence lists (the first ten of each kind) and how the table marks them
OUTLIER_MARKS = {"near_zero": "outlier: accepts next to nothing", "repeating": "outlier: accepts all, text repeats"}
st.title("Requests")


def body() -> None:
    order = st.segmented_control("Order by", list(REQUEST_ORDERS), default="start", key="req_order")
    rows = widgets.query(queries.requests, run_id, order or "start")
    if not rows:
        st.info("No request recorded for this run yet.")
        return
    groups = widgets.query(queries.sampling_acceptance, run_id)
    if len(groups) > 1:  # acceptance of greedy and sampled requests side by side: a collapse in one shows
        st.subheader("Acceptance by sampling")
        st.dataframe([{"sampling": g["sampling"] or "not reported", "requests": g["requests"],
                       "verify steps": g["verify_steps"], "acceptance length": g["mean_acceptance_length"],
                       "acceptance rate": g["acceptance_rate"]} for g in groups],
                     hide_index=True, column_config={
                         "acceptance length": st.column_config.NumberColumn(format="%.2f"),
                         "acceptance rate": st.column_config.NumberColumn(format="percent")})
    dist = widgets.query(queries.distributions, run_id,
                         ("acceptance_histogram", "request_acceptance", "acceptance_by_output_position"))
    left, right = st.columns(2)
    left.plotly_chart(charts.acceptance_histogram(dist["acceptance_histogram"]), key="hist")
    right.plotly_chart(charts.acceptance_by_output_position(dist["acceptance_by_output_position"], k),
                       key="by-output-position")
    spread = next((r for r in dist["request_acceptance"] if r["sampling"] == "all"), None)
    if spread is not None:
        st.caption(f"Per-request acceptance length over {spread['requests']} requests: p10 "
                   f"{widgets.fmt(spread['p10_al'])}, median {widgets.fmt(spread['p50_al'])}, p90 "
                   f"{widgets.fmt(spread['p90_al'])}, p99 {widgets.fmt(spread['p99_al'])}; token-weighted "
                   f"{widgets.fmt(spread['token_weighted_al'])}.")
    outliers = [f for f in widgets.findings(run_id) if f.code == "REQUEST_ACCEPT_OUTLIER"]
    if outliers:
        widgets.findings_banner(outliers)
    marked = {named["request_id"]: label for f in outliers for part, label in OUTLIER_MARKS.items()
              for named in f.evidence.get(part, ())}
    named = sum(f.evidence.get(f"{part}_count", 0) for f in outliers for part in OUTLIER_MARKS)
    st.caption(f"{summary['requests']:,} requests; showing {len(rows)}"
               + (f"; the doctor's outliers marked: {len(marked)} of the {named} it found (it lists up to "
                  "10 of each kind)" if marked else ""))
    st.dataframe([{"request": r["request_id"], "doctor": marked.get(r["request_id"], ""),
                   "rank": r["rank"], "sampling": r["sampling"],
                   "prompt tokens": r["prompt_tokens"],
                   "output tokens": r["output_tokens"], "verify steps": r["verify_steps"],
                   "acceptance length": r["mean_acceptance_length"],
                   "acceptance rate": r["acceptance_rate"], "duration s": r["duration_s"],
                   "step detail": bool(r["step_detail"])} for r in rows],
                 hide_index=True, height="auto" if len(rows) <= ALL_ROWS else 420,
                 column_config={"acceptance length": st.column_config.NumberColumn(format="%.2f"),
                                # a measurement, not a verdict: neutral, not the theme's colour
                                "acceptance rate": st.column_config.ProgressColumn(
                                    min_value=0, max_value=1, format="percent", color=charts.FIGURE),
                                "duration s": st.column_config.NumberColumn(format="%.2f")})
    ids = [r["request_id"] for r in rows]
    request_id = st.selectbox("Request", ids, key="request")
    steps = widgets.query(queries.request_steps, run_id, request_id)
    if not steps:
        st.info(f"{widgets.code(request_id)} has no step detail (sampled out: `step_sample` of the run config); its "
                "acceptance and per-position figures are exact aggregates.")
    left, right = st.columns(2)
    left.plotly_chart(charts.accepted_per_step(steps, k), key="req-steps")
    right.plotly_chart(charts.positions(widgets.query(queries.request_positions, run_id, request_id),
                                        f"Per-position acceptance of {request_id}"), key="req-pos")
    st.subheader("Generated text")
    tokens = queries.marked_tokens(steps)
    text = next(r["text"] for r in rows if r["request_id"] == request_id)
    if tokens:
        st.html(charts.marked_text(tokens))
        if text is not None:
            with st.expander("As returned (the whole output, the first token included)"):
                st.code(text, language=None, wrap_lines=True)
    elif text is not None:
        st.code(text, language=None, wrap_lines=True)
        st.caption("Per-step tokens were not recorded for this request (sampled out of step detail), so "
                   "draft-accepted and bonus tokens are not marked.")
    else:
        st.info("This run recorded no generated text for this request (its engine or recorder gives "
                "token counts only).")


widgets.live(body, summary["state"])
