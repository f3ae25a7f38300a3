"""Turn what the user names (module objects, dotted names, globs) into modules of the draft / target."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence

from torch import nn

from specscope.errors import HookTargetError

_GLOB_CHARS = frozenset("*?[")
_FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f")


def _join(root: str, path: str) -> str:
    return f"{root}.{path}" if path else root


def _lookup_error(what: str, root: str, names: Iterable[str]) -> HookTargetError:
    close = difflib.get_close_matches(what, list(names), n=5, cutoff=0.5)
    hint = ", ".join(_join(root, c) for c in close) if close else "none"
    return HookTargetError(f"no module {_join(root, what)!r} in the {root}; closest names: {hint}")


def resolve_modules(specs: Iterable[nn.Module | str],
                    roots: dict[str, nn.Module]) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for every module named in ``specs``, names like ``draft.fc``.

    ``roots`` maps ``"draft"`` / ``"target"`` to the root modules (draft first). A spec is a module
    object (found by identity), a dotted name from ``named_modules()`` (``"fc"`` or ``"draft.fc"``;
    ``"target.model.norm"`` for the target; no prefix means the draft) or a glob over those names
    (``"midlayer.*"``). Raises :class:`HookTargetError` for an object in neither root or a name/glob
    that matches nothing; the message lists the closest existing names (difflib).
    """
    named = {root: dict(module.named_modules()) for root, module in roots.items()}
    found: dict[str, nn.Module] = {}
    for spec in specs:
        found.update(_resolve_one(spec, named))
    return list(found.items())


def _resolve_one(spec: nn.Module | str, named: dict[str, dict[str, nn.Module]]) -> dict[str, nn.Module]:
    if isinstance(spec, nn.Module):
        for root, modules in named.items():
            for path, module in modules.items():
                if module is spec:
                    return {_join(root, path): module}
        raise HookTargetError(f"module {type(spec).__name__} is not part of the {' or '.join(named)}")
    root, _, path = spec.partition(".")
    if root not in named:
        root, path = next(iter(named)), spec
    modules = named[root]
    if _GLOB_CHARS.intersection(path):
        hits = {_join(root, p): m for p, m in modules.items() if fnmatch.fnmatchcase(p, path)}
    else:
        hits = {_join(root, path): modules[path]} if path in modules else {}
    if not hits:
        raise _lookup_error(path, root, modules)
    return hits


def decoder_layers(target: nn.Module, num_layers: int,
                   override: Sequence[nn.Module] | str | None = None) -> tuple[str, Sequence[nn.Module]]:
    """``(dotted path, layers)`` of the target's decoder layers.

    Default: the first ``nn.ModuleList`` in ``named_modules()`` order whose length is ``num_layers``
    (HF ``model.layers``). ``override``: a dotted name or the layer sequence itself. Raises
    :class:`HookTargetError` when nothing fits, naming the module lists that exist.
    """
    modules = dict(target.named_modules())
    if isinstance(override, str):
        if override not in modules:
            raise _lookup_error(override, "target", modules)
        override = modules[override]
    if override is not None:
        if len(override) != num_layers:
            raise HookTargetError(f"layers override has {len(override)} modules, the target {num_layers}")
        path = next((p for p, m in modules.items() if m is override), "layers")
        return path, override
    lists = {p: m for p, m in modules.items() if isinstance(m, nn.ModuleList)}
    for path, layers in lists.items():
        if len(layers) == num_layers:
            return path, layers
    seen = ", ".join(f"{p} ({len(m)})" for p, m in lists.items()) or "none"
    raise HookTargetError(f"no ModuleList of {num_layers} decoder layers in the target; "
                          f"module lists: {seen}; pass layers=")


def final_norm(target: nn.Module, layers_path: str,
               override: nn.Module | str | None = None) -> nn.Module | None:
    """The target's final norm (its output is HF ``hidden_states[-1]``), or None when not found.

    Default: a sibling of the decoder-layer list named ``norm`` / ``final_layernorm`` / ``ln_f``
    (HF Llama ``model.norm``). ``override``: a dotted name or the module. Raises
    :class:`HookTargetError` for an override name that does not exist.
    """
    modules = dict(target.named_modules())
    if isinstance(override, nn.Module):
        return override
    if isinstance(override, str):
        if override not in modules:
            raise _lookup_error(override, "target", modules)
        return modules[override]
    parent = layers_path.rpartition(".")[0]
    for name in _FINAL_NORM_NAMES:
        module = modules.get(f"{parent}.{name}" if parent else name)
        if module is not None:
            return module
    return None
