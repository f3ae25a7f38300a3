"""One rank of a 2-process gloo group for the tracer's rank / world-size tests (spawned)."""

from __future__ import annotations

import torch
from _list_sink import ListSink

from specscope.events import RankStart, RunConfig, RunStart
from specscope.instrumentation import Tracer


def run_rank(rank: int, store_file: str, out_dir: str, when: str = "after") -> None:
    """Join the group, run a tracer, write ``rank world_size run_world_size [ranks seen]`` of the
    RankStart / RunStart sent once the group is up.

    ``when``: the tracer is built after ``init_process_group`` (``"after"``), built before it
    (``"built_before"``), or built and started before it, its next status sent after
    (``"started_before"``; only the events sent after the group came up are looked at).
    """
    sink = ListSink()
    config = RunConfig(aux_layer_ids_resolved=(2,), target_hidden_size=8, expected_fused_width=8,
                       k=1, num_target_layers=4)

    def tracer() -> Tracer:
        return Tracer(sink, run_id="shared", engine="e", engine_version="0", target_model="t",
                      draft_model="d", config=config)

    early = None if when == "after" else tracer()
    if when == "started_before":
        early.start()
    torch.distributed.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    try:
        sink.events.clear()
        with early or tracer() as traced:
            if when == "started_before":
                traced.status()
            traced.start_request(f"r{rank}", 4)
        start = sink.of(RankStart)[0]
        ranks = sorted({e.rank for e in sink.events})  # every event names its rank
        with open(f"{out_dir}/rank{rank}.txt", "w") as fh:
            fh.write(f"{start.rank} {start.world_size} {sink.of(RunStart)[0].world_size} {ranks}")
    finally:
        # neither rank tears its sockets down while the other may still be connecting to it (gloo's
        # "connectFullMesh failed ... Connection closed by peer" on a loaded machine)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
