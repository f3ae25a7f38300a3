"""The cost of keeping audited requests' token ids (``Tracer(token_requests=)``; docs/design.md,
"Replay against the target") on the engine thread, per request.

Run: ``python -m benchmarks.token_ids [--prompt 512] [--output 256] [--requests 200] [--repeats 15]``.

A Tracer with a discarding sink serves ``requests`` requests of ``prompt`` prompt ids and ``output``
output ids (``start_request(prompt=ids)`` ... ``finish_request(output_ids=ids)``, what the vLLM
plugin and the reference engine call), once keeping the ids (every request within the budget) and
once not (``token_requests=0``), in alternating order per round; a round's cost is the difference of
the two batches in this thread's CPU time (``time.thread_time``: time descheduled on a shared machine
is other people's), the figure the median over ``repeats`` rounds, in microseconds per request.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.hook_overhead import DiscardSink
from specscope.events import RunConfig
from specscope.instrumentation import Tracer


def _batch(keep: bool, prompt: list[int], output: list[int], requests: int) -> float:
    tracer = Tracer(DiscardSink(), engine="bench", engine_version="0", target_model="t", draft_model="d",
                    config=RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8, k=4,
                                     num_target_layers=4),
                    token_requests=requests if keep else 0)
    tracer.start()
    start = time.thread_time()
    for i in range(requests):
        tracer.start_request(f"r{i}", len(prompt), temperature=0.0, prompt=prompt)
        tracer.finish_request(f"r{i}", len(output), output_ids=output)
    elapsed = time.thread_time() - start
    tracer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    prompt, output = list(range(1000, 1000 + args.prompt)), list(range(args.output))
    added = []
    for round_ in range(args.repeats):
        order = (True, False) if round_ % 2 else (False, True)
        times = {keep: _batch(keep, prompt, output, args.requests) for keep in order}
        added.append((times[True] - times[False]) / args.requests * 1e6)
    q1, median, q3 = statistics.quantiles(added, n=4)
    print(f"token ids kept ({args.prompt} prompt + {args.output} output ids per request): "
          f"{median:.1f} us per request added (interquartile {q1:.1f} .. {q3:.1f})")


if __name__ == "__main__":
    main()
