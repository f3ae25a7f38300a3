"""Did acceptance change between two runs? ``compare(base_store, candidate_store, base_run, run)``
returns a :class:`Comparison`: each run's acceptance, the difference in mean acceptance length with a
95% bootstrap interval over requests (paired by prompt when both runs served the same prompts), per
sampling group, a verdict (``regression`` / ``improvement`` / ``inconclusive`` / ``no change``, or
``lossy`` when the candidate fails its losslessness audit) with what decided it, and the requests
that moved most (docs/design.md, "Comparing runs"). ``specscope compare`` prints it and exits 1 on a
regression or a lossy candidate and 3 when inconclusive, so it can gate CI.
"""

from specscope.compare._compare import Comparison, compare, render_text
from specscope.compare._runs import Side, read_side
from specscope.compare._stats import (
    CONFIDENCE,
    EQUIVALENCE_MARGIN,
    MIN_REQUESTS,
    PRACTICAL_FLOOR,
    VERDICTS,
    Difference,
    Requests,
    difference,
    match,
    moved,
)

__all__ = [
    "CONFIDENCE", "EQUIVALENCE_MARGIN", "MIN_REQUESTS", "PRACTICAL_FLOOR", "VERDICTS",
    "Comparison", "Difference", "Requests", "Side", "compare", "difference", "match", "moved", "read_side",
    "render_text",
]
