"""Hook closures. Everything a hook needs is bound when it is made; the per-call path reads tensor
metadata (``.shape`` / ``.dtype`` / ``.device``), bumps counters and compares a cached signature.

Every hook body runs inside :func:`guarded`: an exception is counted and logged once by the tracer and
never reaches the engine; hooks always return None, so arguments and outputs pass through untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specscope.instrumentation._sampling import SamplingConfig, TensorPoint

if TYPE_CHECKING:
    from specscope.instrumentation._provenance import Provenance
    from specscope.instrumentation.tracer import Tracer

MAX_ITEMS = 16
"""Tensors looked at inside one tuple/list/dict argument (bounds the per-call cost)."""

LayerInput = Callable[[tuple, dict], "torch.Tensor | None"]


class PointTable:
    """Hook points of one module hook, made on first sight: ``prefix:key`` or ``prefix:key.index``."""

    __slots__ = ("_prefix", "_sampling", "_points", "_runs")

    def __init__(self, prefix: str, sampling: SamplingConfig) -> None:
        self._prefix = prefix
        self._sampling = sampling
        self._points: dict[Any, TensorPoint] = {}
        self._runs: dict[tuple[str, int], tuple[TensorPoint, ...]] = {}

    def get(self, key: str | tuple[str, Any]) -> TensorPoint:
        point = self._points.get(key)
        if point is None:
            suffix = key if isinstance(key, str) else f"{key[0]}.{key[1]}"
            point = self._points[key] = TensorPoint(f"{self._prefix}:{suffix}", self._sampling)
        return point

    def run(self, name: str, count: int) -> tuple[TensorPoint, ...]:
        """Points ``name.0`` .. ``name.{count-1}`` (cached: a tuple output costs no name building)."""
        points = self._runs.get((name, count))
        if points is None:
            points = self._runs[(name, count)] = tuple(self.get((name, i)) for i in range(count))
        return points


def guarded(tracer: Tracer, name: str, body: Callable[[bool, nn.Module, Any, Any], None]) -> Callable:
    """Wrap ``body(capturing, module, args, kwargs_or_output)``: count the call, tag CUDA-graph
    capture, swallow and count any exception. The counters are bumped inline (hot path)."""
    probe, failed = tracer._capturing, tracer._hook_failed

    def hook(module: nn.Module, args: tuple, extra: Any = None) -> None:
        tracer.hook_calls += 1
        try:
            capturing = probe()
            if capturing:
                tracer._capture_calls += 1
            body(capturing, module, args, extra)
        except Exception as exc:  # noqa: BLE001 - a hook must never raise into the engine
            failed(name, exc)

    return hook


def _visit(tracer: Tracer, table: PointTable, name: str, value: Any, capturing: bool) -> None:
    """Record a tensor, or the tensors one level inside a tuple / list / mapping (``name.i``)."""
    if isinstance(value, torch.Tensor):
        tracer._observe(table.get(name), value, None, capturing)
    elif isinstance(value, (tuple, list)):
        for point, item in zip(table.run(name, min(len(value), MAX_ITEMS)), value):
            if isinstance(item, torch.Tensor):
                tracer._observe(point, item, None, capturing)
    elif isinstance(value, Mapping):
        for count, (key, item) in enumerate(value.items()):
            if count == MAX_ITEMS:
                break
            if isinstance(item, torch.Tensor):
                tracer._observe(table.get((name, key)), item, None, capturing)


def positional_names(forward: Callable[..., Any]) -> tuple[str, ...]:
    """Parameter names positional arguments bind to (``inspect.signature``, up to ``*args``)."""
    names = []
    for param in inspect.signature(forward).parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        names.append(param.name)
    return tuple(names)


def draft_forward_hooks(tracer: Tracer, draft: nn.Module, hidden_arg: str, draft_width: int,
                        provenance: Provenance | None, fused_here: bool = True) -> tuple[Callable, Callable]:
    """``(pre_hook, forward_hook)`` for the draft's forward.

    The pre-hook (``with_kwargs=True``) records every tensor argument as ``draft.forward:<argname>``;
    ``hidden_arg`` is recorded with its expected width (``config.expected_fused_width`` on a
    target-fed call, ``draft_width`` on chained calls) and, on sampled target-fed calls, checked for
    provenance. With ``fused_here=False`` (the engine fuses the aux states before the forward, as
    vLLM's ``combine_hidden_states`` does) ``hidden_arg`` is always expected ``draft_width`` wide and
    provenance is checked at the fused input instead (:func:`fused_input_hook`). The forward hook
    records ``draft.forward:output`` (``output.0``, ... for a tuple).
    """
    if not fused_here:
        provenance = None
    names = positional_names(draft.forward)
    inputs = PointTable("draft.forward", tracer.sampling)
    outputs = PointTable("draft.forward", tracer.sampling)
    positional = tuple((name, inputs.get(name)) for name in names)
    hidden_point = inputs.get(hidden_arg)
    fused = tracer.config.expected_fused_width
    observe = tracer._observe

    def pre(capturing: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        fed = tracer._target_fed
        tracer._target_fed = False
        items = zip(positional, args)
        if kwargs or len(args) > len(names):
            extra = ((f"args.{i}", a) for i, a in enumerate(args[len(names):], len(names)))
            items = chain(items, (((k, inputs.get(k)), v) for k, v in chain(extra, kwargs.items())))
        for (name, point), value in items:
            if not isinstance(value, torch.Tensor):
                _visit(tracer, inputs, name, value, capturing)
            elif point is not hidden_point:
                observe(point, value, None, capturing)
            else:
                observe(point, value, fused if fed and fused_here else draft_width, capturing)
                if fed and provenance is not None and not capturing:
                    tracer._check_provenance(value, point.calls - 1)

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        _visit(tracer, outputs, "output", output, capturing)

    return (guarded(tracer, "draft.forward:input", pre), guarded(tracer, "draft.forward:output", post))


def default_layer_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The hidden state entering a decoder layer: HF layers take it as the first positional argument."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs.get("hidden_states")


def fused_input_hook(tracer: Tracer, name: str, provenance: Provenance | None) -> Callable:
    """Pre-hook on the draft submodule that receives the fused aux hidden states (vLLM: ``fc`` inside
    ``Eagle3LlamaForCausalLM.combine_hidden_states``, ``vllm/model_executor/models/llama_eagle3.py``).

    Records ``<name>:input`` (``(T, W)``) with the expected width ``config.expected_fused_width``
    (n_aux x target hidden) on every call, since the engine calls it on target hidden states only, and
    checks provenance on sampled calls.
    """
    point = TensorPoint(f"{name}:input", tracer.sampling)
    fused = tracer.config.expected_fused_width

    def pre(capturing: bool, module: nn.Module, args: tuple, unused: None) -> None:
        if not args or not isinstance(args[0], torch.Tensor):
            return
        tracer._observe(point, args[0], fused, capturing)
        if provenance is not None and not capturing:
            tracer._check_provenance(args[0], point.calls - 1)

    return guarded(tracer, f"{name}:input", pre)


def target_layer_hook(tracer: Tracer, index: int, record: bool, first: bool,
                      provenance: Provenance | None, layer_input: LayerInput,
                      layer_value: LayerInput | None = None) -> Callable:
    """Pre-hook (``with_kwargs=True``) on target decoder layer ``index``: ``target.layers.{i}:input``.

    ``record``: emit tensor events (configured capture layers); ``first``: the lowest hooked layer,
    whose call marks a new target forward; ``provenance``: fingerprint the input on sampled steps.
    ``layer_input`` picks the tensor whose metadata is recorded (every call: must not compute);
    ``layer_value`` the residual-stream value fingerprinted on sampled steps (default: the same).
    """
    value_of = layer_value or layer_input
    point = TensorPoint(f"target.layers.{index}:input", tracer.sampling) if record else None
    width = tracer.config.target_hidden_size

    def pre(capturing: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if first:  # a new target forward: the next draft call is target-fed
            tracer._target_forward()
        hidden = layer_input(args, kwargs)
        if hidden is None:
            return
        if point is not None:
            tracer._observe(point, hidden, width, capturing)
        if provenance is not None and not capturing and provenance.due:
            provenance.record(index, hidden if value_of is layer_input else value_of(args, kwargs))

    return guarded(tracer, f"target.layers.{index}:input", pre)


def final_norm_hook(tracer: Tracer, provenance: Provenance, index: int) -> Callable:
    """Forward hook on the target's final norm: fingerprint its output as layer ``index`` (= n)."""

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        if isinstance(output, tuple) and output:  # fused add-norm (vLLM, SGLang): (normed, residual)
            output = output[0]
        if not capturing and provenance.due and isinstance(output, torch.Tensor):
            provenance.record(index, output)

    return guarded(tracer, "target.norm:output", post)


def module_hooks(tracer: Tracer, name: str) -> tuple[Callable, Callable]:
    """``(pre_hook, forward_hook)`` recording ``<name>:input`` and ``<name>:output``.

    One positional argument is ``input``; several are ``input.0``, ``input.1``, ...; a tuple output
    is ``output.0``, ``output.1``, ...
    """
    table = PointTable(name, tracer.sampling)

    def pre(capturing: bool, module: nn.Module, args: tuple, unused: None) -> None:
        _visit(tracer, table, "input", args[0] if len(args) == 1 else args, capturing)

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        _visit(tracer, table, "output", output, capturing)

    return guarded(tracer, f"{name}:input", pre), guarded(tracer, f"{name}:output", post)
