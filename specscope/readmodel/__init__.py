"""The read model of a run: what the doctor CLI, the dashboard and the exporter say about a run,
written once (docs/design.md, "Reading a run").

- :func:`summaries` / :func:`summary`: a run's row of ``v_run_summary`` with its :func:`run_state`.
- :func:`distributions`: a run's acceptance histogram, per-request AL percentiles, windows over time
  and AL by output position.
- :func:`report` / :func:`store_verdict`: the verdict (the doctor's runtime findings plus the stored
  checkpoint findings as :func:`specscope.doctor.checkpoint_findings` reads them; with
  ``distributions=True`` the runs carry their distributions too), and storing it when a run ends (the
  collector's ``on_run_end``), so ``v_run_summary`` counts it.
- :class:`RunReader`: verdicts and their error / warning :func:`counts` with the caching policy: a
  run that has ended (:data:`ENDED`) gets its verdict computed once per reader.
"""

from specscope.readmodel._run_view import (
    ENDED,
    STALE_AFTER_S,
    STATES,
    RunReader,
    counts,
    distributions,
    report,
    run_state,
    store_verdict,
    summaries,
    summary,
)
from specscope.storage.views import LOST_AFTER_S

__all__ = ["ENDED", "LOST_AFTER_S", "STALE_AFTER_S", "STATES", "RunReader", "counts", "distributions", "report", "run_state",
           "store_verdict", "summaries", "summary"]
