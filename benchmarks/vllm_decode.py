"""vLLM decode with the specscope plugin vs without it, side by side.

Run: ``python -m benchmarks.vllm_decode [--pairs P] [--max-new-tokens T] [--compiled]
[--baseline bare|audit-off]``.

Two real vLLM OpenAI-compatible servers (``vllm.entrypoints.openai.api_server``) serve the reference
target with the shipped EAGLE-3 draft on loopback at the same time: one bare (``SPECSCOPE_DB`` unset:
the plugin is installed but inert), one with the plugin recording into a temporary SQLite store
(default settings: shape sampling, provenance every 16th fused input, the losslessness audit every
4th verify batch). ``--baseline audit-off`` compares against the plugin with the audit off instead of
a bare server (the audit's own cost); ``--compiled`` serves vLLM's default compiled mode instead of
``--enforce-eager``. Each of ``pairs`` held-out
prompts is sent to both, back to back, in alternating order (one server is busy at a time, so
machine-load drift hits both halves of a pair alike); the figure is the median of the per-pair
slowdowns (bare tokens/s / plugin tokens/s - 1) with its interquartile range. Speed-ups from
different acceptance cannot enter: the same greedy request gives the same tokens and verify steps on
both servers (checked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from specscope.engine import DEFAULT_DRAFT_DIR, heldout_prompts, target_folder
from specscope.engine.vllm_server import complete, start_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--compiled", action="store_true", help="vLLM's default compiled mode")
    parser.add_argument("--baseline", choices=("bare", "audit-off"), default="bare")
    args = parser.parse_args(argv)
    target, draft = target_folder(), Path(DEFAULT_DRAFT_DIR)
    prompts = heldout_prompts()
    with tempfile.TemporaryDirectory() as tmp:
        base = {k: v for k, v in os.environ.items() if k != "SPECSCOPE_DB"}
        base["OMP_NUM_THREADS"] = "1"
        db = str(Path(tmp) / "plugin.db")
        servers = {}
        try:
            baseline = base if args.baseline == "bare" else {
                **base, "SPECSCOPE_DB": str(Path(tmp) / "audit-off.db"), "SPECSCOPE_AUDIT_EVERY": "0"}
            for name, env in (("bare", baseline), ("plugin", {**base, "SPECSCOPE_DB": db})):
                servers[name] = start_server(target, draft, env, Path(tmp) / f"{name}.log", args.compiled)
            ratios = []
            for i in range(args.pairs):
                prompt = prompts[i % len(prompts)]
                halves = {}
                for name in (("bare", "plugin") if i % 2 == 0 else ("plugin", "bare")):
                    halves[name] = complete(servers[name][1], str(target), prompt, args.max_new_tokens)
                if halves["bare"][1] != halves["plugin"][1]:
                    raise RuntimeError(f"pair {i}: the two servers decoded differently")
                ratios.append(100 * (halves["bare"][0] / halves["plugin"][0] - 1))
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=60)
        q1, median, q3 = statistics.quantiles(ratios, n=4)
        from specscope.doctor import diagnose
        from specscope.storage import open_store

        with open_store(db, read_only=True) as store:
            _, rows = store.query("SELECT run_id, verify_steps, mean_acceptance_length FROM v_run_acceptance")
            codes = diagnose(store, rows[0][0]).codes()
    mode = "compiled" if args.compiled else "eager"
    print(f"vLLM decode ({mode}) with the plugin vs {args.baseline} ({args.pairs} paired requests, "
          f"{args.max_new_tokens} tokens): overhead median {median:+.2f}% (interquartile {q1:+.2f}% .. {q3:+.2f}%)")
    print(f"plugin run: {rows[0][1]} verify steps, AL {rows[0][2]:.3f}; doctor: {codes or 'no findings'}")


if __name__ == "__main__":
    main()
