"""The live dashboard (docs/design.md, "Components and data flow"): a Streamlit multipage app over
the store's views.

``specscope dashboard --db URL`` runs :data:`ENTRY` with ``streamlit run``, passing the store through
the :data:`DB_ENV` environment variable. Every SQL statement the pages run lives in
:mod:`specscope.app.queries` (plain functions of a read-only Store, tested directly); pages are thin
UI over them. Importing this package does not import Streamlit.
"""

from pathlib import Path

DB_ENV = "SPECSCOPE_DB"
ENTRY = Path(__file__).with_name("main.py")
ACCENT = "#3b6ea5"
"""The dashboard's accent colour, a neutral blue: its theme colour and the colour of plain figures
(green and red are kept for verdicts)."""

__all__ = ["ACCENT", "DB_ENV", "ENTRY"]
