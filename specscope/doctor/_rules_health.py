"""Rules on the health of the run and of its observation: activations, weights, lost events, hooks."""

from __future__ import annotations

from collections import Counter

from specscope.doctor._context import RunContext
from specscope.doctor._rules_observed import runner_not_attached
from specscope.events import Finding
from specscope.findings import runtime_finding
from specscope.results import markdown_code

MAX_LISTED = 10
"""Keys or hook points listed in evidence at most."""


def check_nonfinite(ctx: RunContext) -> list[Finding]:
    """NONFINITE_ACTIVATIONS [error]: recorded value statistics counted inf/nan elements."""
    rows = ctx.nonfinite
    if not rows:
        return []
    first = rows[0]  # earliest seen: where the non-finite values entered
    return [runtime_finding(
        "NONFINITE_ACTIVATIONS", ctx.run_id,
        f"{first.elements} inf/nan element(s) at {first.hook_point} ({first.events} recorded "
        f"call(s)), first of {len(rows)} hook point(s) with non-finite values",
        {"hook_point": first.hook_point, "count": first.elements, "events": int(first.events),
         "expected": 0,
         "hook_points": [{"hook_point": r.hook_point, "count": r.elements} for r in rows[:MAX_LISTED]]},
        f"Trace the inf/nan back from {first.hook_point}: serve in bf16 instead of fp16 when activations "
        "overflow, and check the draft weights with `specscope inspect --serve-dtype fp16`.")]


def check_weights_dropped(ctx: RunContext) -> list[Finding]:
    """WEIGHTS_DROPPED [error]: a load left parameters at their init or dropped checkpoint keys.

    Reported whatever the load's ``strict`` flag: the run went on, so the keys were dropped and the
    parameters left at init (vLLM, for one, is strict about unknown keys but not about missing ones)."""
    findings = []
    for row in ctx.load_problems:
        missing, dropped = row.missing, row.unexpected
        evidence = {"module": row.module, "source": row.source, "strict": bool(row.strict),
                    "loaded": int(row.loaded), "dropped": len(dropped), "missing": len(missing),
                    "expected_dropped": 0, "expected_missing": 0,
                    "dropped_keys": dropped[:MAX_LISTED], "missing_params": missing[:MAX_LISTED],
                    "rank": row.rank}
        rename = prefix_rename(dropped, missing)
        if rename:
            evidence["rename"] = list(rename)
        hint = (f"rename checkpoint keys {markdown_code(rename[0] + '*')} to {markdown_code(rename[1] + '*')}" if rename
                else "make the checkpoint keys match the parameters the loader maps")
        findings.append(runtime_finding(
            "WEIGHTS_DROPPED", ctx.run_id,
            f"loading {row.module} from {row.source} dropped {len(dropped)} checkpoint key(s) and left "
            f"{len(missing)} parameter(s) at their init"
            + (f" ({rename[0]}* not mapped to {rename[1]}*)" if rename else ""),
            evidence,
            f"Fix the checkpoint before serving: {hint} (or use a loader that renames them) and load "
            "strictly; `specscope inspect --engine ENGINE` lists every dropped key."))
    return findings


def prefix_rename(dropped: list[str], missing: list[str]) -> tuple[str, str] | None:
    """The most common ``(dropped prefix, missing prefix)`` pair of keys equal after their prefixes
    (``layers.0.mlp.up_proj.weight`` / ``midlayer.mlp.up_proj.weight`` -> ``("layers.0.", "midlayer.")``)."""
    by_suffix: dict[str, str] = {}
    for name in missing:
        parts = name.split(".")
        for i in range(1, len(parts)):
            by_suffix.setdefault(".".join(parts[i:]), ".".join(parts[:i]) + ".")
    pairs: Counter = Counter()
    for key in dropped:
        parts = key.split(".")
        for i in range(1, len(parts)):
            target = by_suffix.get(".".join(parts[i:]))
            if target is not None:
                pairs[(".".join(parts[:i]) + ".", target)] += 1
                break
    return pairs.most_common(1)[0][0] if pairs else None


def check_events_dropped(ctx: RunContext) -> list[Finding]:
    """EVENTS_DROPPED [warning]: the collector lost events (full buffer, failed batch)."""
    return _counter_finding(
        ctx, "EVENTS_DROPPED", "events_dropped", "events_written", "expected_dropped", "dropped_per_rank",
        "{bad} event(s) were dropped ({total} written) on rank(s) {ranks}: figures of this run undercount",
        "Give the collector room (`Collector(capacity=..., batch_size=...)`), record fewer events "
        "(`sample_every`, `first_calls`) or write to a faster store.")


def check_hook_errors(ctx: RunContext) -> list[Finding]:
    """HOOK_ERRORS [warning]: hooks raised (caught, counted, never reached the engine)."""
    return _counter_finding(
        ctx, "HOOK_ERRORS", "hook_errors", "hook_calls", "expected_errors", "errors_per_rank",
        "{bad} hook call(s) failed out of {total} on rank(s) {ranks}; what those hooks should have "
        "recorded is missing",
        "Read the engine log's first 'specscope: hook ... failed' warning of each failing hook point "
        "and fix or unhook that point (`instrument(modules=...)`).")


def _counter_finding(ctx: RunContext, code: str, bad: str, total: str, expected_key: str, per_rank_key: str,
                     message: str, fix: str) -> list[Finding]:
    """One finding when some rank's ``run_ranks`` counter ``bad`` is non-zero: the run's sums of
    ``bad`` and ``total``, the ranks and each one's count (``message`` formats ``bad``, ``total``,
    ``ranks``); none otherwise."""
    ranks = [r for r in ctx.rank_status if getattr(r, bad)]
    if not ranks:
        return []
    bad_sum = sum(int(getattr(r, bad)) for r in ctx.rank_status)
    total_sum = sum(int(getattr(r, total)) for r in ctx.rank_status)
    rank_ids = [r.rank for r in ranks]
    return [runtime_finding(code, ctx.run_id, message.format(bad=bad_sum, total=total_sum, ranks=rank_ids),
                    {bad: bad_sum, total: total_sum, expected_key: 0, "ranks": rank_ids,
                     per_rank_key: [int(getattr(r, bad)) for r in ranks]},
                    fix)]


def check_graph_mode(ctx: RunContext) -> list[Finding]:
    """GRAPH_MODE_BLIND [info]: the models ran compiled, or CUDA graphs were replayed, and the
    capture-layer evidence (firing, provenance) is missing; or hooks saw CUDA-graph capture, not
    (all of) its replays."""
    ranks = [r for r in ctx.rank_status if r.graph_mode != "eager"]
    if not ranks or runner_not_attached(ctx):  # nothing was hooked: RUNNER_NOT_ATTACHED says why
        return []
    modes = [r.graph_mode for r in ranks]
    ids = [r.rank for r in ranks]
    if set(modes) <= {"compiled", "cuda_graph"}:
        if ctx.target_observed and ctx.provenance:
            return []  # observed through the compiled graph or the replay buffer: nothing is blind
        if "cuda_graph" in modes:
            missing = [what for what, seen in (("capture layers firing", ctx.target_observed),
                                               ("provenance", bool(ctx.provenance))) if not seen]
            return [runtime_finding(
                "GRAPH_MODE_BLIND", ctx.run_id,
                f"CUDA graphs were replayed on rank(s) {ids}: specscope read the replayed calls from the "
                f"static buffer the captured graphs write, but {' and '.join(missing)} was not recorded; "
                "acceptance, the losslessness audit and the draft's input widths were (per-call value "
                "statistics are never read on replay)",
                {"graph_mode": "cuda_graph", "expected_graph_mode": "eager", "ranks": ids, "modes": modes,
                 "not_observed": missing},
                _replay_fix(ctx.engine))]
        return [runtime_finding(
            "GRAPH_MODE_BLIND", ctx.run_id,
            f"the models ran compiled (torch.compile) on rank(s) {ids}: the target's "
            "capture layers run inside the compiled graph, so whether they fire and which layers reach the "
            "draft (provenance) are not observed; acceptance, the losslessness audit and the draft's "
            "input widths (its fc input) are",
            {"graph_mode": "compiled", "expected_graph_mode": "eager", "ranks": ids,
             "modes": modes, "not_observed": ["capture layers firing", "provenance"]},
            _compiled_fix(ctx.engine))]
    return [runtime_finding(
        "GRAPH_MODE_BLIND", ctx.run_id,
        f"hooks ran under CUDA-graph capture on rank(s) {ids} ({', '.join(sorted(set(modes)))}): "
        "per-step values of replayed steps are invisible; recorded shapes still hold",
        {"graph_mode": modes[0], "expected_graph_mode": "eager", "ranks": ids,
         "modes": modes},
        "For per-step values run a canary with eager decode (SGLang `--disable-cuda-graph`, vLLM "
        "`enforce_eager=True`); acceptance figures and shapes stay valid either way.")]


def _replay_fix(engine: str) -> str:
    """How to get the capture-layer evidence of a run that replayed CUDA graphs."""
    if engine == "vllm":
        return ("With the vLLM plugin: keep `SPECSCOPE_PROVENANCE_EVERY` above 0 (default 16); the replay "
                "buffer then carries the capture layers' fingerprints, read at every status (5 s).")
    return ("Embedded API: `instrument(..., target=target_model)` before the graphs are captured, with "
            "`Tracer(provenance_every=16)`: the captured graphs then write the capture layers' calls and "
            "fingerprints into specscope's replay buffer.")


def _compiled_fix(engine: str) -> str:
    """How to get the evidence a compiled run lacks, for the way the run was recorded."""
    if engine == "vllm":
        return ("For the capture-layer evidence, serve a diagnostic replica eagerly: `--enforce-eager` "
                "(`LLM(..., enforce_eager=True)`), with the plugin as it is; compare its findings with this "
                "run's acceptance.")
    return ("For the capture-layer evidence, run a diagnostic pass with the target not compiled "
            "(hooks inside torch.compile regions do not fire).")
