"""Plotly figures of the dashboard, built from the already aggregated rows of
:mod:`specscope.app.queries` (no data access here). Times on x axes are seconds since the run started.
"""

from __future__ import annotations

import html
from typing import Any

# Imported before any figure: plotly's validators take pandas from sys.modules without importing it,
# so a figure built while another script thread was still importing pandas read a half-initialised
# module ("partially initialized module 'pandas' has no attribute 'Series'", seen in CI). An import
# statement waits for that other thread's import to finish.
import pandas  # noqa: F401
import plotly.graph_objects as go

from specscope.app import ACCENT
from specscope.events import storable_text
from specscope.storage.queries import OUTPUT_POSITION_BUCKETS

Row = dict[str, Any]
# Green and red only where a chart judges (a width against its contract, the AL floor); measured
# figures in a neutral blue; token sources in two colours that read as neither good nor bad.
OK, BAD, MUTED, FIGURE, MARK = "#2e7d32", "#d32f2f", "#9e9e9e", ACCENT, "#424242"
DRAFT, TARGET = "#cfe3f7", "#e6e0f0"


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 300) -> go.Figure:
    # The legend goes under the x axis: above the plot it ran into the title in a half-width column.
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=height + 40,
                      margin=dict(l=10, r=10, t=40, b=10), showlegend=True,
                      legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0.0))
    return fig


def acceptance_over_time(rows: list[Row], k: int | None) -> go.Figure:
    """Mean acceptance length per time slice (:func:`queries.acceptance_over_time`) as faint markers,
    its rolling mean as the line, with the floor AL = 1 (nothing accepted) and the ceiling k + 1."""
    times = [r["t_s"] for r in rows]
    fig = go.Figure(go.Scatter(x=times, y=[r["mean_acceptance_length"] for r in rows],
                               mode="markers", name="per time slice", marker=dict(color=MUTED, size=5),
                               customdata=[r["verify_steps"] for r in rows],
                               hovertemplate="t=%{x:.1f}s AL=%{y:.2f} (%{customdata} steps)<extra></extra>"))
    fig.add_trace(go.Scatter(x=times, y=[r["rolling_acceptance_length"] for r in rows], mode="lines",
                             name="rolling mean", line=dict(color=FIGURE, width=3),
                             hovertemplate="t=%{x:.1f}s rolling AL=%{y:.2f}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color=BAD, dash="dot"), annotation_text="AL 1.0: nothing accepted",
                  annotation_position="bottom right")
    if k:
        fig.add_hline(y=k + 1, line=dict(color=MUTED, dash="dot"), annotation_text=f"k+1 = {k + 1}",
                      annotation_position="top right")
        fig.update_yaxes(range=[0.8, k + 1.3])
    return _layout(fig, "Acceptance length over time", "seconds since run start", "tokens / verify step")


def acceptance_windows(rows: list[Row], k: int | None) -> go.Figure:
    """AL per time window and rank (``acceptance_windows`` of :func:`queries.distributions`): one line
    per rank over seconds since the run's first verify step, so a slow fall shows on its rank."""
    fig = go.Figure()
    t0 = min((r["window_start_wall"] for r in rows), default=0.0)
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        fig.add_trace(go.Scatter(x=[r["window_start_wall"] - t0 for r in mine],
                                 y=[r["mean_acceptance_length"] for r in mine], mode="lines+markers",
                                 name=f"rank {rank}", customdata=[r["verify_steps"] for r in mine],
                                 hovertemplate="t=%{x:.1f}s AL=%{y:.2f} (%{customdata} steps)<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color=BAD, dash="dot"))
    if k:
        fig.update_yaxes(range=[0.8, k + 1.3])
    return _layout(fig, "Acceptance length per window and rank", "seconds since the first verify step",
                   "tokens / verify step", height=260)


def acceptance_histogram(rows: list[Row]) -> go.Figure:
    """Share of verify steps by accepted drafts 0..k, one bar series per sampling group
    (``acceptance_histogram`` of :func:`queries.distributions`)."""
    fig = go.Figure()
    for group in sorted({r["sampling"] for r in rows}):
        mine = [r for r in rows if r["sampling"] == group]
        fig.add_trace(go.Bar(x=[r["accepted_drafts"] for r in mine], y=[r["share"] for r in mine], name=group,
                             customdata=[r["verify_steps"] for r in mine],
                             hovertemplate="%{x} accepted: %{y:.1%} (%{customdata} steps)<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickmode="linear", dtick=1)
    fig.update_yaxes(tickformat=".0%")
    return _layout(fig, "Accepted drafts per verify step", "drafts accepted", "share of verify steps", height=260)


def acceptance_by_output_position(rows: list[Row], k: int | None) -> go.Figure:
    """AL per bucket of tokens generated before the verify step (``acceptance_by_output_position`` of
    :func:`queries.distributions`): whether drafts keep up deep into long answers."""
    upper = dict(zip(OUTPUT_POSITION_BUCKETS, OUTPUT_POSITION_BUCKETS[1:]))
    labels = [f"{r['output_position']}–{upper[r['output_position']] - 1}" if r["output_position"] in upper
              else f"{r['output_position']}+" for r in rows]
    fig = go.Figure(go.Bar(x=labels, y=[r["mean_acceptance_length"] for r in rows], marker_color=FIGURE,
                           name="acceptance length", customdata=[r["verify_steps"] for r in rows],
                           text=[f"{r['mean_acceptance_length']:.2f}" for r in rows], textposition="outside",
                           hovertemplate="after %{x} tokens: AL %{y:.2f} (%{customdata} steps)<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color=BAD, dash="dot"))
    if k:
        fig.update_yaxes(range=[0, k + 1.3])
    fig.update_xaxes(type="category")
    return _layout(fig, "Acceptance length by position in the output", "tokens generated before the verify step",
                   "tokens / verify step", height=260)


def positions(rows: list[Row], title: str = "Per-position acceptance") -> go.Figure:
    """p_i per draft position (:func:`queries.position_acceptance` rows)."""
    fig = go.Figure(go.Bar(x=[f"pos {r['position']}" for r in rows], y=[r["acceptance"] for r in rows],
                           marker_color=FIGURE, name="p_i", text=[f"{r['acceptance']:.0%}" for r in rows],
                           textposition="outside"))
    fig.update_yaxes(range=[0, 1.1], tickformat=".0%")
    return _layout(fig, title, "draft position", "steps accepted", height=260)


def positions_compared(base: list[float], candidate: list[float]) -> go.Figure:
    """p_i of two runs side by side (the ``per_position_acceptance`` lists of a comparison)."""
    fig = go.Figure()
    for name, values, color in (("base", base, MUTED), ("candidate", candidate, FIGURE)):
        fig.add_trace(go.Bar(x=[f"pos {i}" for i in range(len(values))], y=values, name=name, marker_color=color,
                             text=[f"{p:.0%}" for p in values], textposition="outside"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(range=[0, 1.1], tickformat=".0%")
    return _layout(fig, "Per-position acceptance, base vs candidate", "draft position", "steps accepted", height=280)


def what_if_k(rows: list[Row]) -> go.Figure:
    """Acceptance length the run's steps give cut to each k' (bars) and the predicted tokens/s (line,
    right axis, where the run has draft / verify times) (:func:`queries.what_if_k` rows)."""
    ks = [r["k"] for r in rows]
    fig = go.Figure(go.Bar(x=ks, y=[r["mean_acceptance_length"] for r in rows], name="acceptance length",
                           marker_color=DRAFT, text=[f"{r['mean_acceptance_length']:.2f}" for r in rows],
                           textposition="inside"))
    if rows and rows[0]["tokens_per_s"] is not None:
        rates = [r["tokens_per_s"] for r in rows]
        fig.add_trace(go.Scatter(x=ks, y=rates, name="predicted tokens/s, one stream",
                                 mode="lines+markers", line=dict(color=FIGURE, width=3), yaxis="y2"))
        # Explicit ranges keep the line above the bars' labels and inside the plot; tickmode "auto"
        # on both, as Streamlit's theme would sync the overlaying axis's ticks to the other's grid
        # (labels such as 2.7, 5.4, 10.79).
        fig.update_layout(yaxis2=dict(title="tokens / s", overlaying="y", side="right", tickmode="auto",
                                      range=[0, 1.15 * max(rates)], showgrid=False),
                          yaxis=dict(range=[0, 1.6 * max(r["mean_acceptance_length"] for r in rows)],
                                     tickmode="auto"))
    fig.update_xaxes(tickmode="array", tickvals=ks)
    return _layout(fig, "What if k were smaller", "k (draft tokens per step)", "tokens / verify step", height=260)


def accepted_per_step(steps: list[Row], k: int | None) -> go.Figure:
    """Accepted draft tokens per verify step of one request (:func:`queries.request_steps` rows)."""
    fig = go.Figure(go.Bar(x=[r["step"] for r in steps], y=[r["accepted"] for r in steps],
                           name="accepted drafts", marker_color=FIGURE))
    # Zero-height bars are invisible: a mark on the axis shows the steps that accepted nothing.
    nothing = [r["step"] for r in steps if r["accepted"] == 0]
    fig.add_trace(go.Scatter(x=nothing, y=[0] * len(nothing), mode="markers", name="nothing accepted",
                             marker=dict(color=MARK, symbol="line-ew-open", size=10, line=dict(width=3))))
    if k:
        fig.update_yaxes(range=[0, k + 0.5])
    return _layout(fig, "Accepted draft tokens per verify step", "verify step", "accepted", height=260)


def draft_widths(rows: list[Row], fused_width: int | None, duration_s: float) -> go.Figure:
    """Observed width at the draft's hidden-state input over the run's ``duration_s`` seconds
    (:func:`queries.draft_inputs_over_time` rows), one series per rank, hook point, call kind and
    width: a marker per time slice in which a call was sampled, a line only between adjacent slices.
    Hooks record a sample of the calls, so a slice without one is a gap, never drawn over (a line
    that stopped would read as if the width had). Against the expected fused width (target-fed
    calls) and the draft hidden size (chained calls)."""
    series: dict[tuple, list[Row]] = {}
    for row in rows:
        series.setdefault((row["rank"], row["hook_point"], row["call"], row["width"], row["expected_width"]),
                          []).append(row)
    fig = go.Figure()
    target_fed_last = sorted(series.items(), key=lambda kv: kv[0][2] == "target-fed")  # drawn on top
    for (rank, point, call, width, expected), slices in target_fed_last:
        bad = width != expected
        xs: list[float | None] = []
        sampled: list[int | None] = []
        for previous, row in zip([None, *slices], slices):
            if previous is not None and row["slice"] != previous["slice"] + 1:
                xs.append(None)  # a slice without a sampled call between: a gap in the line
                sampled.append(None)
            xs.append(row["t_s"])
            sampled.append(row["events"])
        fed = call == "target-fed"
        fig.add_trace(go.Scatter(
            x=xs, y=[None if x is None else width for x in xs], mode="lines+markers", connectgaps=False,
            line=dict(color=BAD if bad else (OK if fed else MUTED), width=4 if fed else 2),
            marker=dict(size=9 if fed else 6),
            name=f"{call} rank {rank}: {width}" + (f" (expected {expected})" if bad else ""),
            customdata=sampled,
            hovertemplate=(f"{point}, {call} calls, rank {rank}: width {width}, expected {expected}; "
                           "t=%{x:.1f}s, %{customdata} sampled<extra></extra>")))
    if fused_width:
        fig.add_hline(y=fused_width, line=dict(color=OK, dash="dash"),
                      annotation_text=f"expected fused width {fused_width}", annotation_position="top left")
    widths = [r["width"] for r in rows] + ([fused_width] if fused_width else [])
    if widths:
        fig.update_yaxes(range=[0, max(widths) * 1.25])
    fig.update_xaxes(range=[0, max(duration_s, 1.0)])
    return _layout(fig, "Draft input width vs expected fused width", "seconds since run start",
                   "last dimension (elements)", height=320)


def rank_acceptance(rows: list[Row]) -> go.Figure:
    """Mean acceptance length per rank (:func:`queries.ranks` rows)."""
    fig = go.Figure(go.Bar(x=[f"rank {r['rank']}" for r in rows],
                           y=[r["mean_acceptance_length"] or 0 for r in rows], marker_color=FIGURE,
                           name="acceptance length"))
    return _layout(fig, "Acceptance length per rank", "rank", "tokens / verify step", height=260)


def marked_text(tokens: list[Row]) -> str:
    """HTML of the generated text, each token on a background showing how it was produced:
    blue = accepted draft token, lilac = the target's own (bonus) token
    (:func:`queries.marked_tokens` rows)."""
    spans = []
    for token in tokens:
        color = DRAFT if token["source"] == "draft" else TARGET
        # a lone surrogate (a producer's own text) would fail the page's UTF-8 encoding: replaced
        text = html.escape(storable_text(token["token"])).replace("\n", "↵<br>")
        spans.append(f'<span title="step {token["step"]}: {token["source"]}" '
                     f'style="background:{color};border-radius:3px;padding:1px 0;'
                     f'white-space:pre-wrap">{text}</span>')
    legend = (f'<div style="margin-bottom:6px;font-size:0.85em">'
              f'<span style="background:{DRAFT};padding:1px 4px">accepted draft token</span> '
              f'<span style="background:{TARGET};padding:1px 4px">target / bonus token</span></div>')
    return (f'{legend}<div style="font-family:monospace;line-height:1.7;color:#111">'
            f'{"".join(spans)}</div>')
