"""EAGLE-3 conventions shared by the checkpoint inspector and the runtime load check (docs/design.md,
"EAGLE-3 conventions"), and the per-engine facts of the draft-target contract.

Two questions every EAGLE-3 deployment answers differently per engine, answered here once:

- **Which target layers feed the draft.** Aux hidden states are "the hidden state entering layer i"
  (HF ``hidden_states[i]``), 3 of them by default at ``(2, n // 2, n - 3)``. Explicit
  ``eagle_aux_hidden_state_layer_ids`` mean different layers in different engines (see
  :func:`physical_capture_layers`).
- **What the loader does with each checkpoint key.** Loaded verbatim, renamed, consumed on purpose
  (``d2t`` / ``t2d``), or dropped without a word (see :func:`map_checkpoint_key` and :func:`plan_load`).

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
from dataclasses import dataclass, field
from types import MappingProxyType

from specscope.errors import ConfigError

ENGINES = ("sglang", "vllm", "eagle", "speculators", "reference")

AUX_LAYER_COUNT = 3
"""Aux hidden states an EAGLE-3 draft fuses by default (fc fan-in = 3 x target hidden)."""

VOCAB_MAP_KEYS = ("d2t", "t2d")

OPTIONAL_KEYS = frozenset({"embed_tokens.weight"})
"""Keys an EAGLE-3 checkpoint may omit: every engine shares the target's embedding when absent."""

_LAYER_PARAMS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
)


@dataclass(frozen=True)
class LoaderConvention:
    """How one engine's EAGLE-3 loader names and treats checkpoint keys.

    - ``layer_prefix``: the prefix of the (first) draft decoder layer's parameters.
    - ``prefix_renames``: ``(old, new)`` key prefixes the loader rewrites before matching.
    - ``key_renames``: whole keys the loader rewrites (vLLM ``d2t`` -> ``draft_id_to_target_id``).
    - ``consumed``: keys the loader reads or skips on purpose (not stored as parameters).
    - ``strict``: True when an unmapped key makes the load fail; False when it is dropped silently.
    - ``source``: engine and file the convention was read from.
    """

    engine: str
    layer_prefix: str
    prefix_renames: tuple[tuple[str, str], ...] = ()
    key_renames: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    consumed: frozenset[str] = frozenset()
    strict: bool = False
    source: str = ""


LOADERS: MappingProxyType = MappingProxyType({
    "sglang": LoaderConvention(
        "sglang", "midlayer.", prefix_renames=(("model.", ""),), consumed=frozenset(VOCAB_MAP_KEYS),
        source="SGLang python/sglang/srt/models/llama_eagle3.py"),
    "vllm": LoaderConvention(
        "vllm", "layers.0.", prefix_renames=(("midlayer.", "layers.0."),),
        key_renames=MappingProxyType({"d2t": "draft_id_to_target_id"}), consumed=frozenset({"t2d"}),
        strict=True, source="vLLM vllm/model_executor/models/llama_eagle3.py"),
    "speculators": LoaderConvention(
        "speculators", "layers.0.", source="speculators src/speculators/models/eagle3.py"),
    "eagle": LoaderConvention("eagle", "midlayer.", source="EAGLE eagle/model/ea_model.py"),
    "reference": LoaderConvention("reference", "midlayer.", source="specscope reference engine"),
})


def loader_convention(engine: str) -> LoaderConvention:
    """The :class:`LoaderConvention` of ``engine``. Raises :class:`ConfigError` for an unknown engine."""
    try:
        return LOADERS[engine]
    except KeyError:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}") from None


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """Default capture points ``(2, n // 2, n - 3)`` for a target with ``num_layers`` decoder layers.

    Indices are "hidden state entering layer i" (HF ``hidden_states[i]``); SGLang ``llama.py`` and
    vLLM ``get_eagle3_aux_hidden_state_layers`` use the same defaults. Raises :class:`ConfigError`
    when ``num_layers < 4`` (the three points would collide or fall outside the target).
    """
    if num_layers < 4:
        raise ConfigError(f"a target with {num_layers} layers has no EAGLE-3 default capture points")
    return (2, num_layers // 2, num_layers - 3)


AUX_IDS_SORTED_UNIQUE = frozenset({"vllm"})
"""Engines that sort and deduplicate the aux layer ids before capturing (vLLM 0.32
``vllm/model_executor/models/interfaces.py`` ``_set_aux_hidden_state_layers``: ``tuple(sorted(set(layers)))``);
the others capture and fuse the ids in the configured order, repeats included. vLLM also reads an empty
list as no ids (``GPUModelRunner._get_eagle3_aux_layers_from_config``: ``if not layer_ids``): the defaults."""


VOCAB_SIZE_PADDING_SERVED = frozenset({"vllm"})
"""Engines that serve a draft whose config ``vocab_size`` exceeds the target's as if it were the
target's: vLLM 0.32 uses it only as the width of the draft's logits, scattered from ``d2t`` with -inf
elsewhere (``Eagle3LlamaForCausalLM.compute_logits``), and as the rows of a draft embedding it replaces
by the target's when the draft ships none (``llm_base_proposer._maybe_share_embeddings``)."""


def physical_capture_layers(engine: str, aux_ids: Sequence[int] | None,
                            num_layers: int | None) -> tuple[int, ...]:
    """The capture points ("hidden state entering layer i") ``engine`` uses for ``aux_ids``.

    ``aux_ids`` is ``eagle_aux_hidden_state_layer_ids`` as written in the draft config, ``None`` for
    the engine default (then ``num_layers`` is required). SGLang reads an explicit id as the 0-based
    layer whose *output* is captured and adds +1 (``python/sglang/srt/models/llama.py``
    ``set_eagle3_layers_to_capture``); vLLM (``set_aux_hidden_state_layers``), speculators, EAGLE and
    the reference engine read ids as ``hidden_states`` boundary indices. The result is in the order the
    engine fuses them: engines in :data:`AUX_IDS_SORTED_UNIQUE` capture ``sorted(set(ids))``, so a
    reversed list is fused ascending there and a repeated id is captured once.
    Raises :class:`ConfigError` for an unknown engine or when defaults are asked without ``num_layers``.
    """
    loader_convention(engine)
    if aux_ids is None or (not aux_ids and engine in AUX_IDS_SORTED_UNIQUE):  # vLLM: [] means the defaults
        if num_layers is None:
            raise ConfigError("default aux layers need the target's number of layers")
        return default_aux_layer_ids(num_layers)
    shift = 1 if engine == "sglang" else 0
    layers = tuple(int(i) + shift for i in aux_ids)
    return tuple(sorted(set(layers))) if engine in AUX_IDS_SORTED_UNIQUE else layers


def map_checkpoint_key(engine: str, key: str) -> str | None:
    """The name ``engine``'s loader stores checkpoint ``key`` under, or ``None`` when it consumes it.

    Names are given without the engine's ``model.`` wrapper and without fusing ``q/k/v`` or
    ``gate/up`` (fusion changes the storage, not which key lands where). A returned name is where
    the loader *tries* to put the key; whether such a parameter exists is :func:`plan_load`'s call.
    Examples: SGLang keeps ``midlayer.*`` and turns ``d2t`` into ``hot_token_id`` (``None``); vLLM
    maps ``midlayer.x`` -> ``layers.0.x``. Raises :class:`ConfigError` for an unknown engine.
    """
    conv = loader_convention(engine)
    if key in conv.consumed:
        return None
    if key in conv.key_renames:
        return conv.key_renames[key]
    for old, new in conv.prefix_renames:
        if key.startswith(old):
            return new + key[len(old):]
    return key


def canonical_draft_keys(num_layers: int = 1, *, pruned_vocab: bool = True,
                         tied_embeddings: bool = False, layer_prefix: str = "midlayer.") -> tuple[str, ...]:
    """The checkpoint keys a complete EAGLE-3 draft holds, in the layout of ``layer_prefix``.

    Layer 0 under ``layer_prefix`` (``midlayer.`` for EAGLE/SpecForge/SGLang, ``layers.0.`` for
    speculators); further layers of a multi-layer draft as ``layers.<i>.``; ``fc.weight``,
    ``norm.weight``; ``lm_head.weight`` unless the head is tied to the embedding; ``d2t`` / ``t2d``
    when the draft vocabulary is pruned.
    """
    keys = [layer_prefix + p for p in _LAYER_PARAMS]
    keys += [f"layers.{i}.{p}" for i in range(1, num_layers) for p in _LAYER_PARAMS]
    keys += ["fc.weight", "norm.weight"]
    if not tied_embeddings:
        keys.append("lm_head.weight")
    if pruned_vocab:
        keys += list(VOCAB_MAP_KEYS)
    return tuple(keys)


def expected_draft_params(engine: str, num_layers: int = 1, *, pruned_vocab: bool = True,
                          tied_embeddings: bool = False) -> tuple[str, ...]:
    """The parameters (and persistent buffers) ``engine``'s EAGLE-3 draft expects from a checkpoint.

    Same set as :func:`canonical_draft_keys`, in the engine's naming (e.g. vLLM ``layers.0.*`` and
    ``draft_id_to_target_id``); keys the engine consumes (SGLang ``d2t`` / ``t2d``) are left out.
    """
    conv = loader_convention(engine)
    names = (map_checkpoint_key(engine, k) for k in canonical_draft_keys(
        num_layers, pruned_vocab=pruned_vocab, tied_embeddings=tied_embeddings,
        layer_prefix=conv.layer_prefix))
    return tuple(n for n in names if n is not None)


@dataclass(frozen=True)
class LoadPlan:
    """What ``engine``'s loader does with every key of a checkpoint.

    - ``loaded``: checkpoint keys stored under their own name.
    - ``renamed``: ``(checkpoint_key, parameter)`` pairs for keys stored under another name.
    - ``dropped``: checkpoint keys the loader maps to no parameter (silent unless ``strict``).
    - ``consumed``: keys the loader reads or skips on purpose (SGLang ``d2t`` -> ``hot_token_id``).
    - ``missing``: expected parameters no checkpoint key provides (they keep their random init).
    - ``strict``: True when the loader fails on a dropped key instead of ignoring it.
    """

    engine: str
    loaded: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    dropped: tuple[str, ...] = ()
    consumed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    strict: bool = False


def plan_load(engine: str, checkpoint_keys: Iterable[str],
              expected_params: Iterable[str] | None = None) -> LoadPlan:
    """Classify ``checkpoint_keys`` the way ``engine``'s loader treats them.

    ``expected_params``: the draft module's parameter and persistent-buffer names in the engine's
    naming (``state_dict()`` keys); ``None`` uses :func:`expected_draft_params` for a single-layer
    draft, with the vocabulary maps expected when the checkpoint carries them. ``embed_tokens.weight``
    is optional on both sides (shared with the target when absent). Raises :class:`ConfigError` for an
    unknown engine.
    """
    conv = loader_convention(engine)
    keys = sorted(set(checkpoint_keys))
    if expected_params is None:
        expected_params = expected_draft_params(engine, pruned_vocab="d2t" in keys)
    expected = set(expected_params)
    accepted = expected | OPTIONAL_KEYS
    loaded, renamed, dropped, consumed, provided = [], [], [], [], set()
    for key in keys:
        name = map_checkpoint_key(engine, key)
        if name is None:
            consumed.append(key)
        elif name not in accepted:
            dropped.append(key)
        else:
            provided.add(name)
            if name == key:
                loaded.append(key)
            else:
                renamed.append((key, name))
    missing = sorted(expected - provided - OPTIONAL_KEYS)
    return LoadPlan(engine, tuple(loaded), tuple(renamed), tuple(dropped), tuple(consumed),
                    tuple(missing), conv.strict)


# --- The draft-target contract: which side each setting is read from, per engine -------------------

READ_FROM = ("draft", "target", "both", "ignored", "unknown")
"""Where an engine takes a setting from: the draft config, the target, both (they must agree), not at
all (``ignored``: present in the config, never read), or ``unknown`` (not established from the source)."""


@dataclass(frozen=True)
class SettingFact:
    """How one engine treats one setting: ``read_from`` (one of :data:`READ_FROM`), ``source`` (engine
    file the fact comes from) and ``note`` (the condition or version the fact depends on)."""

    read_from: str
    source: str
    note: str = ""


_VLLM_MODEL = "vLLM 0.32 vllm/model_executor/models/llama_eagle3.py"
_VLLM_LLAMA = "vLLM 0.32 vllm/model_executor/models/llama.py (LlamaAttention, built from the draft hf_config)"
_VLLM_SHARE = "vLLM 0.32 vllm/v1/spec_decode/llm_base_proposer.py (_maybe_share_embeddings / _maybe_share_lm_head)"
_SGL_MODEL = "SGLang python/sglang/srt/models/llama_eagle3.py"
_SGL_WORKER = "SGLang python/sglang/srt/speculative/eagle_worker.py (set_embed / set_embed_and_head)"
_REF = "specscope specscope/engine/draft.py (DraftConfig.from_json keeps only its own fields)"
_UNKNOWN = SettingFact("unknown", "not established from the engine's source")

CONTRACT_SETTINGS = ("hidden_size", "vocab_size", "rope_theta", "rope_scaling", "max_position_embeddings",
                     "sliding_window", "head_dim", "aux_layer_ids", "tie_word_embeddings")
"""The settings draft and target must agree on (``hidden_size``: the draft's ``target_hidden_size``
against the target's ``hidden_size``; ``aux_layer_ids``: the capture layers against the target's layer
count)."""

CONTRACT: MappingProxyType = MappingProxyType({
    "vllm": MappingProxyType({
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
                                           "its own lm_head of draft_vocab_size rows"),
    }),
    "sglang": MappingProxyType({
        "hidden_size": SettingFact("draft", _SGL_MODEL, "fc is sized target_hidden_size x 3"),
        "vocab_size": SettingFact("both", _SGL_MODEL, "hot_token_id maps draft ids into the target vocabulary"),
        "rope_theta": SettingFact("draft", _SGL_MODEL, "the draft layer is built from the draft config"),
        "rope_scaling": SettingFact("draft", _SGL_MODEL, "the draft layer is built from the draft config"),
        "max_position_embeddings": SettingFact("draft", _SGL_MODEL),
        "sliding_window": _UNKNOWN,
        "head_dim": SettingFact("draft", _SGL_MODEL),
        "aux_layer_ids": SettingFact("draft", "SGLang python/sglang/srt/models/llama.py",
                                     "set_eagle3_layers_to_capture adds 1 to explicit ids"),
        "tie_word_embeddings": _UNKNOWN,
    }),
    "speculators": MappingProxyType({
        "hidden_size": SettingFact("draft", "speculators src/speculators/models/eagle3.py"),
        "vocab_size": SettingFact("both", "speculators src/speculators/models/eagle3.py", "d2t / t2d buffers"),
        "rope_theta": SettingFact("draft", "speculators src/speculators/models/eagle3.py",
                                  "transformer_layer_config"),
        "rope_scaling": SettingFact("draft", "speculators src/speculators/models/eagle3.py",
                                    "transformer_layer_config"),
        "max_position_embeddings": SettingFact("draft", "speculators src/speculators/models/eagle3.py",
                                               "transformer_layer_config"),
        "sliding_window": _UNKNOWN,
        "head_dim": SettingFact("draft", "speculators src/speculators/models/eagle3.py"),
        "aux_layer_ids": SettingFact("draft", "speculators src/speculators/models/eagle3.py"),
        "tie_word_embeddings": _UNKNOWN,
    }),
    "eagle": MappingProxyType({
        "hidden_size": SettingFact("draft", "EAGLE eagle/model/cnets.py"),
        "vocab_size": SettingFact("both", "EAGLE eagle/model/cnets.py", "d2t / t2d buffers"),
        "rope_theta": _UNKNOWN,
        "rope_scaling": _UNKNOWN,
        "max_position_embeddings": _UNKNOWN,
        "sliding_window": _UNKNOWN,
        "head_dim": SettingFact("draft", "EAGLE eagle/model/cnets.py"),
        "aux_layer_ids": SettingFact("draft", "EAGLE eagle/model/cnets.py", "ids used as given"),
        "tie_word_embeddings": _UNKNOWN,
    }),
    "reference": MappingProxyType({
        "hidden_size": SettingFact("draft", _REF),
        "vocab_size": SettingFact("both", _REF, "d2t maps draft ids modulo the draft config's vocab_size"),
        "rope_theta": SettingFact("draft", _REF),
        "rope_scaling": SettingFact("ignored", _REF, "no rope_scaling field: default RoPE at every length"),
        "max_position_embeddings": SettingFact("draft", _REF),
        "sliding_window": SettingFact("ignored", _REF, "full attention always"),
        "head_dim": SettingFact("draft", _REF),
        "aux_layer_ids": SettingFact("draft", _REF, "ids used as given"),
        "tie_word_embeddings": SettingFact("ignored", _REF, "lm_head is always the draft's own"),
    }),
})
"""Per engine, per :data:`CONTRACT_SETTINGS` name: the :class:`SettingFact`."""

DRAFT_BEHAVIOUR_KEYS = ("norm_before_fc", "norm_before_residual", "fc_norm", "norm_output",
                        "use_aux_hidden_state", "eagle_config.use_aux_hidden_state",
                        "eagle_config.norm_before_fc", "eagle_config.norm_before_residual", "rope_scaling")
"""Draft config keys that change the draft's computation (``eagle_config.x`` = nested under
``eagle_config``). A key an engine does not read is silently ignored: the draft runs without it.
(``sliding_window`` has its own rule: :data:`SLIDING_WINDOW_NEEDS_LAYER_TYPES`.)"""

BEHAVIOUR_DEFAULTS: MappingProxyType = MappingProxyType({
    "norm_before_fc": False, "norm_before_residual": False, "fc_norm": False, "norm_output": False,
    "use_aux_hidden_state": True, "eagle_config.use_aux_hidden_state": True,
    "eagle_config.norm_before_fc": False, "eagle_config.norm_before_residual": False, "rope_scaling": None,
})
"""The value each :data:`DRAFT_BEHAVIOUR_KEYS` key has when absent (vLLM ``llama_eagle3.py`` defaults for
flat EAGLE configs); a key at its default changes nothing, ignored or not."""

SLIDING_WINDOW_NEEDS_LAYER_TYPES = frozenset({"vllm"})
"""Engines that apply a draft's ``sliding_window`` only to layers its ``layer_types`` marks
``sliding_attention`` (vLLM 0.32 ``vllm/model_executor/models/llama.py`` ``LlamaAttention``)."""

_IGNORED_BY_REF = SettingFact("ignored", _REF)

DRAFT_KEYS: MappingProxyType = MappingProxyType({
    "vllm": MappingProxyType({
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
        "rope_scaling": SettingFact("draft", _VLLM_LLAMA),
    }),
    "sglang": MappingProxyType({
        "norm_before_fc": SettingFact("ignored", _SGL_MODEL, "ignored until sglang PR 32334 "
                                      "(issue 32226); later releases read it"),
        "norm_before_residual": SettingFact("ignored", _SGL_MODEL, "ignored until sglang PR 32334 "
                                            "(issue 32226); later releases read it"),
        "rope_scaling": SettingFact("draft", _SGL_MODEL),
    }),
    "speculators": MappingProxyType({
        "norm_before_residual": SettingFact("draft", "speculators src/speculators/models/eagle3.py"),
        "rope_scaling": SettingFact("draft", "speculators src/speculators/models/eagle3.py"),
    }),
    "eagle": MappingProxyType({}),
    "reference": MappingProxyType({k: _IGNORED_BY_REF for k in DRAFT_BEHAVIOUR_KEYS}),
})
"""Per engine, per :data:`DRAFT_BEHAVIOUR_KEYS` name: the :class:`SettingFact`; keys not listed are
``unknown`` for that engine (see :func:`draft_key_fact`)."""

SHARE_RULES = ("target", "draft", "target_if_absent_or_identical", "target_if_no_draft_vocab", "unknown")
"""How an engine picks ``embed_tokens`` / ``lm_head``: always the target's, always the draft's, the
target's when the draft has none or an identical copy (else the draft's), the target's when the draft
config has no ``draft_vocab_size`` (else the draft's), or not established."""

SHARED_TENSORS: MappingProxyType = MappingProxyType({
    "vllm": MappingProxyType({
        "embed_tokens": SettingFact("target_if_absent_or_identical", _VLLM_SHARE, "and the widths match"),
        "lm_head": SettingFact("target_if_absent_or_identical", _VLLM_SHARE),
    }),
    "sglang": MappingProxyType({
        "embed_tokens": SettingFact("target", _SGL_WORKER, "set_embed for every EAGLE-3 draft"),
        "lm_head": SettingFact("target_if_no_draft_vocab", _SGL_WORKER, "load_lm_head_from_target"),
    }),
    "speculators": MappingProxyType({"embed_tokens": _UNKNOWN, "lm_head": _UNKNOWN}),
    "eagle": MappingProxyType({
        "embed_tokens": SettingFact("target", "EAGLE eagle/model/cnets.py", "read from the base model"),
        "lm_head": SettingFact("draft", "EAGLE eagle/model/cnets.py"),
    }),
    "reference": MappingProxyType({
        "embed_tokens": SettingFact("target", "specscope specscope/engine/draft.py", "never saved"),
        "lm_head": SettingFact("draft", "specscope specscope/engine/draft.py"),
    }),
})
"""Per engine, for ``embed_tokens`` and ``lm_head``: the :class:`SettingFact` whose ``read_from`` is
one of :data:`SHARE_RULES`."""


def served_from(engine: str, tensor: str, *, draft_has: bool, identical: bool | None,
                draft_vocab_size_set: bool) -> str:
    """``"draft"``, ``"target"`` or ``"unknown"``: whose ``tensor`` (``embed_tokens`` / ``lm_head``)
    ``engine`` serves, given whether the draft checkpoint has it, whether it is identical to the
    target's (``None``: not compared) and whether the draft config sets ``draft_vocab_size``.
    Raises :class:`ConfigError` for an unknown engine."""
    loader_convention(engine)
    rule = SHARED_TENSORS[engine][tensor].read_from
    if rule == "target_if_absent_or_identical":
        if not draft_has or identical:
            return "target"
        return "draft" if identical is False else "unknown"
    if rule == "target_if_no_draft_vocab":
        return "draft" if draft_vocab_size_set else "target"
    return rule


def contract_fact(engine: str, setting: str) -> SettingFact:
    """The :class:`SettingFact` of ``setting`` (one of :data:`CONTRACT_SETTINGS`) under ``engine``.
    Raises :class:`ConfigError` for an unknown engine."""
    loader_convention(engine)
    return CONTRACT[engine][setting]


def draft_key_fact(engine: str, key: str) -> SettingFact:
    """The :class:`SettingFact` of draft config key ``key`` (one of :data:`DRAFT_BEHAVIOUR_KEYS`)
    under ``engine``; ``unknown`` where the engine's source was not established. Raises
    :class:`ConfigError` for an unknown engine."""
    loader_convention(engine)
    return DRAFT_KEYS[engine].get(key, _UNKNOWN)


__all__ = [
    "AUX_IDS_SORTED_UNIQUE", "AUX_LAYER_COUNT", "BEHAVIOUR_DEFAULTS", "CONTRACT", "CONTRACT_SETTINGS", "DRAFT_BEHAVIOUR_KEYS", "DRAFT_KEYS",
    "ENGINES",
    "LOADERS", "LoadPlan", "LoaderConvention", "OPTIONAL_KEYS", "READ_FROM", "SHARED_TENSORS", "SHARE_RULES",
    "SLIDING_WINDOW_NEEDS_LAYER_TYPES", "SettingFact",
    "VOCAB_MAP_KEYS", "VOCAB_SIZE_PADDING_SERVED", "canonical_draft_keys", "contract_fact", "default_aux_layer_ids", "draft_key_fact",
    "expected_draft_params", "loader_convention", "map_checkpoint_key", "physical_capture_layers",
    "plan_load", "served_from",
]
