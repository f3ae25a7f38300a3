"""specscope.instrumentation on real torch modules: a random Llama target and an EAGLE-3-shaped draft."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from _draft_fixture import AUX, HIDDEN, LAYERS, K, ListSink, TinyEagle3Draft, make_models, run_config, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

import specscope.instrumentation as instrumentation
from specscope.errors import ConfigError, HookTargetError
from specscope.events import (
    ProvenanceEvent,
    RankStart,
    RankStatus,
    RequestEnd,
    RequestStart,
    RunStart,
    TensorEvent,
    VerifyStep,
)
from specscope.instrumentation import SamplingConfig, Tracer, instrument

FUSED = len(AUX) * HIDDEN


@pytest.fixture
def models():
    return make_models()


def make_tracer(sink, **kwargs) -> Tracer:
    kwargs.setdefault("first_calls", 10_000)  # record everything unless a test is about sampling
    return Tracer(sink, engine="test-engine", engine_version="0.0", target_model="tiny-llama",
                  draft_model="tiny-eagle3", config=run_config(), **kwargs)


def all_hooks(*roots) -> dict:
    """Every hook id registered on every module of ``roots``, by module path, and each module's
    instance attributes (specscope wraps ``forward`` there, the way accelerate's hooks do)."""
    hooks = {}
    for root in roots:
        for path, module in root.named_modules():
            for attr in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks",
                         "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs"):
                hooks[(id(root), path, attr)] = tuple(getattr(module, attr).keys())
            hooks[(id(root), path, "__dict__")] = tuple(sorted(vars(module)))
            hooks[(id(root), path, "forward")] = id(vars(module).get("forward"))
    return hooks


def test_exported_names_are_complete():
    public = {name for name in vars(instrumentation) if not name.startswith("_")}
    public -= {"annotations"}
    modules = {name for name in public if type(getattr(instrumentation, name)).__name__ == "module"}
    assert set(instrumentation.__all__) == public - modules
    assert {"Tracer", "instrument", "check_load", "SamplingConfig"} <= set(instrumentation.__all__)


def test_every_hook_point_with_its_shapes(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target, modules=("fc", "target.model.norm"))
        run_engine(target, draft, tracer, requests=1, steps=2, prompt_len=6)
    points = {e.hook_point for e in sink.of(TensorEvent)}
    assert points == {
        "draft.forward:input_ids", "draft.forward:positions", "draft.forward:hidden_states",
        "draft.forward:output.0", "draft.forward:output.1",
        "target.layers.2:input", "target.layers.4:input", "target.layers.6:input",
        "draft.fc:input", "draft.fc:output", "target.model.norm:input", "target.model.norm:output",
    }
    first = {e.hook_point: e for e in reversed(sink.of(TensorEvent))}  # first event per point
    assert first["draft.forward:input_ids"].shape == (1, 6)
    assert first["draft.forward:input_ids"].dtype == "int64"
    assert first["draft.forward:hidden_states"].shape == (1, 6, FUSED)
    assert first["draft.forward:output.0"].shape == (1, 6, 256)
    assert first["draft.forward:output.1"].shape == (1, 6, HIDDEN)
    assert first["draft.fc:input"].shape == (1, 6, FUSED)
    assert first["draft.fc:output"].shape == (1, 6, HIDDEN)
    for i in AUX:
        event = first[f"target.layers.{i}:input"]
        assert event.shape == (1, 6, HIDDEN) and event.expected_shape == (-1, -1, HIDDEN)
    assert {e.device for e in sink.of(TensorEvent)} == {"cpu"}
    assert {e.graph_phase for e in sink.of(TensorEvent)} == {"eager"}
    # The target's capture layers fired once per target forward: prefill + 2 verify steps.
    assert len(sink.tensors("target.layers.4:input")) == 3


def test_run_and_rank_start_carry_the_contract(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink, run_id="run-1", fault="aux_off") as tracer:
        instrument(tracer, draft=draft, target=target)
    (rank_start,) = sink.of(RankStart)
    (run_start,) = sink.of(RunStart)
    assert (rank_start.run_id, rank_start.rank, rank_start.world_size, rank_start.device) == ("run-1", 0, 1, "cpu")
    assert rank_start.pid > 0 and rank_start.host
    assert run_start.config == {**run_config().to_dict(), "step_sample": 1.0}
    assert (run_start.engine, run_start.fault, run_start.draft_model) == ("test-engine", "aux_off", "tiny-eagle3")
    assert sink.events.index(rank_start) < sink.events.index(run_start)


def test_target_fed_and_chained_calls_carry_their_own_expectation(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target)
        run_engine(target, draft, tracer, requests=2, steps=3)
    events = sink.tensors("draft.forward:hidden_states")
    assert len(events) == 2 * 3 * K  # every draft call
    fed = [e for e in events if e.expected_shape == (-1, -1, FUSED)]
    chained = [e for e in events if e.expected_shape == (-1, -1, HIDDEN)]
    assert len(fed) == 2 * 3 and len(chained) == 2 * 3 * (K - 1)
    assert all(e.shape[-1] == FUSED for e in fed)
    assert all(e.shape == (1, 1, HIDDEN) for e in chained)
    # Each round starts target-fed: calls 0, K, 2K, ...
    assert [e.call_index for e in fed] == list(range(0, 2 * 3 * K, K))
    # Request / step tags follow start_request and record_verify.
    assert [(e.request_id, e.step) for e in fed] == [(f"req-{r}", s) for r in range(2) for s in range(3)]


def test_aux_capture_off_shows_target_width_against_fused_expectation(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target)
        run_engine(target, draft, tracer, capture="off", requests=1, steps=2)
    fed = [e for e in sink.tensors("draft.forward:hidden_states") if e.expected_shape[-1] == FUSED]
    assert len(fed) == 2
    assert all(e.shape[-1] == HIDDEN for e in fed)  # 64 where 192 was expected: AUX_NOT_FUSED evidence


def test_target_forward_alone_marks_the_next_draft_call_target_fed(models):
    """Engines that never call start_request / record_verify still get the fed/chained split."""
    target, draft = models
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target)
        with torch.no_grad():
            hidden = target(torch.tensor([[1, 2, 3]]), output_hidden_states=True).hidden_states
            aux = torch.cat([hidden[i] for i in AUX], dim=-1)
            _, out = draft(torch.tensor([[2, 3, 4]]), torch.arange(3).unsqueeze(0), aux)
            draft(torch.tensor([[5]]), torch.tensor([[3]]), out[:, -1:])
    expected = [e.expected_shape[-1] for e in sink.tensors("draft.forward:hidden_states")]
    assert expected == [FUSED, HIDDEN]
    assert all(e.request_id is None for e in sink.of(TensorEvent))


def test_outputs_bit_identical_with_and_without_tracer(models):
    target, draft = models
    plain = run_engine(target, draft)
    sink = ListSink()
    with make_tracer(sink, value_stats=True, provenance_every=1) as tracer:
        instrument(tracer, draft=draft, target=target, modules=("fc", "midlayer.*", "target.model.layers.*"))
        traced = run_engine(target, draft, tracer)
    assert tracer.hook_errors == 0 and sink.of(ProvenanceEvent)
    assert len(plain) == len(traced)
    assert all(torch.equal(a, b) for a, b in zip(plain, traced))


def test_close_removes_every_hook(models):
    target, draft = models
    run_engine(target, draft, requests=1, steps=1)  # let HF install its own output-capturing hooks
    before = all_hooks(target, draft)
    expected = run_engine(target, draft)
    sink = ListSink()
    tracer = make_tracer(sink, provenance_every=1)
    instrument(tracer, draft=draft, target=target, modules=("fc", "midlayer", "target.lm_head"))
    assert all_hooks(target, draft) != before
    traced = run_engine(target, draft, tracer)
    tracer.close()
    assert all_hooks(target, draft) == before
    assert not draft._forward_pre_hooks and not draft._forward_hooks
    assert all(not m._forward_pre_hooks for m in target.modules())
    count = len(sink.events)
    after = run_engine(target, draft)
    assert len(sink.events) == count  # nothing fires any more
    assert all(torch.equal(a, b) for a, b in zip(expected, after))
    assert all(torch.equal(a, b) for a, b in zip(expected, traced))
    status = sink.of(RankStatus)[-1]
    assert status.finished and status.hook_calls == tracer.hook_calls > 0 and sink.flushes == 1


class BrokenMetadata(torch.Tensor):
    """A tensor whose shape cannot be read: any hook reading it fails."""

    @property
    def shape(self):
        raise RuntimeError("shape unavailable")


def test_hook_exception_is_swallowed_counted_and_logged_once(models, caplog):
    target, draft = models
    broken = torch.zeros(2).as_subclass(BrokenMetadata)
    expected = run_engine(target, draft, requests=1, steps=2, draft_kwargs={"cache": None})
    sink = ListSink()
    with caplog.at_level(logging.WARNING, logger="specscope"), make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target)
        outputs = run_engine(target, draft, tracer, requests=1, steps=2, draft_kwargs={"cache": broken})
    assert all(torch.equal(a, b) for a, b in zip(expected, outputs))
    assert tracer.hook_errors == 2 * K  # every draft call's pre-hook failed
    warnings = [r for r in caplog.records if r.name == "specscope"]
    assert len(warnings) == 1 and "draft.forward:input" in warnings[0].getMessage()
    assert sink.of(RankStatus)[-1].hook_errors == 2 * K


class FailingSink(ListSink):
    def emit(self, event) -> None:
        raise OSError("disk full")


def test_failing_sink_never_reaches_the_engine(models):
    target, draft = models
    expected = run_engine(target, draft, requests=1, steps=1)
    tracer = make_tracer(FailingSink())
    instrument(tracer, draft=draft, target=target)
    outputs = run_engine(target, draft, tracer, requests=1, steps=1)
    tracer.close()
    assert tracer.hook_errors > 0
    assert all(torch.equal(a, b) for a, b in zip(expected, outputs))


def test_sampling_first_calls_new_signatures_and_every_nth():
    draft = TinyEagle3Draft().eval()
    sink = ListSink()
    tracer = make_tracer(sink, first_calls=3, sample_every=10)
    instrument(tracer, draft=draft)
    with torch.no_grad():
        for call in range(40):
            length = 2 if call == 17 else 1  # one call with a new shape
            draft(torch.zeros(1, length, dtype=torch.long), torch.zeros(1, length, dtype=torch.long),
                  torch.zeros(1, length, HIDDEN))
    tracer.close()
    indices = [e.call_index for e in sink.tensors("draft.forward:input_ids")]
    assert indices == [0, 1, 2, 10, 17, 20, 30]
    shapes = {e.call_index: e.shape for e in sink.tensors("draft.forward:input_ids")}
    assert shapes[17] == (1, 2) and shapes[20] == (1, 1)


def test_sampling_config_rejects_bad_values():
    with pytest.raises(ConfigError):
        SamplingConfig(sample_every=0)
    with pytest.raises(ConfigError):
        make_tracer(ListSink(), first_calls=-1)


def test_value_stats_are_opt_in(models):
    target, draft = models
    for enabled in (False, True):
        sink = ListSink()
        with make_tracer(sink, value_stats=enabled) as tracer:
            instrument(tracer, draft=draft, target=target)
            run_engine(target, draft, tracer, requests=1, steps=1)
        hidden = sink.tensors("draft.forward:hidden_states")[0]
        ids = sink.tensors("draft.forward:input_ids")[0]
        assert ids.absmax is None and ids.nonfinite is None
        if not enabled:
            assert hidden.absmax is None and hidden.mean is None and hidden.nonfinite is None
        else:
            assert hidden.absmax > 0 and hidden.nonfinite == 0 and abs(hidden.mean) <= hidden.absmax


def test_value_stats_count_nonfinite_values():
    draft = TinyEagle3Draft().eval()
    sink = ListSink()
    with make_tracer(sink, value_stats=True) as tracer:
        instrument(tracer, draft=draft)
        hidden = torch.ones(1, 2, HIDDEN)
        hidden[0, 0, :3] = float("nan")
        with torch.no_grad():
            draft(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), hidden)
    assert sink.tensors("draft.forward:hidden_states")[0].nonfinite == 3


@pytest.mark.parametrize(("capture", "received"), [
    ("ok", AUX),
    ("shifted", tuple(i + 1 for i in AUX)),
    ("off", (LAYERS,)),  # final norm output, HF hidden_states[-1]
])
def test_provenance_names_the_layers_the_draft_received(models, capture, received):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink, provenance_every=2) as tracer:
        instrument(tracer, draft=draft, target=target)
        run_engine(target, draft, tracer, capture=capture, requests=2, steps=3)
    events = sink.of(ProvenanceEvent)
    assert len(events) == 3  # 6 target-fed calls, every 2nd sampled
    assert {e.configured for e in events} == {AUX}
    assert {e.received for e in events} == {received}
    assert {e.width for e in events} == {HIDDEN * len(received)}
    # The call index names the draft forward call, in step with draft.forward:hidden_states.
    assert [e.call_index for e in events] == [0, 2 * K, 4 * K]


def test_provenance_reports_no_match_for_foreign_hidden_states(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink, provenance_every=1) as tracer:
        instrument(tracer, draft=draft, target=target)
        tracer.start_request("r", 3)
        with torch.no_grad():
            target(torch.tensor([[1, 2, 3]]))
            draft(torch.tensor([[1]]), torch.tensor([[0]]), torch.randn(1, 1, FUSED))
    (event,) = sink.of(ProvenanceEvent)
    assert event.received == (None, None, None)


def test_requests_and_verify_steps(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink, status_interval_s=0.0) as tracer:
        tracer.start_request(7, prompt_tokens=12)
        tracer.record_verify(7, proposed=3, accepted=2)
        tracer.record_verify(7, proposed=3, accepted=1, accepted_mask=[True, False, False],
                             draft_s=0.01, verify_s=0.02, emitted=["a", "b"])
        tracer.finish_request(7, output_tokens=5, text="ab")
    assert sink.of(RequestStart)[0].prompt_tokens == 12
    steps = sink.of(VerifyStep)
    assert [(s.request_id, s.step, s.accepted, s.mask()) for s in steps] == [("7", 0, 2, "110"), ("7", 1, 1, "100")]
    assert steps[1].emitted == ("a", "b") and steps[1].verify_s == 0.02
    (end,) = sink.of(RequestEnd)
    assert (end.verify_steps, end.output_tokens, end.text) == (2, 5, "ab")
    statuses = sink.of(RankStatus)
    assert len(statuses) == 3 and [s.finished for s in statuses] == [False, False, True]


def test_unknown_module_name_lists_the_closest_names(models):
    target, draft = models
    before = all_hooks(target, draft)
    tracer = make_tracer(ListSink())
    with pytest.raises(HookTargetError, match=r"'draft\.fcc'.*draft\.fc\b"):
        instrument(tracer, draft=draft, target=target, modules=("fcc",))
    with pytest.raises(HookTargetError, match=r"target\.model\.norm"):
        instrument(tracer, draft=draft, target=target, modules=("target.model.nrom",))
    with pytest.raises(HookTargetError, match="glob"):
        instrument(tracer, draft=draft, target=target, modules=("nothing.*glob",))
    with pytest.raises(HookTargetError):
        instrument(tracer, draft=draft, target=target, modules=(torch.nn.Linear(2, 2),))
    assert all_hooks(target, draft) == before  # nothing was hooked on failure
    assert not tracer.instrumented


def test_modules_by_object_and_glob(models):
    target, draft = models
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target, modules=(draft.lm_head, "midlayer.*"))
        run_engine(target, draft, tracer, requests=1, steps=1)
    points = {e.hook_point for e in sink.of(TensorEvent)}
    assert {"draft.lm_head:input", "draft.midlayer.0:output", "draft.midlayer.2:output"} <= points
    assert "draft.midlayer:input" not in points  # the glob names children only


def test_layer_list_and_aux_ids_are_validated(models):
    target, draft = models
    with pytest.raises(ConfigError, match="within 0..7"):
        instrument(make_tracer(ListSink()), draft=draft, target=target, aux_layer_ids=(2, 8))
    with pytest.raises(HookTargetError, match="model.layers"):
        instrument(make_tracer(ListSink()), draft=draft, target=target, layers="model.layer")
    sink = ListSink()
    with make_tracer(sink) as tracer:
        instrument(tracer, draft=draft, target=target, layers="model.layers", aux_layer_ids=(1,))
        run_engine(target, draft, tracer, requests=1, steps=1)
    assert {e.hook_point for e in sink.of(TensorEvent) if e.hook_point.startswith("target")} == {
        "target.layers.1:input"}


def test_a_tracer_instruments_once(models):
    target, draft = models
    with make_tracer(ListSink()) as tracer:
        instrument(tracer, draft=draft, target=target)
        with pytest.raises(ConfigError):
            instrument(tracer, draft=draft)


def test_reference_engine_draft_module_is_observed(models):
    """The reference engine's Eagle3Draft (a DraftCache argument, shared embedding, d2t/t2d buffers)."""
    from specscope.engine.draft import DraftCache, DraftConfig, Eagle3Draft

    target, _ = models
    torch.manual_seed(1)
    draft = Eagle3Draft(DraftConfig(hidden_size=HIDDEN, target_hidden_size=HIDDEN, intermediate_size=128,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    vocab_size=256, draft_vocab_size=256, aux_layer_ids=AUX),
                        target.get_input_embeddings()).eval()
    plain = run_engine(target, draft, requests=1, steps=2, draft_kwargs={"cache": DraftCache()})
    for capture, received in (("ok", AUX), ("off", (LAYERS,))):
        sink = ListSink()
        with make_tracer(sink, provenance_every=1) as tracer:
            instrument(tracer, draft=draft, target=target, modules=("fc", "midlayer"))
            traced = run_engine(target, draft, tracer, capture=capture, requests=1, steps=2,
                                draft_kwargs={"cache": DraftCache()})
        assert tracer.hook_errors == 0
        fed = [e for e in sink.tensors("draft.forward:hidden_states") if e.expected_shape[-1] == FUSED]
        assert [e.shape[-1] for e in fed] == [len(received) * HIDDEN] * 2
        assert {e.received for e in sink.of(ProvenanceEvent)} == {received}
        assert sink.tensors("draft.forward:output.0")[0].shape == (1, 6, 256)
        assert not any(e.hook_point.startswith("draft.forward:cache") for e in sink.of(TensorEvent))
        if capture == "ok":
            assert len(traced) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, traced))
    assert all(not m._forward_pre_hooks for m in draft.modules())


def test_rank_and_world_size_come_from_torch_distributed(tmp_path):
    from _rank_worker import run_rank  # a light module: the spawned ranks skip transformers

    torch.multiprocessing.spawn(run_rank, args=(str(tmp_path / "pg"), str(tmp_path)), nprocs=2)
    assert (tmp_path / "rank0.txt").read_text() == "0 2 2 [0]"
    assert (tmp_path / "rank1.txt").read_text() == "1 2 2 [1]"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture_is_tagged_and_replay_is_invisible():
    draft = TinyEagle3Draft().cuda().eval()
    args = (torch.zeros(1, 1, dtype=torch.long, device="cuda"), torch.zeros(1, 1, dtype=torch.long, device="cuda"),
            torch.randn(1, 1, HIDDEN, device="cuda"))
    sink = ListSink()
    tracer = make_tracer(sink)
    instrument(tracer, draft=draft)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            draft(*args)  # eager warm-up, as torch.cuda.graph requires
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            draft(*args)
        calls = tracer.hook_calls
        graph.replay()
        torch.cuda.synchronize()
    assert tracer.hook_calls == calls  # replays never reach a hook
    tracer.close()
    phases = [e.graph_phase for e in sink.tensors("draft.forward:hidden_states")]
    assert phases == ["eager", "capture"]
    assert sink.of(RankStatus)[-1].graph_mode == "mixed" and tracer.hook_errors == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 4), st.lists(st.sampled_from([3, 7, 6, 12, None]), min_size=1, max_size=3))
def test_provenance_matches_every_chunk_against_every_layer_at_once(seed, rows, sources):
    """Each chunk of a draft input goes to the candidate whose nearest rows lie closest (the first of
    a tie, configured layers first), within tolerance, as a layer-by-layer reading finds it; layers
    with fewer rows, a neighbour equal to a configured layer and chunks from no layer included."""
    from specscope.instrumentation._provenance import RELATIVE_TOLERANCE, Provenance

    generator, hidden = torch.Generator().manual_seed(seed), 32
    provenance = Provenance((3, 7), (3, 7, 6, 12), hidden, every=1)
    states = {layer: torch.randn(5 if layer != 12 else 3, hidden, generator=generator) for layer in (3, 7, 12)}
    states[6] = states[7].clone()
    prints = {layer: provenance.fingerprint(state) for layer, state in states.items()}
    chunks = [provenance.fingerprint(torch.randn(rows, hidden, generator=generator) if layer is None else
                                     states[layer][torch.randint(0, len(states[layer]), (rows,), generator=generator)])
              for layer in sources]

    def one_by_one(chunk: torch.Tensor) -> int | None:
        scores = []
        for layer in provenance.candidates:
            nearest, index = torch.cdist(chunk, prints[layer]).min(dim=1)
            scores.append(float((nearest / prints[layer].norm(dim=1)[index]).max()) if len(chunk) else math.inf)
        best = min(range(len(scores)), key=scores.__getitem__)
        return provenance.candidates[best] if scores[best] <= RELATIVE_TOLERANCE else None

    matched = provenance.match(chunks, prints)
    assert matched == tuple(one_by_one(chunk) for chunk in chunks)
    assert matched == tuple((7 if source == 6 else source) if rows else None for source in sources)
