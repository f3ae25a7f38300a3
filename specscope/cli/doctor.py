"""`specscope doctor` (placeholder until its issue lands)."""


def register(sub):
    sub.add_parser("doctor", help="(not built yet)").set_defaults(func=lambda args: 2)
