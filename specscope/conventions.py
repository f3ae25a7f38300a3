"""EAGLE-3 conventions shared by the checkpoint inspector and the runtime load check (docs/design.md,
"EAGLE-3 conventions"), answered from one record of facts per engine (:class:`EngineFacts`).

Two questions every EAGLE-3 deployment answers differently per engine:

- **Which target layers feed the draft.** Aux hidden states are "the hidden state entering layer i"
  (HF ``hidden_states[i]``), 3 of them by default at ``(2, n // 2, n - 3)``. Explicit
  ``eagle_aux_hidden_state_layer_ids`` mean different layers in different engines
  (:func:`physical_capture_layers`).
- **What the loader does with each checkpoint key.** Loaded verbatim, renamed, consumed on purpose
  (``d2t`` / ``t2d``), or dropped without a word (:func:`map_checkpoint_key`, :func:`plan_load`).

Facts come from the engines' own loaders:

- SGLang ``python/sglang/srt/models/llama_eagle3.py`` (``LlamaForCausalLMEagle3.load_weights``): the
  draft layer is the attribute ``midlayer``; a key is stored under its own name or ``model.<name>``,
  keys matching no parameter are skipped silently; ``d2t`` becomes ``hot_token_id = d2t + arange``,
  ``t2d`` is skipped. Aux ids: ``python/sglang/srt/models/llama.py`` ``set_eagle3_layers_to_capture``
  adds +1 to explicit ids and captures before layer i.
- vLLM ``vllm/model_executor/models/llama_eagle3.py`` (``LlamaModel.load_weights`` and
  ``Eagle3LlamaForCausalLM.load_weights``): renames ``midlayer.`` -> ``layers.0.``, ``d2t`` ->
  ``draft_id_to_target_id``, skips ``t2d``; a key matching no parameter fails the load (vLLM 0.32:
  ``ValueError: There is no module or parameter named ...``, served in ``tests/test_vllm.py``).
  Aux ids are used as given (``set_aux_hidden_state_layers``), captured before layer i.
- speculators ``src/speculators/models/eagle3.py``: the draft layer is ``layers.0``; ``d2t`` / ``t2d``
  are registered buffers; loading goes through HF ``from_pretrained``, which logs unexpected keys and
  goes on.
- EAGLE (SafeAILab) ``eagle/model/ea_model.py`` / ``cnets.py``: ``midlayer``; ``load_state_dict(...,
  strict=False)`` drops anything else silently. The specscope reference engine follows this layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import MappingProxyType

from specscope._engine_facts import (
    BEHAVIOUR_DEFAULTS,
    CONTRACT_SETTINGS,
    DRAFT_BEHAVIOUR_KEYS,
    FACTS,
    READ_FROM,
    UNKNOWN,
    EngineFacts,
    SettingFact,
    ShareRule,
)
from specscope._loader_keys import OPTIONAL_KEYS, VOCAB_MAP_KEYS, LoaderConvention, LoadPlan, canonical_draft_keys
from specscope.errors import ConfigError

ENGINES = tuple(FACTS)

AUX_LAYER_COUNT = 3
"""Aux hidden states an EAGLE-3 draft fuses by default (fc fan-in = 3 x target hidden)."""

SHARE_RULES = tuple(ShareRule)


def engine_facts(engine: str) -> EngineFacts:
    """The :class:`EngineFacts` of ``engine``. Raises :class:`ConfigError` for an unknown engine."""
    try:
        return FACTS[engine]
    except KeyError:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}") from None


def loader_convention(engine: str) -> LoaderConvention:
    """The :class:`LoaderConvention` of ``engine``. Raises :class:`ConfigError` for an unknown engine."""
    return engine_facts(engine).loader


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """Default capture points ``(2, n // 2, n - 3)`` for a target with ``num_layers`` decoder layers
    (SGLang ``llama.py`` and vLLM ``get_eagle3_aux_hidden_state_layers`` alike). Raises
    :class:`ConfigError` when ``num_layers < 4`` (the points would collide or fall outside)."""
    if num_layers < 4:
        raise ConfigError(f"a target with {num_layers} layers has no EAGLE-3 default capture points")
    return (2, num_layers // 2, num_layers - 3)


def physical_capture_layers(engine: str, aux_ids: Sequence[int] | None,
                            num_layers: int | None) -> tuple[int, ...]:
    """The capture points ("hidden state entering layer i") ``engine`` uses for ``aux_ids``, in the
    order it fuses them.

    ``aux_ids`` is ``eagle_aux_hidden_state_layer_ids`` as written in the draft config, ``None`` for
    the engine default (then ``num_layers`` is required). Raises :class:`ConfigError` for an unknown
    engine or when defaults are asked without ``num_layers``.
    """
    facts = engine_facts(engine)
    if aux_ids is None or (not aux_ids and facts.aux_ids_sorted_unique):
        if num_layers is None:
            raise ConfigError("default aux layers need the target's number of layers")
        return default_aux_layer_ids(num_layers)
    layers = tuple(int(i) + facts.aux_id_offset for i in aux_ids)
    return tuple(sorted(set(layers))) if facts.aux_ids_sorted_unique else layers


def map_checkpoint_key(engine: str, key: str) -> str | None:
    """The name ``engine``'s loader stores checkpoint ``key`` under, or ``None`` when it consumes it
    (SGLang ``d2t``; vLLM maps ``midlayer.x`` -> ``layers.0.x``). Whether such a parameter exists is
    :func:`plan_load`'s call. Raises :class:`ConfigError` for an unknown engine."""
    return loader_convention(engine).map_key(key)


def expected_draft_params(engine: str, num_layers: int = 1, *, pruned_vocab: bool = True,
                          tied_embeddings: bool = False) -> tuple[str, ...]:
    """The parameters (and persistent buffers) ``engine``'s EAGLE-3 draft expects from a checkpoint:
    :func:`canonical_draft_keys` in the engine's naming, keys it consumes left out."""
    return loader_convention(engine).expected_params(num_layers, pruned_vocab=pruned_vocab,
                                                     tied_embeddings=tied_embeddings)


def plan_load(engine: str, checkpoint_keys: Iterable[str],
              expected_params: Iterable[str] | None = None) -> LoadPlan:
    """Classify ``checkpoint_keys`` the way ``engine``'s loader treats them.

    ``expected_params``: the draft module's ``state_dict()`` keys in the engine's naming; ``None``
    uses :func:`expected_draft_params` for a single-layer draft. Raises :class:`ConfigError` for an
    unknown engine.
    """
    return loader_convention(engine).plan(checkpoint_keys, expected_params)


def served_from(engine: str, tensor: str, *, draft_has: bool, identical: bool | None,
                draft_vocab_size_set: bool) -> str:
    """``"draft"``, ``"target"`` or ``"unknown"``: whose ``tensor`` (``embed_tokens`` / ``lm_head``)
    ``engine`` serves, given whether the draft checkpoint has it, whether it is identical to the
    target's (``None``: not compared) and whether the draft config sets ``draft_vocab_size``.
    Raises :class:`ConfigError` for an unknown engine."""
    rule = engine_facts(engine).shared[tensor].read_from
    return rule.served(draft_has=draft_has, identical=identical, draft_vocab_size_set=draft_vocab_size_set)


def contract_fact(engine: str, setting: str) -> SettingFact:
    """The :class:`SettingFact` of ``setting`` (one of :data:`CONTRACT_SETTINGS`) under ``engine``.
    Raises :class:`ConfigError` for an unknown engine."""
    return engine_facts(engine).contract[setting]


def draft_key_fact(engine: str, key: str) -> SettingFact:
    """The :class:`SettingFact` of draft config key ``key`` (one of :data:`DRAFT_BEHAVIOUR_KEYS`) under
    ``engine``; ``unknown`` where the engine's source was not established. Raises :class:`ConfigError`
    for an unknown engine."""
    return engine_facts(engine).draft_keys.get(key, UNKNOWN)


# The facts per question, across engines (what the inspector and docs/engines.md read).
LOADERS = MappingProxyType({e: f.loader for e, f in FACTS.items()})
CONTRACT = MappingProxyType({e: f.contract for e, f in FACTS.items()})
DRAFT_KEYS = MappingProxyType({e: f.draft_keys for e, f in FACTS.items()})
SHARED_TENSORS = MappingProxyType({e: f.shared for e, f in FACTS.items()})
AUX_IDS_SORTED_UNIQUE = frozenset(e for e, f in FACTS.items() if f.aux_ids_sorted_unique)
VOCAB_SIZE_PADDING_SERVED = frozenset(e for e, f in FACTS.items() if f.vocab_size_padding_served)
SLIDING_WINDOW_NEEDS_LAYER_TYPES = frozenset(e for e, f in FACTS.items() if f.sliding_window_needs_layer_types)

__all__ = [
    "AUX_IDS_SORTED_UNIQUE", "AUX_LAYER_COUNT", "BEHAVIOUR_DEFAULTS", "CONTRACT", "CONTRACT_SETTINGS",
    "DRAFT_BEHAVIOUR_KEYS", "DRAFT_KEYS", "ENGINES", "EngineFacts", "LOADERS", "LoadPlan", "LoaderConvention",
    "OPTIONAL_KEYS", "READ_FROM", "SHARED_TENSORS", "SHARE_RULES", "SLIDING_WINDOW_NEEDS_LAYER_TYPES",
    "SettingFact", "ShareRule", "VOCAB_MAP_KEYS", "VOCAB_SIZE_PADDING_SERVED", "canonical_draft_keys",
    "contract_fact", "default_aux_layer_ids", "draft_key_fact", "engine_facts", "expected_draft_params",
    "loader_convention", "map_checkpoint_key", "physical_capture_layers", "plan_load", "served_from",
]
