"""Two runs compared: each side, the difference with its interval and verdict, per sampling group where
recorded, and the requests that moved most; the JSON and text forms of ``specscope compare``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specscope.compare._runs import Side, read_side
from specscope.compare._stats import MIN_REQUESTS, Difference, difference, moved, split_groups
from specscope.errors import ConfigError
from specscope.storage import Store

EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3


@dataclass(frozen=True)
class Comparison:
    """``candidate`` against ``base``: ``overall`` over every request; ``groups`` per sampling group
    that both runs served (only when some request reported its sampling settings); ``moved``: the
    paired requests whose AL changed most."""

    base: Side
    candidate: Side
    overall: Difference
    groups: dict[str, Difference] = field(default_factory=dict)
    moved: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """Per sampling group where both runs served one (acceptance differs by design across groups,
        so a pooled figure over different mixes is no verdict): a regression in any group is a
        regression, else an improvement in any is an improvement, else an inconclusive group makes the
        comparison inconclusive; otherwise the pooled verdict."""
        if not self.groups:
            return self.overall.verdict
        verdicts = {diff.verdict for diff in self.groups.values()}
        for verdict in ("regression", "improvement", "inconclusive"):
            if verdict in verdicts:
                return verdict
        return "no change"

    @property
    def rule(self) -> str:
        """The verdict rule with this comparison's floor and margin."""
        return RULE.format(floor=self.overall.floor, margin=self.overall.margin)

    @property
    def exit_code(self) -> int:
        """1 on a regression, 3 when inconclusive (a CI gate cannot pass what it could not measure),
        else 0."""
        return {"regression": EXIT_REGRESSION, "inconclusive": EXIT_INCONCLUSIVE}.get(self.verdict, 0)

    def to_dict(self) -> dict[str, Any]:
        """``base`` / ``candidate`` (run, acceptance), ``delta``, ``ci95``, ``verdict``, ``rule``,
        ``paired`` and the rest of :meth:`Difference.to_dict`, ``groups`` and ``moved``."""
        return {"base": self.base.to_dict(), "candidate": self.candidate.to_dict(), **self.overall.to_dict(),
                "verdict": self.verdict, "rule": self.rule,
                "groups": {name: diff.to_dict() for name, diff in self.groups.items()}, "moved": self.moved}


def compare(base_store: Store, candidate_store: Store, base_run: str | None = None,
            candidate_run: str | None = None, *, seed: int | None = 0) -> Comparison:
    """Compare ``candidate_run`` of ``candidate_store`` with ``base_run`` of ``base_store`` (ids or
    unique prefixes; None: each store's newest run). Read-only.

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
    return Comparison(base, candidate, overall, groups, moved(base.requests, candidate.requests))


def _al(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _side_line(name: str, side: Side) -> str:
    fault = f" fault={side.fault}" if side.fault else ""
    rate = "n/a" if side.acceptance_rate is None else f"{side.acceptance_rate:.1%}"
    positions = " ".join(f"{p:.2f}" for p in side.per_position_acceptance) or "n/a"
    return (f"{name:9} run {side.run_id} [{side.engine}{fault}] in {side.store}: {len(side.requests)} request(s), "
            f"{side.verify_steps} verify step(s), AL {_al(side.mean_acceptance_length)}, rate {rate}, p_i {positions}")


def _difference_line(label: str, diff: Difference) -> str:
    how = (f"paired over {diff.matched} request(s) with the same prompt" if diff.paired
           else f"two-sample over {diff.base_requests} + {diff.candidate_requests} request(s)")
    low, high = diff.ci95
    return (f"{label}: delta AL {diff.delta:+.3f} (95% CI {low:+.3f} .. {high:+.3f}), {how}: {diff.verdict}")


RULE = ("a regression or improvement needs the 95% interval clear of 0 and |delta| >= {floor:.3f}, 1% of "
        "the base AL; no change, the interval within ±{margin:.3f}, 5% of it; else inconclusive: serve more "
        "requests")
"""The verdict rule as the text and the dashboard say it (``floor``, ``margin``: the difference's)."""


def render_text(comparison: Comparison) -> str:
    """Both sides, the difference with its interval and verdict (and per group), the requests that
    moved most, and the rule behind the verdict."""
    c = comparison
    lines = [_side_line("base", c.base), _side_line("candidate", c.candidate), _difference_line("all requests", c.overall)]
    lines += [_difference_line(f"  {name}", diff) for name, diff in c.groups.items()]
    if c.moved:
        lines.append("requests that moved most (AL base -> candidate):")
        lines += [f"  {m['candidate_request_id']}: {m['base_acceptance_length']:.2f} -> "
                  f"{m['candidate_acceptance_length']:.2f} ({m['delta']:+.2f})" for m in c.moved[:5]]
    lines.append(f"verdict: {c.verdict} ({c.rule})")
    return "\n".join(lines)
