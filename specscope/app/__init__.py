"""The live dashboard (docs/design.md, "Components and data flow"): a Streamlit multipage app over
the store's views.

``specscope dashboard --db URL`` runs :data:`ENTRY` with ``streamlit run``, passing the store through
the :data:`DB_ENV` environment variable. Every SQL statement the pages run lives in
:mod:`specscope.app.queries` (plain functions of a read-only Store, tested directly); pages are thin
UI over them. Importing this package does not import Streamlit.
"""

import math
import os
from pathlib import Path

from specscope.errors import ConfigError

DB_ENV = "SPECSCOPE_DB"
ENTRY = Path(__file__).with_name("main.py")
ACCENT = "#3b6ea5"
"""The dashboard's accent colour, a neutral blue: its theme colour and the colour of plain figures
(green and red are kept for verdicts)."""

TRACE_ENV = "SPECSCOPE_TRACE_SQL"
"""Set to a number of seconds: every statement the pages run that takes longer is logged (logger
``specscope``) with its time, to explain a slow page."""


def trace_threshold() -> float | None:
    """The seconds of :data:`TRACE_ENV` (None when unset).

    Raises:
        ConfigError: set to something that is not a finite number of seconds >= 0.
    """
    text = os.environ.get(TRACE_ENV)
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise ConfigError(f"{TRACE_ENV}={text!r} is not a number of seconds >= 0")
    return seconds


__all__ = ["ACCENT", "DB_ENV", "ENTRY", "TRACE_ENV", "trace_threshold"]
