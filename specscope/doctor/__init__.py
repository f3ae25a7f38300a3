"""The doctor: rules over stored traces that name the runtime failures (docs/design.md, "Finding codes").

``diagnose(store, run_id=None)`` reads a store (read-only, aggregates in SQL) and returns a
:class:`DoctorReport`: a :class:`RunSummary` per run and the findings (errors first), each with
observed-vs-expected evidence and a fix naming the engine knobs. ``save_findings`` writes them into
the store's ``findings`` table; ``render_text`` prints them for people; ``checkpoint_findings``
reads a run's stored checkpoint findings as the run's observations qualify them; ``named_ranks``
reads the ranks a finding pins itself to; ``group_drift`` is ACCEPT_DRIFT's test over one sampling
group's requests (``DRIFT_ALPHA`` its false-alarm bound per run) and ``text_repeats`` how
REQUEST_ACCEPT_OUTLIER tells a repetition loop. Rules read only the
instrumentation's recorded contract (run config, tensor events, provenance, load reports, rank
counters, verify steps), never the reference engine's fault switch.
"""

from specscope.doctor._causes import SETTLED_BY_ACCEPTANCE, as_inspected
from specscope.doctor._context import RunContext
from specscope.doctor._diagnose import RULES, diagnose
from specscope.doctor._report import DoctorReport, render_text
from specscope.doctor._rules_accept import COLLAPSE_AL, MIN_VERIFY_STEPS, POSITION0_MIN
from specscope.doctor._rules_drift import DRIFT_ALPHA, group_drift
from specscope.doctor._rules_outlier import text_repeats
from specscope.doctor._rules_ranks import RANK_AL_MARGIN
from specscope.doctor._stored import SETTLED_BY_PROVENANCE, checkpoint_findings, save_findings
from specscope.doctor._summary import RunSummary
from specscope.findings import CODES as _CODES
from specscope.findings import CONTRACT_CODES, named_ranks
from specscope.findings import SEVERITY as _SEVERITY

CODES = _CODES["doctor"]
SEVERITY = {code: _SEVERITY[code] for code in CODES}

__all__ = [
    "CODES", "COLLAPSE_AL", "CONTRACT_CODES", "DRIFT_ALPHA", "DoctorReport", "MIN_VERIFY_STEPS", "POSITION0_MIN",
    "RANK_AL_MARGIN", "RULES", "RunContext", "RunSummary", "SETTLED_BY_ACCEPTANCE", "SETTLED_BY_PROVENANCE",
    "SEVERITY", "as_inspected", "checkpoint_findings", "diagnose", "group_drift", "named_ranks", "render_text",
    "save_findings", "text_repeats",
]
