"""`specscope inspect PATH`: check an EAGLE-3 draft checkpoint before serving it (docs/design.md,
"Finding codes"), alone or against its target (``--target``) and an older draft (``--compare``).

Exit status: 0 no error finding, 1 at least one error finding, 2 unusable input (one line on stderr).
"""

from __future__ import annotations

from specscope.conventions import ENGINES
from specscope.inspector import SERVE_DTYPES, inspect_checkpoint, render_text
from specscope.results import to_json


def register(sub) -> None:
    """Add the ``inspect`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("inspect", help="check a draft checkpoint for silent loader failures",
                       description="Inspect an EAGLE-3 draft checkpoint (folder, sharded set or "
                                   ".safetensors file) for what the engine's loader would get wrong.")
    p.add_argument("path", help="checkpoint folder, model.safetensors.index.json folder or .safetensors file")
    p.add_argument("--engine", choices=ENGINES, default="sglang", help="loader to check against (default sglang)")
    p.add_argument("--target", metavar="TARGET",
                   help="the target model: a model folder (config.json, safetensors compared when present), "
                        "a config.json, a .gguf file, or 'reference' (the reference engine's GGUF)")
    p.add_argument("--target-config", metavar="PATH", help="the target model's config.json (or its folder)")
    p.add_argument("--compare", metavar="OLD", help="an older draft of the same target: report what changed")
    p.add_argument("--serve-dtype", choices=SERVE_DTYPES, help="dtype the draft will be served in")
    p.add_argument("--json", action="store_true",
                   help="print the machine format (path, format, engine, findings, keys, contract[, compare])")
    p.set_defaults(func=run)


def run(args) -> int:
    """Inspect ``args.path`` and print the report; returns the exit status (0 / 1)."""
    report = inspect_checkpoint(args.path, engine=args.engine, target_config=args.target_config,
                                serve_dtype=args.serve_dtype, target=args.target, compare=args.compare)
    print(to_json(report.to_dict()) if args.json else render_text(report))
    return report.exit_code
