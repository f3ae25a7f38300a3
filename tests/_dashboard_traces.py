"""Event sequences as the Tracer emits them while the reference engine serves (SmolLM2-135M target:
30 layers, hidden 576; EAGLE-3 draft fusing layers 2, 15, 27 into 1728; chain of k=4), for the
dashboard tests. ``trace(...)`` returns the events of one run; ``write_store(path, ...)`` writes runs
into a SQLite store with ``Store.write``.

Per verify step, as ``specscope.instrumentation`` records it: the target forward's capture layers
(``target.layers.{i}:input``, width 576), the target-fed draft call (``draft.forward:hidden_states``,
expected 1728) and k-1 chained calls (expected 576), ``draft.forward:output.0/1``, a VerifyStep with
the emitted tokens (accepted drafts first, bonus token last) and, every 4th step, a provenance check.

Faults (``specscope.engine.faults``): ``"no-aux-capture"`` hands the draft the final hidden state
(width 576 where 1728 is expected, provenance = layer 30) and nothing is accepted.
"""

from __future__ import annotations

from pathlib import Path

from specscope import events as ev
from specscope.storage import open_store

HIDDEN, LAYERS, VOCAB = 576, 30, 49152
AUX = (2, 15, 27)
FUSED = len(AUX) * HIDDEN
K = 4
T0 = 1_750_000_000.0
WORDS = ("The", " draft", " proposes", " tokens", ",", " the", " target", " verifies", " them", " in",
         " one", " forward", ".", " Speculative", " decoding", " keeps", " the", " output", " exact")

CONFIG = ev.RunConfig(aux_layer_ids_resolved=AUX, aux_layer_ids_configured=AUX, target_hidden_size=HIDDEN,
                      expected_fused_width=FUSED, k=K, num_target_layers=LAYERS).to_dict()


def accepted_pattern(fault: str | None, step: int, request: int) -> int:
    """Accepted drafts of one step: about 2.4 on average healthy, 0 with no-aux-capture."""
    if fault == "no-aux-capture":
        return 0
    return (step * 7 + request * 3) % (K + 1) if (step + request) % 3 else K


def trace(run_id: str, *, fault: str | None = None, requests: int = 6, steps: int = 12,
          world_size: int = 1, t0: float = T0, finished: bool = True, dt: float = 0.05,
          temperatures: tuple[float | None, ...] = (None,), audited: bool = True) -> list:
    """The events of one run in emission order (times from ``t0``, one verify step every ``dt`` s);
    request r samples at ``temperatures[r % len(temperatures)]`` (None: not reported); ``audited``:
    each greedy request's tokens audited against the target, every one its argmax."""
    out: list = [ev.RunStart(run_id, "specscope-reference", "0.1.0", "HuggingFaceTB/SmolLM2-135M-Instruct",
                             "specscope/eagle3-smollm2-135m", CONFIG, fault=fault, world_size=world_size,
                             host="node-0", ts_wall=t0)]
    out += [ev.RankStart(run_id, rank, world_size, "node-0", 4000 + rank, f"cuda:{rank}", ts_wall=t0)
            for rank in range(world_size)]
    out += [ev.LoadReport(run_id, rank, "draft", "eagle3-smollm2/model.safetensors", True, 12, ts_wall=t0)
            for rank in range(world_size)]
    out.append(ev.Finding("CKPT_FORMAT", "info", "checkpoint layout: EAGLE-3 (midlayer.*), 12 tensors",
                          {"format": "eagle3", "tensors": 12}, "nothing to do", run_id=run_id,
                          source="inspect", ts_wall=t0))
    feed_width = HIDDEN if fault == "no-aux-capture" else FUSED
    received = (LAYERS,) if fault == "no-aux-capture" else AUX
    calls = {}
    now = t0

    def tensor(rank, point, shape, expected, request_id, step):
        index = calls.get((rank, point), 0)
        calls[(rank, point)] = index + 1
        return ev.TensorEvent(run_id, rank, point, index, shape, "bfloat16", f"cuda:{rank}", expected,
                              request_id=request_id, step=step, ts_wall=now)

    for r in range(requests):
        rank, request_id = r % world_size, f"req-{r}"
        out.append(ev.RequestStart(run_id, request_id, rank, 24 + r, temperatures[r % len(temperatures)],
                                   ts_wall=now))
        emitted_total, words = 0, []
        for step in range(steps):
            now += dt
            tokens = 24 + r + emitted_total
            out += [tensor(rank, f"target.layers.{i}:input", (1, tokens, HIDDEN), (-1, -1, HIDDEN),
                           request_id, step) for i in AUX]
            out.append(tensor(rank, "draft.forward:hidden_states", (1, 1, feed_width), (-1, -1, FUSED),
                              request_id, step))
            out += [tensor(rank, "draft.forward:hidden_states", (1, 1, HIDDEN), (-1, -1, HIDDEN),
                           request_id, step) for _ in range(K - 1)]
            out += [tensor(rank, "draft.forward:output.0", (1, 1, VOCAB), None, request_id, step),
                    tensor(rank, "draft.forward:output.1", (1, 1, HIDDEN), None, request_id, step)]
            if step % 4 == 0:
                out.append(ev.ProvenanceEvent(run_id, rank, calls[(rank, "draft.forward:hidden_states")] - K,
                                              AUX, received, feed_width, request_id, step, ts_wall=now))
            accepted = accepted_pattern(fault, step, r)
            emitted = tuple(WORDS[(emitted_total + j) % len(WORDS)] for j in range(accepted + 1))
            emitted_total += accepted + 1
            words += emitted
            out.append(ev.VerifyStep(run_id, request_id, rank, step, K, accepted, draft_s=0.004,
                                     verify_s=0.011, emitted=emitted, ts_wall=now))
        if audited and not temperatures[r % len(temperatures)]:
            out.append(ev.LosslessAudit(run_id, rank, request_id, "greedy", emitted_total, ts_wall=now))
        out.append(ev.RequestEnd(run_id, request_id, rank, emitted_total, steps, "".join(words), ts_wall=now))
    for rank in range(world_size):
        out.append(ev.RankStatus(run_id, rank, hook_calls=sum(calls.values()), hook_errors=0,
                                 finished=finished, ts_wall=now))
    return out


def write_store(path: Path | str, runs: list[list]) -> str:
    """Create a SQLite store at ``path`` holding the given runs (each a :func:`trace` list)."""
    with open_store(str(path)) as store:
        for events in runs:
            store.write(events)
    return str(path)
