"""What an EAGLE-3 loader does with each checkpoint key: loaded verbatim, renamed, consumed on purpose
(``d2t`` / ``t2d``) or dropped without a word. Engine-free: each engine's :class:`LoaderConvention`
is part of its facts in :mod:`specscope.conventions`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

VOCAB_MAP_KEYS = ("d2t", "t2d")

OPTIONAL_KEYS = frozenset({"embed_tokens.weight"})
"""Keys an EAGLE-3 checkpoint may omit: every engine shares the target's embedding when absent."""

_LAYER_PARAMS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
)


def canonical_draft_keys(num_layers: int = 1, *, pruned_vocab: bool = True,
                         tied_embeddings: bool = False, layer_prefix: str = "midlayer.") -> tuple[str, ...]:
    """The checkpoint keys a complete EAGLE-3 draft holds, in the layout of ``layer_prefix``.

    Layer 0 under ``layer_prefix`` (``midlayer.`` for EAGLE/SpecForge/SGLang, ``layers.0.`` for
    speculators); further layers as ``layers.<i>.``; ``fc.weight``, ``norm.weight``; ``lm_head.weight``
    unless the head is tied to the embedding; ``d2t`` / ``t2d`` when the draft vocabulary is pruned.
    """
    keys = [layer_prefix + p for p in _LAYER_PARAMS]
    keys += [f"layers.{i}.{p}" for i in range(1, num_layers) for p in _LAYER_PARAMS]
    keys += ["fc.weight", "norm.weight"]
    if not tied_embeddings:
        keys.append("lm_head.weight")
    if pruned_vocab:
        keys += list(VOCAB_MAP_KEYS)
    return tuple(keys)


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

    def map_key(self, key: str) -> str | None:
        """The name the loader stores ``key`` under, or ``None`` when it consumes it (names without
        the engine's ``model.`` wrapper, ``q/k/v`` and ``gate/up`` unfused)."""
        if key in self.consumed:
            return None
        if key in self.key_renames:
            return self.key_renames[key]
        for old, new in self.prefix_renames:
            if key.startswith(old):
                return new + key[len(old):]
        return key

    def expected_params(self, num_layers: int = 1, *, pruned_vocab: bool = True,
                        tied_embeddings: bool = False) -> tuple[str, ...]:
        """:func:`canonical_draft_keys` in the engine's naming, less the keys it consumes."""
        names = (self.map_key(k) for k in canonical_draft_keys(
            num_layers, pruned_vocab=pruned_vocab, tied_embeddings=tied_embeddings,
            layer_prefix=self.layer_prefix))
        return tuple(n for n in names if n is not None)

    def plan(self, checkpoint_keys: Iterable[str], expected_params: Iterable[str] | None = None) -> LoadPlan:
        """Classify ``checkpoint_keys`` against ``expected_params`` (``None``: a single-layer draft's,
        the vocabulary maps expected when the checkpoint carries ``d2t``); ``embed_tokens.weight`` is
        optional on both sides."""
        keys = sorted(set(checkpoint_keys))
        if expected_params is None:
            expected_params = self.expected_params(pruned_vocab="d2t" in keys)
        expected = set(expected_params)
        accepted = expected | OPTIONAL_KEYS
        loaded, renamed, dropped, consumed, provided = [], [], [], [], set()
        for key in keys:
            name = self.map_key(key)
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
        return LoadPlan(self.engine, tuple(loaded), tuple(renamed), tuple(dropped), tuple(consumed),
                        tuple(missing), self.strict)
