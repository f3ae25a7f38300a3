"""The losslessness audit's cost on the step path, against the verify forward it rides on.

Run: ``python -m benchmarks.audit_cost [--slots 5] [--repeats 31]``.

One audited verify step costs one :func:`specscope.instrumentation.token_stats` call over its slots
(k + 1 per request: the drafts and the bonus token, each with the draft token verified there, which
the recovered-token check reads) at the target's vocabulary; the audit runs it on
one verify step in ``SPECSCOPE_AUDIT_EVERY`` (default 4). The baseline is the verify forward itself:
the reference target (SmolLM2-135M, float32) scoring k + 1 = 5 tokens on a 64-token KV cache, the
forward a single-request verify step makes. Both are timed in this thread's CPU time on one torch
thread (``time.thread_time``: time descheduled on a shared machine is other people's), alternating per
round; the figures are medians over rounds with their interquartile range, and the cost per verify
step is the token_stats median over the forward's median, divided by the audit's period. A GPU runs
both on the device and overlaps the audit's copy; this CPU figure is the unfavourable case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specscope.engine.target import load_target
from specscope.instrumentation import token_stats

PERIODS = (4, 1)  # the default SPECSCOPE_AUDIT_EVERY, and every verify step


def _timed(fn) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=5, help="audited slots per verify step (k + 1 per request)")
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _ = load_target()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 64), generator=generator)
    draft = torch.randint(0, vocab, (1, 5), generator=generator)
    logits = torch.randn(args.slots, vocab, generator=generator) * 4
    emitted = torch.randint(0, vocab, (args.slots,), generator=generator)
    target = logits.argmax(dim=-1)  # what a lossless greedy engine emits
    temperature = torch.tensor([0.0, 0.8] * args.slots)[:args.slots]
    top_k, top_p = torch.full((args.slots,), 20), torch.full((args.slots,), 0.9)
    uniform = torch.rand(args.slots, generator=generator)
    drafted = torch.cat([torch.randint(0, vocab, (args.slots - 1,), generator=generator), torch.tensor([-1])])

    with torch.inference_mode():
        cache = model(prompt, use_cache=True).past_key_values

        def verify() -> None:
            model(draft, past_key_values=cache, use_cache=True)
            cache.crop(-draft.shape[1])  # the next round verifies on the same 64-token cache

        def audit() -> None:  # requests with top-k / top-p: vLLM's cut, found among each row's largest logits
            token_stats(logits, emitted, temperature, top_k, top_p, uniform=uniform, drafted=drafted)

        def audit_plain() -> None:  # greedy and temperature-only requests: no truncation, no sort
            token_stats(logits, emitted, temperature, uniform=uniform, drafted=drafted)

        def audit_greedy() -> None:  # a batch of greedy requests alone, as the engine says on the host: lossless
            token_stats(logits, target, torch.zeros(args.slots), uniform=uniform, drafted=drafted, all_greedy=True)

        def audit_greedy_wrong() -> None:  # every slot a mismatch: the host then reads the target's argmax too
            token_stats(logits, emitted, torch.zeros(args.slots), uniform=uniform, drafted=drafted, all_greedy=True)

        jobs = {"verify forward": verify, "token_stats, top-k/top-p": audit, "token_stats, no truncation": audit_plain,
                "token_stats, all greedy": audit_greedy, "token_stats, all greedy, every slot a mismatch": audit_greedy_wrong}
        times: dict[str, list[float]] = {name: [] for name in jobs}
        for fn in jobs.values():
            fn()  # warm-up
        for r in range(args.repeats):  # rotate which goes first, so none always meets a warm cache
            names = list(jobs)[r % len(jobs):] + list(jobs)[:r % len(jobs)]
            for name in names:
                times[name].append(_timed(jobs[name]) * 1e3)
    figures = {name: _quartiles(values) for name, values in times.items()}
    forward = figures.pop("verify forward")[1]
    print(f"verify forward (5 tokens on a 64-token cache, {vocab} vocabulary): {forward:.2f} ms")
    for name, (q1, median, q3) in figures.items():
        shares = ", ".join(f"every {period}: {median / forward / period:.2%}" for period in PERIODS)
        print(f"{name} over {args.slots} slots: {median:.2f} ms (interquartile {q1:.2f} .. {q3:.2f}); "
              f"of the verify forward, audited {shares}")


if __name__ == "__main__":
    main()
