"""Tensors: the shape contract at the draft boundary: the draft input width against the expected
fused width first, then the observation mode, the capture layers, provenance and every hook point."""

import dataclasses

import pandas as pd
import streamlit as st

from specscope.app import charts, queries, widgets
from specscope.doctor import CONTRACT_CODES
from specscope.events import RunConfig, unhooked

UNOBSERVED = widgets.UNOBSERVED_CODES
RUN_CONFIG_FIELDS = [field.name for field in dataclasses.fields(RunConfig)]  # the stored config's keys

run_id = widgets.run_picker()
summary = widgets.query(queries.run_summary, run_id)
config = summary["config"]
fused = config.get("expected_fused_width")
aux = config.get("aux_layer_ids_resolved") or []
st.title("Tensors")
MODES = {
    "eager": "**Eager**: hooks saw every call, so shapes and sampled values are per step.",
    "compiled": "**Compiled** (torch.compile): the capture layers reach specscope through its op inside "
                "the compiled graph, so shapes, firing and provenance are per step as in eager mode "
                "(where CUDA graphs are replayed, the mode reads CUDA-graph replay).",
    "cuda_graph": "**CUDA-graph replay**: the captured graphs write each capture layer's calls and row "
                  "fingerprints into a static device buffer that specscope reads between steps, so firing "
                  "counts every replay and provenance is sampled at each read (every few seconds); shapes are "
                  "those captured, and per-call value statistics of replayed steps are not read.",
    "capture_only": "**CUDA-graph capture only**: hooks fired only while graphs were captured; replays "
                    "are invisible. The shapes shown are those captured (and replayed); per-step values "
                    "and counts are not observed.",
    "mixed": "**Mixed**: some calls (or ranks) were seen eagerly, others only while CUDA graphs were "
             "captured (replays invisible).",
}


def body() -> None:
    outside = unhooked(config)
    if outside is not None:
        st.info(f"Not hooked: this run was {outside}, from outside the engine, so it holds acceptance only; "
                "no tensor, capture layer or graph mode was observed.", icon=":material/visibility_off:")
        return
    contract = widgets.query(queries.tensor_contract, run_id)
    widths = queries.draft_input_widths(contract, fused)
    if summary["run_start"]:
        st.markdown(f"Contract: {len(aux)} capture layers {widgets.inert(aux)} × target hidden "
                    f"{widgets.inert(config.get('target_hidden_size'))} = **expected fused width {fused}**; "
                    f"k = {widgets.inert(config.get('k'))}.")
    else:
        st.info("Contract unknown: this run's RunStart, which declares it, was not stored "
                "(RUN_START_MISSING). The hook points below are what was observed.", icon=":material/help:")
    # The doctor's verdict on the contract (its rules and thresholds, not the page's own).
    verdict = [f for f in widgets.findings(run_id) if f.code in CONTRACT_CODES + UNOBSERVED]
    if widths or verdict:
        widgets.findings_banner(verdict, ok=f"The doctor finds the contract kept: target-fed draft calls "
                                            f"carry the expected fused width {fused} from the configured "
                                            "capture layers")
    if widths:
        over_time = widgets.query(queries.draft_inputs_over_time, run_id, fused)
        duration_s = (summary["last_seen_wall"] or summary["started_wall"]) - summary["started_wall"]
        st.plotly_chart(charts.draft_widths(over_time, fused, duration_s), key="widths")
        st.caption("A point per time slice in which a call was sampled (hooks record the first calls, "
                   "then every Nth, and every new shape): an empty stretch is calls not sampled, not a "
                   "change of width.")
    else:
        st.info("No draft input with a width contract recorded yet (`draft.forward:hidden_states`, or "
                "the engine's fused input such as vLLM's `draft.model.fc:input`): is the draft instrumented?")
    phases = queries.graph_phases(contract)
    mode = summary["graph_mode"] or "eager"
    counts = ", ".join(f"{widgets.inert(phase)}: {events:,}" for phase, events in phases.items()) or "none"
    per_rank = {r["rank"]: r["graph_mode"] for r in widgets.query(queries.ranks, run_id)}
    by_rank = (" Per rank: " + ", ".join(f"rank {k} {widgets.inert(v)}" for k, v in per_rank.items()) + "."
               if len(set(per_rank.values())) > 1 else "")
    st.info(f"Observed mode — {MODES.get(mode) or widgets.inert(mode)}{by_rank} Events by graph phase: {counts}.",
            icon=":material/visibility:")
    left, right = st.columns(2)
    with left:
        st.subheader("Capture layers")
        layers = queries.capture_layers(config, contract)
        st.dataframe([{"layer": r["layer"], "rank": r["rank"], "configured": r["configured"],
                       "fired": "yes" if r["fired"] else "NEVER", "events": r["events"]} for r in layers],
                     hide_index=True)
        st.caption("Fired: the target ran the layer on that rank (its hook saw calls). Whether its value "
                   "reached the draft is provenance's answer, beside.")
    with right:
        st.subheader("Provenance (by fingerprint)")
        rows = widgets.query(queries.provenance, run_id)
        final = config.get("num_target_layers")
        if not rows:
            st.caption("No provenance checks recorded (Tracer provenance_every=0).")
        st.dataframe([{"rank": r["rank"], "configured": str(r["configured"]),
                       "received": ", ".join("final norm" if x == final else "?" if x is None else str(x)
                                             for x in r["received"]),
                       "matches": "yes" if r["matches"] else "NO", "width": r["width"], "checks": r["checks"]}
                      for r in rows], hide_index=True)
    with st.expander("The contract this run declared (RunConfig)" if summary["run_start"]
                     else "The contract this run declared (RunConfig): not stored"):
        st.dataframe([{"field": name, "value": "—" if config.get(name) is None else str(config[name])}
                      for name in RUN_CONFIG_FIELDS], hide_index=True)
    st.subheader("Every hook point: observed vs expected")
    frame = pd.DataFrame([{"hook point": r["hook_point"], "rank": r["rank"],
                           "shape": widgets.shape_text(r["shape"]),
                           "expected": widgets.shape_text(r["expected_shape"]), "dtype": r["dtype"],
                           "phase": r["graph_phase"],
                           "events": r["events"],
                           "first seen s": r["first_wall"] - summary["started_wall"],
                           "last seen s": r["last_wall"] - summary["started_wall"],
                           "mismatch": "MISMATCH" if r["width_mismatch"] else ""} for r in contract])
    if not frame.empty:
        frame = frame.style.apply(lambda row: ["background-color: #ffcdd2" if row["mismatch"] else ""]
                                  * len(row), axis=1).format({"first seen s": "{:.1f}", "last seen s": "{:.1f}"})
    st.dataframe(frame, hide_index=True)


widgets.live(body, summary["state"])
