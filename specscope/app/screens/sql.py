"""SQL: one read-only statement on the store (the guarantee of ``specscope query``: Store.query on a
connection the database keeps read-only), results as a table with CSV download; the schema and the
views documented beside it."""

import io

import streamlit as st

from specscope.app import widgets
from specscope.errors import SpecscopeError
from specscope.results import distinct_names, portable, write_csv
from specscope.storage import DEFAULT_QUERY_TIMEOUT_S, schema, views
from specscope.storage.queries import EXAMPLES

ROW_LIMIT = 10_000
BYTE_LIMIT = 16 * 2**20  # what one page view may pull into the Streamlit server and the browser
MAX_TIMEOUT_S = 30.0  # a visitor may raise the time limit up to this, never remove it
run_id = widgets.run_picker()
st.title("SQL")


def reference() -> None:
    """The views (from :mod:`specscope.storage.views`' own table, as Markdown) and every table."""
    lines = [line for line in views.__doc__.splitlines() if line.startswith("|")]
    header = lines[:2]  # the docstring's later tables repeat it: one table here
    st.markdown("\n".join(header + [line for line in lines[2:] if line not in header]).replace("``", "`"))
    st.caption("Acceptance: AL = 1 + accepted / verify steps, rate = accepted / proposed, "
               "p_i = steps with position i accepted / verify steps. Filter views by `run_id`.")
    st.subheader("Tables")
    st.caption("`positions` holds 0..N-1 for the per-position views; the others hold the traces.")
    columns = st.columns(3)
    for index, table in enumerate(schema.metadata.sorted_tables):
        with columns[index % 3].expander(table.name):
            st.markdown("\n".join(f"- `{c.name}` {c.type}" for c in table.columns))


example = st.selectbox("Example", list(EXAMPLES), key="sql_example")
with st.form("sql"):
    sql = st.text_area("One read-only SQL statement", EXAMPLES[example].format(run_id=run_id), height=140,
                       key=f"sql_text_{example}")
    submitted = st.form_submit_button("Run", type="primary")
timeout_s = st.number_input("Time limit (s)", min_value=0.1, max_value=MAX_TIMEOUT_S,
                            value=DEFAULT_QUERY_TIMEOUT_S, step=0.5, key="sql_timeout_s")
st.caption(f"Writes, ATTACH, temp tables and extensions are refused by the database, and on PostgreSQL "
           f"every function but the read-only built-ins; at most {ROW_LIMIT:,} rows and "
           f"{BYTE_LIMIT // 2**20} MiB are fetched.")
if submitted or sql:
    try:
        result = widgets.store().query(sql, limit=ROW_LIMIT, timeout_s=timeout_s, max_bytes=BYTE_LIMIT)
    except SpecscopeError as exc:
        st.error(str(exc))
    else:
        columns, rows = result
        if result.truncated:
            st.warning(f"Result cut at {result.truncated}: add a LIMIT or narrow the query.")
        names = distinct_names(columns)  # a row is a dict: a second "a" would overwrite the first
        st.dataframe([dict(zip(names, portable(row))) for row in rows], hide_index=True)
        out = io.StringIO()
        write_csv(columns, rows, out)
        st.download_button("Download CSV", out.getvalue(), file_name="specscope-query.csv", mime="text/csv")
        st.caption(f"{len(rows)} row(s)")
st.subheader("Views")
reference()
