"""vLLM decode with the specscope plugin on vs off, in one engine, calibrated to resolve 1%.

Run: ``python -m benchmarks.vllm_decode [--pairs P] [--batch B] [--max-new-tokens T]
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
nothing to wait for). Every batch must return the very token ids of the first one (checked): same
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

The engine is eager (``enforce_eager``): ``paused()`` refuses a compiled target (taking the capture
layers' hooks out of a target vLLM compiled with them in crashed its compiled forward), so vLLM's
compiled mode has no figure from this method. At the end the run's requests are counted: exactly those
of the observed batches are recorded (nothing while paused).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from specscope.paired import AA, compare, report, timed

EVERY = 1 << 30
"""A token-id budget no benchmark spends: every request's ids are kept."""


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

    def __init__(self, batch: int, max_new_tokens: int) -> None:
        from vllm import LLM, SamplingParams

        from specscope.engine import DEFAULT_DRAFT_DIR, heldout_prompts, target_folder

        self.llm = LLM(model=str(target_folder()), dtype="float32", max_model_len=1024,
                       enforce_eager=True, kv_cache_memory_bytes=1 << 30, seed=0,
                       speculative_config={"method": "eagle3", "model": str(DEFAULT_DRAFT_DIR),
                                           "num_speculative_tokens": 4})
        tokenizer = self.llm.get_tokenizer()
        self.chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                    add_generation_prompt=True) for p in heldout_prompts()[:batch]]
        self.params = SamplingParams(temperature=0, max_tokens=max_new_tokens, ignore_eos=True)
        self.reference: list[list[int]] | None = None
        self.observed_requests = 0

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
                seconds = timed(lambda: (outputs.extend(self.llm.generate(self.chats, self.params, use_tqdm=False)),
                                         plugin.flush()))
            ids = [list(o.outputs[0].token_ids) for o in outputs]
            self.reference = self.reference or ids
            if ids != self.reference:
                raise RuntimeError("a batch decoded other tokens than the first: the sides are not comparable")
            return seconds

        return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=24, help="pairs per comparison")
    parser.add_argument("--batch", type=int, default=4, help="requests per batch")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--only", nargs="+", choices=list(COMPARISONS), default=None)
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no round after this many seconds")
    args = parser.parse_args(argv)
    names = args.only or list(COMPARISONS)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ):  # the environment restored after
        db = str(Path(tmp) / "plugin.db")
        os.environ.update({"SPECSCOPE_DB": db, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        os.environ.pop("SPECSCOPE_RUN_ID", None)
        from specscope.adapters import vllm as plugin

        plugin.register()
        load = os.getloadavg()[0]
        bench = Bench(args.batch, args.max_new_tokens)
        results = {}
        try:
            for state in {OFF, *(s for n in names for s in COMPARISONS[n][1:])}:  # warm every state once
                bench.side(state)()
            sides = {AA: (bench.side(OFF), bench.side(OFF))}
            sides.update({COMPARISONS[n][0]: (bench.side(COMPARISONS[n][1]), bench.side(COMPARISONS[n][2]))
                          for n in names})
            seconds = timed(lambda: results.update(compare(sides, args.pairs, args.budget_s)))
        finally:
            bench.llm.llm_engine.engine_core.shutdown()
            plugin.close()
        requests, steps, al = _recorded(db)
    print(f"vLLM decode (eager), one engine, plugin switched per batch: {results[AA].n} ABBA pairs per comparison, "
          f"batches of {args.batch} greedy requests x {args.max_new_tokens} tokens; load average "
          f"{load:.2f} at start, {os.getloadavg()[0]:.2f} at end; B's time over A's:")
    for line in report(results):
        print(line)
    print(f"{2 * results[AA].n * len(sides)} timed batches in {seconds:.0f} s")
    print(f"recorded: {requests} requests (served observed: {bench.observed_requests}), {steps} verify steps, "
          f"AL {al:.3f}; every batch decoded the same tokens")


def _recorded(db: str) -> tuple[int, int, float]:
    """(requests, verify steps, mean acceptance length) the plugin stored."""
    from specscope.storage import open_store

    with open_store(db, read_only=True) as store:
        _, rows = store.query("SELECT count(*) FROM requests")
        _, run = store.query("SELECT verify_steps, mean_acceptance_length FROM v_run_acceptance")
    return rows[0][0], run[0][0], run[0][1]


if __name__ == "__main__":
    main()
