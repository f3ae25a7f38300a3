"""Hook closures over a :class:`HookState`. Everything a hook needs is bound when it is made; the
per-call path reads tensor metadata (``.shape`` / ``.dtype`` / ``.device``), bumps counters and
compares a cached signature (:meth:`HookState.observe`).

Every hook body runs inside :func:`guarded`: an exception is counted and logged once by the state and
never reaches the engine; hooks always return None, so arguments and outputs pass through untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specscope.instrumentation import points
from specscope.instrumentation._sampling import SamplingConfig, TensorPoint
from specscope.instrumentation._state import HookState

if TYPE_CHECKING:
    from specscope.instrumentation._provenance import Provenance

MAX_ITEMS = 16
"""Tensors looked at inside one tuple/list/dict argument (bounds the per-call cost)."""

LayerInput = Callable[[tuple, dict], "torch.Tensor | None"]


class PointTable:
    """Hook points of one module hook, made on first sight: ``module:key`` or ``module:key.index``."""

    __slots__ = ("_module", "_sampling", "_points", "_runs")

    def __init__(self, module: str, sampling: SamplingConfig) -> None:
        self._module = module
        self._sampling = sampling
        self._points: dict[Any, TensorPoint] = {}
        self._runs: dict[tuple[str, int], tuple[TensorPoint, ...]] = {}

    def get(self, key: str | tuple[str, Any]) -> TensorPoint:
        point = self._points.get(key)
        if point is None:
            suffix = key if isinstance(key, str) else points.item(*key)
            point = self._points[key] = TensorPoint(points.point(self._module, suffix), self._sampling)
        return point

    def run(self, name: str, count: int) -> tuple[TensorPoint, ...]:
        """Points ``name.0`` .. ``name.{count-1}`` (cached: a tuple output costs no name building)."""
        points = self._runs.get((name, count))
        if points is None:
            points = self._runs[(name, count)] = tuple(self.get((name, i)) for i in range(count))
        return points


def guarded(state: HookState, name: str, body: Callable[[bool, nn.Module, Any, Any], None]) -> Callable:
    """Wrap ``body(capturing, module, args, kwargs_or_output)``: count the call, tag CUDA-graph
    capture, swallow and count any exception. The counters are bumped inline (hot path)."""
    probe, failed = state.capturing, state.failed

    def hook(module: nn.Module, args: tuple, extra: Any = None) -> None:
        state.calls += 1
        try:
            capturing = probe()
            if capturing:
                state.capture_calls += 1
            body(capturing, module, args, extra)
        except Exception as exc:  # noqa: BLE001 - a hook must never raise into the engine
            failed(name, exc)

    return hook


def _visit(state: HookState, table: PointTable, name: str, value: Any, capturing: bool) -> None:
    """Record a tensor, or the tensors one level inside a tuple / list / mapping (``name.i``)."""
    if isinstance(value, torch.Tensor):
        state.observe(table.get(name), value, None, capturing)
    elif isinstance(value, (tuple, list)):
        for point, item in zip(table.run(name, min(len(value), MAX_ITEMS)), value):
            if isinstance(item, torch.Tensor):
                state.observe(point, item, None, capturing)
    elif isinstance(value, Mapping):
        for count, (key, item) in enumerate(value.items()):
            if count == MAX_ITEMS:
                break
            if isinstance(item, torch.Tensor):
                state.observe(table.get((name, key)), item, None, capturing)


def positional_names(forward: Callable[..., Any]) -> tuple[str, ...]:
    """Parameter names positional arguments bind to (``inspect.signature``, up to ``*args``)."""
    names = []
    for param in inspect.signature(forward).parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        names.append(param.name)
    return tuple(names)


def draft_forward_hooks(state: HookState, sampling: SamplingConfig, draft: nn.Module, hidden_arg: str,
                        fused_width: int, draft_width: int,
                        provenance: Provenance | None) -> tuple[Callable, Callable]:
    """``(pre_hook, forward_hook)`` for the draft's forward.

    The pre-hook (``with_kwargs=True``) records every tensor argument as ``draft.forward:<argname>``;
    ``hidden_arg`` is recorded with its expected width (``fused_width``, i.e.
    ``config.expected_fused_width``, on a target-fed call, ``draft_width`` on chained calls) and, on sampled target-fed calls, checked for
    provenance. The forward hook records ``draft.forward:output`` (``output.0``, ... for a tuple).
    """
    names = positional_names(draft.forward)
    inputs = PointTable(points.DRAFT_FORWARD, sampling)
    outputs = PointTable(points.DRAFT_FORWARD, sampling)
    positional = tuple((name, inputs.get(name)) for name in names)
    hidden_point = inputs.get(hidden_arg)
    observe = state.observe

    def pre(capturing: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        fed = state.target_fed
        state.target_fed = False
        items = zip(positional, args)
        if kwargs or len(args) > len(names):
            extra = ((points.item("args", i), a) for i, a in enumerate(args[len(names):], len(names)))
            items = chain(items, (((k, inputs.get(k)), v) for k, v in chain(extra, kwargs.items())))
        for (name, point), value in items:
            if not isinstance(value, torch.Tensor):
                _visit(state, inputs, name, value, capturing)
            elif point is not hidden_point:
                observe(point, value, None, capturing)
            else:
                observe(point, value, fused_width if fed else draft_width, capturing)
                if fed and provenance is not None and not capturing:
                    state.check_provenance(value, point.calls - 1)

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        _visit(state, outputs, points.OUTPUT, output, capturing)

    return (guarded(state, points.point(points.DRAFT_FORWARD, points.INPUT), pre),
            guarded(state, points.DRAFT_OUTPUT, post))


def default_layer_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The hidden state entering a decoder layer: HF layers take it as the first positional argument."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs.get("hidden_states")


def target_layer_hook(state: HookState, sampling: SamplingConfig, index: int, width: int, record: bool,
                      first: bool, provenance: Provenance | None, layer_input: LayerInput) -> Callable:
    """Pre-hook (``with_kwargs=True``) on target decoder layer ``index``: ``target.layers.{i}:input``.

    ``width``: the expected hidden width (``config.target_hidden_size``); ``record``: emit tensor
    events (configured capture layers); ``first``: the lowest hooked layer, whose call marks a new
    target forward; ``provenance``: fingerprint the input on sampled steps.
    """
    name = points.target_layer_input(index)
    point = TensorPoint(name, sampling) if record else None

    def pre(capturing: bool, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if first:  # a new target forward: the next draft call is target-fed
            state.target_forward()
        hidden = layer_input(args, kwargs)
        if hidden is None:
            return
        if point is not None:
            state.observe(point, hidden, width, capturing)
        if provenance is not None and not capturing and provenance.due:
            provenance.record(index, hidden)

    return guarded(state, name, pre)


def final_norm_hook(state: HookState, provenance: Provenance, index: int) -> Callable:
    """Forward hook on the target's final norm: fingerprint its output as layer ``index`` (= n)."""

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        if not capturing and provenance.due and isinstance(output, torch.Tensor):
            provenance.record(index, output)

    return guarded(state, points.TARGET_NORM_OUTPUT, post)


def module_hooks(state: HookState, sampling: SamplingConfig, name: str) -> tuple[Callable, Callable]:
    """``(pre_hook, forward_hook)`` recording ``<name>:input`` and ``<name>:output``.

    One positional argument is ``input``; several are ``input.0``, ``input.1``, ...; a tuple output
    is ``output.0``, ``output.1``, ...
    """
    table = PointTable(name, sampling)

    def pre(capturing: bool, module: nn.Module, args: tuple, unused: None) -> None:
        _visit(state, table, points.INPUT, args[0] if len(args) == 1 else args, capturing)

    def post(capturing: bool, module: nn.Module, args: tuple, output: Any) -> None:
        _visit(state, table, points.OUTPUT, output, capturing)

    return (guarded(state, points.point(name, points.INPUT), pre),
            guarded(state, points.point(name, points.OUTPUT), post))
