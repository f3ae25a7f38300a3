"""The demo job: the reference engine, instrumented, serving built-in prompts into a trace store.

One process per rank; with ``ranks > 1`` the ranks form a torch.distributed (gloo) group and split
the requests, so per-rank views hold real data; ``rank_fault`` switches a fault on for one rank only.
Every rank writes through its own collector into the same store; rank 0 also stores the checkpoint
inspection of the draft. Provenance sampling is on.
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
from dataclasses import dataclass

from specscope.errors import ConfigError


@dataclass(frozen=True)
class DemoOptions:
    """What one demo run does. ``max_new_tokens`` and ``k`` in tokens; ``provenance_every``: compare
    fingerprints on every Nth target-fed draft call (0 = off); ``first_prompt``: serve the held-out
    prompts from this index on (another prompt set); ``draft_dir``: another EAGLE-3 checkpoint folder
    than the shipped head (None)."""

    db: str
    requests: int = 8
    fault: str | None = None
    ranks: int = 1
    k: int = 4
    max_new_tokens: int = 48
    provenance_every: int = 4
    rank_fault: tuple[int, str] | None = None
    first_prompt: int = 0
    draft_dir: str | None = None
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)  # as a Tracer's own ids

    def check(self) -> None:
        """Raise ConfigError for values the demo cannot run with."""
        from specscope.engine.faults import check_fault

        check_fault(self.fault, greedy=True)
        if self.requests < 1 or self.ranks < 1 or self.k < 1 or self.max_new_tokens < 1:
            raise ConfigError("--requests, --ranks, --k and --max-new-tokens must be at least 1")
        if self.first_prompt < 0:
            raise ConfigError(f"--first-prompt must be at least 0, got {self.first_prompt}")
        if self.ranks > self.requests:
            raise ConfigError(f"--ranks {self.ranks} exceeds --requests {self.requests}: a rank would idle")
        if self.rank_fault is not None:
            rank, name = self.rank_fault
            check_fault(name, greedy=True)
            if not 0 <= rank < self.ranks:
                raise ConfigError(f"--rank-fault names rank {rank}, but the run has ranks 0..{self.ranks - 1}")

    def fault_for(self, rank: int) -> str | None:
        """The fault switch of ``rank``: the rank fault on its rank, else the run's fault."""
        if self.rank_fault is not None and self.rank_fault[0] == rank:
            return self.rank_fault[1]
        return self.fault

    @property
    def label(self) -> str | None:
        """The run's fault label as stored (display only): ``"rank 1: no-aux-capture"`` for a rank fault."""
        if self.rank_fault is None:
            return self.fault
        rank, name = self.rank_fault
        return f"{self.fault} + rank {rank}: {name}" if self.fault else f"rank {rank}: {name}"


def run_demo(opts: DemoOptions) -> str:
    """Run the demo into ``opts.db`` and return the run id. Raises ConfigError for bad options."""
    opts.check()
    if opts.ranks == 1:
        _serve_rank(0, opts, None)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_serve_rank, args=(opts, _free_port()), nprocs=opts.ranks, join=True)
    return opts.run_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_rank(rank: int, opts: DemoOptions, port: int | None) -> None:
    import torch
    import torch.distributed as dist

    from specscope.collector import Collector
    from specscope.readmodel import store_verdict

    # Ranks share the process's threads (OMP_NUM_THREADS, else the cores): oversubscribed OpenMP
    # threads spin against each other and slow the target's forward by an order of magnitude.
    if opts.ranks > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // opts.ranks))
    if port is not None:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=opts.ranks)
    try:
        with Collector(opts.db, on_run_end=store_verdict) as collector:
            _serve(rank, opts, collector)
    finally:
        if port is not None:
            dist.destroy_process_group()


def _serve(rank: int, opts: DemoOptions, collector) -> None:
    from specscope.engine import (
        DEFAULT_DRAFT_DIR,
        ENGINE_NAME,
        ENGINE_VERSION,
        Engine,
        demo_prompts,
        target_folder,
    )
    from specscope.inspector import inspect_checkpoint
    from specscope.instrumentation import Tracer, check_load, instrument

    draft_dir = opts.draft_dir or DEFAULT_DRAFT_DIR
    engine = Engine(draft_dir, fault=opts.fault_for(rank), k=opts.k)
    target_id, draft_id = engine.model_ids
    with Tracer(collector, engine=ENGINE_NAME, engine_version=ENGINE_VERSION, target_model=target_id,
                draft_model=draft_id, config=engine.run_config(), run_id=opts.run_id, fault=opts.label,
                provenance_every=opts.provenance_every) as tracer:
        instrument(tracer, draft=engine.draft, target=engine.target, modules=["fc"])
        check_load(tracer, engine.draft, list(engine.loaded.checkpoint_keys), engine="reference",
                   strict=engine.loaded.strict)
        if rank == 0:
            # against the target it serves: the contract checks run too, and the capture-id
            # convention is judged for this engine and target, not in the abstract
            report = inspect_checkpoint(draft_dir, engine="reference", target=target_folder())
            for finding in report.findings:
                collector.emit(dataclasses.replace(finding, run_id=opts.run_id))
        engine.tracer = tracer
        mine = list(range(opts.requests))[rank::opts.ranks]
        prompts = demo_prompts(opts.requests, opts.first_prompt)
        engine.generate([prompts[i] for i in mine], max_new_tokens=opts.max_new_tokens,
                        request_ids=[f"req-{i:03d}" for i in mine])
