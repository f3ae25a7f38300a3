"""The reference target and EAGLE-3 draft as real vLLM (offline ``LLM``) serves them, healthy or with a
fault reproduced the way it happens in vLLM; :mod:`specscope.adapters.vllm_demo` serves them observed.

Faults (each only plumbing; vLLM starts and serves, or fails, exactly as it would in production):

- ``no-aux-capture``: the target's model class does not pass ``set_aux_hidden_state_layers`` through
  (a wrapper class that forgot it, the failure of the design notes' story): vLLM activates no capture.
- ``aux-off-by-one``: the target's model class shifts the capture ids by +1 (SGLang's "output of layer
  i" convention ported into a vLLM model): the draft receives layers it was not trained on.
- ``aux-no-residual``, ``aux-first-repeated``: right layer ids, wrong value captured: the target's
  model captures each configured layer's sublayer output without the residual stream (a port that
  forgot ``hidden_states + residual``), or hands the first capture layer's value for every one.
- ``d2t-absolute``: the draft's ``d2t`` holds absolute target ids (converted twice); vLLM loads it.
- ``tied-target``: the target folder stores its tied embedding only as ``lm_head.weight`` (no
  ``model.embed_tokens.weight``, no ``architectures``); vLLM leaves the embedding uninitialised.
- ``unknown-key``: the draft checkpoint carries a tensor vLLM's EAGLE-3 loader does not map
  (``midlayer.mlp.extra_proj.weight``); vLLM refuses it at load (``ValueError``: no module or
  parameter named ...).
- ``emit-draft-token``: the verifier emits the draft's token at the first rejected position instead of
  the target's (vLLM's ``RejectionSampler`` wrapped in this process): acceptance is untouched, the text
  is no longer the target's.
- ``d2t-wrong``: the draft's ``d2t`` maps every draft token to the target id one below its own (built
  against ``arange(1, n + 1)``), still in range and increasing; its ``t2d`` is right. vLLM serves
  ``d2t``, so every draft token is proposed as another target token.
- ``t2d-mismatch``, ``vocab-size-padded``, ``aux-reversed``: draft problems vLLM does not act on (it
  never loads ``t2d``, only pads the draft's logits to its ``vocab_size``, sorts the aux ids): served
  exactly as the healthy draft. ``aux-duplicated``: a repeated aux id, which vLLM captures once, so
  the fused input is one layer short of ``fc``'s and the first draft forward fails.

The fault model classes reach vLLM only in the process that registers them (:func:`register_fault_models`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specscope.errors import ConfigError

VLLM_FAULTS: dict[str, str] = {
    "no-aux-capture": "the target model class drops set_aux_hidden_state_layers: no aux capture is active",
    "aux-off-by-one": "the target model class captures every aux layer one later than configured",
    "aux-no-residual": "the target model class captures the right layers without the residual stream",
    "aux-first-repeated": "the target model class hands the first capture layer's value for all three",
    "d2t-absolute": "the draft's d2t holds absolute target ids; vLLM adds the index again",
    "tied-target": "the target folder has its tied embedding only as lm_head.weight, no architectures",
    "unknown-key": "the draft checkpoint has a tensor vLLM's loader does not map: vLLM refuses it at load",
    "emit-draft-token": "the verifier emits the draft's token where it rejects: same acceptance, not the target's text",
    # Draft checkpoints with a problem vLLM does not act on, or acts on in its own way (docs/design.md,
    # "Verdicts per engine"): each served here so the verdict is checked against what vLLM does.
    "t2d-mismatch": "the draft's t2d disagrees with d2t; vLLM never loads t2d",
    "d2t-wrong": "the draft's d2t maps each draft token one target id too low, its t2d is right; vLLM serves d2t",
    "vocab-size-padded": "the draft config's vocab_size is 64 above the target's; vLLM only pads the draft's logits",
    "aux-reversed": "the draft config lists its aux layer ids in reverse; vLLM sorts them",
    "aux-duplicated": "the draft config repeats an aux layer id; vLLM captures it once and the fused width falls short of fc",
}

UNKNOWN_KEY = "midlayer.mlp.extra_proj.weight"
_WRAPPERS = {"no-aux-capture": "NoAuxCaptureLlamaForCausalLM", "aux-off-by-one": "AuxOffByOneLlamaForCausalLM",
             "aux-no-residual": "NoResidualLlamaForCausalLM", "aux-first-repeated": "FirstRepeatedLlamaForCausalLM"}


def check_vllm_fault(name: str | None) -> str | None:
    """``name`` if it is a known vLLM fault or None; ConfigError naming the valid ones otherwise."""
    if name is not None and name not in VLLM_FAULTS:
        raise ConfigError(f"unknown vLLM fault {name!r}; choose one of: {', '.join(VLLM_FAULTS)}")
    return name


def prepare(fault: str | None, workdir: Path) -> tuple[Path, Path]:
    """``(target folder, draft folder)`` for ``fault``: the shipped ones, or copies under ``workdir``
    changed the way the fault needs (weights linked, not copied, where they are unchanged)."""
    from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR, write_faulty_draft
    from specscope.engine.target import target_folder

    target, draft = target_folder(), Path(DEFAULT_DRAFT_DIR)
    check_vllm_fault(fault)
    if fault == "d2t-absolute":
        draft = write_faulty_draft(draft, workdir / "draft-d2t-absolute", fault)
    elif fault in _WRAPPERS:
        target = _folder_copy(target, workdir / f"target-{fault}",
                              lambda config: {**config, "architectures": [_WRAPPERS[fault]]})
    elif fault == "tied-target":
        target = _folder_copy(target, workdir / "target-tied",
                              lambda config: {k: v for k, v in config.items() if k != "architectures"}, _tied_only)
    elif fault in _DRAFT_EDITS:
        draft = _folder_copy(draft, workdir / f"draft-{fault}", *_DRAFT_EDITS[fault])
    return target, draft


def _aux_ids(config: dict, edit) -> dict:
    eagle = dict(config["eagle_config"])
    eagle["eagle_aux_hidden_state_layer_ids"] = edit(eagle["eagle_aux_hidden_state_layer_ids"])
    return {**config, "eagle_config": eagle}


def _flip_t2d(state: dict) -> dict:
    """``t2d`` no longer the set ``d2t`` maps to: its first 256 draft tokens unmarked."""
    import torch

    t2d = state["t2d"].clone()
    d2t = state["d2t"]
    t2d[(d2t + torch.arange(d2t.numel(), dtype=d2t.dtype))[:256]] = False
    return {**state, "t2d": t2d}


def _d2t_off_by_one(state: dict) -> dict:
    """``d2t`` built against ``arange(1, n + 1)``: each draft id maps to the target id below its own."""
    return {**state, "d2t": state["d2t"] - 1}


def _with_unknown_key(state: dict) -> dict:
    """One more tensor, under a name no EAGLE-3 loader maps."""
    import torch

    return {**state, UNKNOWN_KEY: torch.zeros(4, 4)}


def _tied_only(state: dict) -> dict:
    """The layout earlier specscope caches had: the tied weight as ``lm_head.weight`` only."""
    state = dict(state)
    state["lm_head.weight"] = state.pop("model.embed_tokens.weight")
    return state


_DRAFT_EDITS = {  # fault -> (config edit, tensor edit) of the draft folder
    "unknown-key": (None, _with_unknown_key),
    "t2d-mismatch": (None, _flip_t2d),
    "d2t-wrong": (None, _d2t_off_by_one),
    "vocab-size-padded": (lambda config: {**config, "vocab_size": config["vocab_size"] + 64}, None),
    "aux-reversed": (lambda config: _aux_ids(config, lambda ids: ids[::-1]), None),
    "aux-duplicated": (lambda config: _aux_ids(config, lambda ids: [ids[0], ids[1], ids[1]]), None),
}


def _folder_copy(source: Path, dest: Path, edit_config=None, edit_state=None) -> Path:
    """A model folder under ``dest``: its ``config.json`` through ``edit_config``, its
    ``model.safetensors`` through ``edit_state`` (each kept as is when None), every other file linked."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    weights = "model.safetensors"
    for item in source.iterdir():
        if item.name != "config.json" and not (edit_state and item.name == weights) and not (dest / item.name).exists():
            (dest / item.name).symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(edit_config(config) if edit_config else config, indent=2))
    if edit_state:
        save_file(edit_state(load_file(str(source / weights))), str(dest / weights), metadata={"format": "pt"})
    return dest


def register_fault_models() -> None:
    """Register the fault model classes with vLLM's ``ModelRegistry`` (this process only)."""
    from vllm import ModelRegistry

    for name in _WRAPPERS.values():
        ModelRegistry.register_model(name, f"specscope.engine._vllm_models:{name}")


def emit_draft_token(forward):
    """``RejectionSampler.forward`` broken as the ``emit-draft-token`` fault: where a request rejects
    draft m, it emits draft m instead of the target's token (its count of emitted tokens, and so
    vLLM's acceptance, unchanged)."""
    import torch

    def broken(self, metadata, draft_probs, logits, sampling_metadata):
        output = forward(self, metadata, draft_probs, logits, sampling_metadata)
        tokens = output.sampled_token_ids  # (B, W), -1 where empty
        drafted = torch.tensor(metadata.num_draft_tokens, device=tokens.device)
        accepted = (tokens >= 0).sum(dim=1) - 1  # (B,)
        starts = torch.cumsum(drafted, 0) - drafted
        rejected = accepted < drafted
        if bool(rejected.any()):
            rows = rejected.nonzero()[:, 0]
            tokens[rows, accepted[rows]] = metadata.draft_token_ids[starts[rows] + accepted[rows]].to(tokens.dtype)
        return output

    return broken
