"""Hooks under torch.compile: vLLM compiles its models (unless ``enforce_eager``), and TorchDynamo
inlines module hooks into the graph it traces. A hook with Python side effects broke a ``fullgraph``
compile of the whole engine (seen in a real vLLM server); compiled code must run without them."""

from __future__ import annotations

import torch
from _list_sink import ListSink
from torch import nn

from specscope import RunConfig, Tracer, instrument
from specscope.events import ProvenanceEvent, TensorEvent


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden_states)


class Target(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.norm = nn.LayerNorm(8)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class Draft(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 8)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc(hidden_states)


def test_fullgraph_compile_of_a_hooked_model_runs_without_the_hooks():
    config = RunConfig(aux_layer_ids_resolved=(0, 1, 2), target_hidden_size=8, expected_fused_width=24,
                       k=2, num_target_layers=4)
    sink = ListSink()
    tracer = Tracer(sink, engine="compiled", engine_version="0", target_model="t", draft_model="d",
                    config=config, provenance_every=1)
    target = Target()
    instrument(tracer, draft=Draft(), target=target, draft_hidden_size=8)
    compiled = torch.compile(target, fullgraph=True, backend="eager")  # Dynamo's tracing, no codegen
    x = torch.randn(2, 8)
    assert torch.allclose(compiled(x), target.norm(target.layers[3](target.layers[2](
        target.layers[1](target.layers[0](x))))))
    assert tracer.hook_errors == 0
    before = tracer.hook_calls
    target(x)  # eager calls are still observed
    assert tracer.hook_calls > before
    tracer.close()


def test_a_compiled_target_still_reports_its_capture_layers_and_provenance():
    """vLLM's default: the target compiled. The capture-layer hooks put one ``specscope::observe`` op
    into the graph, which hands the layer's value back on every compiled run: the layers' events and
    the fingerprints that name which layers reached the draft are recorded as in eager mode."""
    config = RunConfig(aux_layer_ids_resolved=(0, 1, 2), target_hidden_size=8, expected_fused_width=24,
                       k=2, num_target_layers=4)
    sink = ListSink()
    tracer = Tracer(sink, engine="compiled", engine_version="0", target_model="t", draft_model="d",
                    config=config, provenance_every=1, compiled=True)
    target, draft = Target(), Draft()
    instrument(tracer, draft=draft, target=target, draft_hidden_size=8)
    compiled = torch.compile(target, fullgraph=True, backend="aot_eager", dynamic=True)
    for rows in (3, 5):
        x = torch.randn(rows, 8)
        compiled(x)
        with torch.no_grad():  # what the engine captured: the hidden states entering layers 0, 1, 2
            entering = [x, Layer.forward(target.layers[0], x)]  # the class's forward: no hook fires
            entering.append(Layer.forward(target.layers[1], entering[1]))
        calls_before = tracer.hook_calls
        draft(torch.zeros(rows, dtype=torch.long), torch.cat(entering, dim=-1))
        assert tracer.hook_calls > calls_before
    tracer.close()
    assert tracer.hook_errors == 0 and tracer.graph_mode == "compiled"
    layers = {e.hook_point for e in sink.of(TensorEvent) if e.hook_point.startswith("target.layers.")}
    assert layers == {"target.layers.0:input", "target.layers.1:input", "target.layers.2:input"}
    received = [e.received for e in sink.of(ProvenanceEvent)]
    assert received and all(r == (0, 1, 2) for r in received), received


def test_a_compiled_target_captured_into_a_cuda_graph_writes_the_replay_buffer():
    """vLLM captures its compiled graphs into CUDA graphs: the op's body, run at capture, must issue
    the static-buffer writes the replays repeat (forced capture on a CPU: they run at once)."""
    from _hooked_pair import AUX, CONFIG, HIDDEN
    from _hooked_pair import Draft as PairDraft
    from _hooked_pair import Target as PairTarget

    sink = ListSink()
    tracer = Tracer(sink, engine="compiled", engine_version="0", target_model="t", draft_model="d",
                    config=CONFIG, provenance_every=1, compiled=True)
    tracer.hook_state.capturing = lambda: True
    target, draft = PairTarget(), PairDraft()
    instrument(tracer, draft=draft, target=target, draft_hidden_size=HIDDEN)
    compiled = torch.compile(target, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(2):
            _, aux = compiled(torch.randn(4, HIDDEN))
            draft(torch.zeros(2, dtype=torch.long), aux[1:3])
    assert sink.of(ProvenanceEvent) == []  # under capture nothing is matched on the engine thread
    tracer.close()
    assert tracer.hook_errors == 0 and tracer.graph_mode == "cuda_graph"
    replayed = {e.hook_point for e in sink.of(TensorEvent) if e.graph_phase == "replay"}
    assert replayed == {f"target.layers.{i}:input" for i in AUX}
    assert [e.received for e in sink.of(ProvenanceEvent)] == [AUX]


def test_a_paused_compiled_target_keeps_its_graph_and_records_nothing_until_resumed():
    """Taking a wrapper out from under vLLM's compiled target crashed it. Paused, a compiled tracer's
    wrappers stay where the graph was traced through them and pass through; resumed, they record."""
    config = RunConfig(aux_layer_ids_resolved=(0, 1, 2), target_hidden_size=8, expected_fused_width=24,
                       k=2, num_target_layers=4)
    sink = ListSink()
    tracer = Tracer(sink, engine="compiled", engine_version="0", target_model="t", draft_model="d",
                    config=config, first_calls=10_000, compiled=True)
    target = Target()
    instrument(tracer, draft=Draft(), target=target, draft_hidden_size=8)
    wrappers = [layer.__dict__.get("forward") for layer in target.layers]
    assert wrappers[0] is not None
    compiled = torch.compile(target, backend="aot_eager")
    x = torch.randn(3, 8)
    expected = compiled(x)
    recorded = len(sink.of(TensorEvent))
    assert recorded > 0
    tracer.pause()
    assert [layer.__dict__.get("forward") for layer in target.layers] == wrappers  # left in place
    assert torch.equal(compiled(x), expected)
    target(x)  # an eager call passes through too
    assert len(sink.of(TensorEvent)) == recorded
    tracer.resume()
    compiled(x)
    assert len(sink.of(TensorEvent)) > recorded
    tracer.close()
    assert tracer.hook_errors == 0
