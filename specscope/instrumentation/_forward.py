"""Attach hook bodies to a module by wrapping its ``forward``, not through torch's hook registry.

Mechanism (the convention of Hugging Face accelerate's ``add_hook_to_module``,
``accelerate/hooks.py``): the module instance gets a ``forward`` attribute that runs the pre body,
the previous forward and the post body. ``nn.Module._call_impl`` calls ``self.forward`` on its fast
path, which it leaves for a slower one as soon as any torch hook is registered on the module (or
globally); that slow path alone cost about as much as the whole budget of a shape-only hook
(docs/performance.md, "Shape-only hook"). Engines therefore run unchanged, with one extra Python frame per hooked
module call.

The wrapper is bound with :class:`types.MethodType` and calls the class's ``forward`` function with
the module it is bound to, so that ``copy.deepcopy`` (which rebinds methods to the copy) yields a
copy that runs its own forward; a copy is not instrumented (it records nothing, it is not the
module the tracer hooked). A module whose ``forward`` was already an instance attribute (another
wrapper) keeps it in its ``__dict__`` under a private name and the wrapper calls it through
``self``, so copies get theirs too. ``inspect.signature(module.forward)`` is the previous forward's
(``__signature__`` / ``__wrapped__``, as ``functools.wraps`` would set them).

Guarantees: the bodies' exceptions are counted and logged once per point by
:meth:`HookState.failed` and never reach the engine; the output is returned as the forward returned
it. Under ``torch.compile`` tracing (``torch.compiler.is_compiling()``, a constant to TorchDynamo) the
wrapper calls the previous forward, and, for a hook given a ``traced`` observation, first puts one
call of the custom op ``specscope::observe`` into the graph with the tensor that observation picks:
the compiled graph then calls back into specscope with that tensor on every run (a
``torch.library`` op is opaque to the compiler and runs its Python implementation), so a compiled
target's capture layers are still seen (docs/design.md, "Where the engines let us in"). CUDA-graph
replay runs no Python: while a graph is captured, eager and compiled bodies alike hand their value
to the static buffer of :mod:`specscope.instrumentation._replay`, whose device writes the graph
replays.
:meth:`ForwardTap.remove` restores the module; when something wrapped ``forward`` after us, that
wrapper stays in place and ours becomes a pass-through (a compiled graph that still calls the op
finds no observer and does nothing). :meth:`ForwardTap.suspend` does the same until
:meth:`ForwardTap.resume` puts ours back (a tracer paused for a while).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specscope.instrumentation._state import HookState

PreBody = Callable[[bool, bool, int, tuple, dict], None]
"""``pre(capturing, due, index, args, kwargs)``: runs before the forward with its arguments;
``index``: the module call's index (the ``call_index`` of its events); ``due``: the call is sampled
by count (:class:`~specscope.instrumentation._sampling.CallCount`)."""
PostBody = Callable[[bool, bool, int, Any], None]
"""``post(capturing, due, index, output)``: runs after the forward with what it returned."""

TracedBody = Callable[[bool, bool, int, torch.Tensor], None]
"""``traced(capturing, due, index, tensor)``: a pre body for compiled calls, given the one tensor the
hook's ``pick(args, kwargs)`` took from the call while TorchDynamo traced it; ``capturing``: the
compiled graph is being captured into a CUDA graph (the body's device ops are then replayed)."""
Pick = Callable[[tuple, dict], "torch.Tensor | None"]

_PREVIOUS = "_specscope_previous_forward_"
_serial = itertools.count()
_observers: dict[int, Callable[[torch.Tensor], None]] = {}
_tokens: dict[torch.device, torch.Tensor] = {}


# Defined on a torch.library.Library, not with torch.library.custom_op: a compiled graph calls the op
# on every run, paused or not, and custom_op's Python wrapper cost about 13 us per call against
# 1.5 us for the dispatcher calling the kernel straight (docs/performance.md, "vLLM decode").
_LIBRARY = torch.library.Library("specscope", "DEF")
_LIBRARY.define("observe(Tensor value, Tensor(a!) token, int site) -> ()")


def _observe(value: torch.Tensor, token: torch.Tensor, site: int) -> None:
    """Called by a compiled graph on every run: hand ``value`` to the observer of ``site``. ``token``
    is a one-element tensor the op declares it mutates (it does not), so no compiler drops the call."""
    observer = _observers.get(site)
    if observer is not None:
        observer(value)


def _observe_fake(value: torch.Tensor, token: torch.Tensor, site: int) -> None:
    return None


_LIBRARY.impl("observe", _observe, "CompositeExplicitAutograd")
torch.library.register_fake("specscope::observe", _observe_fake, lib=_LIBRARY)


def _token(module: nn.Module) -> torch.Tensor:
    """The op's token on the module's device, made outside any trace."""
    device = next(itertools.chain(module.parameters(), module.buffers()), torch.zeros(0)).device
    if device not in _tokens:
        _tokens[device] = torch.zeros(1, device=device)
    return _tokens[device]


class ForwardTap:
    """Handle of one wrapped ``forward`` (what :meth:`HookState.install` owns): :meth:`remove`, and
    :meth:`suspend` / :meth:`resume` to take the wrapper out for a while."""

    __slots__ = ("_module", "_function", "_previous_key", "_switch", "_suspended")

    def __init__(self, module: nn.Module, function: Callable, previous_key: str | None,
                 switch: Callable[[bool], None]) -> None:
        self._module, self._function, self._previous_key, self._switch = (
            module, function, previous_key, switch)
        self._suspended = False

    def _outermost(self, module: nn.Module) -> bool:
        current = module.__dict__.get("forward")
        return getattr(current, "__func__", None) is self._function and current.__self__ is module

    def _restore_previous(self, module: nn.Module) -> None:
        if self._previous_key is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = module.__dict__[self._previous_key]

    def remove(self) -> None:
        """Restore the module's previous ``forward`` if ours is still the outermost; else leave
        the outer wrapper alone. Either way ours passes through from now on (a reference to it
        kept elsewhere stays harmless). Idempotent."""
        module, self._module = self._module, None
        if module is None:
            return
        self._switch(False)
        if self._outermost(module):
            self._restore_previous(module)
            if self._previous_key is not None:
                del module.__dict__[self._previous_key]

    def suspend(self, in_place: bool = False) -> None:
        """Until :meth:`resume`, the module runs its previous ``forward`` as if never wrapped (when a
        later wrapper covers ours, ours stays under it and passes through). ``in_place``: ours stays
        the module's ``forward`` and passes through, and a compiled graph's op finds no observer
        (for a module compiled through the wrapper: vLLM's compiled target crashed when it was taken
        out). Idempotent; nothing after :meth:`remove`."""
        module = self._module
        if module is None or self._suspended:
            return
        self._switch(False)
        self._suspended = not in_place and self._outermost(module)
        if self._suspended:
            self._restore_previous(module)

    def resume(self) -> None:
        """Undo :meth:`suspend`: ours observes again (and is the outermost again where it was
        taken out and nothing wrapped the module since). Idempotent; nothing after :meth:`remove`."""
        module = self._module
        if module is None:
            return
        self._switch(True)
        if self._suspended:
            self._suspended = False
            previous = module.__dict__.get(self._previous_key) if self._previous_key else None
            if module.__dict__.get("forward") is previous:  # not wrapped again while we were out
                module.__dict__["forward"] = types.MethodType(self._function, module)


def tap_forward(module: nn.Module, state: HookState, pre: PreBody | None = None,
                post: PostBody | None = None, pre_point: str = "", post_point: str = "",
                traced: tuple[Pick, TracedBody] | None = None) -> ForwardTap:
    """Wrap ``module.forward`` to run ``pre`` and / or ``post`` around it; returns the handle.

    Per module call the wrapper takes the call's index and whether it is due by count from one
    :class:`~specscope.instrumentation._sampling.CallCount` (:meth:`HookState.count`; each body call
    is a hook call, ``state.calls``), probes once for CUDA-graph capture (``state.capture_calls``)
    and passes all three to the bodies. An exception in a body or in the probe is counted at
    ``pre_point`` / ``post_point`` (:meth:`HookState.failed`) and the call goes on. ``traced``:
    ``(pick, body)`` observes compiled calls too: while Dynamo traces, ``pick(args, kwargs)`` chooses
    a tensor (it may compute, in the graph) and each run of the compiled graph calls ``body(capturing,
    due, index, tensor)``, counted with the eager calls.
    """
    compiling, probe, failed = torch.compiler.is_compiling, state.capturing, state.failed
    inner, previous_key, original = _inner_forward(module)
    count = state.count((pre is not None) + (post is not None))
    owner: nn.Module | None = module
    site = next(_serial)
    pick = None
    if traced is not None:
        pick, body = traced
        token = _token(module)

        def observed(value: torch.Tensor) -> None:
            index = count.calls
            count.calls = index + 1
            due = index == count.due
            if due:
                count.schedule()
            try:
                capturing = probe is not None and probe()
                if capturing:
                    state.capture_calls += count.bodies
                body(capturing, due, index, value)
            except Exception as exc:  # noqa: BLE001 - a hook must never raise into the engine
                failed(pre_point, exc)

        _observers[site] = observed

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if compiling():  # traced by Dynamo: the op (when asked for) is all the graph holds of us
            if pick is not None and self is owner:
                value = pick(args, kwargs)
                if value is not None:
                    torch.ops.specscope.observe(value, token, site)
            return inner(self, *args, **kwargs)
        if self is not owner:  # a copy, or removed: pass through
            return inner(self, *args, **kwargs)
        index = count.calls
        count.calls = index + 1
        due = index == count.due
        if due:
            count.schedule()
        capturing = False
        if probe is not None:
            try:
                if probe():
                    capturing = True
                    state.capture_calls += count.bodies
            except Exception as exc:  # noqa: BLE001 - a hook must never raise into the engine
                failed(pre_point or post_point, exc)
        if pre is not None:
            try:
                pre(capturing, due, index, args, kwargs)
            except Exception as exc:  # noqa: BLE001
                failed(pre_point, exc)
        output = inner(self, *args, **kwargs)
        if post is not None:
            try:
                post(capturing, due, index, output)
            except Exception as exc:  # noqa: BLE001
                failed(post_point, exc)
        return output

    def switch(on: bool) -> None:
        nonlocal owner
        owner = module if on else None
        if not on:
            _observers.pop(site, None)
        elif pick is not None:
            _observers[site] = observed

    functools.update_wrapper(forward, original)
    try:
        forward.__signature__ = _with_self(inspect.signature(module.forward))  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # no signature to give (a builtin): inspect says so itself
        pass
    module.__dict__["forward"] = types.MethodType(forward, module)
    return ForwardTap(module, forward, previous_key, switch)


def _inner_forward(module: nn.Module) -> tuple[Callable[..., Any], str | None, Callable[..., Any]]:
    """``(inner, previous_key, original)``: ``inner(self, *args, **kwargs)`` runs the forward the
    module has now; ``previous_key`` names where an instance-attribute forward was moved (None
    when the forward is the class's); ``original`` is what ``__wrapped__`` points to."""
    if "forward" not in module.__dict__:
        function = inspect.getattr_static(module, "forward")
        if isinstance(function, types.FunctionType):
            return function, None, function
    previous = module.forward
    key = f"{_PREVIOUS}{next(_serial)}"
    module.__dict__[key] = previous

    def inner(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # A deep copy has its own copy of the previous forward under ``key``; the owner, once
        # restored, no longer has it there.
        return self.__dict__.get(key, previous)(*args, **kwargs)

    return inner, key, previous


def _with_self(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` of a bound forward with a leading ``self``, so that binding drops it again."""
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return signature.replace(parameters=[this, *signature.parameters.values()])
