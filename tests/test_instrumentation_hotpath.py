"""The hook hot path: one call key per hook call, fast and general paths recording alike."""

from __future__ import annotations

import torch
from _draft_fixture import HIDDEN, ListSink, TinyEagle3Draft, run_config
from torch import nn

from specscope import points
from specscope.events import TensorEvent
from specscope.instrumentation import SamplingConfig, Tracer, instrument


def traced(draft: nn.Module, sampling: SamplingConfig, **kwargs) -> tuple[Tracer, ListSink]:
    sink = ListSink()
    tracer = Tracer(sink, engine="e", engine_version="0", target_model="t", draft_model="d",
                    config=run_config(), sampling=sampling)
    instrument(tracer, draft=draft, **kwargs)
    return tracer, sink


def draft_args(length: int = 1, positions_length: int | None = None) -> tuple[torch.Tensor, ...]:
    """``(input_ids (1, T), positions (1, T'), hidden_states (1, T, H))``; the tiny draft does not
    read positions, so T' may differ from T."""
    return (torch.zeros(1, length, dtype=torch.long),
            torch.zeros(1, positions_length or length, dtype=torch.long), torch.zeros(1, length, HIDDEN))


def recorded(sink: ListSink) -> list[tuple]:
    return sorted((e.hook_point, e.call_index, e.shape, e.expected_shape) for e in sink.of(TensorEvent))


@torch.no_grad()
def test_keyword_and_positional_calls_record_alike():
    sampling = SamplingConfig(first_calls=2, sample_every=5)
    draft = TinyEagle3Draft().eval()
    lengths = [1, 1, 1, 2, 1, 1, 1, 1, 3, 1, 1, 1]
    positional, by_name = traced(draft, sampling), None
    for length in lengths:
        draft(*draft_args(length))  # the fast path: positional tensors only
    positional[0].close()
    by_name = traced(draft, sampling)
    for length in lengths:
        ids, pos, hidden = draft_args(length)
        draft(input_ids=ids, positions=pos, hidden_states=hidden)  # the general path: keywords
    by_name[0].close()
    assert recorded(positional[1]) == recorded(by_name[1])
    calls = sorted({e.call_index for e in positional[1].tensors(points.DRAFT_HIDDEN_STATES)})
    assert calls == [0, 1, 3, 5, 8, 10]  # first 2, new shapes at 3 and 8, every 5th


@torch.no_grad()
def test_a_new_combination_of_seen_signatures_is_recorded_whole():
    draft = TinyEagle3Draft().eval()
    tracer, sink = traced(draft, SamplingConfig(first_calls=1, sample_every=1000))
    draft(*draft_args(1))  # 0: first call
    draft(*draft_args(2))  # 1: new shapes
    draft(*draft_args(1, positions_length=2))  # 2: every signature seen before, not together
    draft(*draft_args(1, positions_length=2))  # 3: seen
    draft(*draft_args(1))  # 4: seen
    tracer.close()
    inputs = [(e.hook_point, e.call_index) for e in sink.of(TensorEvent) if ":output" not in e.hook_point]
    assert sorted({index for _, index in inputs}) == [0, 1, 2]
    assert sorted(point for point, index in inputs if index == 2) == sorted(
        points.draft_input(name) for name in ("input_ids", "positions", "hidden_states"))
    assert tracer.hook_calls == 10  # every call counted: 5 pre-hook and 5 forward-hook calls


@torch.no_grad()
def test_events_of_one_call_share_its_index():
    draft = TinyEagle3Draft().eval()
    tracer, sink = traced(draft, SamplingConfig(first_calls=0, sample_every=3))
    for _ in range(7):
        draft(*draft_args(1))
    tracer.close()
    by_point: dict[str, list[int]] = {}
    for event in sink.of(TensorEvent):
        by_point.setdefault(event.hook_point, []).append(event.call_index)
    assert len(by_point) == 5  # 3 arguments, 2 outputs
    assert all(indices == [0, 3, 6] for indices in by_point.values()), by_point


class Pair(nn.Module):
    def forward(self, x: torch.Tensor, scale: float) -> tuple[torch.Tensor, None]:
        return x * scale, None


@torch.no_grad()
def test_non_tensors_take_the_general_path():
    draft = TinyEagle3Draft().eval()
    draft.pair = Pair()
    tracer, sink = traced(draft, SamplingConfig(first_calls=1, sample_every=4), modules=("pair",))
    for call in range(6):
        draft(*draft_args(1), None)  # a positional non-tensor (the cache): the general path
        draft.pair(torch.zeros(2, 3 + (call == 2)), 2.0)  # input (tensor, float), output (tensor, None)
    tracer.close()
    assert tracer.hook_errors == 0
    calls = {point: [e.call_index for e in sink.tensors(point)] for point in (
        points.DRAFT_HIDDEN_STATES, "draft.pair:input.0", "draft.pair:output.0")}
    assert calls[points.DRAFT_HIDDEN_STATES] == [0, 4]
    assert calls["draft.pair:input.0"] == calls["draft.pair:output.0"] == [0, 2, 4]  # first, new, 4th
    assert not sink.tensors("draft.pair:input.1") and not sink.tensors("draft.pair:output.1")


def test_the_bodies_of_a_module_call_share_its_index_and_due_flag():
    """One count per module call: the pre and post bodies get the same index, the same ``due`` (first
    calls, then every Nth) and the same capture flag; hook calls are module calls x bodies and stay
    counted after removal; a capture probe that raises is counted and the call goes on."""
    from specscope.instrumentation._forward import tap_forward
    from specscope.instrumentation._state import HookState

    answers = iter([False, True, None])

    def probe() -> bool:
        answer = next(answers)
        if answer is None:
            raise RuntimeError("probe broke")
        return answer

    seen = []
    state = HookState(ListSink(), "r", 0, SamplingConfig(first_calls=1, sample_every=2), probe)
    layer = nn.Linear(2, 2)
    tap = tap_forward(layer, state, pre=lambda capturing, due, index, args, kwargs: seen.append(
                          ("pre", capturing, due, index)),
                      post=lambda capturing, due, index, output: seen.append(("post", capturing, due, index)),
                      pre_point="layer:input", post_point="layer:output")
    for _ in range(3):
        layer(torch.zeros(1, 2))
    tap.remove()
    layer(torch.zeros(1, 2))  # unhooked: not counted
    assert seen == [("pre", False, True, 0), ("post", False, True, 0), ("pre", True, False, 1),
                    ("post", True, False, 1), ("pre", False, True, 2), ("post", False, True, 2)]
    assert (state.calls, state.capture_calls, state.errors) == (6, 2, 1)
