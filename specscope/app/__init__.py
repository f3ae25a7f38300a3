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

__all__ = ["DB_ENV", "ENTRY"]
