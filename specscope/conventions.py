"""EAGLE-3 conventions shared by the checkpoint inspector and the runtime load check (DESIGN.md section 5).

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
  ``draft_id_to_target_id``, skips ``t2d``; a key matching no parameter raises ``KeyError`` at load.
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


def physical_capture_layers(engine: str, aux_ids: Sequence[int] | None,
                            num_layers: int | None) -> tuple[int, ...]:
    """The capture points ("hidden state entering layer i") ``engine`` uses for ``aux_ids``.

    ``aux_ids`` is ``eagle_aux_hidden_state_layer_ids`` as written in the draft config, ``None`` for
    the engine default (then ``num_layers`` is required). SGLang reads an explicit id as the 0-based
    layer whose *output* is captured and adds +1 (``python/sglang/srt/models/llama.py``
    ``set_eagle3_layers_to_capture``); vLLM (``set_aux_hidden_state_layers``), speculators, EAGLE and
    the reference engine read ids as ``hidden_states`` boundary indices, unchanged.
    Raises :class:`ConfigError` for an unknown engine or when defaults are asked without ``num_layers``.
    """
    loader_convention(engine)
    if aux_ids is None:
        if num_layers is None:
            raise ConfigError("default aux layers need the target's number of layers")
        return default_aux_layer_ids(num_layers)
    shift = 1 if engine == "sglang" else 0
    return tuple(int(i) + shift for i in aux_ids)


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


__all__ = [
    "AUX_LAYER_COUNT", "ENGINES", "LOADERS", "LoadPlan", "LoaderConvention", "OPTIONAL_KEYS",
    "VOCAB_MAP_KEYS", "canonical_draft_keys", "default_aux_layer_ids", "expected_draft_params",
    "loader_convention", "map_checkpoint_key", "physical_capture_layers", "plan_load",
]
