"""Two runs compared: each side, the difference with its interval and verdict, per sampling group where
recorded, and the requests that moved most; the JSON and text forms of ``specscope compare``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specscope import readmodel
from specscope.compare._runs import Side, read_side
from specscope.compare._stats import MIN_REQUESTS, Difference, difference, moved, split_groups, tail
from specscope.errors import ConfigError
from specscope.results import terminal_text
from specscope.storage import Store

EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3
ALL_REQUESTS = "all requests"
AUDIT = "losslessness audit"
LOSSY = "LOSSLESS_VIOLATION"
"""The candidate's finding that makes its comparison ``lossy``: acceptance of an engine that does not
emit the target's distribution is no improvement, whatever it reads."""


@dataclass(frozen=True)
class Comparison:
    """``candidate`` against ``base``: ``overall`` over every request; ``groups`` per sampling group
    that both runs served (only when some request reported its sampling settings); ``moved``: the
    paired requests whose AL changed most; ``doctor``: each side's error / warning counts; ``lossy``:
    the messages of the candidate's LOSSLESS_VIOLATION findings; ``tail``: the per-request AL
    percentiles of both sides over all requests and their differences (:func:`~specscope.compare.
    _stats.tail`), reported beside the verdict, which judges the mean."""

    base: Side
    candidate: Side
    overall: Difference
    groups: dict[str, Difference] = field(default_factory=dict)
    moved: list[dict[str, Any]] = field(default_factory=list)
    doctor: dict[str, dict[str, int]] = field(default_factory=dict)
    lossy: tuple[str, ...] = ()
    tail: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def acceptance_verdict(self) -> str:
        """Per sampling group where both runs served one (acceptance differs by design across groups,
        so a pooled figure over different mixes is no verdict): a regression in any group is a
        regression, else an improvement in any is an improvement, else an inconclusive group makes the
        comparison inconclusive; otherwise the pooled verdict."""
        if not self.groups:
            return self.overall.verdict
        verdicts = {diff.verdict for diff in self.groups.values()}
        return next((v for v in ("regression", "improvement", "inconclusive") if v in verdicts), "no change")

    @property
    def verdict(self) -> str:
        """``lossy`` when the candidate failed its losslessness audit, else :attr:`acceptance_verdict`."""
        return "lossy" if self.lossy else self.acceptance_verdict

    @property
    def decided_by(self) -> list[str]:
        """What gave the verdict: the losslessness audit, the sampling groups whose own verdict it is,
        or all requests pooled (no group judged)."""
        if self.lossy:
            return [AUDIT]
        if not self.groups:
            return [ALL_REQUESTS]
        return [name for name, diff in self.groups.items() if diff.verdict == self.verdict]

    @property
    def rule(self) -> str:
        """The verdict rule with this comparison's floor and margin."""
        return RULE.format(floor=self.overall.floor, margin=self.overall.margin)

    @property
    def exit_code(self) -> int:
        """1 on a regression or a lossy candidate, 3 when inconclusive (a CI gate cannot pass what it
        could not measure), else 0."""
        return {"regression": EXIT_REGRESSION, "lossy": EXIT_REGRESSION,
                "inconclusive": EXIT_INCONCLUSIVE}.get(self.verdict, 0)

    def to_dict(self) -> dict[str, Any]:
        """``base`` / ``candidate`` (run, acceptance), ``delta``, ``ci95``, ``paired`` and the rest of
        :meth:`Difference.to_dict` over all requests, ``verdict``, ``decided_by``,
        ``acceptance_verdict``, ``lossless_violations``, ``rule``, ``groups``, ``moved``, ``doctor``,
        ``tail``."""
        return {"base": self.base.to_dict(), "candidate": self.candidate.to_dict(), **self.overall.to_dict(),
                "verdict": self.verdict, "decided_by": self.decided_by, "acceptance_verdict": self.acceptance_verdict,
                "lossless_violations": list(self.lossy), "rule": self.rule,
                "groups": {name: diff.to_dict() for name, diff in self.groups.items()}, "moved": self.moved,
                "doctor": self.doctor, "tail": self.tail}


def compare(base_store: Store, candidate_store: Store, base_run: str | None = None,
            candidate_run: str | None = None, *, seed: int | None = 0) -> Comparison:
    """Compare ``candidate_run`` of ``candidate_store`` with ``base_run`` of ``base_store`` (ids or
    unique prefixes; None: each store's newest run), with each run's doctor verdict
    (:func:`specscope.readmodel.report`). Read-only.

    Raises:
        ConfigError: a run is missing or ambiguous, both sides name the same run, or a side has fewer
            than two requests with verify steps.
        StoreError: a store cannot be read.
    """
    base, candidate = read_side(base_store, base_run), read_side(candidate_store, candidate_run)
    if (base_store.location, base.run_id) == (candidate_store.location, candidate.run_id):
        raise ConfigError(f"base and candidate are the same run {base.run_id} of {base.store}; "
                          "name the other with --base-run / --run")
    try:
        overall = difference(base.requests, candidate.requests, seed=seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    groups = {}
    if set(base.groups) | set(candidate.groups) != {"unknown"}:
        ours, theirs = split_groups(base.requests, base.groups), split_groups(candidate.requests, candidate.groups)
        groups = {name: difference(ours[name], theirs[name], seed=seed) for name in sorted(ours.keys() & theirs.keys())
                  if min(len(ours[name]), len(theirs[name])) >= MIN_REQUESTS}
        known = (set(base.groups) - {"unknown"}, set(candidate.groups) - {"unknown"})
        if all(known) and not known[0] & known[1]:
            raise ConfigError(f"the runs share no sampling group (base: {', '.join(sorted(known[0]))}; candidate: "
                              f"{', '.join(sorted(known[1]))}): acceptance differs by design across sampling "
                              "settings, so there is nothing to compare")
    # The acceptance verdict judges acceptance only; the doctor's verdict says whether the candidate
    # still emits the target's distribution, without which its acceptance means nothing.
    findings = {name: readmodel.report(store, side.run_id).findings
                for name, store, side in (("base", base_store, base), ("candidate", candidate_store, candidate))}
    return Comparison(base, candidate, overall, groups, moved(base.requests, candidate.requests),
                      {name: readmodel.counts(found) for name, found in findings.items()},
                      tuple(f.message for f in findings["candidate"] if f.code == LOSSY),
                      tail(base.requests, candidate.requests, seed=seed))


def _al(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _side_line(name: str, side: Side) -> str:
    fault = f" fault={terminal_text(side.fault)}" if side.fault else ""
    rate = "n/a" if side.acceptance_rate is None else f"{side.acceptance_rate:.1%}"
    positions = " ".join(f"{p:.2f}" for p in side.per_position_acceptance) or "n/a"
    return (f"{name:9} run {terminal_text(side.run_id)} [{terminal_text(side.engine)}{fault}] in "
            f"{terminal_text(side.store)}: {len(side.requests)} request(s), "
            f"{side.verify_steps} verify step(s), AL {_al(side.mean_acceptance_length)}, rate {rate}, p_i {positions}")


def _difference_line(label: str, diff: Difference, verdict: str | None = None) -> str:
    how = (f"paired over {diff.matched} request(s) with the same prompt" if diff.paired
           else f"two-sample over {diff.base_requests} + {diff.candidate_requests} request(s)")
    low, high = diff.ci95
    return (f"{label}: delta AL {diff.delta:+.3f} (95% CI {low:+.3f} .. {high:+.3f}), {how}: "
            f"{diff.verdict if verdict is None else verdict}")


RULE = ("a regression or improvement needs the 95% interval clear of 0 and |delta| >= {floor:.3f}, 1% of "
        "the base AL; no change, the interval within ±{margin:.3f}, 5% of it; else inconclusive: serve more "
        "requests; a candidate that fails its losslessness audit is lossy whatever its acceptance")
"""The verdict rule as the text and the dashboard say it (``floor``, ``margin``: the difference's)."""


def render_text(comparison: Comparison) -> str:
    """Both sides, the difference with its interval and verdict (and per group), the requests that
    moved most, and the verdict with what decided it and the rule behind it."""
    c = comparison
    lines = [_side_line("base", c.base), _side_line("candidate", c.candidate)]
    # with sampling groups, the pooled line mixes acceptances that differ by design: shown, not judged
    pooled = "not judged (each sampling group is)" if c.groups else None
    lines.append(_difference_line(ALL_REQUESTS, c.overall, pooled))
    lines += [_difference_line(f"  {name}", diff) for name, diff in c.groups.items()]
    if c.tail:
        lines.append("per-request AL, all requests: " + "; ".join(
            f"{name} {t['base']:.2f} -> {t['candidate']:.2f} ({t['delta']:+.2f}, 95% CI {t['ci95'][0]:+.2f} .. "
            f"{t['ci95'][1]:+.2f}{', changed' if t['changed'] else ''})" for name, t in c.tail.items()))
    if c.moved:
        lines.append("requests that moved most (AL base -> candidate):")
        lines += [f"  {terminal_text(m['candidate_request_id'])}: {m['base_acceptance_length']:.2f} -> "
                  f"{m['candidate_acceptance_length']:.2f} ({m['delta']:+.2f})" for m in c.moved[:5]]
    lines += [f"lossy: {terminal_text(message)}" for message in c.lossy]
    if c.lossy:
        lines.append(f"verdict: lossy, decided by the candidate's {AUDIT} (acceptance alone: {c.acceptance_verdict}; "
                     f"{c.rule})")
    else:
        groups = "sampling group" + ("s " if len(c.decided_by) > 1 else " ") if c.groups else ""
        lines.append(f"verdict: {c.verdict}, decided by {groups}{', '.join(c.decided_by)} ({c.rule})")
    return "\n".join(lines)
