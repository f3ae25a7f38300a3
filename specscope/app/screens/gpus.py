"""GPUs: per rank (device) acceptance, steps, throughput, counters, the doctor's findings that name
the rank, and the shapes seen at each hook point; ranks that differ from the others or that a
finding names are highlighted."""

import pandas as pd
import streamlit as st

from specscope.app import charts, queries, widgets
from specscope.doctor import named_ranks
from specscope.events import Finding

run_id = widgets.run_picker()
summary = widgets.query(queries.run_summary, run_id)
st.title("GPUs")


def _rank_findings(findings: list[Finding]) -> dict[int, list[str]]:
    """Per rank, the codes of the doctor's error and warning findings that name it
    (:func:`specscope.doctor.named_ranks`)."""
    named: dict[int, list[str]] = {}
    for f in findings:
        if f.severity in ("error", "warning"):
            for rank in named_ranks(f.code, f.evidence):
                named.setdefault(rank, []).append(f.code)
    return named


def _rank_frame(rows: list[dict], named: dict[int, list[str]]) -> pd.DataFrame:
    """Ranks as a table with the findings that name each (:func:`_rank_findings`); ranks named by
    a finding and ranks with hook errors or dropped events highlighted."""
    # Verdict and figures first, where the page is read; where it ran last. Headers as short as the
    # Overview's tiles: the table fits a 1280 px window.
    frame = pd.DataFrame([{"rank": r["rank"], "findings": ", ".join(named.get(r["rank"], [])),
                           "verify steps": r["verify_steps"], "accept length": r["mean_acceptance_length"],
                           "accept rate": r["acceptance_rate"], "tokens/s": r["tokens_per_s"],
                           "hook errors": r["hook_errors"], "dropped": r["events_dropped"],
                           "mode": widgets.graph_mode(summary["config"], r["graph_mode"]), "device": r["device"], "host": r["host"]}
                          for r in rows])

    def highlight(row: pd.Series) -> list[str]:
        bad = bool(row["findings"]) or row["hook errors"] > 0 or row["dropped"] > 0
        return ["background-color: #ffcdd2" if bad else ""] * len(row)

    return frame.style.apply(highlight, axis=1).format(
        {"accept length": "{:.2f}", "accept rate": "{:.1%}", "tokens/s": "{:.1f}"}, na_rep="—")


CELL_WIDTHS = 3  # widths a shape cell names; the rest are counted (every shape per rank: the Tensors page)


def _shape_matrix(contract: list[dict], ranks: list[int], differing: set[str]) -> list[dict]:
    """One row per hook point, one column per rank: the widths seen (ranks serve different requests,
    so only the last dimension is comparable), each with its events and graph phase, ``≠`` and the
    expected width where it breaks the contract; ``differing`` hook points (named by the doctor's
    RANK_DIVERGENCE) marked."""
    events: dict[str, dict[int, dict[tuple, int]]] = {}
    for row in contract:
        key = (row["width"], row["expected_width"] if row["width_mismatch"] else None, row["graph_phase"])
        per_rank = events.setdefault(row["hook_point"], {}).setdefault(row["rank"], {})
        per_rank[key] = per_rank.get(key, 0) + row["events"]

    def cell(widths: dict[tuple, int] | None) -> str:
        if not widths:
            return "not seen"
        # Contract breaks first, then the most frequent widths: a point whose last dimension is a
        # length (input ids, positions) has a width per prompt, which would run past the column.
        ranked = sorted(widths.items(), key=lambda item: (item[0][1] is None, -item[1]))
        shown = "; ".join(f"…×{width}" + (f" ≠ …×{expected}" if expected is not None else "")
                          + f" ({n}{'' if phase == 'eager' else ', ' + phase})"
                          for (width, expected, phase), n in ranked[:CELL_WIDTHS])
        rest = ranked[CELL_WIDTHS:]
        return shown + (f"; +{len(rest)} more ({sum(n for _, n in rest)})" if rest else "")

    return [{"hook point": point, "ranks differ": "DIFFER" if point in differing else "",
             **{f"rank {rank}": cell(by_rank.get(rank)) for rank in ranks}}
            for point, by_rank in events.items()]


def body() -> None:
    rows = widgets.query(queries.ranks, run_id)
    if not rows:
        st.info("No rank has reported for this run yet.")
        return
    # The doctor's RANK_DIVERGENCE (its margin and minimum steps), not a threshold of this page.
    findings = widgets.findings(run_id)
    divergence = [f for f in findings if f.code == "RANK_DIVERGENCE"]
    if len(rows) == 1:
        st.caption("This run has a single rank.")
    else:
        widgets.findings_banner(divergence, ok=f"The doctor finds the {len(rows)} ranks in agreement "
                                               "(acceptance length and contract widths)")
    st.dataframe(_rank_frame(rows, _rank_findings(findings)), hide_index=True)
    if len(rows) > 1:
        st.plotly_chart(charts.rank_acceptance(rows), key="rank-al")
    st.subheader("Shapes seen at each hook point, per rank")
    differing = {point["hook_point"] for f in divergence for point in f.evidence.get("hook_points", [])}
    matrix = _shape_matrix(widgets.query(queries.tensor_contract, run_id), [r["rank"] for r in rows], differing)
    st.caption(f"Cells: last dimension (events recorded; graph phase when not eager), contract breaks "
               f"first, then the {CELL_WIDTHS} most frequent; `≠` marks a width that breaks the contract; "
               "DIFFER marks a contract point whose widths differ between ranks (RANK_DIVERGENCE). Full "
               "shapes per rank: the Tensors page.")
    st.dataframe(pd.DataFrame(matrix).style.apply(
        lambda row: ["background-color: #ffcdd2" if row["ranks differ"] else ""] * len(row), axis=1)
        if matrix else pd.DataFrame(), hide_index=True)


widgets.live(body, summary["state"])
