"""`specscope dashboard` (placeholder until its issue lands)."""


def register(sub):
    sub.add_parser("dashboard", help="(not built yet)").set_defaults(func=lambda args: 2)
