"""Rules on what the engine emitted: the losslessness audit (docs/design.md, "Losslessness audit")
and acceptance per sampling group. Verdicts come from ``v_lossless_audit``, where the sampled test's
bound is written once in SQL (``storage/views.py``, ``rare_threshold``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from specscope.doctor._context import RunContext, parse_json
from specscope.doctor._rules_accept import COLLAPSE_AL, MIN_VERIFY_STEPS
from specscope.events import PIT_BINS, Finding
from specscope.findings import runtime_finding
from specscope.storage import queries as q

_EXAMPLES = 3
_SHARPENED = "a sharpened distribution, as a temperature applied twice or ignored"
_FLATTENED = "a flattened distribution, as a top-k / top-p truncation or a temperature lost"

_GREEDY_FIX = ("The verifier emitted tokens the target does not choose at temperature 0. Likely causes, "
               "most likely first: the verifier emits the draft's token where it should emit its own "
               "(a rejected position), greedy requests batched with sampled ones are verified with the "
               "sampled requests' settings (per-request temperature lost in the batch), or the target "
               "logits are read at the wrong positions. Reproduce with greedy requests alone and in a "
               "mixed batch; until fixed, serve without speculative decoding.")
_SAMPLED_FIX = ("The emitted tokens are not draws from the target's distribution at this request's "
                "settings. Likely causes: the draft and target sample with different settings (a draft "
                "sampler that ignores temperature, or one request's settings applied to the whole "
                "batch), a wrong recovered-token distribution (must be max(p - q, 0) normalised, q the "
                "draft's probabilities, one-hot for an argmax draft: a rejected draft token can never be the "
                "recovered token). Compare the same requests served without speculative decoding; until "
                "fixed, serve sampled traffic without it.")


def _number(value: object) -> float | None:
    return None if value is None else float(value)


def _pit(group: SimpleNamespace) -> list[int]:
    return [int(getattr(group, f"pit_{b}") or 0) for b in range(PIT_BINS)]


def sampled_evidence(group: SimpleNamespace) -> dict:
    """The audit's figures of one group (``v_lossless_audit`` or ``v_replay_audit``) as evidence."""
    return {"sampling": group.sampling, "requests": int(group.requests),
            "tokens_audited": int(group.tokens_audited), "greedy_mismatches": int(group.greedy_mismatches),
            "rare_observed": int(group.rare_observed), "rare_expected": _number(group.rare_expected),
            "rare_threshold": _number(group.rare_threshold), "epsilon": _number(group.epsilon),
            "mean_p_emitted": group.mean_p_emitted, "mean_p_expected": group.mean_p_expected,
            "scored_tokens": int(group.scored_tokens or 0), "p_excess": _number(group.p_excess),
            "p_excess_threshold": _number(group.p_excess_threshold),
            "detectable_p_shift": _number(group.detectable_p_shift), "pit_histogram": _pit(group),
            "pit_threshold": _number(group.pit_threshold),
            "detectable_pit_excess": _number(group.detectable_pit_excess),
            "mean_surprise_emitted": _number(group.mean_surprise_emitted),
            "mean_surprise_expected": _number(group.mean_surprise_expected),
            "surprise_excess": _number(group.surprise_excess),
            "surprise_threshold_below": _number(group.surprise_threshold_below),
            "surprise_threshold_above": _number(group.surprise_threshold_above),
            "detectable_surprise_shift": _number(group.detectable_surprise_shift),
            "failed_tests": [name for name, flag in (("junk", group.junk_failed), ("mean", group.mean_failed),
                                                     ("pit", group.pit_failed), ("surprise", group.surprise_failed))
                             if flag],
            "verdict": group.verdict}


def _live_evidence(group: SimpleNamespace) -> dict:
    """The live audit's figures of one group (``v_lossless_audit``): the sampled tests' and the
    recovered-token check's, which only the live audit can make (a replay sees no draft tokens)."""
    evidence = sampled_evidence(group)
    if group.recovered_failed:
        evidence["failed_tests"].append("recovered")
    return {**evidence, "recovered_audited": int(group.recovered_audited or 0),
            "recovered_as_draft": int(group.recovered_as_draft or 0),
            "recovered_p_expected": _number(group.recovered_p_expected),
            "detectable_recovered_from_p": _number(group.detectable_recovered_from_p)}


def _undetectable(group: SimpleNamespace) -> float | None:
    """The share of a sampled group's audited tokens that could be junk (target probability below
    epsilon) and still stay under the bound: ``rare_threshold / tokens_audited`` (None for greedy,
    where every token is checked exactly)."""
    if group.sampling == "greedy" or group.rare_threshold is None:
        return None
    return min(1.0, float(group.rare_threshold) / int(group.tokens_audited))


def _reach(group: SimpleNamespace) -> str:
    """What a group's audit that found nothing could have seen, in words."""
    if group.sampling == "greedy":
        return f"greedy {group.tokens_audited} tokens, each the target's argmax"
    seen = (f"{group.sampling} {group.tokens_audited} tokens, {group.rare_observed} of target probability "
            f"< {group.epsilon:g} where {float(group.rare_expected):.1f} are expected")
    if group.verdict == "too few tokens":
        shift = "no token scored" if group.detectable_p_shift is None else (
            f"only a shift of the mean emitted probability by {float(group.detectable_p_shift):.2f} or more "
            "was detectable")
        return (f"{seen}; too few tokens to judge the distribution ({shift}; up to {_undetectable(group):.0%} "
                "junk stays under the bound): audit more tokens (SPECSCOPE_AUDIT_EVERY=1)")
    return (f"{seen}; mean emitted probability {group.mean_p_emitted:.3f} vs {group.mean_p_expected:.3f} "
            f"expected; a shift of {float(group.detectable_p_shift):.3f}, an excess of "
            f"{float(group.detectable_pit_excess):.0%} of tokens in one PIT decile or a fall of the mean surprise "
            f"by {float(group.detectable_surprise_shift):.3f} nats would have been detected{_recovered_reach(group)}")


def _recovered_reach(group: SimpleNamespace) -> str:
    """What the recovered-token check of a group could have seen (live audit only), in words."""
    recovered = int(group.recovered_audited or 0)
    if not recovered:
        return ""
    return (f"; {recovered} recovered tokens, none the rejected draft token (a verifier drawing them from p "
            f"would have shown one with probability {float(group.detectable_recovered_from_p):.0%})")


def sampled_message(g: SimpleNamespace, more: Sequence[str] = ()) -> str:
    """Which of the sampled tests failed, with the figures a person can check (``more``: other
    failed checks, said after them)."""
    said = []
    if g.junk_failed:
        said.append(f"{g.rare_observed} of {g.tokens_audited} audited tokens had target probability "
                    f"< {g.epsilon:g}, where a lossless engine emits {float(g.rare_expected):.1f} on average "
                    f"and more than {float(g.rare_threshold):.1f} with probability under 1e-3")
    if g.mean_failed:
        said.append(f"the emitted tokens' mean target probability is {g.mean_p_emitted:.3f} where a lossless "
                    f"engine gives {g.mean_p_expected:.3f} (excess {float(g.p_excess):+.1f} over "
                    f"{g.scored_tokens} tokens, bound ±{float(g.p_excess_threshold):.1f}: "
                    f"{_SHARPENED if float(g.p_excess) > 0 else _FLATTENED})")
    if g.pit_failed:
        counts, worst = _pit(g), int(g.pit_worst_bin)
        said.append(f"their probability integral transform is not uniform: decile {worst} holds "
                    f"{counts[worst]} of {g.scored_tokens} tokens where {g.scored_tokens / PIT_BINS:.1f} ± "
                    f"{float(g.pit_threshold):.1f} are expected (histogram {counts}; low deciles: the "
                    "target's most probable tokens)")
    if g.surprise_failed:
        said.append(f"their mean surprise (-ln of the target probability) is {g.mean_surprise_emitted:.3f} nats "
                    f"where a lossless engine gives {g.mean_surprise_expected:.3f}, the target's entropy (excess "
                    f"{float(g.surprise_excess):+.1f} over {g.scored_tokens} tokens, bounds "
                    f"-{float(g.surprise_threshold_below):.1f} / +{float(g.surprise_threshold_above):.1f}: "
                    f"{_SHARPENED if float(g.surprise_excess) < 0 else _FLATTENED})")
    return f"output is not the target's distribution ({g.sampling}): " + "; ".join([*said, *more])


def _recovered_message(g: SimpleNamespace) -> list[str]:
    """The recovered-token check's failure, in words (none when it passed)."""
    if not g.recovered_failed:
        return []
    return [f"{g.recovered_as_draft} of {g.recovered_audited} recovered tokens (emitted where a draft token was "
            "rejected) are that rejected draft token, which a correct verifier never emits there (it draws the "
            "recovered token from max(p - q, 0), zero at any draft token it can reject): the recovered token is "
            "drawn from another distribution, such as p itself"]


def check_lossless(ctx: RunContext) -> list[Finding]:
    """LOSSLESS_VIOLATION [error], per sampling group whose audit failed: a greedy token that is not
    the target's argmax, a sampled test's bound crossed (junk tail, mean probability, PIT, surprise;
    together at most 1e-3 false alarms), or a recovered token equal to the draft token it replaced
    (never, lossless). LOSSLESS_AUDITED [info] names every group that did not fail, with what its
    audit could have detected or that it had too few tokens to judge."""
    groups = [g for g in ctx.lossless_audit if int(g.tokens_audited or 0) > 0]
    failed = [g for g in groups if g.verdict == "violation"]
    examples: dict[str, list] = {}
    if failed:
        for row in ctx.rows(q.AUDIT_EXAMPLES, limit=_EXAMPLES * len(failed) * 4):
            kept = examples.setdefault(row.sampling, [])
            example = parse_json(row.example, "lossless_audit.example", ctx.run_id)
            if len(kept) < _EXAMPLES and isinstance(example, dict):  # rows written around the Store may not be
                kept.append({**example, "request_id": row.request_id})
    out = []
    for g in failed:
        evidence = {**_live_evidence(g), "examples": examples.get(g.sampling, [])}
        if g.greedy_mismatches:
            message = (f"output is not the target's: {g.greedy_mismatches} of {g.tokens_audited} audited "
                       "greedy tokens are not the target's argmax")
            fix = _GREEDY_FIX
        else:
            message, fix = sampled_message(g, _recovered_message(g)), _SAMPLED_FIX
        out.append(runtime_finding("LOSSLESS_VIOLATION", ctx.run_id, message, evidence, fix))
    rest = [g for g in groups if g.verdict != "violation"]
    if rest:
        tokens = sum(int(g.tokens_audited) for g in rest)
        judged = [g for g in rest if g.verdict == "passed"]
        out.append(runtime_finding(
            "LOSSLESS_AUDITED", ctx.run_id,
            f"output audited against the target: {tokens} tokens in {len(rest)} sampling group(s) without "
            f"violation, {len(judged)} judged: {'; '.join(_reach(g) for g in rest)}",
            {"groups": [{**_live_evidence(g), "undetectable_below": _undetectable(g)} for g in rest]},
            "Nothing to fix. The audit checks a sample of verify steps (SPECSCOPE_AUDIT_EVERY / "
            "Tracer(audit_every=)); audit every step to check every token."))
    return out


def check_sampled_collapse(ctx: RunContext) -> list[Finding]:
    """ACCEPT_COLLAPSE_SAMPLED [warning]: acceptance collapsed (AL <= COLLAPSE_AL over >=
    MIN_VERIFY_STEPS steps) in a sampled group while the greedy group of the same run accepts."""
    groups = {g.sampling: g for g in ctx.sampling_acceptance}
    greedy = groups.get("greedy")
    if greedy is None or int(greedy.verify_steps) < MIN_VERIFY_STEPS or greedy.mean_acceptance_length <= COLLAPSE_AL:
        return []
    out = []
    for name, g in groups.items():
        if name in ("greedy", "unknown") or int(g.verify_steps) < MIN_VERIFY_STEPS:
            continue
        if g.mean_acceptance_length > COLLAPSE_AL:
            continue
        out.append(runtime_finding(
            "ACCEPT_COLLAPSE_SAMPLED", ctx.run_id,
            f"acceptance collapsed for sampled requests only: {name} AL {g.mean_acceptance_length:.3f} over "
            f"{g.verify_steps} verify steps, greedy AL {greedy.mean_acceptance_length:.3f} over "
            f"{greedy.verify_steps}",
            {"sampling": name, "mean_acceptance_length": g.mean_acceptance_length,
             "verify_steps": int(g.verify_steps), "greedy_mean_acceptance_length": greedy.mean_acceptance_length,
             "greedy_verify_steps": int(greedy.verify_steps), "threshold": COLLAPSE_AL},
            "The draft works (greedy requests accept it), so look at the sampled path: the verifier's "
            "acceptance rule and recovered-token sampling, and whether the draft and target sample with "
            "the same settings. Some fall is by design (an argmax draft is accepted with the target's "
            "probability of its token), a collapse to AL ~1 is not; check LOSSLESS_VIOLATION for this run."))
    return out
