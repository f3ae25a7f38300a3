"""vLLM decode with the specscope plugin on vs off, side by side in one process, calibrated to resolve 1%.

Run: ``python -m benchmarks.vllm_decode [--compiled] [--pairs P] [--batch B] [--max-new-tokens T]
[--only NAME ...] [--budget-s S]`` (names: ``plugin``, ``audit-4``, ``audit-1``, ``token-ids``; default all).

One process holds one vLLM engine (offline ``LLM``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: scheduler,
models and verifier in this process) serving the reference target with the shipped EAGLE-3 draft,
built with ``SPECSCOPE_DB`` set so the plugin attaches as in a server. The plugin is then switched
between batches: :func:`specscope.adapters.vllm.paused` takes everything it put into vLLM out (vLLM's
own methods, no hook on the models or the verifier) and puts it back; :func:`~specscope.adapters.vllm.configure`
sets the audit's rate and the token-id budget of the live run. Both sides of every comparison are
therefore the same engine, the same weights in the same memory, the same threads on the same cores:
the placement bias of two server processes (several percent, larger than the 1% budget) cannot
enter. A batch is ``batch`` held-out prompts (chat template), greedy, ``max_new_tokens`` each with
the end-of-sequence token ignored, timed from ``generate`` until the plugin's writer has stored what
the batch recorded (``flush``; the observed side pays for its writes, the paused side's flush has
nothing to wait for; a garbage collection runs before each batch, outside its time). vLLM's CPU
backend is told to leave one core to the threads outside its OpenMP team (``VLLM_CPU_NUM_OF_RESERVED_CPU=1``,
its knob for serving threads): by default its team takes both cores of this machine and spins between
kernels, so any other thread, the plugin's writer as the kernel's own, preempts the decode, and two
identical batches scattered by 4-6% a pair (1.8% with the core left). Every batch must return the very token ids of the first one (checked): same
tokens, same verify steps, so a different acceptance cannot pass for a speed difference.

Comparisons (side A, the baseline, vs side B), timed in interleaved ABBA rounds with the A/A
calibration of :mod:`specscope.paired` (an A/B figure is reported only when the A/A interval lies
within +-0.5%):

- ``A/A``: paused vs paused;
- ``plugin``: paused vs the plugin at its defaults (shape sampling, provenance every 16th fused
  input, the audit every 4th verify batch), with the token ids of every request kept (the default
  keeps the first 256 requests of a run; kept for all, the figure is that first stretch's);
- ``audit-4`` / ``audit-1``: the plugin with the audit off vs every 4th (the default) / every verify
  batch (token ids kept for none in both);
- ``token-ids``: the plugin with the audit every 4th and token ids for none vs for every request.

The engine is eager (``enforce_eager``) unless ``--compiled``: vLLM's default mode, the models
compiled (torch.compile, inductor), switched the same way. A compiled target keeps the wrappers its
graph was traced through even paused (taking them out crashed it), and its graph still calls the
``specscope::observe`` op, which finds no observer and returns: that pass-through is the one cost a
paused compiled engine keeps over a bare one, so the comparison leaves it out, and it is timed apart
(:func:`op_pass_through`: the op's cost per call in a compiled graph, times the hook calls per verify
step the run recorded, an upper bound on the op's calls). Two bare compiled engines of one process,
the design before this one, differed by 1.25% (95% CI -1.44% .. -1.06%, 330 pairs): a bias between
engines no number of pairs removes, where the observed engine against itself has none to carry.

At the end the run's requests are counted: exactly those of the observed batches must be recorded
(nothing while paused), else the benchmark fails.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from specscope.paired import AA, compare, report, timed

EVERY = 1 << 30
"""A token-id budget no benchmark spends: every request's ids are kept."""
RESERVED_CPU = "VLLM_CPU_NUM_OF_RESERVED_CPU"
"""vLLM's CPU backend binds its OpenMP threads to every core but this many, which it leaves to the
serving threads (set to 1 here unless the environment says otherwise)."""


@dataclass(frozen=True)
class State:
    """What the plugin does for a batch: nothing (paused), or observe with this audit."""

    observed: bool
    audit_every: int = 4
    token_requests: int = EVERY


OFF = State(observed=False)
COMPARISONS = {
    "plugin": ("plugin (defaults, token ids kept) vs paused", OFF, State(True)),
    "audit-4": ("audit every 4th batch vs audit off", State(True, 0, 0), State(True, 4, 0)),
    "audit-1": ("audit every batch vs audit off", State(True, 0, 0), State(True, 1, 0)),
    "token-ids": ("token ids of every request vs none", State(True, 4, 0), State(True, 4, EVERY)),
}


class Bench:
    """The engine, the batch and the reference token ids every batch must reproduce."""

    def __init__(self, batch: int, max_new_tokens: int, compiled: bool) -> None:
        from vllm import SamplingParams

        from specscope.engine import heldout_prompts

        self.llm = _engine(compiled)
        tokenizer = self.llm.get_tokenizer()
        self.chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                    add_generation_prompt=True) for p in heldout_prompts()[:batch]]
        self.params = SamplingParams(temperature=0, max_tokens=max_new_tokens, ignore_eos=True)
        self.reference: list[list[int]] | None = None
        self.observed_requests = 0
        self.paused_seconds: list[float] = []

    def side(self, state: State):
        """The side that runs one batch in ``state`` and returns its time (seconds)."""
        from specscope.adapters import vllm as plugin

        def run() -> float:
            with contextlib.ExitStack() as stack:
                if state.observed:
                    plugin.configure(audit_every=state.audit_every, token_requests=state.token_requests)
                    self.observed_requests += len(self.chats)
                else:
                    stack.enter_context(plugin.paused())
                outputs = []
                gc.collect()  # a collection the garbage of earlier batches made due lands outside the time
                seconds = timed(lambda: (outputs.extend(self.llm.generate(self.chats, self.params, use_tqdm=False)),
                                         plugin.flush()))
            ids = [list(o.outputs[0].token_ids) for o in outputs]
            self.reference = self.reference or ids
            if ids != self.reference:
                raise RuntimeError("a batch decoded other tokens than the first: the sides are not comparable")
            if not state.observed:
                self.paused_seconds.append(seconds)
            return seconds

        return run

    def shutdown(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def op_pass_through(calls: int = 20_000, blocks: int = 15) -> tuple[float, float, float]:
    """Microseconds per call of the ``specscope::observe`` op with no observer, as a compiled graph
    calls it: ``(mean, low, high)`` of the per-call difference between a compiled function that calls
    it and the same function without it, timed ``blocks`` times in alternating order, ``calls`` calls
    each (Student's t interval over the blocks)."""
    import torch

    from specscope.paired import mean_interval

    token, x = torch.zeros(1), torch.ones(4, 8)
    site = -1  # no hook has this site: the op finds no observer, as in a paused compiled graph

    def plain(v):
        return v * 2

    def observed(v):
        torch.ops.specscope.observe(v, token, site)
        return v * 2

    functions = [torch.compile(f, fullgraph=True, dynamic=False) for f in (plain, observed)]
    for f in functions:
        f(x)

    def block(f) -> float:
        return timed(lambda: [f(x) for _ in range(calls)])

    differences = []
    for i in range(blocks):
        first, second = functions if i % 2 == 0 else functions[::-1]
        t_first, t_second = block(first), block(second)
        t_plain, t_observed = (t_first, t_second) if i % 2 == 0 else (t_second, t_first)
        differences.append(1e6 * (t_observed - t_plain) / calls)
    return mean_interval(differences)


def _engine(compiled: bool):
    """One vLLM engine serving the reference target with the shipped EAGLE-3 draft."""
    from vllm import LLM

    from specscope.engine import DEFAULT_DRAFT_DIR, target_folder

    return LLM(model=str(target_folder()), dtype="float32", max_model_len=1024, enforce_eager=not compiled,
               kv_cache_memory_bytes=1 << 30, seed=0,
               speculative_config={"method": "eagle3", "model": str(DEFAULT_DRAFT_DIR), "num_speculative_tokens": 4})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100, help="pairs per comparison")
    parser.add_argument("--batch", type=int, default=4, help="requests per batch")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--only", nargs="+", choices=list(COMPARISONS), default=None)
    parser.add_argument("--budget-s", type=float, default=1200.0, help="start no round after this many seconds")
    parser.add_argument("--compiled", action="store_true",
                        help="vLLM's compiled mode, the observed engine paused vs observed, and the op apart")
    args = parser.parse_args(argv)
    names = args.only or list(COMPARISONS)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ):  # the environment restored after
        db = str(Path(tmp) / "plugin.db")
        os.environ.update({"SPECSCOPE_DB": db, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        os.environ.setdefault(RESERVED_CPU, "1")
        os.environ.pop("SPECSCOPE_RUN_ID", None)
        from specscope.adapters import vllm as plugin

        plugin.register()
        load = os.getloadavg()[0]
        bench = Bench(args.batch, args.max_new_tokens, args.compiled)
        results = {}
        try:
            for state in {OFF, *(s for n in names for s in COMPARISONS[n][1:])}:  # warm every state once
                bench.side(state)()
            sides = {AA: (bench.side(OFF), bench.side(OFF))}
            sides.update({COMPARISONS[n][0]: (bench.side(COMPARISONS[n][1]), bench.side(COMPARISONS[n][2]))
                          for n in names})
            seconds = timed(lambda: results.update(compare(sides, args.pairs, args.budget_s)))
        finally:
            bench.shutdown()
            plugin.close()
        requests, steps, al, hook_calls = _recorded(db)
    how = "compiled" if args.compiled else "eager"
    print(f"vLLM decode ({how}, one engine, plugin switched per batch): {results[AA].n} ABBA pairs per comparison, "
          f"batches of {args.batch} greedy requests x {args.max_new_tokens} tokens; load average {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end; B's time over A's:")
    for line in report(results):
        print(line)
    print(f"{2 * results[AA].n * len(sides)} timed batches in {seconds:.0f} s")
    if requests != bench.observed_requests:
        raise RuntimeError(f"the run recorded {requests} requests, the observed batches served "
                           f"{bench.observed_requests}: a paused batch was recorded, or an observed one lost")
    print(f"recorded: {requests} requests, exactly those served observed; {steps} verify steps, AL {al:.3f}; "
          f"every batch decoded the same tokens")
    if args.compiled:
        per_call, low, high = op_pass_through()
        calls = hook_calls / steps
        batches = requests / len(bench.chats)  # observed ones: each decodes the same verify steps
        step_us = 1e6 * statistics.median(bench.paused_seconds) * batches / steps
        print(f"left out above, the op's pass-through in the paused graph: {per_call:.2f} us per call (95% CI "
              f"{low:.2f} .. {high:.2f}) x at most {calls:.1f} calls per verify step (hook calls recorded) "
              f"against a verify step of {step_us:.0f} us: at most {100 * high * calls / step_us:.3f}% of decode")


def _recorded(db: str) -> tuple[int, int, float, int]:
    """(requests, verify steps, mean acceptance length, hook calls) the plugin stored."""
    from specscope.storage import open_store

    with open_store(db, read_only=True) as store:
        _, rows = store.query("SELECT count(*) FROM requests")
        _, run = store.query("SELECT verify_steps, mean_acceptance_length FROM v_run_acceptance")
        _, calls = store.query("SELECT SUM(hook_calls) FROM run_ranks")
    return rows[0][0], run[0][0], run[0][1], calls[0][0]


if __name__ == "__main__":
    main()
