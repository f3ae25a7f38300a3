"""Hooks as a wrapped ``forward`` (accelerate's ``add_hook_to_module`` convention): what the module
looks like to others while instrumented, after ``close``, when copied, and next to other wrappers."""

from __future__ import annotations

import copy
import functools
import inspect

import pytest
import torch
from _draft_fixture import HIDDEN, ListSink, TinyEagle3Draft, run_config
from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from torch import nn

from specscope import points
from specscope.events import TensorEvent
from specscope.instrumentation import Tracer, instrument


def traced(draft: nn.Module, **kwargs) -> tuple[Tracer, ListSink]:
    sink = ListSink()
    tracer = Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                    config=run_config(), first_calls=10_000)
    instrument(tracer, draft=draft, **kwargs)
    return tracer, sink


def draft_args(width: int = HIDDEN) -> tuple[torch.Tensor, ...]:
    """A draft call on two tokens; a ``width`` other than HIDDEN goes through ``fc``."""
    return torch.zeros(1, 2, dtype=torch.long), torch.arange(2).unsqueeze(0), torch.randn(1, 2, width)


def recorded(sink: ListSink) -> int:
    return len(sink.of(TensorEvent))


class CountingHook(ModelHook):
    """An accelerate hook that counts the calls it wraps and passes everything through."""

    def __init__(self) -> None:
        self.calls = 0

    def pre_forward(self, module, *args, **kwargs):
        self.calls += 1
        return args, kwargs


def outer_wrapper(module: nn.Module, calls: list) -> None:
    """Another tool's plain instance-attribute wrapper, installed after specscope's."""
    previous = module.forward

    @functools.wraps(previous)
    def forward(*args, **kwargs):
        calls.append(1)
        return previous(*args, **kwargs)

    module.forward = forward


@torch.no_grad()
def test_torch_hook_registry_stays_empty_and_close_restores_the_class_forward():
    draft = TinyEagle3Draft().eval()
    tracer, sink = traced(draft)
    assert "forward" in vars(draft)  # the wrapper: torch's hook dispatch stays on its fast path
    assert not draft._forward_pre_hooks and not draft._forward_hooks
    draft(*draft_args())
    assert recorded(sink) == 5  # input_ids, positions, hidden_states, output.0, output.1
    tracer.close()
    assert vars(draft).keys() == vars(TinyEagle3Draft()).keys()  # nothing of ours left
    assert draft.forward.__func__ is TinyEagle3Draft.forward


@torch.no_grad()
def test_signature_and_wrapped_are_the_original_forwards():
    draft = TinyEagle3Draft().eval()
    before = inspect.signature(draft.forward)
    tracer, _ = traced(draft)
    assert inspect.signature(draft.forward) == before
    assert list(inspect.signature(draft.forward).parameters) == ["input_ids", "positions", "hidden_states", "cache"]
    assert draft.forward.__wrapped__ is TinyEagle3Draft.forward
    assert draft.forward.__name__ == "forward"
    tracer.close()


@torch.no_grad()
def test_a_deep_copy_runs_its_own_forward_and_records_nothing():
    draft = TinyEagle3Draft().eval()
    tracer, sink = traced(draft)
    twin = copy.deepcopy(draft)
    args = draft_args()
    expected = twin(*args)[0]
    calls, count = tracer.hook_calls, recorded(sink)
    nn.init.zeros_(draft.lm_head.weight)  # the original changes; the copy must not see it
    assert torch.equal(twin(*args)[0], expected)
    assert not torch.equal(draft(*args)[0], expected)
    assert (tracer.hook_calls, recorded(sink)) == (calls + 2, count + 5)  # only the original's call
    tracer.close()
    assert torch.equal(twin(*args)[0], expected)  # the copy's pass-through outlives the tracer


@torch.no_grad()
def test_a_wrapper_installed_after_ours_survives_close():
    draft = TinyEagle3Draft().eval()
    args = draft_args()
    expected = draft(*args)
    tracer, sink = traced(draft)
    outer: list = []
    outer_wrapper(draft, outer)
    draft(*args)
    assert len(outer) == 1 and recorded(sink) == 5
    tracer.close()
    output = draft(*args)  # theirs still runs, ours passes through
    assert len(outer) == 2 and recorded(sink) == 5
    assert all(torch.equal(a, b) for a, b in zip(output, expected))


@torch.no_grad()
def test_accelerate_hooks_before_and_after_ours():
    draft = TinyEagle3Draft().eval()
    args = draft_args(3 * HIDDEN)
    expected = draft(*args)
    first, last = CountingHook(), CountingHook()
    add_hook_to_module(draft, first)  # accelerate before us on the draft: we wrap its wrapper
    theirs = draft.forward
    tracer, sink = traced(draft, modules=("fc",))
    add_hook_to_module(draft.fc, last)  # accelerate after us on fc: it wraps ours
    output = draft(*args)
    assert (first.calls, last.calls) == (1, 1)
    assert {points.point("draft.fc", points.INPUT), points.DRAFT_HIDDEN_STATES} <= {
        e.hook_point for e in sink.of(TensorEvent)}
    twin = copy.deepcopy(draft)
    nn.init.zeros_(draft.lm_head.weight)
    assert torch.equal(twin(*args)[0], expected[0])  # the copy runs its own weights
    assert (first.calls, last.calls) == (1, 1)  # not through the original's hooks: its own copies
    assert (twin._hf_hook.calls, twin.fc._hf_hook.calls) == (2, 2)
    tracer.close()
    count = recorded(sink)
    assert draft.forward is theirs  # accelerate's wrapper back in place on the draft
    draft(*args)
    assert (first.calls, last.calls) == (2, 2) and recorded(sink) == count  # theirs run, ours pass
    remove_hook_from_module(draft)
    remove_hook_from_module(draft.fc)  # restores our (now pass-through) wrapper on fc
    assert draft.forward.__func__ is TinyEagle3Draft.forward  # (accelerate leaves the bound method)
    assert not [name for name in vars(draft) if "specscope" in name]
    assert all(torch.equal(a, b) for a, b in zip(output, expected))


@torch.no_grad()
def test_a_module_hooked_twice_is_restored_whole():
    draft = TinyEagle3Draft().eval()
    tracer, sink = traced(draft, modules=("fc",), fused_input="fc")
    draft(*draft_args(3 * HIDDEN))
    assert {points.point("draft.fc", points.INPUT)} <= {e.hook_point for e in sink.of(TensorEvent)}
    tracer.close()
    assert "forward" not in vars(draft.fc) and vars(draft.fc).keys() == vars(nn.Linear(1, 1)).keys()


class Failing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the engine's own error")


def test_the_forwards_own_exception_reaches_the_caller_unchanged():
    draft = TinyEagle3Draft().eval()
    draft.failing = Failing()
    tracer, _ = traced(draft, modules=("failing",))
    with pytest.raises(RuntimeError, match="the engine's own error"):
        draft.failing(torch.zeros(2))
    assert tracer.hook_errors == 0
    tracer.close()


@torch.no_grad()
def test_a_paused_tracer_takes_its_hooks_out_and_resume_puts_them_back():
    draft = TinyEagle3Draft().eval()
    args = draft_args()
    tracer, sink = traced(draft)
    draft(*args)
    calls, count = tracer.hook_calls, recorded(sink)
    tracer.pause()
    tracer.pause()  # idempotent
    assert draft.forward.__func__ is TinyEagle3Draft.forward  # the module's own forward, no frame of ours
    draft(*args)
    assert (tracer.hook_calls, recorded(sink)) == (calls, count)
    tracer.resume()
    tracer.resume()
    draft(*args)
    assert (tracer.hook_calls, recorded(sink)) == (calls + 2, count + 5)
    tracer.close()
    tracer.resume()  # nothing to put back once closed
    assert vars(draft).keys() == vars(TinyEagle3Draft()).keys()


@torch.no_grad()
def test_a_paused_hook_under_another_wrapper_passes_through_and_the_wrapper_stays():
    draft = TinyEagle3Draft().eval()
    args = draft_args()
    tracer, sink = traced(draft)
    outer: list = []
    outer_wrapper(draft, outer)
    tracer.pause()
    draft(*args)
    assert len(outer) == 1 and recorded(sink) == 0
    tracer.resume()
    draft(*args)
    assert len(outer) == 2 and recorded(sink) == 5
    tracer.close()
