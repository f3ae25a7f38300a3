"""``python -m benchmarks`` (``make bench``): every benchmark in turn, each printing its own table."""

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

for module in (engine_decode, hook_overhead, audit_cost, token_ids, collector_ingest, pg_ingest, dashboard_queries,
               inspect_memory):
    print(f"\n=== {module.__name__} ===", flush=True)
    module.main()
