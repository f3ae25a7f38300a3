"""Where a command that creates its store when missing (``dashboard``, ``demo``, ``watch``) may
create it: never in an existing empty file, which SQLite would take for an empty database and turn
into a store (a user's file, a typo), and, for the dashboard, which only waits for runs, never in a
folder that does not exist (a mistyped path would wait for runs written elsewhere)."""

from __future__ import annotations

from specscope.errors import ConfigError
from specscope.storage import store_file


def check_store_location(db: str, command: str, *, existing_folder: bool = False) -> None:
    """ConfigError (one line) when ``db`` names an existing empty file, or with ``existing_folder`` a
    new file in a folder that does not exist; a PostgreSQL URL passes. StoreError for a location
    that is no store URL or path."""
    path = store_file(db)
    if path is None:
        return
    try:
        empty = path.is_file() and path.stat().st_size == 0
        unplaced = existing_folder and not path.exists() and not path.parent.is_dir()
    except OSError as exc:  # a name too long, a folder without permission
        raise ConfigError(f"cannot use {db} as a store ({exc.strerror or exc})") from exc
    if unplaced:
        raise ConfigError(f"no folder {path.parent} for the store {db}: the {command} creates a new store "
                          "only in a folder that exists")
    if empty:
        raise ConfigError(f"{db} is an empty file, not a specscope store: give a store, or a path "
                          f"that does not exist yet (the {command} creates the store there)")
