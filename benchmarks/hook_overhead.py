"""Shape-only hook overhead: added time per hooked call vs two empty torch hooks and ``torch.profiler``.

Run: ``python -m benchmarks.hook_overhead [--calls N] [--repeats R]``; ``--profile`` instead prints
where the steady-state specscope call's time goes (cProfile over the 4-op module, per call).

Two small EAGLE-3-shaped modules (``forward(input_ids, positions, hidden_states) -> (logits,
hidden)``; a 4-op one, and one with a draft layer's op count) are each called in a loop six ways
(and once more unhooked, the A/A below): unhooked; with two empty hooks (a forward pre-hook with
kwargs and a forward hook: what torch's hook dispatch alone costs); with the reads floor (a bare
``forward`` wrapper that reads the five tensors' ``(shape, dtype, device)`` and compares them with
the previous call's, and does nothing else: the least any hook can add that notices every new
signature); hooked by a specscope Tracer (``instrument(tracer, draft=model)``: its wrapper around
the draft's forward with the draft-input and output bodies, default sampling: first 8 calls, new
signatures, every 64th) into a discarding sink; the same into the real Collector writing a temporary
SQLite store; unhooked under ``torch.profiler.profile(record_shapes=True)``.

Every mode runs on the same module object (hooks are registered before a batch and removed after it):
identical deep copies of a module differ by up to 50% in time per call on this machine, more than
the hooks cost. Batches are timed in this thread's CPU time (``time.thread_time``), not wall time:
on a shared machine the time spent descheduled is other people's. One round times one batch of
``calls`` calls per mode, in an order that rotates from round to round; a mode's added cost is the
median over ``repeats`` rounds of its batch minus the unhooked batch of the same round (paired, so
drift in machine load cancels), shown with its interquartile range over the rounds and the 95%
interval of the mean (:mod:`specscope.paired`). A seventh mode times the unhooked module again (an
A/A pair): its added figure and spread are what load alone produces in this run, so a reader can
tell load from a regression. Figures are in microseconds per call. Budget (docs/design.md,
"Budgets"): the specscope hook adds at most 1.5x what the two empty hooks add, and the profiler adds
at least 10x what the specscope hook adds. The profiler's cost grows with the ops inside the module,
the hook's does not; the reads floor shows how far below any hook's reach the second aim lies on a
module as small as the 4-op one.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import tempfile
import time
import types
from operator import attrgetter
from pathlib import Path

import torch
from torch import nn

from specscope.collector import Collector
from specscope.events import RunConfig
from specscope.instrumentation import Tracer, instrument
from specscope.paired import mean_interval, spread

HIDDEN = 64
VOCAB = 128
SIGNATURE = attrgetter("shape", "dtype", "device")
"""What the reads floor reads per tensor: the key specscope's hooks read (``_hooks.SIGNATURE``)."""


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
    """Mean time of one call over a batch of ``calls`` calls (µs of this thread's CPU time: on a
    shared machine, time spent descheduled is not the hook's), after ``calls // 4`` untimed calls
    and a garbage collection, so that every mode starts its batch from the same state."""
    for _ in range(calls // 4):
        model(*args)
    gc.collect()
    start = time.thread_time()
    for _ in range(calls):
        model(*args)
    return (time.thread_time() - start) / calls * 1e6


def profiled_batch_us(model: nn.Module, args: tuple, calls: int) -> float:
    """:func:`batch_us` under ``torch.profiler`` with ``record_shapes`` (its start and stop untimed)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        return batch_us(model, args, calls)


def empty_hooks_batch_us(model: nn.Module, args: tuple, calls: int) -> float:
    """:func:`batch_us` with a no-op forward pre-hook (with kwargs) and forward hook registered."""
    handles = (model.register_forward_pre_hook(lambda module, args, kwargs: None, with_kwargs=True),
               model.register_forward_hook(lambda module, args, output: None))
    try:
        return batch_us(model, args, calls)
    finally:
        for handle in handles:
            handle.remove()


def reads_floor_batch_us(model: nn.Module, args: tuple, calls: int) -> float:
    """:func:`batch_us` with the reads floor: ``model.forward`` wrapped (as specscope wraps it) by a
    function that passes through under TorchDynamo, reads ``(shape, dtype, device)`` of the three
    arguments and the two outputs and compares each call key with the previous call's."""
    function = type(model).forward
    last = [None, None]

    def forward(self: nn.Module, *args: torch.Tensor, **kwargs) -> tuple:
        if torch.compiler.is_compiling():
            return function(self, *args, **kwargs)
        key = tuple(map(SIGNATURE, args))
        if key != last[0]:
            last[0] = key
        output = function(self, *args, **kwargs)
        key = tuple(map(SIGNATURE, output))
        if key != last[1]:
            last[1] = key
        return output

    model.forward = types.MethodType(forward, model)
    try:
        return batch_us(model, args, calls)
    finally:
        del model.forward


def traced_batch_us(model: nn.Module, args: tuple, calls: int, sink) -> float:
    """:func:`batch_us` with a fresh instrumented Tracer into ``sink``, past its first calls (the
    steady state: seen signatures, every 64th call sampled); ``close`` removes its hooks."""
    with tracer_for(sink) as tracer:
        instrument(tracer, draft=model)
        for _ in range(tracer.sampling.first_calls):
            model(*args)
        return batch_us(model, args, calls)


def tracer_for(sink) -> Tracer:
    config = RunConfig(aux_layer_ids_resolved=(2, 4, 6), target_hidden_size=HIDDEN,
                       expected_fused_width=3 * HIDDEN, k=3, num_target_layers=8)
    return Tracer(sink, engine="bench", engine_version="0", target_model="-", draft_model="-",
                  config=config)


UNHOOKED = "unhooked"
AGAIN = "unhooked again (A/A: this run's noise)"
EMPTY = "two empty hooks (torch's hook dispatch)"
FLOOR = "reads floor (5 signatures read, compared)"
SPECSCOPE = "specscope hook (discard sink)"
COLLECTOR = "specscope hook (Collector -> SQLite)"
PROFILER = "torch.profiler(record_shapes=True)"
OBSERVED = 5
"""Tensors per call the specscope hook reads: 3 arguments and a 2-tuple output."""


@torch.no_grad()
def compare(model: nn.Module, calls: int, repeats: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``(median µs per call, paired added µs per call of every round)`` of each mode on ``model``."""
    args = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
            torch.randn(1, 1, HIDDEN))
    with tempfile.TemporaryDirectory() as tmp, Collector(str(Path(tmp) / "bench.db")) as collector:
        modes = {UNHOOKED: lambda: batch_us(model, args, calls),
                 AGAIN: lambda: batch_us(model, args, calls),
                 EMPTY: lambda: empty_hooks_batch_us(model, args, calls),
                 FLOOR: lambda: reads_floor_batch_us(model, args, calls),
                 SPECSCOPE: lambda: traced_batch_us(model, args, calls, DiscardSink()),
                 COLLECTOR: lambda: traced_batch_us(model, args, calls, collector),
                 PROFILER: lambda: profiled_batch_us(model, args, calls)}
        names = list(modes)
        for run in modes.values():  # warm up allocator and dispatch caches
            run()
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        added: dict[str, list[float]] = {mode: [] for mode in modes}
        for round_ in range(repeats):
            shift = round_ % len(names)
            batch = {mode: modes[mode]() for mode in names[shift:] + names[:shift]}
            for mode, value in batch.items():
                samples[mode].append(value)
                added[mode].append(value - batch[UNHOOKED])
    return {mode: statistics.median(values) for mode, values in samples.items()}, added


def ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as ``"2.1x"``; a denominator at or below zero is an added cost
    lost in this run's noise (paired medians can come out negative), so no ratio."""
    if denominator <= 0:
        return "not measurable (the divisor is below this run's noise)"
    return f"{numerator / denominator:.2f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=101, help="rounds (one batch per mode each)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the specscope call instead")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    if opts.profile:
        profile()
        return 0
    print(f"{opts.repeats} rounds x {opts.calls} calls per mode, torch {torch.__version__}, 1 thread, "
          f"width {HIDDEN}; µs of this thread's CPU time per call; 'added' is the median over rounds of "
          f"(mode batch - unhooked batch of the same round), not the difference of the medians")
    for model in (SmallDraft().eval(), LayerDraft().eval()):
        figures, rounds = compare(model, opts.calls, opts.repeats)
        print(f"\n{type(model).__name__}: {model.__doc__.splitlines()[0]}")
        print(f"{'mode':42} {'median us/call':>15} {'added us/call':>14}  {'added: interquartile, 95% CI of mean':>36}")
        added = {UNHOOKED: 0.0}
        print(f"{UNHOOKED:42} {figures[UNHOOKED]:15.2f}")
        for mode in list(figures)[1:]:
            q1, added[mode], q3 = spread(rounds[mode])
            _, low, high = mean_interval(rounds[mode])
            print(f"{mode:42} {figures[mode]:15.2f} {added[mode]:14.2f}  {q1:7.2f} .. {q3:<7.2f} "
                  f"{low:7.2f} .. {high:<7.2f}")
        print("noise floor: the A/A row (two unhooked batches of one round) is what load alone adds; an added "
              "figure inside its interquartile range is not a cost")
        print(f"specscope added / empty hooks added: {ratio(added[SPECSCOPE], added[EMPTY])} (aim <= 1.5x)")
        print(f"profiler added / specscope added: {ratio(added[PROFILER], added[SPECSCOPE])} (aim >= 10x)")
        print(f"profiler added / reads floor added: {ratio(added[PROFILER], added[FLOOR])} (the most any "
              f"hook reading five signatures can reach); specscope above the floor: "
              f"{added[SPECSCOPE] - added[FLOOR]:.2f} us")
        print(f"specscope added per observed tensor: {added[SPECSCOPE] / OBSERVED:.2f} us "
              f"({OBSERVED} tensors per call: 3 arguments, a 2-tuple output)")
    return 0


def profile(calls: int = 20_000, rows: int = 16) -> None:
    """cProfile of ``calls`` steady-state calls of the instrumented 4-op module (discard sink):
    calls, own time and cumulative time per module call of the functions that take the most own
    time. cProfile's own per-call cost inflates Python frames: read it for where time goes, and
    :func:`compare` for how much."""
    model = SmallDraft().eval()
    args = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
            torch.randn(1, 1, HIDDEN))
    profiler = cProfile.Profile()
    with torch.no_grad(), tracer_for(DiscardSink()) as tracer:
        instrument(tracer, draft=model)
        for _ in range(calls // 10):
            model(*args)
        profiler.runcall(lambda: [model(*args) for _ in range(calls)])
    stats = pstats.Stats(profiler).stats
    print(f"cProfile, {calls} calls of SmallDraft instrumented; per module call:")
    print(f"{'calls':>6} {'own us':>8} {'cum us':>8}  function")
    for (path, line, name), (_, count, own, cumulative, _) in sorted(
            stats.items(), key=lambda item: -item[1][2])[:rows]:
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}" if line else "~"
        print(f"{count / calls:6.2f} {own / calls * 1e6:8.2f} {cumulative / calls * 1e6:8.2f}  {where}({name})")


if __name__ == "__main__":
    raise SystemExit(main())
