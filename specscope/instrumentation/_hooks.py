"""Hook bodies: closures over a :class:`HookState`. Everything a body needs is bound when it is made.

A body runs inside the wrapper :func:`~specscope.instrumentation._forward.tap_forward` puts around
a module's ``forward``: a pre body as ``pre(capturing, due, index, args, kwargs)`` before it, a post
body as ``post(capturing, due, index, output)`` after it (``index``: the module call's index,
``due``: sampled by count). Per call a body reads its tensors' metadata into one call key
(``(shape, dtype, device)`` of each, read in C by :data:`SIGNATURE` when the value is a tensor or a
sequence of tensors) and returns when the call is not due and the key is its previous call's (one
tuple comparison); otherwise its :class:`CallSite` says whether the key is new
(:meth:`CallSite.sampled`). Only a sampled call builds names and events. Values that are not plain
tensors or sequences of tensors (mappings, mixed sequences, keyword arguments) take the general
path, which names every tensor in the key.

The wrapper counts the module calls, and an exception in a body is counted and logged once by the
state and never reaches the engine; bodies return None and the wrapper passes arguments and output
through untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from specscope import points
from specscope.instrumentation._forward import PostBody, PreBody, TracedBody
from specscope.instrumentation._sampling import CallSite, SamplingConfig
from specscope.instrumentation._state import HookState

if TYPE_CHECKING:
    from specscope.instrumentation._provenance import Provenance
    from specscope.instrumentation._replay import ReplayRecorder

    Replay = tuple[ReplayRecorder, int]
    """A static-buffer site (:mod:`specscope.instrumentation._replay`): the recorder and the site index."""

MAX_ITEMS = 16
"""Tensors looked at inside one tuple/list/dict argument (bounds the per-call cost)."""

SIGNATURE = attrgetter("shape", "dtype", "device")
"""A tensor's ``(shape, dtype, device)`` in one C call; AttributeError for a non-tensor."""

LayerInput = Callable[[tuple, dict], "Tensor | None"]


class PointTable:
    """Hook-point names of one hook, made on first sight: ``module:key`` or ``module:key.index``."""

    __slots__ = ("_module", "_names", "_runs")

    def __init__(self, module: str) -> None:
        self._module = module
        self._names: dict[Any, str] = {}
        self._runs: dict[tuple[str, int], tuple[str, ...]] = {}

    def get(self, key: str | tuple[str, Any]) -> str:
        name = self._names.get(key)
        if name is None:
            suffix = key if isinstance(key, str) else points.item(*key)
            name = self._names[key] = points.point(self._module, suffix)
        return name

    def run(self, name: str, count: int) -> tuple[str, ...]:
        """Names ``name.0`` .. ``name.{n-1}``, n = ``min(count, MAX_ITEMS)`` (cached by ``count``)."""
        run = self._runs.get((name, count))
        if run is None:
            run = self._runs[(name, count)] = tuple(self.get((name, i)) for i in range(min(count, MAX_ITEMS)))
        return run


def _tensors(table: PointTable, name: str, value: Any) -> Iterator[tuple[str, Tensor]]:
    """``(point name, tensor)`` for a tensor, or the tensors one level inside a tuple / list /
    mapping (``name.i`` / ``name.key``, at most :data:`MAX_ITEMS` items looked at)."""
    if isinstance(value, Tensor):
        yield table.get(name), value
    elif isinstance(value, (tuple, list)):
        for point, item in zip(table.run(name, len(value)), value):
            if isinstance(item, Tensor):
                yield point, item
    elif isinstance(value, Mapping):
        for count, (key, item) in enumerate(value.items()):
            if count == MAX_ITEMS:
                break
            if isinstance(item, Tensor):
                yield table.get((name, key)), item


def _general_key(items: list[tuple[str, Tensor, int | None]]) -> tuple:
    """The call key of named tensors: which points were present, and each one's signature."""
    return tuple((point, *SIGNATURE(tensor), width) for point, tensor, width in items)


def value_hook(state: HookState, sampling: SamplingConfig, table: PointTable, name: str) -> PostBody:
    """``body(capturing, due, index, value)``, recording one value as ``name`` (a forward's output, or its
    positional inputs as :func:`module_hooks` passes them). A tensor is ``name``, a sequence's
    tensors ``name.0``, ``name.1``, ..."""
    site = CallSite(sampling)

    def body(capturing: bool, due: bool, index: int, value: Any) -> None:
        if isinstance(value, Tensor):
            key = SIGNATURE(value)
            if (due or key != site.last) and site.sampled(key, due):
                state.record(table.get(name), index, value, None, capturing)
            return
        key = None
        if isinstance(value, (tuple, list)) and len(value) <= MAX_ITEMS:
            try:
                key = tuple(map(SIGNATURE, value))  # all tensors: the common output
            except AttributeError:  # something other than a tensor inside: the general path
                pass
        if key is not None:
            if (due or key != site.last) and site.sampled(key, due):
                for point, item in zip(table.run(name, len(value)), value):
                    state.record(point, index, item, None, capturing)
            return
        items = [(point, tensor, None) for point, tensor in _tensors(table, name, value)]
        key = _general_key(items)
        if (due or key != site.last) and site.sampled(key, due):
            for point, tensor, _ in items:
                state.record(point, index, tensor, None, capturing)

    return body


def positional_names(forward: Callable[..., Any]) -> tuple[str, ...]:
    """Parameter names positional arguments bind to (``inspect.signature``, up to ``*args``)."""
    names = []
    for param in inspect.signature(forward).parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        names.append(param.name)
    return tuple(names)


def draft_forward_hooks(state: HookState, sampling: SamplingConfig, draft: nn.Module, hidden_arg: str,
                        fused_width: int, draft_width: int, provenance: Provenance | None,
                        fused_here: bool = True, replay: Replay | None = None) -> tuple[PreBody, PostBody]:
    """``(pre, post)`` bodies for the draft's forward.

    The pre body records every tensor argument (positional or keyword) as ``draft.forward:<argname>``;
    ``hidden_arg`` is recorded with its expected width (``fused_width``, i.e.
    ``config.expected_fused_width``, on a target-fed call, ``draft_width`` on chained calls) and, on
    sampled target-fed calls, checked for provenance. The post body records
    ``draft.forward:output`` (``output.0``, ... for a tuple). The common call (only positional
    tensors) reads them into the call key without looking at names. With ``fused_here=False`` (the
    engine fuses the aux states before the draft forward, as vLLM's ``combine_hidden_states`` does)
    ``hidden_arg`` is expected ``draft_width`` wide on every call and provenance is checked at the
    fused input instead (:func:`fused_input_hook`). ``replay``: the static-buffer site of the
    target-fed input (:func:`provenance_check`).
    """
    if not fused_here:
        fused_width, provenance = draft_width, None
    check = provenance_check(state, replay) if provenance is not None else None
    names = positional_names(draft.forward)
    inputs = PointTable(points.DRAFT_FORWARD)
    positional = tuple(inputs.get(name) for name in names)
    hidden_point = inputs.get(hidden_arg)
    hidden_at = names.index(hidden_arg) if hidden_arg in names else None
    count = len(names)
    site = CallSite(sampling)

    def pre(capturing: bool, due: bool, index: int, args: tuple, kwargs: dict) -> None:
        fed = state.target_fed
        if fed:
            state.target_fed = False
        width = fused_width if fed else draft_width
        key = None
        if not kwargs and len(args) == count:
            try:
                key = (width, *map(SIGNATURE, args))
            except AttributeError:  # a positional argument that is not a tensor: the general path
                pass
        if key is None:
            _draft_call(capturing, due, index, args, kwargs, fed, width)
            return
        if (due or key != site.last) and site.sampled(key, due):
            for point, value in zip(positional, args):
                state.record(point, index, value, width if point is hidden_point else None, capturing)
        if fed and check is not None and hidden_at is not None:
            check(capturing, args[hidden_at], index)

    def _draft_call(capturing: bool, due: bool, index: int, args: tuple, kwargs: dict, fed: bool,
                    width: int) -> None:
        # General path: named arguments (keywords, extra positionals, containers, non-tensors).
        named = chain(zip(names, args),
                      ((points.item("args", i), a) for i, a in enumerate(args[count:], count)),
                      kwargs.items())
        items = [(point, tensor, width if point == hidden_point else None)
                 for name, value in named for point, tensor in _tensors(inputs, name, value)]
        key = _general_key(items)
        if (due or key != site.last) and site.sampled(key, due):
            for point, tensor, expected in items:
                state.record(point, index, tensor, expected, capturing)
        if fed and check is not None:
            for point, tensor, _ in items:
                if point == hidden_point:
                    check(capturing, tensor, index)

    return pre, value_hook(state, sampling, PointTable(points.DRAFT_FORWARD), points.OUTPUT)


def provenance_check(state: HookState, replay: Replay | None) -> Callable[[bool, Tensor, int], None]:
    """``check(capturing, hidden, index)`` for a target-fed draft input: into the static buffer
    when it is being captured or the buffer is armed (matched later by the host, no sync), else
    the eager match (:meth:`HookState.check_provenance`, a sync on sampled calls)."""

    def check(capturing: bool, hidden: Tensor, index: int) -> None:
        if replay is not None and (capturing or replay[0].armed):
            replay[0].write(replay[1], hidden, capturing)
        elif not capturing:
            state.check_provenance(hidden, index)

    return check


def fused_input_hook(state: HookState, sampling: SamplingConfig, name: str, fused_width: int,
                     provenance: Provenance | None, replay: Replay | None = None) -> PreBody:
    """Pre body on the draft submodule that receives the fused aux hidden states (vLLM: ``fc``, called
    by ``Eagle3LlamaForCausalLM.combine_hidden_states``, ``vllm/model_executor/models/llama_eagle3.py``).

    Records ``<name>:input`` ``(T, W)`` with the expected width ``fused_width`` (n_aux x target hidden)
    on every call, since the engine calls it on the target's aux hidden states only, and checks
    provenance on sampled calls (``replay``: :func:`provenance_check`).
    """
    point = points.point(name, points.INPUT)
    site = CallSite(sampling)
    check = provenance_check(state, replay) if provenance is not None else None

    def pre(capturing: bool, due: bool, index: int, args: tuple, kwargs: dict) -> None:
        if not args or not isinstance(args[0], Tensor):
            return
        key = SIGNATURE(args[0])
        if (due or key != site.last) and site.sampled(key, due):
            state.record(point, index, args[0], fused_width, capturing)
        if check is not None:
            check(capturing, args[0], index)

    return pre


def default_layer_input(args: tuple, kwargs: dict) -> Tensor | None:
    """The hidden state entering a decoder layer: HF layers take it as the first positional argument."""
    if args and isinstance(args[0], Tensor):
        return args[0]
    return kwargs.get("hidden_states")


def target_layer_hook(state: HookState, sampling: SamplingConfig, index: int, width: int, record: bool,
                      first: bool, provenance: Provenance | None, layer_input: LayerInput,
                      layer_value: LayerInput | None = None,
                      replay: Replay | None = None) -> tuple[PreBody, tuple[LayerInput, TracedBody]]:
    """Pre body on target decoder layer ``index``: ``target.layers.{i}:input``, and its ``traced``
    observation for compiled calls (:func:`~specscope.instrumentation._forward.tap_forward`).

    ``width``: the expected hidden width (``config.target_hidden_size``); ``record``: emit tensor
    events (configured capture layers); ``first``: the lowest hooked layer, whose call marks a new
    target forward; ``provenance``: fingerprint the input on sampled steps. ``layer_input`` picks the
    tensor whose metadata is recorded (every call: it must not compute); ``layer_value`` the
    residual-stream value fingerprinted on sampled steps (default: the same tensor); ``replay``: the
    layer's static-buffer site, written with that value under CUDA-graph capture (and, once armed,
    on eager calls), so replays count the layer's calls and refresh its fingerprints.
    """
    name = points.target_layer_input(index)
    site = CallSite(sampling)

    def observe(capturing: bool, due: bool, call: int, hidden: Tensor, args: tuple | None,
                kwargs: dict | None) -> None:
        if first:  # a new target forward: the next draft call is target-fed
            state.target_forward()
        if record:
            key = SIGNATURE(hidden)
            if (due or key != site.last) and site.sampled(key, due):
                state.record(name, call, hidden, width, capturing)
        # Once the buffer is written (capture, or armed by one) it is the provenance path: the draft
        # input is matched there too, so the eager fingerprints would never be read.
        buffered = replay is not None and (capturing or replay[0].armed)
        if buffered or (provenance is not None and not capturing and provenance.due):
            value = hidden if layer_value is None or args is None else layer_value(args, kwargs)
            if buffered:
                replay[0].write(replay[1], value, capturing)
            else:
                provenance.record(index, value)

    def pre(capturing: bool, due: bool, call: int, args: tuple, kwargs: dict) -> None:
        hidden = layer_input(args, kwargs)
        if hidden is not None:
            observe(capturing, due, call, hidden, args, kwargs)

    def traced(capturing: bool, due: bool, call: int, value: Tensor) -> None:
        # a compiled call: the graph handed over the residual-stream value itself (same shape as
        # the layer's input), recorded and fingerprinted as the eager pre records the input
        observe(capturing, due, call, value, None, None)

    pick = layer_value or layer_input
    return pre, (pick, traced)


def final_norm_hook(state: HookState, provenance: Provenance, index: int,
                    replay: Replay | None = None) -> PostBody:
    """Post body on the target's final norm: fingerprint its output as layer ``index`` (= n)
    (``replay``: its static-buffer site, as for a layer)."""

    def post(capturing: bool, due: bool, call: int, output: Any) -> None:
        if isinstance(output, tuple) and output:  # fused add-norm (vLLM, SGLang): (normed, residual)
            output = output[0]
        if not isinstance(output, Tensor):
            return
        if replay is not None and (capturing or replay[0].armed):
            replay[0].write(replay[1], output, capturing)
        elif not capturing and provenance.due:
            provenance.record(index, output)

    return post


def module_hooks(state: HookState, sampling: SamplingConfig, name: str) -> tuple[PreBody, PostBody]:
    """``(pre, post)`` bodies recording ``<name>:input`` and ``<name>:output``.

    One positional argument is ``input``; several are ``input.0``, ``input.1``, ...; a tuple output
    is ``output.0``, ``output.1``, ...
    """
    table = PointTable(name)
    inputs = value_hook(state, sampling, table, points.INPUT)

    def pre(capturing: bool, due: bool, index: int, args: tuple, kwargs: dict) -> None:
        inputs(capturing, due, index, args[0] if len(args) == 1 else args)

    return pre, value_hook(state, sampling, table, points.OUTPUT)
