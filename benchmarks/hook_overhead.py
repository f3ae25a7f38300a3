"""Shape-only hook overhead: added time per hooked call vs ``torch.profiler`` with ``record_shapes``.

Run: ``python -m benchmarks.hook_overhead [--calls N] [--repeats R]``.

Two small EAGLE-3-shaped modules (``forward(input_ids, positions, hidden_states) -> (logits,
hidden)``; a 4-op one, and one with a draft layer's op count) are each called in a loop five ways,
in one process, one batch of each mode in turn so that drift in machine load hits all alike:
unhooked; with two empty hooks (what torch's hook dispatch alone costs); hooked by a specscope
Tracer (draft forward pre-hook and forward hook, default sampling: first 8 calls, new shapes, every
64th) into a discarding sink; the same into the real Collector writing a temporary SQLite store;
unhooked under ``torch.profiler.profile(record_shapes=True)``. Each figure is the median over
``repeats`` batches of ``calls`` calls, in microseconds per call; "added" subtracts the unhooked
median. Budget (DESIGN.md section 9): a few microseconds per shape-only call, and >= 10x cheaper
than the profiler. The profiler's cost grows with the ops inside the module, the hook's does not.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from specscope.collector import Collector
from specscope.events import RunConfig
from specscope.instrumentation import Tracer, instrument

HIDDEN = 64
VOCAB = 128


class SmallDraft(nn.Module):
    """Just enough work to be a module: embedding, one Linear, a head (4 ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"hidden_size": HIDDEN})()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids, positions, hidden_states):
        hidden = self.proj(hidden_states + self.embed_tokens(input_ids))  # (B, T, H)
        return self.lm_head(hidden), hidden


class LayerDraft(SmallDraft):
    """An EAGLE-3 draft's op count at toy width: fc, one pre-norm attention + SwiGLU layer, head."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * HIDDEN, HIDDEN, bias=False)
        self.norms = nn.ModuleList([nn.RMSNorm(HIDDEN) for _ in range(3)])
        self.qkv = nn.Linear(2 * HIDDEN, 3 * HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_up = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, input_ids, positions, hidden_states):
        if hidden_states.shape[-1] != HIDDEN:
            hidden_states = self.fc(hidden_states)  # (B, T, 3H) -> (B, T, H)
        x = torch.cat([self.norms[0](self.embed_tokens(input_ids)), self.norms[1](hidden_states)], -1)
        q, k, v = self.qkv(x).unflatten(-1, (3, 4, HIDDEN // 4)).transpose(1, 3).unbind(2)  # (B, 4, T, d)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        hidden = hidden_states + self.o_proj(attn.transpose(1, 2).flatten(-2))  # (B, T, H)
        gate, up = self.gate_up(self.norms[2](hidden)).chunk(2, dim=-1)
        hidden = hidden + self.down(nn.functional.silu(gate) * up)
        return self.lm_head(hidden), hidden


class DiscardSink:
    """Accepts and forgets events: isolates the hook's own cost."""

    def emit(self, event) -> None:
        pass

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def batch_us(model: nn.Module, args: tuple, calls: int) -> float:
    """Mean time of one call over a batch of ``calls`` calls (µs)."""
    start = time.perf_counter()
    for _ in range(calls):
        model(*args)
    return (time.perf_counter() - start) / calls * 1e6


def profiled_batch_us(model: nn.Module, args: tuple, calls: int) -> float:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        return batch_us(model, args, calls)


def tracer_for(sink) -> Tracer:
    config = RunConfig(aux_layer_ids_resolved=(2, 4, 6), target_hidden_size=HIDDEN,
                       expected_fused_width=3 * HIDDEN, k=3, num_target_layers=8)
    return Tracer(sink, engine="bench", engine_version="0", target_model="-", draft_model="-",
                  config=config)


@torch.no_grad()
def compare(model: nn.Module, calls: int, repeats: int) -> dict[str, float]:
    """Median µs per call of each mode. Modes run on identical copies of ``model``, one batch each in
    turn, so drift in machine load hits every mode alike."""
    args = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
            torch.randn(1, 1, HIDDEN))
    empty, hooked, collected = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    empty.register_forward_pre_hook(lambda module, args, kwargs: None, with_kwargs=True)
    empty.register_forward_hook(lambda module, args, output: None)
    with tempfile.TemporaryDirectory() as tmp, Collector(str(Path(tmp) / "bench.db")) as collector, \
            tracer_for(DiscardSink()) as discard_tracer, tracer_for(collector) as collector_tracer:
        instrument(discard_tracer, draft=hooked)
        instrument(collector_tracer, draft=collected)
        modes = {"unhooked": lambda: batch_us(model, args, calls),
                 "two empty hooks (torch's hook dispatch)": lambda: batch_us(empty, args, calls),
                 "specscope hook (discard sink)": lambda: batch_us(hooked, args, calls),
                 "specscope hook (Collector -> SQLite)": lambda: batch_us(collected, args, calls),
                 "torch.profiler(record_shapes=True)": lambda: profiled_batch_us(model, args, calls)}
        for run in modes.values():  # warm up allocator and dispatch caches
            run()
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(repeats):
            for mode, run in modes.items():
                samples[mode].append(run())
    return {mode: statistics.median(values) for mode, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=21, help="timed batches per mode")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{opts.repeats} x {opts.calls} calls, torch {torch.__version__}, 1 thread, width {HIDDEN}")
    for model in (SmallDraft().eval(), LayerDraft().eval()):
        figures = compare(model, opts.calls, opts.repeats)
        plain = figures["unhooked"]
        added = {mode: value - plain for mode, value in figures.items()}
        print(f"\n{type(model).__name__}: {model.__doc__.splitlines()[0]}")
        print(f"{'mode':42} {'median us/call':>15} {'added us/call':>14}")
        for mode, value in figures.items():
            print(f"{mode:42} {value:15.2f} {added[mode]:14.2f}")
        profiler = added["torch.profiler(record_shapes=True)"]
        hook = added["specscope hook (discard sink)"]
        print(f"profiler added / hook added: {profiler / max(hook, 1e-9):.1f}x (aim >= 10x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
