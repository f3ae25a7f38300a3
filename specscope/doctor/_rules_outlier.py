"""REQUEST_ACCEPT_OUTLIER: single requests whose acceptance sits far outside their run's (docs/design.md,
"Acceptance across time and requests"). Two shapes are reported from serving (vLLM issue 36872, PR
44487): a request that accepts next to nothing while its neighbours accept well (its draft is fed
something else: garbled state, another request's features), and one that accepts every draft while its
text loops (the draft and target agree on a repetition)."""

from __future__ import annotations

import statistics
import zlib
from types import SimpleNamespace

from scipy import stats

from specscope.doctor._context import RunContext
from specscope.events import Finding
from specscope.findings import runtime_finding
from specscope.storage import queries as q

MIN_STEPS = 8
"""Verify steps a request needs before its acceptance is judged: a two-step request accepting nothing
is a hard prompt, not a broken one."""

MIN_REQUESTS = 4
"""Judged requests a sampling group needs to have a distribution to sit outside of."""

NEAR_ZERO_RATE = 0.05
"""A request accepting at most 5% of its drafts accepts "next to nothing" ..."""

OUTLIER_ALPHA = 1e-3
"""... and is an outlier when so few accepted drafts are that unlikely at its group's median request
rate: the binomial tail at most this, Bonferroni over the group's judged requests. Drafts of one chain
are not independent, so this is a yardstick of "far below", not an exact false-alarm rate; where the
whole group accepts next to nothing the tail is large and the run itself is the finding
(ACCEPT_COLLAPSE)."""

REPEAT_RATIO = 0.35
"""A text "repeats" when zlib compresses it to at most 35% of its length: a loop of one phrase does,
ordinary prose and code stay above ~0.5 at these lengths."""

MIN_REPEAT_CHARS = 64
"""Texts shorter than this are not judged for repetition (compression overhead dominates)."""

EXCERPT_CHARS = 120
"""Characters of a request's text shown in the finding."""

_LISTED = 10  # requests named per finding; the count says how many there were


def text_repeats(text: str | None) -> bool:
    """Whether ``text`` is dominated by repetition (:data:`REPEAT_RATIO`)."""
    if not text or len(text) < MIN_REPEAT_CHARS:
        return False
    raw = text.encode()
    return len(zlib.compress(raw, 9)) <= REPEAT_RATIO * len(raw)


def _named(rows: list[SimpleNamespace], texts: dict[str, str | None]) -> list[dict]:
    return [{"request_id": r.request_id, "sampling": r.sampling, "mean_acceptance_length": r.mean_acceptance_length,
             "acceptance_rate": r.acceptance_rate, "verify_steps": r.verify_steps,
             "text_excerpt": (texts.get(r.request_id) or "")[:EXCERPT_CHARS]} for r in rows[:_LISTED]]


def check_request_outliers(ctx: RunContext) -> list[Finding]:
    """REQUEST_ACCEPT_OUTLIER [warning]: within a sampling group of at least :data:`MIN_REQUESTS` judged
    requests (:data:`MIN_STEPS` verify steps each), the requests accepting at most :data:`NEAR_ZERO_RATE`
    of their drafts, that few being improbable at the group's median rate (:data:`OUTLIER_ALPHA`), and
    those accepting every draft with a repeating text while the group's median does not."""
    groups = {sampling: [row for row in rows if row.verify_steps >= MIN_STEPS and row.proposed]
              for sampling, rows in ctx.request_groups.items()}
    low, high, medians = [], [], {}
    for sampling, rows in groups.items():
        if len(rows) < MIN_REQUESTS:
            continue
        medians[sampling] = median = statistics.median(r.acceptance_rate for r in rows)
        low += [r for r in rows if r.acceptance_rate <= NEAR_ZERO_RATE
                and stats.binom.cdf(r.accepted, r.proposed, median) <= OUTLIER_ALPHA / len(rows)]
        if median < 1.0:
            high += [r for r in rows if r.accepted == r.proposed]
    ids = [r.request_id for r in low + high]
    texts = {row.request_id: row.text for row in ctx.rows(q.REQUEST_TEXTS, request_ids=ids)} if ids else {}
    high = [r for r in high if text_repeats(texts.get(r.request_id))]
    if not low and not high:
        return []
    parts = []
    if low:
        parts.append(f"{len(low)} accept next to nothing ({', '.join(r.request_id for r in low[:3])}"
                     f"{', ...' if len(low) > 3 else ''})")
    if high:
        parts.append(f"{len(high)} accept every draft while their text repeats "
                     f"({', '.join(r.request_id for r in high[:3])}{', ...' if len(high) > 3 else ''})")
    return [runtime_finding(
        "REQUEST_ACCEPT_OUTLIER", ctx.run_id,
        f"requests far outside the run's acceptance: {'; '.join(parts)}",
        {"near_zero": _named(low, texts), "near_zero_count": len(low), "repeating": _named(high, texts),
         "repeating_count": len(high), "group_median_rate": medians, "near_zero_rate": NEAR_ZERO_RATE,
         "outlier_alpha": OUTLIER_ALPHA},
        "Open the named requests (Requests page): near-zero acceptance beside healthy neighbours points at "
        "per-request state fed to the draft (a reused slot, a preempted request's features, garbled text "
        "in the output); a repetition loop accepted in full is the target repeating itself, where the "
        "draft agrees: check the sampling settings (repetition penalty, temperature) of those requests.")]
