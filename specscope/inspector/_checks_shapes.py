"""Shape checks from headers only: fc, aux layers, sizes against the target, the draft head."""

from __future__ import annotations

from specscope.conventions import (
    AUX_IDS_SORTED_UNIQUE,
    AUX_LAYER_COUNT,
    ENGINES,
    VOCAB_SIZE_PADDING_SERVED,
    default_aux_layer_ids,
    physical_capture_layers,
)
from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext


def _target_hidden(ctx: CheckContext) -> int | None:
    return ctx.config.target_hidden_size or (ctx.target.hidden_size if ctx.target else None)


def check_fc(ctx: CheckContext) -> list[Finding]:
    """FC_SHAPE_MISMATCH: ``fc.weight`` [out, in] against the ``Linear(3 x target_hidden -> hidden)``
    SGLang and vLLM allocate (both size fc for 3 aux layers: ``llama_eagle3.py`` in each engine)."""
    shape, th, hidden = ctx.shape("fc.weight"), _target_hidden(ctx), ctx.hidden_size
    if shape is None or len(shape) != 2 or th is None or hidden is None:
        return []
    out_f, in_f = shape
    expected_in = AUX_LAYER_COUNT * th
    if (out_f, in_f) == (hidden, expected_in):
        return []
    message = (f"fc.weight is [{out_f}, {in_f}]: fan-in {in_f} = {in_f / th:g} x target hidden {th}, "
               f"the engine builds fc as [{hidden}, {expected_in}] ({AUX_LAYER_COUNT} aux layers x {th})")
    evidence = {"fc_in_features": in_f, "expected_in_features": expected_in, "fc_out_features": out_f,
                "expected_out_features": hidden, "target_hidden_size": th,
                "fc_aux_layers": in_f / th, "expected_aux_layers": AUX_LAYER_COUNT}
    fix = (f"Train or export the draft with fc: Linear({expected_in} -> {hidden}, bias=False), i.e. "
           f"{AUX_LAYER_COUNT} aux layers of width {th}; check target_hidden_size in config.json.")
    return [checkpoint_finding("FC_SHAPE_MISMATCH", message, evidence, fix)]


def check_aux_count(ctx: CheckContext) -> list[Finding]:
    """AUX_LAYER_COUNT_MISMATCH: the layers the engine captures for explicit aux ids give another fused
    width than fc's fan-in, either because the ids are too few or many, or because the engine
    captures a repeated id once (vLLM: the draft then fails at its first forward)."""
    ids, shape, th = ctx.config.aux_layer_ids, ctx.shape("fc.weight"), _target_hidden(ctx)
    if ids is None or shape is None or len(shape) != 2 or th is None:
        return []
    captured = physical_capture_layers(ctx.engine, ids, ctx.target.num_hidden_layers if ctx.target else None)
    if len(captured) * th == shape[1]:
        return []
    fc = f"fc takes {shape[1]} ({shape[1] / th:g} layers of {th})"
    if len(captured) < len(ids) and len(ids) * th == shape[1]:
        message = (f"{ctx.engine} captures each aux layer once: ids {list(ids)} become {len(captured)} "
                   f"layers {list(captured)}, a fused width of {len(captured) * th}, but {fc}: the draft's "
                   f"first forward fails")
    else:
        message = f"{len(ids)} aux layer ids {list(ids)} give a fused width of {len(captured) * th}, but {fc}"
    evidence = {"aux_layer_ids": len(ids), "captured_layers": len(captured), "fc_aux_layers": shape[1] / th,
                "fused_width": len(captured) * th, "fc_in_features": shape[1]}
    fix = ("Make eagle_aux_hidden_state_layer_ids list exactly the layers the draft was trained on, "
           "one per target_hidden block of fc's input, each once.")
    return [checkpoint_finding("AUX_LAYER_COUNT_MISMATCH", message, evidence, fix)]


def check_aux_order(ctx: CheckContext) -> list[Finding]:
    """AUX_LAYER_IDS_ORDER: explicit aux ids not strictly ascending. Engines in
    :data:`~specscope.conventions.AUX_IDS_SORTED_UNIQUE` fuse them sorted, the others as listed, so
    the two families feed fc's blocks in different orders and at most one is the trained order: a
    warning, which the run's acceptance settles."""
    ids = ctx.config.aux_layer_ids
    if ids is None or all(a < b for a, b in zip(ids, ids[1:])):
        return []
    listed = sorted(set(ENGINES) - AUX_IDS_SORTED_UNIQUE)
    sorting = sorted(AUX_IDS_SORTED_UNIQUE)
    repeated = len(set(ids)) < len(ids)
    message = (f"aux layer ids {list(ids)} are not strictly ascending: {'/'.join(sorting)} fuses them as "
               f"{sorted(set(ids))} (sorted{', repeats captured once' if repeated else ''}), "
               f"{'/'.join(listed)} as listed; fc's blocks follow the order the draft was trained with, so "
               f"these engines cannot all feed it right")
    evidence = {"configured": list(ids), "sorted_unique": sorted(set(ids)), "repeated": int(repeated),
                "sorting_engines": sorting, "listed_order_engines": listed}
    fix = ("Write the ids ascending, each once, in the order the draft was trained with (its fc blocks); "
           "a run's acceptance shows whether the serving engine's order is the trained one.")
    return [checkpoint_finding("AUX_LAYER_IDS_ORDER", message, evidence, fix)]


def check_aux_convention(ctx: CheckContext) -> list[Finding]:
    """AUX_LAYER_IDS_CONVENTION: explicit aux ids, whose physical layers differ between engines.

    Silent when the target is known and the chosen engine captures exactly the default layers
    ``(2, n // 2, n - 3)`` every engine uses without explicit ids: the draft then gets what a draft
    trained on the defaults expects, whichever convention wrote the ids.
    """
    ids = ctx.config.aux_layer_ids
    if ids is None:
        return []
    n = ctx.target.num_hidden_layers if ctx.target else None
    per_engine = {e: list(physical_capture_layers(e, ids, n)) for e in ENGINES}
    if len({tuple(v) for v in per_engine.values()}) == 1:
        return []
    if n is not None and n >= 4 and tuple(per_engine[ctx.engine]) == default_aux_layer_ids(n):
        return []
    groups: dict[tuple[int, ...], list[str]] = {}
    for engine, layers in per_engine.items():
        groups.setdefault(tuple(layers), []).append(engine)
    message = (f"explicit aux layer ids {list(ids)} mean different target layers per engine (SGLang "
               f"captures id + 1; vLLM sorts the ids): " + "; ".join(
                   f"{'/'.join(names)} capture hidden_states {list(layers)}" for layers, names in groups.items())
               + f"; {ctx.engine} uses {per_engine[ctx.engine]}")
    evidence = {"configured": list(ids), **per_engine}
    if n is not None:
        evidence["num_target_layers"] = n
        evidence["defaults"] = list(physical_capture_layers(ctx.engine, None, n))
    fix = ("Confirm which hidden states the draft was trained on (SpecForge/SGLang: output of layer id, "
           "i.e. hidden_states[id + 1]; speculators/vLLM: hidden_states[id]) and write the ids in the "
           "serving engine's convention, or drop them if training used the defaults.")
    return [checkpoint_finding("AUX_LAYER_IDS_CONVENTION", message, evidence, fix)]


def check_target_sizes(ctx: CheckContext) -> list[Finding]:
    """VOCAB_SIZE_MISMATCH and HIDDEN_SIZE_MISMATCH against ``--target-config``."""
    if ctx.target is None:
        return []
    out = []
    cfg, tgt = ctx.config, ctx.target
    if cfg.vocab_size is not None and tgt.vocab_size is not None and cfg.vocab_size != tgt.vocab_size:
        message = f"draft vocab_size {cfg.vocab_size} != target vocab_size {tgt.vocab_size}"
        severity = None
        if cfg.vocab_size > tgt.vocab_size and ctx.engine in VOCAB_SIZE_PADDING_SERVED:
            affected = sorted(set(ENGINES) - VOCAB_SIZE_PADDING_SERVED)
            message += (f": {ctx.engine} only pads the draft's logits to it (-inf beyond the d2t-mapped ids) "
                        f"and serves as with the target's size; {', '.join(affected)} read it to size or "
                        f"map the vocabulary")
            severity = "warning"
        out.append(checkpoint_finding(
            "VOCAB_SIZE_MISMATCH", message,
            {"draft_vocab_size_config": cfg.vocab_size, "target_vocab_size": tgt.vocab_size},
            "Use a draft trained for this target (same tokenizer); set vocab_size to the target's and "
            "rebuild d2t/t2d against the target vocabulary.", severity=severity))
    th = _target_hidden(ctx)
    if th is not None and tgt.hidden_size is not None and th != tgt.hidden_size:
        out.append(checkpoint_finding(
            "HIDDEN_SIZE_MISMATCH",
            f"draft expects target hidden states of width {th}, the target's hidden_size is {tgt.hidden_size}",
            {"draft_target_hidden_size": th, "target_hidden_size": tgt.hidden_size},
            "Serve the draft with the target it was trained for; target_hidden_size and fc's fan-in "
            "(3 x target hidden) must match the target's hidden_size."))
    return out


def check_head_rows(ctx: CheckContext) -> list[Finding]:
    """DRAFT_VOCAB_MISMATCH: ``lm_head.weight`` rows vs the draft vocabulary the engine allocates."""
    shape, rows = ctx.shape("lm_head.weight"), ctx.draft_vocab_size
    if shape is None or rows is None or ctx.config.tie_word_embeddings or shape[0] == rows:
        return []
    message = f"lm_head.weight has {shape[0]} rows, the engine allocates {rows} (draft_vocab_size)"
    evidence = {"lm_head_rows": shape[0], "draft_vocab_size": rows}
    fix = "Set draft_vocab_size in config.json to the head's row count, matching the d2t length."
    return [checkpoint_finding("DRAFT_VOCAB_MISMATCH", message, evidence, fix)]


def check_tied(ctx: CheckContext) -> list[Finding]:
    """TIED_EMBEDDINGS_MISMATCH: ``tie_word_embeddings`` set while the checkpoint has its own
    ``lm_head.weight`` (the engine serves the embedding instead; SGLang then skips the key) or a
    pruned draft vocabulary (the embedding has ``vocab_size`` rows, the head needs ``draft_vocab_size``)."""
    cfg = ctx.config
    if not cfg.tie_word_embeddings:
        return []
    head = ctx.shape("lm_head.weight")
    if head is None and not cfg.pruned_vocab:
        return []
    message = ("tie_word_embeddings is true but " + (
        f"the checkpoint has its own lm_head.weight ({head[0]} rows), which the engine ignores"
        if head is not None else
        f"the draft vocabulary is pruned ({cfg.draft_vocab_size} of {cfg.vocab_size}): an embedding "
        f"with {cfg.vocab_size} rows cannot be the head"))
    evidence = {"tie_word_embeddings": 1, "lm_head_rows": head[0] if head else 0,
                "draft_vocab_size": ctx.draft_vocab_size, "vocab_size": cfg.vocab_size}
    fix = "Set tie_word_embeddings to false in the draft config.json so the trained lm_head is used."
    return [checkpoint_finding("TIED_EMBEDDINGS_MISMATCH", message, evidence, fix)]
