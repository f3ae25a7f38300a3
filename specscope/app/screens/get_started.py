"""Get started: shown while the store holds no run; how to instrument an engine."""

import streamlit as st

from specscope.app import queries, widgets
from specscope.app.snippet import SNIPPET

st.title("No run recorded yet")
st.markdown(f"""
The store `{widgets.db_url()}` is a specscope store with no run in it. A run appears here as soon as
an instrumented engine writes its first event, and its pages then refresh by themselves.

**See it first:** `specscope demo` serves a healthy and a faulty (`no-aux-capture`) run of the
reference engine into a store and opens this dashboard on it.

**Instrument your engine** (one `Tracer` per rank; hooks read shapes only, no device sync):
""")
st.code(SNIPPET, language="python")
st.markdown("""
- `instrument` hooks `draft.forward:hidden_states` (expected width: the fused width on target-fed
  calls, the draft hidden size on chained ones) and `target.layers.{i}:input` for every capture layer.
- `check_load` records what the loader does with the checkpoint's keys (dropped, missing, renamed).
- `record_verify` takes CPU-side values only: the accepted count the engine already holds.
""")


@st.fragment(run_every=widgets.REFRESH_S)
def _wait_for_a_run() -> None:
    """Poll the store; the first run written switches the app to its pages."""
    if widgets.query(queries.runs):
        st.rerun(scope="app")
    st.caption(f"Waiting for a run: this page checks the store every {widgets.REFRESH_S:g} s.")


_wait_for_a_run()
