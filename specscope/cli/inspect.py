"""`specscope inspect` (placeholder until its issue lands)."""


def register(sub):
    sub.add_parser("inspect", help="(not built yet)").set_defaults(func=lambda args: 2)
