"""Realistic event sequences for doctor tests: what the instrumentation records for one EAGLE-3 run.

The shapes follow the reference engine (SmolLM2-135M target: 30 layers, hidden 576; EAGLE-3 draft
capturing layers (2, 15, 27), fused width 3 x 576 = 1728, chain of k = 4 drafts) and the recording
contract of ``specscope.instrumentation``:

- per request: a prefill (``target.layers.{i}:input`` for the capture layers, width 576), then a
  target-fed draft call (``draft.forward:hidden_states`` expected 1728) with a provenance sample;
- per verify step: k - 1 chained draft calls (expected width 576 = draft hidden), the verify step,
  the target's verify forward, and the next target-fed draft call over the accepted tokens.

Every call is recorded (a tracer with ``sample_every=1``), so recorded counts are exact here.
:class:`RankTrace` holds one rank's behaviour; the scenario functions at the end build the healthy
run and one run per failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import cycle, islice

from specscope.events import (
    Event,
    LoadReport,
    LosslessAudit,
    ProvenanceEvent,
    RankStart,
    RankStatus,
    RequestEnd,
    RequestStart,
    RunConfig,
    RunStart,
    TensorEvent,
    VerifyStep,
)
from specscope.storage import Store

LAYERS = 30
HIDDEN = 576
AUX = (2, 15, 27)
FUSED = len(AUX) * HIDDEN  # 1728
DRAFT_HIDDEN = 576
DRAFT_VOCAB = 32000
K = 4
PHASES = {"eager": "eager", "cuda_graph": "replay"}  # graph_phase of a rank's events by graph mode, else capture
PROMPT_TOKENS = 24
LAYER_PARAMS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight", "input_layernorm.weight", "hidden_norm.weight",
                "post_attention_layernorm.weight")


@dataclass(frozen=True)
class RankTrace:
    """One rank's behaviour.

    ``fed_width``: width of the draft's target-fed ``hidden_states``; ``received``: provenance answer
    on every other target-fed call (None: provenance off); ``capture_layers``: layers whose
    ``target.layers.{i}:input`` events are recorded; ``target_points``: further target hook points;
    ``accepted``: accepted drafts per verify step, cycled; ``nonfinite``: hook point -> inf/nan count
    on each of its events (value statistics on); ``missing`` / ``unexpected``: the load report;
    ``hooks``: False records no tensor event and no provenance (``instrument()`` never called);
    ``audited``: each request's verify steps were handed to the losslessness audit, greedy, every
    emitted token the target's argmax (False: the audit off, nothing said of the output).
    """

    rank: int = 0
    fed_width: int = FUSED
    received: tuple[int | None, ...] | None = AUX
    capture_layers: tuple[int, ...] = AUX
    target_points: tuple[str, ...] = ()
    accepted: tuple[int, ...] = (2, 1, 0, 1)
    requests: int = 4
    steps_per_request: int = 8
    nonfinite: dict[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    events_dropped: int = 0
    hook_errors: int = 0
    graph_mode: str = "eager"
    hooks: bool = True
    audited: bool = True


@dataclass(frozen=True)
class Trace:
    """A run: its id, the fault label (metadata only) and its ranks."""

    run_id: str
    ranks: tuple[RankTrace, ...] = (RankTrace(),)
    fault: str | None = None
    engine: str = "specscope-reference"
    active: tuple[int, ...] | None = None  # the capture layers the engine reports active (vLLM)
    model_runner: str | None = None  # vLLM's runner, where the engine has several

    def config(self) -> RunConfig:
        return RunConfig(aux_layer_ids_resolved=AUX, aux_layer_ids_configured=AUX,
                         target_hidden_size=HIDDEN, expected_fused_width=FUSED, k=K,
                         num_target_layers=LAYERS, aux_layer_ids_active=self.active,
                         model_runner=self.model_runner)

    def events(self) -> list[Event]:
        """Every rank's events in engine order, rank by rank (for a collector)."""
        return [event for rank in self.ranks for event in _RankRecorder(self, rank).events()]

    def write(self, store: Store) -> None:
        """Write every rank's events with the collector's counters (events written / dropped)."""
        for rank in self.ranks:
            events = _RankRecorder(self, rank).events()
            store.write(events, counters={(self.run_id, rank.rank): (len(events), rank.events_dropped)})


class _RankRecorder:
    """Builds one rank's events in engine order, numbering calls per hook point like the tracer."""

    def __init__(self, trace: Trace, rank: RankTrace) -> None:
        self.trace, self.r = trace, rank
        self.out: list[Event] = []
        self.calls: dict[str, int] = {}
        self.fed_calls = 0
        self.request: str | None = None
        self.step: int | None = None
        self.ts = 1_700_000_000.0 + rank.rank

    def tick(self) -> float:
        self.ts += 0.001
        return self.ts

    def tensor(self, point: str, shape: tuple[int, ...], expected: int | None = None) -> None:
        if not self.r.hooks:
            return
        index = self.calls.get(point, 0)
        self.calls[point] = index + 1
        stats = bool(self.r.nonfinite)
        self.out.append(TensorEvent(
            self.trace.run_id, self.r.rank, point, index, shape, "float32", "cpu",
            None if expected is None else (-1,) * (len(shape) - 1) + (expected,),
            absmax=1.5 if stats else None, mean=0.0 if stats else None,
            nonfinite=self.r.nonfinite.get(point, 0) if stats else None,
            request_id=self.request, step=self.step,
            graph_phase=PHASES.get(self.r.graph_mode, "capture"), ts_wall=self.tick()))

    def target_forward(self, tokens: int) -> None:
        for layer in self.r.capture_layers:
            self.tensor(f"target.layers.{layer}:input", (1, tokens, HIDDEN), HIDDEN)
        for point in self.r.target_points:
            self.tensor(point, (1, tokens, HIDDEN))

    def draft_call(self, tokens: int, fed: bool) -> None:
        width = self.r.fed_width if fed else DRAFT_HIDDEN
        self.tensor("draft.forward:input_ids", (1, tokens))
        self.tensor("draft.forward:hidden_states", (1, tokens, width), FUSED if fed else DRAFT_HIDDEN)
        self.tensor("draft.forward:output.0", (1, tokens, DRAFT_VOCAB))
        self.tensor("draft.forward:output.1", (1, tokens, DRAFT_HIDDEN))
        if fed:
            if self.r.hooks and self.r.received is not None and self.fed_calls % 2 == 0:
                self.out.append(ProvenanceEvent(
                    self.trace.run_id, self.r.rank, self.calls["draft.forward:hidden_states"] - 1, AUX,
                    self.r.received, width, self.request, self.step, ts_wall=self.tick()))
            self.fed_calls += 1

    def events(self) -> list[Event]:
        t, r = self.trace, self.r
        world = len(t.ranks)
        self.out += [
            RankStart(t.run_id, r.rank, world, "host-a", 4000 + r.rank, f"cuda:{r.rank}", ts_wall=self.tick()),
            RunStart(t.run_id, t.engine, "0.1.0", "HuggingFaceTB/SmolLM2-135M-Instruct",
                     "specscope/eagle3-smollm2", t.config().to_dict(), t.fault, world, "host-a", r.rank,
                     ts_wall=self.tick()),
            LoadReport(t.run_id, r.rank, "draft", "/models/eagle3/model.safetensors", False,
                       len(LAYER_PARAMS) + 3 - len(r.missing), r.missing, r.unexpected, ts_wall=self.tick()),
        ]
        accepted = cycle(r.accepted)
        for q in range(r.requests):
            self.request, self.step = f"req-{q}", 0
            self.out.append(RequestStart(t.run_id, self.request, r.rank, PROMPT_TOKENS, ts_wall=self.tick()))
            self.target_forward(PROMPT_TOKENS)
            self.draft_call(PROMPT_TOKENS, fed=True)
            emitted = 0
            for step, a in enumerate(islice(accepted, r.steps_per_request)):
                for _ in range(K - 1):
                    self.draft_call(1, fed=False)
                self.out.append(VerifyStep(t.run_id, self.request, r.rank, step, K, a,
                                           draft_s=0.004, verify_s=0.011, ts_wall=self.tick()))
                emitted += a + 1
                self.step = step + 1
                self.target_forward(K + 1)
                self.draft_call(a + 1, fed=True)
            if r.audited and emitted:
                self.out.append(LosslessAudit(t.run_id, r.rank, self.request, "greedy", emitted,
                                              ts_wall=self.tick()))
            self.out.append(RequestEnd(t.run_id, self.request, r.rank, emitted, r.steps_per_request,
                                       ts_wall=self.tick()))
        hook_calls = sum(self.calls.values())
        self.out.append(RankStatus(t.run_id, r.rank, hook_calls, r.hook_errors, r.graph_mode, True,
                                   ts_wall=self.tick()))
        return self.out


# -- scenarios ---------------------------------------------------------------------------------

def healthy(run_id: str = "healthy", fault: str | None = None) -> Trace:
    """k=4, target-fed inputs 1728 wide, chained 576, provenance (2, 15, 27), AL 2.0 (p_0 = 0.75)."""
    return Trace(run_id, fault=fault)


def no_aux_capture(run_id: str = "no-aux") -> Trace:
    """The draft gets the final hidden state: width 576 of 1728, provenance [30], AL 1.0."""
    return Trace(run_id, (RankTrace(fed_width=HIDDEN, received=(LAYERS,), accepted=(0,)),),
                 fault="no-aux-capture")


def stopped_before_verify(run_id: str = "stopped") -> Trace:
    """vLLM's no-aux-capture crash: the engine reports no active capture layer, the draft's first
    (prefill) call gets the final hidden state, and the engine stops before its first verify step."""
    return Trace(run_id, (RankTrace(fed_width=HIDDEN, received=(LAYERS,), steps_per_request=0),),
                 fault="no-aux-capture", engine="vllm", active=())


def off_by_one(run_id: str = "off-by-one") -> Trace:
    """Capture ids shifted by +1: provenance (3, 16, 28), widths fine, AL 1.25 (p_0 = 0.25)."""
    return Trace(run_id, (RankTrace(received=(3, 16, 28), accepted=(1, 0, 0, 0)),),
                 fault="aux-off-by-one")


def dropped_keys(run_id: str = "dropped-keys") -> Trace:
    """Checkpoint stores layers.0.*, the loader maps midlayer.* non-strictly: 10 keys dropped,
    10 parameters left at init, AL 1.0."""
    return Trace(run_id, (RankTrace(missing=tuple(f"midlayer.{p}" for p in LAYER_PARAMS),
                                    unexpected=tuple(f"layers.0.{p}" for p in LAYER_PARAMS),
                                    accepted=(0,)),),
                 fault="unrenamed-keys")


def nonfinite(run_id: str = "nonfinite") -> Trace:
    """Value statistics on; every draft output hidden state holds 3 inf/nan elements."""
    return Trace(run_id, (RankTrace(nonfinite={"draft.forward:output.1": 3}),))


def dropped_events(run_id: str = "dropped-events") -> Trace:
    """A healthy run whose collector dropped 120 events."""
    return Trace(run_id, (RankTrace(events_dropped=120),))


def hook_errors(run_id: str = "hook-errors") -> Trace:
    """A healthy run with 3 failed hook calls."""
    return Trace(run_id, (RankTrace(hook_errors=3),))


def two_ranks_diverging(run_id: str = "two-ranks") -> Trace:
    """Rank 0 healthy (AL 2.0); rank 1 never captures aux states (576 wide, provenance [30], AL 1.0)."""
    return Trace(run_id, (RankTrace(rank=0),
                          RankTrace(rank=1, fed_width=HIDDEN, received=(LAYERS,), accepted=(0,))))


def capture_only(run_id: str = "capture-only") -> Trace:
    """Hooks fired only while CUDA graphs were captured: graph_mode capture_only, shapes healthy."""
    return Trace(run_id, (RankTrace(graph_mode="capture_only"),))


def runner_v2(run_id: str = "runner-v2") -> Trace:
    """vLLM served with model runner v2: the scheduler recorded requests and verify steps, no worker
    attached (no tensor event, no provenance), the models ran compiled."""
    return Trace(run_id, (RankTrace(hooks=False, received=None, graph_mode="compiled", audited=False),),
                 engine="vllm", model_runner="v2")


def cuda_graph(run_id: str = "cuda-graph", provenance: bool = True) -> Trace:
    """CUDA graphs replayed, the evidence read from the replay buffer: graph_mode cuda_graph, replay-phase
    events; ``provenance``: False, no draft input was matched (provenance off)."""
    return Trace(run_id, (RankTrace(graph_mode="cuda_graph", received=AUX if provenance else None),))


def partial_capture(run_id: str = "partial") -> Trace:
    """Only layers 2 and 27 captured: input 1152 (2 x 576) of 1728, provenance (2, 27)."""
    return Trace(run_id, (RankTrace(fed_width=2 * HIDDEN, received=(2, 27), capture_layers=(2, 27),
                                    accepted=(1, 0, 1, 0)),))


def capture_layers_silent(run_id: str = "capture-silent") -> Trace:
    """The target is observed (its final norm) but no capture layer ever fires; no provenance."""
    return Trace(run_id, (RankTrace(capture_layers=(), target_points=("target.model.norm:output",),
                                    received=None, fed_width=HIDDEN, accepted=(0, 1, 0, 0)),))


def saturated(run_id: str = "saturated") -> Trace:
    """Every draft accepted in every step (AL 5.0 = k + 1)."""
    return Trace(run_id, (RankTrace(accepted=(K,)),))


def few_steps(run_id: str = "few-steps") -> Trace:
    """A collapsed but short run: 1 request x 8 verify steps, below the 16-step minimum."""
    return Trace(run_id, (RankTrace(requests=1, steps_per_request=8, accepted=(0,)),))


def draft_only(run_id: str = "draft-only") -> Trace:
    """A healthy run instrumented on the draft only: no target event, no provenance."""
    return Trace(run_id, (RankTrace(capture_layers=(), received=None),))


def not_instrumented(run_id: str = "not-instrumented") -> Trace:
    """Verify steps recorded (the tracer's serving-loop calls) but no hook installed: no tensor event."""
    return Trace(run_id, (RankTrace(hooks=False),))

