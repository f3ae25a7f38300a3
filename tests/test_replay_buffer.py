"""The static buffer CUDA-graph replays write (``instrumentation/_replay.py``), run on the CPU: with
the capture probe forced on, every hooked call issues the device writes a captured graph holds, and
on a CPU they execute at once, as a replay executes them. The host reader must then decode the same
evidence (capture layers fired, which layers the draft received) as the eager path."""

from __future__ import annotations

import pytest
import torch
from _hooked_pair import AUX, CONFIG, HIDDEN, Draft, Target
from _list_sink import ListSink

from specscope import Tracer, instrument
from specscope.collector import Collector
from specscope.doctor import diagnose
from specscope.events import ProvenanceEvent, RankStatus, TensorEvent
from specscope.instrumentation._replay import HEAD, TAIL
from specscope.storage import open_store


def _run(capture: tuple[int, ...], replayed: bool, steps: int = 3):
    """``(sink, tracer, step)`` after ``steps`` calls of ``step()``: a target forward followed by a
    target-fed draft call; ``replayed``: every call takes the path of a CUDA-graph capture, whose
    buffer writes run at once on a CPU."""
    torch.manual_seed(0)
    sink = ListSink()
    tracer = Tracer(sink, engine="test", engine_version="0", target_model="t", draft_model="d", config=CONFIG,
                    provenance_every=1)
    if replayed:
        tracer.hook_state.capturing = lambda: True
    target, draft = Target(capture), Draft()
    instrument(tracer, draft=draft, target=target, draft_hidden_size=HIDDEN)

    @torch.no_grad()
    def step() -> None:
        _, aux = target(torch.randn(4, HIDDEN))
        draft(torch.zeros(4, dtype=torch.long), aux[1:3])  # the accepted rows only

    for _ in range(steps):
        step()
    return sink, tracer, step


@pytest.mark.parametrize("capture", [AUX, (0, 1, 3)], ids=["healthy", "wrong-layer"])
def test_replay_buffer_decodes_the_evidence_of_the_eager_path(capture):
    eager, eager_tracer, _ = _run(capture, replayed=False)
    eager_tracer.close()
    replay, tracer, _ = _run(capture, replayed=True)
    assert replay.of(ProvenanceEvent) == []  # nothing is matched on the engine thread under capture
    tracer.close()  # drains the buffer: one copy, decoded
    assert tracer.hook_errors == 0
    expected = {e.received for e in eager.of(ProvenanceEvent)}
    assert expected == {capture}
    assert {e.received for e in replay.of(ProvenanceEvent)} == expected
    assert tracer.graph_mode == "cuda_graph" and replay.of(RankStatus)[-1].graph_mode == "cuda_graph"
    fired = {e.hook_point: e for e in replay.of(TensorEvent) if e.graph_phase == "replay"}
    assert set(fired) == {f"target.layers.{i}:input" for i in AUX}
    assert all(e.shape == (4, HIDDEN) and e.expected_shape == (-1, HIDDEN) and e.call_index == 2
               for e in fired.values())


def test_status_reads_replays_off_the_step_path_and_counts_them():
    sink, tracer, _ = _run(AUX, replayed=True, steps=2)
    calls = tracer.hook_calls
    tracer.status()  # hooks ran under capture since the last look: a capture may go on, no copy
    tracer.status()  # starts the copy
    assert tracer.hook_state.replay_calls == 0
    tracer.status()  # decodes it (on a CPU the copy has landed at once)
    sites = len(tracer.hook_state.replay.sites)  # 5 layers (aux and neighbours), the norm, the draft input
    assert tracer.hook_state.replay_calls == 2 * sites and tracer.hook_calls == calls + 2 * sites
    assert [e.received for e in sink.of(ProvenanceEvent)] == [AUX]  # the latest draft call, once
    tracer.status()
    tracer.status()
    assert tracer.hook_state.replay_calls == 2 * sites  # nothing replayed since: nothing new
    assert len(sink.of(ProvenanceEvent)) == 1
    tracer.close()


def test_a_record_caught_mid_rewrite_waits_for_the_next_read():
    """The copy is not ordered with the engine's stream: a record whose head (written first) is
    ahead of its tail (written last) was being rewritten by a replay and is not decoded yet."""
    sink, tracer, _ = _run(AUX, replayed=True, steps=1)
    meta = tracer.hook_state.replay.meta  # site 0: layer 0, a capture layer
    tracer.status()  # hooks ran under capture since the last look: no copy
    meta[0, HEAD] += 5  # a replay began rewriting layer 0's record
    tracer.status()  # copies
    tracer.status()  # decodes, copies again

    def fired() -> set[str]:
        return {e.hook_point for e in sink.of(TensorEvent) if e.graph_phase == "replay"}

    assert fired() == {f"target.layers.{i}:input" for i in AUX if i != 0}
    # the draft input is not matched against the other layers alone: that would read None for layer 0
    assert sink.of(ProvenanceEvent) == []
    meta[0, TAIL] = meta[0, HEAD]  # the rewrite completed
    tracer.status()  # decodes the copy taken mid-rewrite, copies again
    tracer.status()
    assert fired() == {f"target.layers.{i}:input" for i in AUX}
    tracer.close()


def test_no_read_while_hooks_still_run_under_capture():
    """A hook call under capture between two polls: the engine may be capturing on another thread
    (CUDA's global capture mode), so the status thread leaves the device alone."""
    sink, tracer, step = _run(AUX, replayed=True, steps=1)
    for _ in range(3):
        tracer.status()
        step()
    assert tracer.hook_state.replay_calls == 0 and sink.of(ProvenanceEvent) == []
    tracer.close()  # at close, read once
    assert tracer.hook_state.replay_calls > 0


def test_no_buffer_where_nothing_can_be_captured():
    """Without CUDA the probe is None: no buffer, the eager path exactly as before."""
    sink, tracer, _ = _run(AUX, replayed=False)
    if torch.cuda.is_available():
        pytest.skip("CUDA present: a buffer is allocated for the capture that may come")
    assert tracer.hook_state.replay is None
    tracer.close()
    assert tracer.graph_mode == "eager" and not [e for e in sink.of(TensorEvent) if e.graph_phase == "replay"]


@pytest.mark.parametrize("capture, codes", [(AUX, []), ((0, 1, 3), ["AUX_LAYER_MISMATCH"])],
                         ids=["healthy", "wrong-layer"])
def test_a_replayed_run_is_stored_and_diagnosed_by_its_cause(tmp_path, capture, codes):
    """Through the Collector into a store: graph mode cuda_graph, capture layers and provenance from
    the buffer; a wrong captured layer is named by its cause, a healthy run has no finding but the
    skipped audit (this test's engine hands no verify step to it)."""
    with open_store(str(tmp_path / "replay.db")) as store:
        with Collector(store) as collector:
            tracer = Tracer(collector, run_id="replayed", engine="test", engine_version="0", target_model="t",
                            draft_model="d", config=CONFIG, provenance_every=1)
            tracer.hook_state.capturing = lambda: True
            target, draft = Target(capture), Draft()
            instrument(tracer, draft=draft, target=target, draft_hidden_size=HIDDEN)
            tracer.start_request("r", prompt_tokens=4)
            with torch.no_grad():
                for accepted in (2, 1, 2, 0) * 5:
                    _, aux = target(torch.randn(4, HIDDEN))
                    draft(torch.zeros(2, dtype=torch.long), aux[1:3])
                    tracer.record_verify("r", proposed=2, accepted=accepted)
            tracer.finish_request("r", output_tokens=45)
            tracer.close()
            assert collector.flush()
        report = diagnose(store, "replayed")
        _, modes = store.query("SELECT graph_mode FROM run_ranks WHERE run_id = 'replayed'")
    assert modes == [("cuda_graph",)]
    assert report.codes() == [*codes, "CHECKS_SKIPPED"], [(f.code, f.message) for f in report.findings]
    (skipped,) = [f for f in report.findings if f.code == "CHECKS_SKIPPED"]
    assert [c["check"] for c in skipped.evidence["not_checked"]] == ["losslessness audit"]
