"""GPUs: per rank (device) acceptance, steps, throughput, counters and the shapes seen at each hook
point; ranks that differ from the others are highlighted."""

import pandas as pd
import streamlit as st

from specscope.app import charts, queries, widgets

run_id = widgets.run_picker()
summary = widgets.query("run_summary", run_id)
st.title("GPUs")
AL_MARGIN = 0.25  # tokens/step: a rank further than this from the median rank is highlighted


def _rank_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame([{"rank": r["rank"], "device": r["device"], "host": r["host"],
                           "mode": r["graph_mode"], "verify steps": r["verify_steps"],
                           "acceptance length": r["mean_acceptance_length"],
                           "acceptance rate": r["acceptance_rate"], "tokens/s": r["tokens_per_s"],
                           "hook errors": r["hook_errors"], "dropped events": r["events_dropped"]}
                          for r in rows])
    median = frame["acceptance length"].median()

    def highlight(row: pd.Series) -> list[str]:
        off = (row["acceptance length"] is not None and pd.notna(row["acceptance length"])
               and abs(row["acceptance length"] - median) > AL_MARGIN)
        bad = off or row["hook errors"] > 0 or row["dropped events"] > 0
        return ["background-color: #ffcdd2" if bad else ""] * len(row)

    return frame.style.apply(highlight, axis=1).format(
        {"acceptance length": "{:.2f}", "acceptance rate": "{:.1%}", "tokens/s": "{:.1f}"}, na_rep="—")


def _shape_matrix(contract: list[dict], ranks: list[int]) -> tuple[list[dict], int]:
    # Ranks serve different requests, so sequence dimensions differ; the contract is the width,
    # its expectation and the dtype.
    cells: dict[str, dict[int, list[str]]] = {}
    signatures: dict[str, dict[int, set]] = {}
    for row in contract:
        text = row["shape"] + (f" ≠ {row['expected_shape']}" if row["width_mismatch"] else "")
        cells.setdefault(row["hook_point"], {}).setdefault(row["rank"], []).append(
            f"{text} ({row['events']}, {row['graph_phase']})")
        signatures.setdefault(row["hook_point"], {}).setdefault(row["rank"], set()).add(
            (row["width"], row["expected_width"], row["dtype"]))
    table, differing = [], 0
    for point, by_rank in cells.items():
        differs = len({frozenset(signatures[point].get(rank, ())) for rank in ranks}) > 1
        differing += differs
        table.append({"hook point": point, "ranks differ": "DIFFER" if differs else "",
                      **{f"rank {rank}": "; ".join(by_rank.get(rank, ["not seen"])) for rank in ranks}})
    return table, differing


def body() -> None:
    rows = widgets.query("ranks", run_id)
    if not rows:
        st.info("No rank has reported for this run yet.")
        return
    spread = queries.rank_spread(rows)
    if spread and spread["spread"] > AL_MARGIN:
        st.warning(f"Acceptance length differs between ranks: {spread['min']:.2f} to {spread['max']:.2f} "
                   "tokens/step (highlighted below).", icon=":material/warning:")
    elif len(rows) == 1:
        st.caption("This run has a single rank.")
    st.dataframe(_rank_frame(rows), hide_index=True)
    if len(rows) > 1:
        st.plotly_chart(charts.rank_acceptance(rows), key="rank-al")
    st.subheader("Shapes seen at each hook point, per rank")
    matrix, differing = _shape_matrix(widgets.query("tensor_contract", run_id), [r["rank"] for r in rows])
    if differing:
        st.warning(f"{differing} hook point(s) see different widths or dtypes on different ranks.",
                   icon=":material/warning:")
    st.caption("Cells: shape (events recorded, graph phase); `≠` marks a width that breaks the contract.")
    st.dataframe(pd.DataFrame(matrix).style.apply(
        lambda row: ["background-color: #ffcdd2" if row["ranks differ"] else ""] * len(row), axis=1)
        if matrix else pd.DataFrame(), hide_index=True)


widgets.live(body, summary["state"])
