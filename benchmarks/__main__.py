"""``python -m benchmarks`` (``make bench``): every benchmark in turn, each printing its own table;
the vLLM decode benchmark, eager then compiled, where vLLM is installed (each in a process of its
own: the plugin records one run per process)."""

import importlib.util
import subprocess
import sys

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
for module in modules:
    print(f"\n=== {module.__name__} ===", flush=True)
    module.main()
    if module is engine_decode and importlib.util.find_spec("vllm") is not None:
        for mode in ([], ["--compiled"]):
            print(f"\n=== benchmarks.vllm_decode {' '.join(mode)} ===", flush=True)
            subprocess.run([sys.executable, "-m", "benchmarks.vllm_decode", *mode], check=True)
