"""``python -m benchmarks`` (``make bench``): every benchmark in turn, each printing its own table;
the vLLM decode benchmark (eager, every comparison) where vLLM is installed."""

import importlib.util

from benchmarks import (
    audit_cost,
    collector_ingest,
    dashboard_queries,
    engine_decode,
    hook_overhead,
    inspect_memory,
    pg_ingest,
    token_ids,
)

modules = [engine_decode, hook_overhead, audit_cost, token_ids, collector_ingest, pg_ingest, dashboard_queries,
           inspect_memory]
if importlib.util.find_spec("vllm") is not None:
    from benchmarks import vllm_decode

    modules.insert(1, vllm_decode)
for module in modules:
    print(f"\n=== {module.__name__} ===", flush=True)
    module.main()
