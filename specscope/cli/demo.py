"""``specscope demo``: the reference engine, instrumented, into a store; then the doctor or the dashboard.

Without ``--no-dashboard`` it runs a healthy demo and a faulty one (``--fault``, default
``no-aux-capture``) into one store, then serves the dashboard on it.
"""

from __future__ import annotations

import argparse

from specscope.engine.faults import FAULTS

DEFAULT_DB = "specscope-demo.db"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the instrumented reference engine into a store",
                       description="Serve built-in prompts with the reference EAGLE-3 engine, instrumented "
                                   "(provenance sampling on), into a trace store; print the doctor's "
                                   "summary, or run healthy + faulty and open the dashboard.")
    p.add_argument("--db", default=DEFAULT_DB, help=f"store path or SQLAlchemy URL (default {DEFAULT_DB})")
    p.add_argument("--requests", type=int, default=8, help="requests per run (default 8)")
    p.add_argument("--fault", choices=sorted(FAULTS), default=None,
                   help="fault switch; with the dashboard, the faulty run beside the healthy one "
                        "(default no-aux-capture)")
    p.add_argument("--ranks", type=int, default=1, help="engine processes under torch.distributed (gloo)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--no-dashboard", action="store_true", help="run once and print the doctor summary")
    p.add_argument("--port", type=int, default=8501, help="dashboard port")
    p.add_argument("--host", default="127.0.0.1", help="dashboard address")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specscope.demo import DemoOptions, run_demo
    from specscope.doctor import diagnose, render_text, save_findings
    from specscope.storage import open_store

    common = dict(db=args.db, requests=args.requests, ranks=args.ranks, k=args.k,
                  max_new_tokens=args.max_new_tokens)
    faults = [args.fault] if args.no_dashboard else [None, args.fault or "no-aux-capture"]
    run_ids = []
    for fault in faults:
        print(f"specscope demo: serving {args.requests} requests, fault={fault or 'none'}, "
              f"ranks={args.ranks} -> {args.db}", flush=True)
        run_ids.append(run_demo(DemoOptions(fault=fault, **common)))
    with open_store(args.db) as store:
        reports = [diagnose(store, run_id) for run_id in run_ids]
        for report in reports:
            save_findings(store, report)
            print(render_text(report))
    if args.no_dashboard:
        return max(r.exit_code for r in reports)
    from specscope.cli import dashboard

    return dashboard.run(argparse.Namespace(db=args.db, host=args.host, port=args.port))
