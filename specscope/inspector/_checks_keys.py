"""What the engine's loader does with the checkpoint's keys: KEYS_DROPPED, PARAM_MISSING, LM_HEAD_MISSING."""

from __future__ import annotations

from specscope.conventions import loader_convention, map_checkpoint_key
from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext

LIST_LIMIT = 20
"""Key names listed in evidence at most (counts are always complete)."""


def _rename_fix(ctx: CheckContext, dropped: list[str]) -> str:
    want = loader_convention(ctx.engine).layer_prefix
    other = "layers.0." if want == "midlayer." else "midlayer."
    if any(k.startswith(other) for k in dropped):
        engines = "vLLM or speculators" if other == "layers.0." else "SGLang, vLLM or EAGLE"
        return (f"Rename the keys {other}* -> {want}* when re-saving the safetensors file (keep the "
                f"values), or serve with {engines}, whose loader takes {other}*.")
    return (f"Rename these keys to the names the {ctx.engine} loader expects, or remove them if they "
            f"are training leftovers.")


def check_keys_dropped(ctx: CheckContext) -> list[Finding]:
    """KEYS_DROPPED: checkpoint keys the loader maps to no parameter (silently unless it is strict).

    ``lm_head.weight`` of a tied-embedding draft is left to TIED_EMBEDDINGS_MISMATCH.
    """
    dropped = [k for k in ctx.plan.dropped
               if not (k == "lm_head.weight" and ctx.config.tie_word_embeddings)]
    if not dropped:
        return []
    how = "refuses the load" if ctx.plan.strict else "drops them silently"
    nbytes = sum(ctx.reader.tensors[k].nbytes for k in dropped)
    message = (f"the {ctx.engine} loader maps {len(dropped)} of {len(ctx.reader.tensors)} checkpoint keys "
               f"to no parameter and {how}, e.g. {dropped[0]}")
    evidence = {"dropped_keys": len(dropped), "checkpoint_keys": len(ctx.reader.tensors),
                "dropped_bytes": nbytes, "keys": dropped[:LIST_LIMIT]}
    return [checkpoint_finding("KEYS_DROPPED", message, evidence, _rename_fix(ctx, dropped))]


def _missing(ctx: CheckContext) -> list[str]:
    missing = [p for p in ctx.plan.missing if p != "lm_head.weight"]
    d2t_name = map_checkpoint_key(ctx.engine, "d2t")
    if ctx.config.pruned_vocab and not ctx.has("d2t") and d2t_name not in missing:
        missing.append("d2t")
    return missing


def check_params_missing(ctx: CheckContext) -> list[Finding]:
    """PARAM_MISSING: draft parameters no checkpoint key provides; they keep their random init.

    A pruned draft vocabulary without ``d2t`` counts too (SGLang then reads draft ids as target ids).
    """
    missing = _missing(ctx)
    if not missing:
        return []
    expected = len(ctx.plan.loaded) + len(ctx.plan.renamed) + len(ctx.plan.missing)
    message = (f"{len(missing)} draft parameters get no value from the checkpoint under {ctx.engine}'s "
               f"naming and stay at random init, e.g. {missing[0]}")
    evidence = {"missing_params": len(missing), "expected_params": expected, "params": missing[:LIST_LIMIT]}
    fix = ("Export every draft parameter under the names the loader maps (see KEYS_DROPPED for keys "
           "saved under another name); a draft with random weights proposes noise.")
    return [checkpoint_finding("PARAM_MISSING", message, evidence, fix)]


def check_lm_head(ctx: CheckContext) -> list[Finding]:
    """LM_HEAD_MISSING: ``draft_vocab_size`` set, no tied embedding, no ``lm_head.weight``: the engine
    allocates a fresh head of ``draft_vocab_size`` rows and serves it at random init (SGLang
    ``LlamaForCausalLMEagle3.__init__`` loads the target's head only when ``draft_vocab_size`` is unset)."""
    cfg = ctx.config
    if ctx.has("lm_head.weight") or cfg.tie_word_embeddings or cfg.draft_vocab_size is None:
        return []
    message = (f"no lm_head.weight while draft_vocab_size = {cfg.draft_vocab_size}: the engine builds a "
               f"fresh [{cfg.draft_vocab_size}, {ctx.hidden_size}] head and never fills it")
    evidence = {"lm_head_rows": 0, "draft_vocab_size": cfg.draft_vocab_size}
    fix = ("Save the trained lm_head.weight with the draft (SpecForge/EAGLE exports include it); if the "
           "draft should share the target's head, remove draft_vocab_size and d2t/t2d from the checkpoint.")
    return [checkpoint_finding("LM_HEAD_MISSING", message, evidence, fix)]
