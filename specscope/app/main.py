"""Streamlit entry of the dashboard: ``streamlit run specscope/app/main.py`` with the store in the
``SPECSCOPE_DB`` environment variable (``specscope dashboard --db URL`` does both).

An empty store gets the "Get started" page only; otherwise the pages Overview, Requests, GPUs,
Tensors, Findings and SQL, each opening with the run picker (newest run first). The navigation is a
bar at the top and there is no sidebar, so a page has the window's width (tables read whole at 1280 px).
The page scripts live in ``screens/``: a ``pages/`` folder beside this file would make Streamlit run
its first script run as an old-style multipage app, flashing a raw page list (``main``, ...).
"""

import streamlit as st

from specscope.app import queries, widgets

# The favicon is an image served by this server: a Material or emoji icon makes the browser fetch
# it from a CDN, which fails offline.
ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
        'fill="#2e7d32"/><circle cx="14" cy="14" r="7" fill="none" stroke="#fff" stroke-width="3"/>'
        '<path d="M19 19l7 7" stroke="#fff" stroke-width="3"/></svg>')  # a magnifier, inline
st.set_page_config(page_title="specscope", page_icon=ICON, layout="wide")
widgets.store()
runs = widgets.query(queries.runs)
if not runs:
    # the open run went with the rest: a run written later opens as on a first view, unannounced
    st.session_state.pop(widgets.RUN_KEY, None)
    pages = [st.Page("screens/get_started.py", title="Get started", icon=":material/rocket_launch:")]
else:
    pages = [
        st.Page("screens/overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page("screens/requests.py", title="Requests", icon=":material/list:"),
        st.Page("screens/gpus.py", title="GPUs", icon=":material/memory:"),
        st.Page("screens/tensors.py", title="Tensors", icon=":material/view_in_ar:"),
        st.Page("screens/findings.py", title="Findings", icon=":material/report:"),
        st.Page("screens/sql.py", title="SQL", icon=":material/database:"),
    ]
st.navigation(pages, position="top").run()
