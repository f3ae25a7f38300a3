"""`specscope demo` (placeholder until its issue lands)."""


def register(sub):
    sub.add_parser("demo", help="(not built yet)").set_defaults(func=lambda args: 2)
