"""SQL: one read-only statement on the store (the guarantee of ``specscope query``: Store.query on a
connection the database keeps read-only), results as a table with CSV download; the schema and the
views documented beside it."""

import io

import streamlit as st

from specscope.app import widgets
from specscope.cli.query import write_csv
from specscope.errors import SpecscopeError
from specscope.storage import schema, views

ROW_LIMIT = 10_000
EXAMPLES = {
    "Runs, newest first": "SELECT run_id, engine, fault, status, verify_steps, mean_acceptance_length,\n"
                          "       acceptance_rate, error_findings\nFROM v_run_summary ORDER BY started_wall DESC",
    "Worst requests of the selected run": "SELECT request_id, verify_steps, mean_acceptance_length, duration_s\n"
                                          "FROM v_request_acceptance WHERE run_id = '{run_id}'\n"
                                          "ORDER BY mean_acceptance_length LIMIT 20",
    "Draft input widths vs contract": "SELECT rank, shape, expected_shape, graph_phase, calls, width_mismatch\n"
                                      "FROM v_tensor_contract WHERE run_id = '{run_id}'\n"
                                      "  AND hook_point = 'draft.forward:hidden_states'",
    "Per-position acceptance": "SELECT position, acceptance, verify_steps FROM v_position_acceptance\n"
                               "WHERE run_id = '{run_id}' ORDER BY position",
    "Acceptance per rank": "SELECT rank, verify_steps, mean_acceptance_length, tokens_per_s\n"
                           "FROM v_rank_acceptance WHERE run_id = '{run_id}' ORDER BY rank",
    "Findings": "SELECT source, code, severity, message FROM findings WHERE run_id = '{run_id}'",
}

run_id = widgets.run_picker()
st.title("SQL")
HIDDEN_TABLES = ("positions",)  # a helper of the per-position views (rows 0..N-1), not trace data


def reference() -> None:
    """The views (from :mod:`specscope.storage.views`' own table, as Markdown) and every table."""
    lines = [line for line in views.__doc__.splitlines() if line.startswith("|")]
    st.markdown("\n".join(lines).replace("``", "`"))
    st.caption("Acceptance: AL = 1 + accepted / verify steps, rate = accepted / proposed, "
               "p_i = steps with position i accepted / verify steps. Filter views by `run_id`.")
    st.subheader("Tables")
    for column, table in zip(st.columns(3) * 4, [t for t in schema.metadata.sorted_tables
                                                 if t.name not in HIDDEN_TABLES]):
        with column.expander(table.name):
            st.markdown("\n".join(f"- `{c.name}` {c.type}" for c in table.columns))


example = st.selectbox("Example", list(EXAMPLES), key="sql_example")
with st.form("sql"):
    sql = st.text_area("One read-only SQL statement", EXAMPLES[example].format(run_id=run_id), height=140,
                       key=f"sql_text_{example}")
    submitted = st.form_submit_button("Run", type="primary")
st.caption(f"Writes are refused by the database; at most {ROW_LIMIT:,} rows are fetched.")
if submitted or sql:
    try:
        columns, rows = widgets.store().query(sql, limit=ROW_LIMIT)
    except SpecscopeError as exc:
        st.error(str(exc))
    else:
        st.dataframe([dict(zip(columns, row)) for row in rows], hide_index=True)
        out = io.StringIO()
        write_csv(columns, rows, out)
        st.download_button("Download CSV", out.getvalue(), file_name="specscope-query.csv", mime="text/csv")
        st.caption(f"{len(rows)} row(s)" + (f" (cut at {ROW_LIMIT:,})" if len(rows) == ROW_LIMIT else ""))
st.subheader("Views")
reference()
