"""One record of facts per engine (:class:`EngineFacts`): how its loader treats checkpoint keys, how it
reads the aux layer ids, and which side of the draft-target contract it reads each setting from.
Every fact names the engine file it was read from; :mod:`specscope.conventions` answers questions
with them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from specscope._loader_keys import VOCAB_MAP_KEYS, LoaderConvention

READ_FROM = ("draft", "target", "both", "ignored", "unknown")
"""Where an engine takes a setting from: the draft config, the target, both (they must agree), not at
all (``ignored``: present in the config, never read), or ``unknown`` (not established from the source)."""


class ShareRule(str, Enum):
    """How an engine picks ``embed_tokens`` / ``lm_head``: the ``read_from`` of their facts (a string,
    printed and stored as its value)."""

    TARGET = "target"
    DRAFT = "draft"
    TARGET_IF_ABSENT_OR_IDENTICAL = "target_if_absent_or_identical"  # else the draft's
    TARGET_IF_NO_DRAFT_VOCAB = "target_if_no_draft_vocab"  # the config sets no draft_vocab_size; else the draft's
    UNKNOWN = "unknown"

    def served(self, *, draft_has: bool, identical: bool | None, draft_vocab_size_set: bool) -> str:
        """``"draft"``, ``"target"`` or ``"unknown"`` (``identical`` ``None``: not compared)."""
        if self is ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL:
            if not draft_has or identical:
                return "target"
            return "draft" if identical is False else "unknown"
        if self is ShareRule.TARGET_IF_NO_DRAFT_VOCAB:
            return "draft" if draft_vocab_size_set else "target"
        return self.value

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass(frozen=True)
class SettingFact:
    """How one engine treats one setting: ``read_from`` (one of :data:`READ_FROM`, a :class:`ShareRule`
    for shared tensors), ``source`` (the engine file) and ``note`` (the condition or version)."""

    read_from: str
    source: str
    note: str = ""


CONTRACT_SETTINGS = ("hidden_size", "vocab_size", "rope_theta", "rope_scaling", "max_position_embeddings",
                     "sliding_window", "head_dim", "aux_layer_ids", "tie_word_embeddings")
"""The settings draft and target must agree on (``hidden_size``: the draft's ``target_hidden_size``
against the target's ``hidden_size``; ``aux_layer_ids``: the capture layers against the target's layer
count)."""

DRAFT_BEHAVIOUR_KEYS = ("norm_before_fc", "norm_before_residual", "fc_norm", "norm_output",
                        "use_aux_hidden_state", "eagle_config.use_aux_hidden_state",
                        "eagle_config.norm_before_fc", "eagle_config.norm_before_residual", "rope_scaling")
"""Draft config keys that change the draft's computation (``eagle_config.x`` = nested under
``eagle_config``); a key an engine does not read is silently ignored. (``sliding_window`` has its own
rule: :attr:`EngineFacts.sliding_window_needs_layer_types`.)"""

BEHAVIOUR_DEFAULTS: MappingProxyType = MappingProxyType({
    "norm_before_fc": False, "norm_before_residual": False, "fc_norm": False, "norm_output": False,
    "use_aux_hidden_state": True, "eagle_config.use_aux_hidden_state": True,
    "eagle_config.norm_before_fc": False, "eagle_config.norm_before_residual": False, "rope_scaling": None,
})
"""The value each :data:`DRAFT_BEHAVIOUR_KEYS` key has when absent (vLLM ``llama_eagle3.py`` defaults for
flat EAGLE configs); a key at its default changes nothing, ignored or not."""

SHARED = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class EngineFacts:
    """What one engine does with an EAGLE-3 draft.

    - ``loader``: how it names and treats checkpoint keys.
    - ``contract``: per :data:`CONTRACT_SETTINGS` name, the side it reads the setting from.
    - ``draft_keys``: per :data:`DRAFT_BEHAVIOUR_KEYS` name established from its source, read or ignored.
    - ``shared``: for ``embed_tokens`` and ``lm_head``, whose it serves (``read_from`` a :class:`ShareRule`).
    - ``aux_id_offset``: added to explicit aux ids (SGLang reads id i as the output of layer i).
    - ``aux_ids_sorted_unique``: captures ``sorted(set(ids))`` and reads ``[]`` as the defaults.
    - ``vocab_size_padding_served``: a draft ``vocab_size`` above the target's only pads its logits.
    - ``sliding_window_needs_layer_types``: applies ``sliding_window`` only to ``layer_types`` layers.
    """

    loader: LoaderConvention
    contract: Mapping[str, SettingFact]
    draft_keys: Mapping[str, SettingFact]
    shared: Mapping[str, SettingFact]
    aux_id_offset: int = 0
    aux_ids_sorted_unique: bool = False
    vocab_size_padding_served: bool = False
    sliding_window_needs_layer_types: bool = False

    def __post_init__(self) -> None:
        for what, facts, names in (("contract", self.contract, CONTRACT_SETTINGS),
                                   ("shared", self.shared, SHARED)):
            if tuple(facts) != names:
                raise ValueError(f"{self.loader.engine} {what} facts must be {names}, got {tuple(facts)}")
        if not set(self.draft_keys) <= set(DRAFT_BEHAVIOUR_KEYS):
            raise ValueError(f"{self.loader.engine}: unknown draft keys {set(self.draft_keys) - set(DRAFT_BEHAVIOUR_KEYS)}")
        if not all(isinstance(f.read_from, ShareRule) for f in self.shared.values()):
            raise ValueError(f"{self.loader.engine}: a shared tensor's read_from must be a ShareRule")
        for name in ("contract", "draft_keys", "shared"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))


_VLLM_MODEL = "vLLM 0.32 vllm/model_executor/models/llama_eagle3.py"
_VLLM_LLAMA = "vLLM 0.32 vllm/model_executor/models/llama.py (LlamaAttention, built from the draft hf_config)"
_VLLM_SHARE = "vLLM 0.32 vllm/v1/spec_decode/llm_base_proposer.py (_maybe_share_embeddings / _maybe_share_lm_head)"
_SGL_MODEL = "SGLang python/sglang/srt/models/llama_eagle3.py"
_SGL_WORKER = "SGLang python/sglang/srt/speculative/eagle_worker.py (set_embed / set_embed_and_head)"
_SPEC = "speculators src/speculators/models/eagle3.py"
_EAGLE = "EAGLE eagle/model/cnets.py"
_REF = "specscope specscope/engine/draft.py (DraftConfig.from_json keeps only its own fields)"
_NOT_ESTABLISHED = "not established from the engine's source"
UNKNOWN = SettingFact("unknown", _NOT_ESTABLISHED)
_UNKNOWN_SHARE = SettingFact(ShareRule.UNKNOWN, _NOT_ESTABLISHED)
_SGL_NORM_KEY = SettingFact("ignored", _SGL_MODEL, "ignored until sglang PR 32334 (issue 32226); later releases read it")

FACTS: Mapping[str, EngineFacts] = MappingProxyType({
    "sglang": EngineFacts(
        LoaderConvention("sglang", "midlayer.", prefix_renames=(("model.", ""),), consumed=frozenset(VOCAB_MAP_KEYS),
                         source="SGLang python/sglang/srt/models/llama_eagle3.py"),
        contract={
            "hidden_size": SettingFact("draft", _SGL_MODEL, "fc is sized target_hidden_size x 3"),
            "vocab_size": SettingFact("both", _SGL_MODEL, "hot_token_id maps draft ids into the target vocabulary"),
            "rope_theta": SettingFact("draft", _SGL_MODEL, "the draft layer is built from the draft config"),
            "rope_scaling": SettingFact("draft", _SGL_MODEL, "the draft layer is built from the draft config"),
            "max_position_embeddings": SettingFact("draft", _SGL_MODEL),
            "sliding_window": UNKNOWN,
            "head_dim": SettingFact("draft", _SGL_MODEL),
            "aux_layer_ids": SettingFact("draft", "SGLang python/sglang/srt/models/llama.py",
                                         "set_eagle3_layers_to_capture adds 1 to explicit ids"),
            "tie_word_embeddings": UNKNOWN},
        draft_keys={"norm_before_fc": _SGL_NORM_KEY, "norm_before_residual": _SGL_NORM_KEY,
                    "rope_scaling": SettingFact("draft", _SGL_MODEL)},
        shared={"embed_tokens": SettingFact(ShareRule.TARGET, _SGL_WORKER, "set_embed for every EAGLE-3 draft"),
                "lm_head": SettingFact(ShareRule.TARGET_IF_NO_DRAFT_VOCAB, _SGL_WORKER, "load_lm_head_from_target")},
        aux_id_offset=1),
    "vllm": EngineFacts(
        LoaderConvention("vllm", "layers.0.", prefix_renames=(("midlayer.", "layers.0."),),
                         key_renames=MappingProxyType({"d2t": "draft_id_to_target_id"}), consumed=frozenset({"t2d"}),
                         strict=True, source="vLLM vllm/model_executor/models/llama_eagle3.py"),
        contract={
            "hidden_size": SettingFact("draft", _VLLM_MODEL, "fc is sized target_hidden_size x n_aux"),
            "vocab_size": SettingFact("both", _VLLM_MODEL, "draft_id_to_target_id exists only when "
                                      "draft_vocab_size != the target's vocab size; logits scatter to vocab_size"),
            "rope_theta": SettingFact("draft", _VLLM_LLAMA, "get_rope(rope_parameters=draft config)"),
            "rope_scaling": SettingFact("draft", _VLLM_LLAMA, "get_rope(rope_parameters=draft config)"),
            "max_position_embeddings": SettingFact("draft", _VLLM_LLAMA, "sizes the draft's rotary cache"),
            "sliding_window": SettingFact("draft", _VLLM_LLAMA, "only through the draft's layer_types; a "
                                          "sliding_window without layer_types runs full attention"),
            "head_dim": SettingFact("draft", _VLLM_LLAMA),
            "aux_layer_ids": SettingFact("draft", "vLLM 0.32 vllm/v1/worker/gpu_model_runner.py",
                                         "eagle_aux_hidden_state_layer_ids of the draft, sorted and deduplicated"),
            "tie_word_embeddings": SettingFact("ignored", _VLLM_MODEL, "Eagle3LlamaForCausalLM always builds "
                                               "its own lm_head of draft_vocab_size rows")},
        draft_keys={
            "norm_before_fc": SettingFact("draft", _VLLM_MODEL, "eagle_config.norm_before_fc first, then top level"),
            "eagle_config.norm_before_fc": SettingFact("draft", _VLLM_MODEL),
            "norm_before_residual": SettingFact("draft", _VLLM_MODEL, "top level only"),
            "eagle_config.norm_before_residual": SettingFact(
                "ignored", _VLLM_MODEL, "LlamaDecoderLayer reads getattr(config, 'norm_before_residual') only"),
            "fc_norm": SettingFact("draft", _VLLM_MODEL),
            "norm_output": SettingFact("draft", _VLLM_MODEL),
            "use_aux_hidden_state": SettingFact(
                "ignored", _VLLM_MODEL, "LlamaModel reads eagle_config['use_aux_hidden_state'] only"),
            "eagle_config.use_aux_hidden_state": SettingFact("draft", _VLLM_MODEL),
            "rope_scaling": SettingFact("draft", _VLLM_LLAMA)},
        shared={"embed_tokens": SettingFact(ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, _VLLM_SHARE,
                                            "and the widths match"),
                "lm_head": SettingFact(ShareRule.TARGET_IF_ABSENT_OR_IDENTICAL, _VLLM_SHARE)},
        # vLLM 0.32 interfaces.py _set_aux_hidden_state_layers: tuple(sorted(set(layers))), and
        # GPUModelRunner._get_eagle3_aux_layers_from_config reads [] as no ids (``if not layer_ids``)
        aux_ids_sorted_unique=True,
        # the draft's vocab_size only sizes its logits (-inf outside d2t, compute_logits) and the rows of
        # an embedding replaced by the target's when the draft ships none (_maybe_share_embeddings)
        vocab_size_padding_served=True,
        sliding_window_needs_layer_types=True),  # LlamaAttention in vllm/model_executor/models/llama.py
    "eagle": EngineFacts(
        LoaderConvention("eagle", "midlayer.", source="EAGLE eagle/model/ea_model.py"),
        contract={
            "hidden_size": SettingFact("draft", _EAGLE),
            "vocab_size": SettingFact("both", _EAGLE, "d2t / t2d buffers"),
            "rope_theta": UNKNOWN, "rope_scaling": UNKNOWN, "max_position_embeddings": UNKNOWN,
            "sliding_window": UNKNOWN,
            "head_dim": SettingFact("draft", _EAGLE),
            "aux_layer_ids": SettingFact("draft", _EAGLE, "ids used as given"),
            "tie_word_embeddings": UNKNOWN},
        draft_keys={},
        shared={"embed_tokens": SettingFact(ShareRule.TARGET, _EAGLE, "read from the base model"),
                "lm_head": SettingFact(ShareRule.DRAFT, _EAGLE)}),
    "speculators": EngineFacts(
        LoaderConvention("speculators", "layers.0.", source=_SPEC),
        contract={
            "hidden_size": SettingFact("draft", _SPEC),
            "vocab_size": SettingFact("both", _SPEC, "d2t / t2d buffers"),
            "rope_theta": SettingFact("draft", _SPEC, "transformer_layer_config"),
            "rope_scaling": SettingFact("draft", _SPEC, "transformer_layer_config"),
            "max_position_embeddings": SettingFact("draft", _SPEC, "transformer_layer_config"),
            "sliding_window": UNKNOWN,
            "head_dim": SettingFact("draft", _SPEC),
            "aux_layer_ids": SettingFact("draft", _SPEC),
            "tie_word_embeddings": UNKNOWN},
        draft_keys={"norm_before_residual": SettingFact("draft", _SPEC), "rope_scaling": SettingFact("draft", _SPEC)},
        shared={"embed_tokens": _UNKNOWN_SHARE, "lm_head": _UNKNOWN_SHARE}),
    "reference": EngineFacts(
        LoaderConvention("reference", "midlayer.", source="specscope reference engine"),
        contract={
            "hidden_size": SettingFact("draft", _REF),
            "vocab_size": SettingFact("both", _REF, "d2t maps draft ids modulo the draft config's vocab_size"),
            "rope_theta": SettingFact("draft", _REF),
            "rope_scaling": SettingFact("ignored", _REF, "no rope_scaling field: default RoPE at every length"),
            "max_position_embeddings": SettingFact("draft", _REF),
            "sliding_window": SettingFact("ignored", _REF, "full attention always"),
            "head_dim": SettingFact("draft", _REF),
            "aux_layer_ids": SettingFact("draft", _REF, "ids used as given"),
            "tie_word_embeddings": SettingFact("ignored", _REF, "lm_head is always the draft's own")},
        draft_keys=dict.fromkeys(DRAFT_BEHAVIOUR_KEYS, SettingFact("ignored", _REF)),
        shared={"embed_tokens": SettingFact(ShareRule.TARGET, "specscope specscope/engine/draft.py", "never saved"),
                "lm_head": SettingFact(ShareRule.DRAFT, "specscope specscope/engine/draft.py")}),
})
"""Every engine specscope knows, in the order messages list them."""
