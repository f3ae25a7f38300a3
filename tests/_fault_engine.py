"""A small instrumented engine for the fault-injection tests, run as its own process.

A real torch module with specscope hooks (``TinyEagle3Draft`` of ``_draft_fixture``, every call
sampled) feeds a Tracer, whose sink counts what it is given and passes it to a Collector writing the
store. Two modes:

- ``kill DIR TRIALS SEED``: a zygote that imports torch once, then per trial forks an engine child on
  a fresh SQLite store, reads its flush acknowledgements ("events committed so far") and SIGKILLs it at
  a random point; one JSON line per trial on stdout.
- ``serve STORE``: one engine that runs steps, prints ``ready``, waits for ``fault [fsize]`` on stdin
  (``fsize`` makes it cap its own file size at 0 with RLIMIT_FSIZE: a full file system), then runs
  timed steps (one every millisecond or so) under the fault the test applies until ``clear`` arrives,
  recovers, and prints one JSON line of figures.
"""

from __future__ import annotations

import json
import os
import random
import resource
import select
import signal
import statistics
import sys
import time

import torch
from _draft_fixture import AUX, HIDDEN, TinyEagle3Draft, run_config

from specscope import events as ev
from specscope.collector import Collector
from specscope.instrumentation import Tracer, instrument

STEPS_PER_REQUEST = 16


class CountingSink:
    """Counts the events the tracer emits (total, tensor events, verify steps) before the collector."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.emitted = self.tensors = self.verify_steps = 0

    def emit(self, event) -> None:
        self.emitted += 1
        self.tensors += isinstance(event, ev.TensorEvent)
        self.verify_steps += isinstance(event, ev.VerifyStep)
        self.collector.emit(event)

    def flush(self, timeout_s: float | None = None) -> bool:
        return self.collector.flush(timeout_s)

    def close(self) -> None:
        self.collector.close()


def make_engine(store: str, run_id: str, batch_size: int = 64):
    torch.manual_seed(0)
    draft = TinyEagle3Draft().eval()
    sink = CountingSink(Collector(store, batch_size=batch_size, flush_interval_s=0.02))
    tracer = Tracer(sink, run_id=run_id, engine="fault-engine", engine_version="0", target_model="t",
                    draft_model="d", config=run_config(), sample_every=1)
    instrument(tracer, draft=draft)
    return draft, sink, tracer


@torch.no_grad()
def step(draft, tracer: Tracer, i: int) -> None:
    """One engine step: a target-fed draft call (B=1, T=1, 3H), its verify step, request bookkeeping."""
    request = f"q{i // STEPS_PER_REQUEST}"
    if i % STEPS_PER_REQUEST == 0:
        tracer.start_request(request, 8)
    draft(torch.tensor([[i % 200]]), torch.tensor([[i]]), torch.randn(1, 1, len(AUX) * HIDDEN))
    accepted = i % 4
    tracer.record_verify(request, proposed=3, accepted=min(accepted, 3))
    if i % STEPS_PER_REQUEST == STEPS_PER_REQUEST - 1:
        tracer.finish_request(request, STEPS_PER_REQUEST * 2)


def kill_child(store: str, ack_fd: int, batch_size: int) -> None:
    draft, sink, tracer = make_engine(store, "run-kill", batch_size)
    i = 0
    while True:
        step(draft, tracer, i)
        i += 1
        if i % 8 == 0:
            counts = (sink.emitted, sink.tensors, sink.verify_steps)  # emitted before this flush
            if sink.flush(60):
                os.write(ack_fd, f"{counts[0]} {counts[1]} {counts[2]}\n".encode())


def kill_trials(directory: str, trials: int, seed: int) -> None:
    rng = random.Random(seed)
    for trial in range(trials):
        store = os.path.join(directory, f"kill-{trial}.db")
        read_fd, write_fd = os.pipe()
        acks_wanted = rng.randint(1, 12)
        batch_size = rng.choice([1, 7, 64, 500])
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                kill_child(store, write_fd, batch_size)
            finally:
                os._exit(1)
        os.close(write_fd)
        last = "0 0 0"
        with os.fdopen(read_fd) as acks:
            for _ in range(acks_wanted):
                line = acks.readline()
                if not line:
                    break
                last = line
            time.sleep(rng.uniform(0, 0.03))  # land anywhere: mid-batch, mid-commit, mid-hook
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        emitted, tensors, verify_steps = map(int, last.split())
        print(json.dumps({"store": store, "signal": -os.waitstatus_to_exitcode(status), "acked_events": emitted,
                          "acked_tensors": tensors, "acked_verify_steps": verify_steps,
                          "batch_size": batch_size}), flush=True)


def serve(store: str) -> None:
    draft, sink, tracer = make_engine(store, "run-fault")
    i = 0

    def timed_steps(n: int) -> list[float]:
        nonlocal i
        took = []
        for _ in range(n):
            start = time.perf_counter()
            step(draft, tracer, i)
            took.append(time.perf_counter() - start)
            i += 1
        return took

    healthy = timed_steps(200)
    assert sink.flush(60), "the store failed before the fault"
    print("ready", flush=True)
    full = "fsize" in sys.stdin.readline().split()  # fault [fsize]
    if full:  # a full file system: no file may grow (SIGXFSZ ignored -> EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    faulted: list[float] = []
    while not select.select([sys.stdin], [], [], 0.001)[0]:  # until "clear" arrives
        faulted += timed_steps(1)
    sys.stdin.readline()
    if full:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    # Recovery: one flush answers for the outage (False), then the store takes writes again.
    deadline = time.monotonic() + 120
    sink.flush(60)
    timed_steps(20)
    while not sink.flush(10) and time.monotonic() < deadline:
        timed_steps(1)
    close_start = time.perf_counter()
    tracer.close()
    close_s = time.perf_counter() - close_start
    collector = sink.collector
    collector.close()
    print(json.dumps({
        "emitted": sink.emitted, "written": collector.written, "dropped": collector.dropped,
        "write_errors": collector.write_errors, "hook_errors": tracer.hook_errors,
        "fault_steps": len(faulted), "longest_steps_s": sorted(faulted)[-3:],
        "median_healthy_step_s": statistics.median(healthy),
        "close_s": close_s}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        kill_trials(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        serve(sys.argv[2])
