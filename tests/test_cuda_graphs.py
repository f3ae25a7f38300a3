"""Evidence recorded on CUDA-graph replay (``instrumentation/_replay.py``): a hooked target and draft,
instrumented through the public API, captured once with ``torch.cuda.graph`` and replayed with new
inputs. Replays run no Python; the device writes captured from the hooks fill the static buffer,
which the tracer reads off the step path. Needs a CUDA device (``tools/device_check.sh``)."""

from __future__ import annotations

import pytest
import torch
from _hooked_pair import AUX, CONFIG, HIDDEN, Draft, Target, capture_graph
from _list_sink import ListSink

from specscope import Tracer, instrument
from specscope.events import LosslessAudit, ProvenanceEvent, RankStatus, TensorEvent
from specscope.instrumentation import AuditSlot

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROWS, REPLAYS = 4, 5


def _replayed(capture: tuple[int, ...], compiled: bool = False) -> tuple[list, Tracer]:
    """The events recorded after the capture (replays only), and the closed tracer."""
    torch.manual_seed(0)
    sink = ListSink()
    tracer = Tracer(sink, engine="test", engine_version="0", target_model="t", draft_model="d", config=CONFIG,
                    provenance_every=1, compiled=compiled)
    target, draft = Target(capture).cuda().eval(), Draft().cuda().eval()
    instrument(tracer, draft=draft, target=target, draft_hidden_size=HIDDEN)
    run = torch.compile(target, backend="aot_eager") if compiled else target
    x = torch.randn(ROWS, HIDDEN, device="cuda")
    ids = torch.zeros(2, dtype=torch.long, device="cuda")

    def step() -> torch.Tensor:
        _, aux = run(x)
        return draft(ids, aux[1:3])  # the accepted rows only

    with torch.no_grad():
        graph = capture_graph(step)
        torch.cuda.synchronize()
        mark = len(sink.events)
        torch.cuda.set_sync_debug_mode("error")  # the step path and the status polls never sync
        try:
            for _ in range(REPLAYS):
                x.copy_(torch.randn(ROWS, HIDDEN, device="cuda"))
                graph.replay()
                tracer.status()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    tracer.close()
    return sink.events[mark:], tracer


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-hooks", "compiled-op"])
@pytest.mark.parametrize("capture", [AUX, (0, 1, 3)], ids=["healthy", "wrong-layer"])
def test_replays_record_capture_layers_and_provenance(capture, compiled):
    events, tracer = _replayed(capture, compiled)
    assert tracer.hook_errors == 0
    statuses = [e for e in events if isinstance(e, RankStatus)]
    assert tracer.graph_mode == "cuda_graph" and statuses[-1].graph_mode == "cuda_graph"
    replayed = [e for e in events if isinstance(e, TensorEvent) and e.graph_phase == "replay"]
    assert {e.hook_point for e in replayed} == {f"target.layers.{i}:input" for i in AUX}
    last = {e.hook_point: e.call_index for e in replayed}
    assert set(last.values()) == {REPLAYS - 1}  # every replay counted, on the device
    assert all(e.shape == (ROWS, HIDDEN) and e.device.startswith("cuda") for e in replayed)
    received = [e.received for e in events if isinstance(e, ProvenanceEvent)]
    assert received and set(received) == {capture}, received  # the wrong layer is named on replay too
    # every site written by each replay; compiled, the final norm (an eager post hook) is not in the graph
    written = len(tracer.hook_state.replay.sites) - (1 if compiled else 0)
    assert tracer.hook_state.replay_calls == REPLAYS * written


def test_eager_hooks_and_the_audit_never_sync_the_step_path():
    """Shape-only hooks (no provenance, no value statistics) and the losslessness audit's submit,
    on a CUDA model under ``set_sync_debug_mode("error")``: any device sync raises."""
    sink = ListSink()
    tracer = Tracer(sink, engine="test", engine_version="0", target_model="t", draft_model="d", config=CONFIG,
                    provenance_every=0, audit_every=1)
    target, draft = Target().cuda().eval(), Draft().cuda().eval()
    instrument(tracer, draft=draft, target=target, draft_hidden_size=HIDDEN)
    tracer.start_request("r", prompt_tokens=ROWS)
    x = torch.randn(ROWS, HIDDEN, device="cuda")
    logits = torch.randn(3, 50, device="cuda")
    emitted = logits.argmax(-1)
    torch.cuda.synchronize()
    with torch.no_grad():
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(4):
                _, aux = target(x)
                draft(torch.zeros(2, dtype=torch.long, device="cuda"), aux[1:3])
                if tracer.audit_due():
                    tracer.record_audit(logits, emitted, torch.zeros(3, device="cuda"),
                                        [AuditSlot("r", "greedy", j) for j in range(3)])
                tracer.record_verify("r", proposed=2, accepted=1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    tracer.close()
    assert tracer.hook_errors == 0 and tracer.graph_mode == "eager"
    assert {e.hook_point for e in sink.of(TensorEvent)} >= {f"target.layers.{i}:input" for i in AUX}
    audits = sink.of(LosslessAudit)
    assert audits and all(a.mismatches == 0 for a in audits)
