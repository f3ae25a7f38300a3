"""The replay against the target alone (docs/design.md, "Replay against the target"): verdicts from
``v_replay_audit``, where the audit's tests run over the replayed figures."""

from __future__ import annotations

from types import SimpleNamespace

from specscope.doctor._context import RunContext, parse_json
from specscope.doctor._rules_lossless import sampled_evidence, sampled_message
from specscope.events import Finding
from specscope.findings import runtime_finding
from specscope.storage import queries as q

_EXAMPLES = 3

_FIX = ("The text differs from what the target served alone emits. Margins beyond a near-tie are a bug: "
        "the verifier emits tokens the target does not choose (the draft's token at a rejected position, "
        "another request's sampling settings applied in a mixed batch, logits read at the wrong "
        "positions); reproduce with those requests alone and in a mixed batch, and serve without "
        "speculative decoding until fixed.")
_NEAR_TIE_FIX = ("Only near-ties departed: the target's two best tokens were within the margin, and a "
                 "(k+1)-token verify forward is not bit-identical to a one-token forward (batch shape, "
                 "kernel choice, reduced precision), so either token is the target's. Nothing is broken; "
                 "serve in float32 or with batch-invariant kernels if bit-identical text is required.")


def _greedy_evidence(g: SimpleNamespace) -> dict:
    return {"sampling": g.sampling, "requests": int(g.requests), "tokens_replayed": int(g.tokens_audited),
            "departures": int(g.departures), "near_ties": int(g.near_ties),
            "departed_requests": int(g.departed_requests), "near_tie_requests": int(g.near_tie_requests),
            "max_margin": g.max_margin, "near_tie_margin": g.near_tie_margin, "source": g.source,
            "verdict": g.verdict}


def _evidence(g: SimpleNamespace) -> dict:
    return _greedy_evidence(g) if g.sampling == "greedy" else {**sampled_evidence(g), **_greedy_evidence(g)}


def _examples(ctx: RunContext) -> list[dict]:
    out = []
    for row in ctx.rows(q.REPLAY_DEPARTURES, limit=_EXAMPLES):
        example = None if row.example is None else parse_json(row.example, "replay_requests.example", ctx.run_id)
        out.append({"request_id": row.request_id, "departures": int(row.departures),
                    "near_ties": int(row.near_ties), "first_departure": row.first_departure,
                    "first_margin": row.first_margin, "max_margin": row.max_margin,
                    **(example if isinstance(example, dict) else {})})
    return out


def _departed(g: SimpleNamespace) -> str:
    return (f"{g.sampling}: {g.departed_requests} of {g.requests} requests depart from the target's greedy "
            f"choice ({g.departures} of {g.tokens_audited} tokens; {g.near_ties} within a near-tie margin of "
            f"{float(g.near_tie_margin):g}, largest margin {float(g.max_margin):.3g})")


def check_replay(ctx: RunContext) -> list[Finding]:
    """REPLAY_DIVERGENCE [error]: a replayed greedy token departs from the target's own choice by more
    than a near-tie, or the replayed sampled tokens fail the audit's tests; [warning] when every
    departure is a near-tie. REPLAY_AUDITED [info]: the groups replayed without either, with counts."""
    groups = [g for g in ctx.replay_audit if int(g.tokens_audited or 0) > 0]
    if not groups:
        return []
    failed = [g for g in groups if g.verdict == "violation"]
    near = [g for g in groups if g.verdict != "violation" and int(g.near_ties or 0) > 0]
    clean = [g for g in groups if g not in failed and g not in near]
    out = []
    if failed or near:
        said = [_departed(g) if int(g.departures or 0) else sampled_message(g) for g in failed + near]
        errors = bool(failed)
        out.append(runtime_finding(
            "REPLAY_DIVERGENCE", ctx.run_id,
            ("output departs from the target served alone" if errors else
             "output departs from the target served alone by near-ties only") + ": " + "; ".join(said),
            {"groups": [_evidence(g) for g in failed + near], "examples": _examples(ctx)},
            _FIX if errors else _NEAR_TIE_FIX, severity=None if errors else "warning"))
    if clean:
        out.append(runtime_finding(
            "REPLAY_AUDITED", ctx.run_id,
            "output replayed against the target served alone without departure: " + "; ".join(
                f"{g.sampling} {g.tokens_audited} tokens of {g.requests} requests"
                + ("" if g.sampling == "greedy" else f" ({g.verdict})") for g in clean),
            {"groups": [_evidence(g) for g in clean]},
            "Nothing to fix. A replay scores the requests whose token ids were kept (specscope replay)."))
    return out
