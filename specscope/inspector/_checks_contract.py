"""The draft-target contract: every setting both sides must agree on, which side the engine reads it
from (:data:`specscope.conventions.CONTRACT`), and the draft config keys the engine ignores.

Findings: ROPE_MISMATCH, MAX_POSITIONS_MISMATCH, SLIDING_WINDOW_IGNORED, DRAFT_KEY_IGNORED,
AUX_LAYER_OUT_OF_RANGE, TARGET_TIED_WEIGHT_MISSING. Sizes (hidden, vocabulary) keep their own codes
(HIDDEN_SIZE_MISMATCH, VOCAB_SIZE_MISMATCH in ``_checks_shapes``).
"""

from __future__ import annotations

from typing import Any

from specscope.conventions import (
    BEHAVIOUR_DEFAULTS,
    CONTRACT_SETTINGS,
    SLIDING_WINDOW_NEEDS_LAYER_TYPES,
    contract_fact,
    draft_key_fact,
    physical_capture_layers,
)
from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext

DEFAULT_ROPE_THETA = 10000.0
"""RoPE base a config without ``rope_theta`` gets (transformers ``LlamaConfig`` default, which vLLM and
SGLang inherit): a converter that drops ``rope_theta`` silently moves the draft to this base."""


def _draft_value(ctx: CheckContext, setting: str) -> Any:
    cfg, s = ctx.config, ctx.config.settings
    if setting == "hidden_size":
        return cfg.target_hidden_size
    if setting == "aux_layer_ids":
        ids, n = cfg.aux_layer_ids, ctx.target.num_hidden_layers if ctx.target else None
        if ids is None and (n is None or n < 4):
            return None  # the engine default needs a target of at least 4 layers
        return list(physical_capture_layers(ctx.engine, ids, n))
    if setting == "tie_word_embeddings":
        return cfg.tie_word_embeddings
    if setting == "rope_theta":
        return s.rope_theta if s.rope_theta is not None else DEFAULT_ROPE_THETA
    value = getattr(s, setting)
    return list(value) if isinstance(value, tuple) else value


def _target_value(ctx: CheckContext, setting: str) -> Any:
    if ctx.target is None:
        return None
    if setting == "aux_layer_ids":
        return ctx.target.num_hidden_layers
    value = getattr(ctx.target, setting)
    return list(value) if isinstance(value, tuple) else value


def _agree(setting: str, draft: Any, target: Any) -> bool | None:
    if draft is None or target is None:
        return None
    if setting == "aux_layer_ids":
        return all(0 <= i < target for i in draft)
    if setting == "max_position_embeddings":
        return draft >= target
    if setting == "tie_word_embeddings":
        return None  # each side ties its own head: TIED_EMBEDDINGS_MISMATCH / TARGET_TIED_WEIGHT_MISSING
    return draft == target


def contract_rows(ctx: CheckContext) -> list[dict[str, Any]]:
    """One row per :data:`~specscope.conventions.CONTRACT_SETTINGS` name: ``{"setting", "draft",
    "target", "agree", "read_from", "source", "note"}``. ``agree`` is ``None`` when a side does not
    say; ``aux_layer_ids`` compares the capture layers the engine uses with the target's layer count,
    ``max_position_embeddings`` agrees when the draft covers the target's; ``tie_word_embeddings`` is
    shown, not compared (each side's tie concerns its own head)."""
    rows = []
    for setting in CONTRACT_SETTINGS:
        fact = contract_fact(ctx.engine, setting)
        draft, target = _draft_value(ctx, setting), _target_value(ctx, setting)
        rows.append({"setting": setting, "draft": draft, "target": target,
                     "agree": _agree(setting, draft, target), "read_from": fact.read_from,
                     "source": fact.source, "note": fact.note})
    return rows


def check_rope(ctx: CheckContext) -> list[Finding]:
    """ROPE_MISMATCH: the draft's RoPE (theta, scaling type and factor) differs from the target's while
    the engine builds the draft's rotary embedding from the draft config (or ignores its scaling)."""
    if ctx.target is None or ctx.target.rope_theta is None:
        return []
    d_theta, t_theta = _draft_value(ctx, "rope_theta"), ctx.target.rope_theta
    d_scale = ctx.config.settings.rope_scaling
    if contract_fact(ctx.engine, "rope_scaling").read_from == "ignored":
        d_scale = ("default", None, None)
    t_scale = ctx.target.rope_scaling
    if contract_fact(ctx.engine, "rope_theta").read_from not in ("draft", "ignored") or (
            d_theta == t_theta and d_scale == t_scale):
        return []
    what = []
    if d_theta != t_theta:
        what.append(f"rope_theta {d_theta:g} vs the target's {t_theta:g}")
    if d_scale != t_scale:
        what.append(f"rope scaling {d_scale[0]} (factor {d_scale[1]}) vs the target's {t_scale[0]} "
                    f"(factor {t_scale[1]})")
    message = (f"the {ctx.engine} draft runs RoPE from its own config: " + "; ".join(what)
               + " (positions rotate differently from the hidden states the target hands over)")
    evidence = {"draft_rope_theta": d_theta, "target_rope_theta": t_theta,
                "draft_rope_type": d_scale[0], "target_rope_type": t_scale[0],
                "draft_rope_factor": d_scale[1], "target_rope_factor": t_scale[1],
                "draft_rope_theta_in_config": int(ctx.config.settings.rope_theta is not None)}
    fix = ("Copy rope_theta and rope_scaling (type, factor, original_max_position_embeddings) from the "
           "target's config.json into the draft's, as the draft was trained (a converter that drops them "
           "leaves the draft on default RoPE).")
    return [checkpoint_finding("ROPE_MISMATCH", message, evidence, fix)]


def check_max_positions(ctx: CheckContext) -> list[Finding]:
    """MAX_POSITIONS_MISMATCH: the draft config covers fewer positions than the target serves."""
    draft = ctx.config.settings.max_position_embeddings
    target = ctx.target.max_position_embeddings if ctx.target else None
    if draft is None or target is None or draft >= target:
        return []
    message = (f"draft max_position_embeddings {draft} < target's {target}: past position {draft} the "
               f"draft's rotary cache and training stop while the target goes on")
    evidence = {"draft_max_position_embeddings": draft, "target_max_position_embeddings": target}
    fix = ("Set the draft's max_position_embeddings (and rope_scaling) to the target's, or cap the "
           "served context length at the draft's.")
    return [checkpoint_finding("MAX_POSITIONS_MISMATCH", message, evidence, fix)]


def check_sliding_window(ctx: CheckContext) -> list[Finding]:
    """SLIDING_WINDOW_IGNORED: the draft config sets ``sliding_window`` and the engine runs the draft
    with full attention anyway (it does not read the key, or, vLLM, reads it only through
    ``layer_types``)."""
    s = ctx.config.settings
    if s.sliding_window is None:
        return []
    fact = contract_fact(ctx.engine, "sliding_window")
    sliding_layers = sum(t == "sliding_attention" for t in s.layer_types or ())
    ignored = fact.read_from == "ignored" or (
        ctx.engine in SLIDING_WINDOW_NEEDS_LAYER_TYPES and not sliding_layers)
    if not ignored:
        return []
    message = (f"the draft config sets sliding_window = {s.sliding_window} but {ctx.engine} runs the "
               f"draft with full attention ({fact.note or 'the key is not read'})")
    evidence = {"sliding_window": s.sliding_window, "sliding_layers_in_layer_types": sliding_layers}
    fix = ("Add layer_types (\"sliding_attention\" for the draft's layer) to the draft config.json for "
           "vLLM, or serve with an engine that applies the window; a window-trained draft loses "
           "acceptance at long context under full attention.")
    return [checkpoint_finding("SLIDING_WINDOW_IGNORED", message, evidence, fix)]


def _is_set(key: str, value: Any) -> bool:
    """Whether a behaviour key's value differs from its default (changes the draft's computation)."""
    if key == "rope_scaling":
        return isinstance(value, dict) and (value.get("rope_type") or value.get("type")) not in (None, "default")
    return value != BEHAVIOUR_DEFAULTS[key]


def check_draft_keys(ctx: CheckContext) -> list[Finding]:
    """DRAFT_KEY_IGNORED: draft config keys set away from their default that the engine does not read,
    so the draft runs without them (:data:`specscope.conventions.DRAFT_KEYS`)."""
    ignored = [(k, v) for k, v in ctx.config.behaviour
               if _is_set(k, v) and draft_key_fact(ctx.engine, k).read_from == "ignored"]
    if not ignored:
        return []
    notes = {k: draft_key_fact(ctx.engine, k).note for k, _ in ignored}
    message = (f"{ctx.engine} does not read draft config key(s) " + ", ".join(
        f"{k} = {v}" + (f" ({notes[k]})" if notes[k] else "") for k, v in ignored)
        + ": the draft runs as if they were absent")
    evidence = {"ignored_keys": [k for k, _ in ignored], "values": {k: v for k, v in ignored},
                "source": draft_key_fact(ctx.engine, ignored[0][0]).source}
    fix = ("Serve with an engine (version) that reads these keys, or move them where the engine reads "
           "them (vLLM: norm_before_residual at the top level, use_aux_hidden_state under eagle_config); "
           "otherwise the served draft computes something other than the trained one.")
    return [checkpoint_finding("DRAFT_KEY_IGNORED", message, evidence, fix)]


def check_aux_range(ctx: CheckContext) -> list[Finding]:
    """AUX_LAYER_OUT_OF_RANGE: a capture layer the engine uses (after its id convention) is not a layer
    of the target, so the target never hands that hidden state over."""
    ids, n = ctx.config.aux_layer_ids, ctx.target.num_hidden_layers if ctx.target else None
    if ids is None or n is None:
        return []
    layers = list(physical_capture_layers(ctx.engine, ids, n))
    outside = [i for i in layers if not 0 <= i < n]
    if not outside:
        return []
    message = (f"{ctx.engine} captures the hidden states entering target layers {layers} for aux ids "
               f"{list(ids)}, but the target has {n} layers: {outside} never run")
    evidence = {"capture_layers": layers, "outside": outside, "num_target_layers": n,
                "configured": list(ids)}
    fix = (f"Write eagle_aux_hidden_state_layer_ids for this target (0 <= layer < {n} after the engine's "
           f"convention); ids from a deeper target mean the draft was trained for another model.")
    return [checkpoint_finding("AUX_LAYER_OUT_OF_RANGE", message, evidence, fix)]


def check_target_tied(ctx: CheckContext) -> list[Finding]:
    """TARGET_TIED_WEIGHT_MISSING: a target folder with ``tie_word_embeddings`` whose safetensors hold
    no ``*embed_tokens.weight``. Loaders that tie skip ``lm_head.weight`` and load the embedding (vLLM
    0.32 ``vllm/model_executor/models/llama.py`` ``LlamaForCausalLM.load_weights``), so both stay at
    init; with ``architectures`` also absent, vLLM served such a target generating token 0 forever."""
    t, w = ctx.target, ctx.target_weights
    if t is None or w is None or not t.tie_word_embeddings:
        return []
    if any(k.endswith("embed_tokens.weight") for k in w.tensors):
        return []
    has_head = "lm_head.weight" in w.tensors
    message = ("the target ties its embeddings but its safetensors hold no embed_tokens.weight"
               + (" (only lm_head.weight)" if has_head else "")
               + ("; its config names no architectures" if t.architectures is None else "")
               + ": the loader fills neither the embedding nor the tied head")
    evidence = {"tie_word_embeddings": 1, "embed_tokens_present": 0, "lm_head_present": int(has_head),
                "architectures_present": int(t.architectures is not None)}
    fix = ("Save the tied weight as model.embed_tokens.weight (the name tied loaders read), or set "
           "tie_word_embeddings to false; set architectures (e.g. [\"LlamaForCausalLM\"]) in config.json.")
    return [checkpoint_finding("TARGET_TIED_WEIGHT_MISSING", message, evidence, fix)]


CONTRACT_CHECKS = (check_rope, check_max_positions, check_sliding_window, check_draft_keys, check_aux_range,
                   check_target_tied)
