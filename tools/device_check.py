"""GPU half of ``tools/device_check.sh``: what the static replay buffer costs and shows at a realistic
size, with every step under ``torch.cuda.set_sync_debug_mode("error")``.

A target of ``--layers`` residual blocks (hidden ``--hidden``, bfloat16) hands the hidden states
entering three capture layers to an EAGLE-3-style ``fc``; the step (target forward, then the draft on
the accepted rows) is captured once into a CUDA graph, bare and instrumented, and each graph is
replayed ``--replays`` times with fresh inputs. Printed: the median replay time of each (CUDA events),
the replay buffer's share, the tracer's status poll time on the host, the capture layers and
provenance read back from the buffer. Exit status 1 when CUDA is missing, a sync happens on the
step path, or the buffer's evidence is not the configured layers'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specscope import RunConfig, Tracer, instrument
from specscope.events import ProvenanceEvent, TensorEvent

# The suite's small hooked pair and list sink, at this script's sizes (the device image runs both).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _hooked_pair import Draft, Target, capture_graph  # noqa: E402
from _list_sink import ListSink  # noqa: E402


def _graph(step) -> torch.cuda.CUDAGraph:
    graph = capture_graph(step)
    torch.cuda.synchronize()
    return graph


def _replays(graph: torch.cuda.CUDAGraph, x: torch.Tensor, count: int, tracer: Tracer | None) -> tuple[list, list]:
    """Replay ``count`` times with fresh inputs under sync debug 'error': each replay's device time
    (ms) and, with a tracer, each status poll's host time (ms)."""
    inputs = torch.randn(count, *x.shape, device=x.device, dtype=x.dtype)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    polls = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(count):
            x.copy_(inputs[i])
            starts[i].record()
            graph.replay()
            ends[i].record()
            if tracer is not None:
                begin = time.perf_counter()
                tracer.status()
                polls.append((time.perf_counter() - begin) * 1e3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], polls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--rows", type=int, default=64, help="tokens per decode step")
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--out", help="write the summary as JSON here too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("device check: FAILED (no CUDA device)")
        return 1
    hidden, layers = args.hidden, args.layers
    aux = (2, layers // 2, layers - 3)
    config = RunConfig(aux_layer_ids_resolved=aux, target_hidden_size=hidden, expected_fused_width=3 * hidden,
                       k=3, num_target_layers=layers, dtype="bfloat16")
    torch.manual_seed(0)
    target = Target(aux, hidden, layers).cuda().to(torch.bfloat16).eval()
    draft = Draft(hidden, len(aux)).cuda().to(torch.bfloat16).eval()
    x = torch.randn(args.rows, hidden, device="cuda", dtype=torch.bfloat16)
    ids = torch.zeros(args.rows // 2, dtype=torch.long, device="cuda")

    def step() -> torch.Tensor:
        _, fused = target(x)
        return draft(ids, fused[: args.rows // 2])

    summary: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "hidden": hidden,
                     "layers": layers, "rows": args.rows, "replays": args.replays}
    with torch.no_grad():
        bare, _ = _replays(_graph(step), x, args.replays, None)
        sink = ListSink()
        tracer = Tracer(sink, engine="device-check", engine_version="0", target_model="t", draft_model="d",
                        config=config, provenance_every=16)
        instrument(tracer, draft=draft, target=target, draft_hidden_size=hidden)
        graph = _graph(step)
        mark = len(sink.events)  # what follows was read from the replays
        hooked, polls = _replays(graph, x, args.replays, tracer)
    tracer.close()
    replayed = sink.events[mark:]
    fired = sorted({e.hook_point for e in replayed if isinstance(e, TensorEvent) and e.graph_phase == "replay"})
    received = sorted({e.received for e in replayed if isinstance(e, ProvenanceEvent)}, key=str)
    bare_ms, hooked_ms = statistics.median(bare), statistics.median(hooked)
    summary.update(
        bare_replay_ms=round(bare_ms, 4), hooked_replay_ms=round(hooked_ms, 4),
        buffer_overhead=round(hooked_ms / bare_ms - 1, 4), status_poll_ms_median=round(statistics.median(polls), 4),
        replay_calls=tracer.hook_state.replay_calls, graph_mode=tracer.graph_mode, hook_errors=tracer.hook_errors,
        capture_layers_fired=fired, provenance_received=[list(r) for r in received])
    expected_points = [f"target.layers.{i}:input" for i in aux]
    ok = (tracer.hook_errors == 0 and tracer.graph_mode == "cuda_graph" and fired == sorted(expected_points)
          and received == [aux])
    summary["passed"] = ok
    for key, value in summary.items():
        print(f"{key:>24}: {value}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)
    print(f"device check: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
