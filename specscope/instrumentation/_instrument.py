"""Attach a :class:`Tracer` to a draft (and optionally its target) without touching engine source."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn

from specscope import points
from specscope.errors import ConfigError
from specscope.instrumentation._context import module_device
from specscope.instrumentation._forward import tap_forward
from specscope.instrumentation._hooks import (
    LayerInput,
    default_layer_input,
    draft_forward_hooks,
    final_norm_hook,
    fused_input_hook,
    module_hooks,
    target_layer_hook,
)
from specscope.instrumentation._provenance import Provenance
from specscope.instrumentation._replay import ReplayRecorder, ReplaySite
from specscope.instrumentation._resolve import decoder_layers, final_norm, resolve_modules
from specscope.instrumentation.tracer import Tracer

DRAFT_SITE = "draft"
"""Key of the draft's target-fed input among the static-buffer sites."""


def instrument(tracer: Tracer, *, draft: nn.Module, target: nn.Module | None = None,
               aux_layer_ids: Sequence[int] | None = None, modules: Iterable[nn.Module | str] = (),
               draft_hidden_arg: str = "hidden_states",
               layers: Sequence[nn.Module] | str | None = None,
               final_norm_module: nn.Module | str | None = None,
               draft_hidden_size: int | None = None,
               layer_input: LayerInput | None = None, layer_value: LayerInput | None = None,
               fused_input: nn.Module | str | None = None) -> Tracer:
    """Hook the draft's forward, the target's capture layers and any further ``modules``.

    Hook points (docs/design.md, "Event model"):

    - ``draft.forward:<argname>`` for every tensor argument, positional ones bound to their names
      with ``inspect.signature`` (e.g. ``input_ids`` (B, T), ``positions`` (B, T),
      ``hidden_states`` (B, T, W)), and ``draft.forward:output`` (``output.0``, ``output.1`` for a
      tuple). ``draft_hidden_arg`` carries the expectation: on the first draft call after
      ``start_request`` / ``record_verify`` / a target forward ("target-fed") W must be
      ``config.expected_fused_width`` (n_aux x target hidden; the engine applies ``fc`` because W
      differs from the embedding width, SGLang ``python/sglang/srt/models/llama_eagle3.py``); on the
      later chained calls of the round W must be the draft hidden size.
    - ``target.layers.{i}:input`` for every aux id i (default ``config.aux_layer_ids_resolved``): the
      hidden state entering decoder layer i, HF ``hidden_states[i]``, expected width
      ``config.target_hidden_size``. ``layers``: the decoder layer list or its dotted name (default:
      the ``ModuleList`` of ``config.num_target_layers`` modules). ``layer_input(args, kwargs)`` picks
      the hidden state from a layer's call (default: first positional tensor, else ``hidden_states``;
      SGLang layers need ``hidden_states + residual``). ``layer_value(args, kwargs)``: the residual-stream
      value fingerprinted for provenance on sampled steps when it differs from what ``layer_input``
      returns (vLLM and SGLang layers take ``(positions, hidden_states, residual)``: the captured value
      is ``hidden_states + residual``, ``vllm/model_executor/models/interfaces.py``
      ``_maybe_add_hidden_state``); ``layer_input`` runs on every call and must not compute.
    - ``fused_input``: the draft submodule (object or dotted name) that receives the fused aux hidden
      states when the engine fuses them before the draft forward (vLLM: ``"model.fc"``). Its input is
      recorded as ``draft.<name>:input`` with the fused width expected and is checked for provenance;
      ``draft_hidden_arg`` is then expected ``draft_width`` wide on every call.
    - ``<draft|target>.<module path>:input|output`` for each of ``modules``: module objects, dotted
      names (``"fc"``, ``"target.model.norm"``) or globs over ``named_modules()``.

    With ``provenance_every`` set, neighbours of the aux layers and the final norm (default: the
    sibling ``norm`` of the layer list, or ``final_norm_module``) are fingerprinted too (no events).
    The draft hidden size comes from ``draft_hidden_size``, ``draft.config.hidden_size`` or
    ``fc.out_features``. Returns the tracer. Raises :class:`HookTargetError` for a module name or
    object that matches nothing (the message lists the closest names), :class:`ConfigError` for an aux
    id outside the target, an unknown draft hidden size, or a tracer already instrumented or closed.
    Nothing is hooked when it raises.
    """
    if tracer.instrumented or tracer.closed:
        raise ConfigError("this tracer is already instrumented or closed; use one tracer per engine")
    config = tracer.config
    aux = tuple(int(i) for i in (config.aux_layer_ids_resolved if aux_layer_ids is None else aux_layer_ids))
    draft_width = draft_hidden_size or _draft_hidden_size(draft)
    roots = {"draft": draft} if target is None else {"draft": draft, "target": target}
    extra = resolve_modules(modules, roots)
    fused = resolve_modules([fused_input], {"draft": draft})[0] if fused_input is not None else None
    state, sampling = tracer.hook_state, tracer.sampling
    handles = []
    provenance = None
    replay = {}
    if target is not None:
        layer_hooks, provenance, norm = _target_plan(tracer, target, aux, layers, final_norm_module)
        replay = _replay_sites(tracer, target, aux, [index for index, _ in layer_hooks], norm, provenance)
        if norm is not None:
            handles.append(tap_forward(norm, state, post=final_norm_hook(state, provenance, config.num_target_layers,
                                                                         replay.get(config.num_target_layers)),
                                       post_point=points.TARGET_NORM_OUTPUT))
        read_input = layer_input or default_layer_input
        first = min(index for index, _ in layer_hooks)
        for index, layer in layer_hooks:
            hook, traced = target_layer_hook(state, sampling, index, config.target_hidden_size, index in aux,
                                             index == first, provenance, read_input, layer_value,
                                             replay.get(index))
            handles.append(tap_forward(layer, state, pre=hook, pre_point=points.target_layer_input(index),
                                       traced=traced))
    pre, post = draft_forward_hooks(state, sampling, draft, draft_hidden_arg, config.expected_fused_width,
                                    draft_width, provenance, fused_here=fused is None,
                                    replay=replay.get(DRAFT_SITE))
    handles.append(tap_forward(draft, state, pre, post, points.point(points.DRAFT_FORWARD, points.INPUT),
                               points.DRAFT_OUTPUT))
    if fused is not None:
        hook = fused_input_hook(state, sampling, fused[0], config.expected_fused_width, provenance,
                                replay.get(DRAFT_SITE))
        handles.append(tap_forward(fused[1], state, pre=hook, pre_point=points.point(fused[0], points.INPUT)))
    for name, module in extra:
        pre, post = module_hooks(state, sampling, name)
        handles.append(tap_forward(module, state, pre, post, points.point(name, points.INPUT),
                                   points.point(name, points.OUTPUT)))
    state.install(handles, provenance, sees_target=target is not None)
    tracer.device = tracer.device or module_device(draft)
    tracer.start()
    return tracer


def _replay_sites(tracer: Tracer, target: nn.Module, aux: tuple[int, ...], hooked: list[int],
                  norm: nn.Module | None, provenance: Provenance | None) -> dict[int | str, tuple[ReplayRecorder, int]]:
    """The static buffer for CUDA-graph replay (:mod:`specscope.instrumentation._replay`), where a
    graph can be captured (CUDA; ``hook_state.capturing`` set): a site per hooked layer (keyed by its
    index), the final norm (``num_target_layers``) and, with provenance, the draft's target-fed
    input (:data:`DRAFT_SITE`). Empty where nothing can be captured: eager runs are unchanged."""
    state, config = tracer.hook_state, tracer.config
    if state.capturing is None:
        return {}
    width = config.target_hidden_size
    keys: list[int | str] = list(hooked)
    sites = [ReplaySite(points.target_layer_input(i) if i in aux else None, width if i in aux else None, i)
             for i in hooked]
    if norm is not None:
        keys.append(config.num_target_layers)
        sites.append(ReplaySite(None, None, config.num_target_layers))
    if provenance is not None:
        keys.append(DRAFT_SITE)
        sites.append(ReplaySite(None, None, None))
    recorder = ReplayRecorder(state, sites, module_device(target) or "cpu", width,
                              config.expected_fused_width // width, provenance)
    state.replay = recorder
    return {key: (recorder, site) for site, key in enumerate(keys)}


def _draft_hidden_size(draft: nn.Module) -> int:
    width = getattr(getattr(draft, "config", None), "hidden_size", None)
    if width is None:
        fc = dict(draft.named_modules()).get("fc")
        width = getattr(fc, "out_features", None)
    if width is None:
        raise ConfigError("cannot tell the draft hidden size (no config.hidden_size, no fc); "
                          "pass draft_hidden_size=")
    return int(width)


def _target_plan(tracer: Tracer, target: nn.Module, aux: tuple[int, ...],
                 layers: Sequence[nn.Module] | str | None, norm_override: nn.Module | str | None,
                 ) -> tuple[list[tuple[int, nn.Module]], Provenance | None, nn.Module | None]:
    """Which target layers to hook, the provenance tracker and the final norm to fingerprint."""
    config = tracer.config
    n = config.num_target_layers
    outside = [i for i in aux if not 0 <= i < n]
    if outside or not aux:
        raise ConfigError(f"aux layer ids {list(aux)} must be non-empty and within 0..{n - 1} "
                          f"(hidden state entering layer i)")
    path, layer_list = decoder_layers(target, n, layers)
    hooked = set(aux)
    provenance = norm = None
    every = tracer.sampling.provenance_every
    if every:
        neighbours = sorted({j for i in aux for j in (i - 1, i + 1) if 0 <= j < n} - hooked)
        norm = final_norm(target, path, norm_override)
        candidates = aux + tuple(neighbours) + ((n,) if norm is not None else ())
        provenance = Provenance(aux, candidates, config.target_hidden_size, every)
        hooked.update(neighbours)
    return [(i, layer_list[i]) for i in sorted(hooked)], provenance, norm
