"""SQLite built-ins whose one call can outlive a user statement's time limit, bounded per call.

SQLite never interrupts a function call (its progress handler runs between VM instructions), and
these grow faster than their arguments: ``instr`` and ``replace`` search naively (a 4 MB text and a
300 KB near-match took 22.8 s), ``trim`` / ``ltrim`` / ``rtrim`` scan their whole character set for
every character trimmed (100 KB by 100 KB: 29 s), ``json_patch`` compares every key with every key
(two 30,000-key objects: 1.6 s), and ``printf('%.*c', 2000000000, 'x')`` runs its repeat loop to
the end even after the value outgrew the length limit (10.9 s). :class:`Builtins` replaces them on
a user statement's connection by Python functions that refuse a call over its budget and hand every
other call to the real built-in, on a private in-memory connection: results are SQLite's own.
A call costs about 4 us more (measured here).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

# (name, arguments) -> most (first argument's length) x (second argument's length) a call may take:
# about 10 ms each here (the measurements above: 5e10 character pairs a second for instr, replace and
# json_patch; 3.4e8 for the trims)
PRODUCT_BUDGETS = {("instr", 2): 2**29, ("replace", 3): 2**29, ("json_patch", 2): 2**29,
                   ("trim", 2): 2**22, ("ltrim", 2): 2**22, ("rtrim", 2): 2**22}
_FORMATS = ("printf", "format")  # format is printf's other name
_NUMBER_TEXT = 32  # a number's text is shorter than this
# printf's conversions (https://sqlite.org/printf.html): flags, width, precision, length, type
_CONVERSION = re.compile(r"%[-+ #0!,]*(\*|\d*)(?:\.(\*|\d*))?(?:ll|l)?(.?)", re.DOTALL)
_private = threading.local()  # one in-memory connection per thread calls the real built-ins


class CallRefused(Exception):
    """Raised inside a replaced built-in; SQLite reports it as a failed function call."""


class Builtins:
    """The replacements for one user statement; ``error`` is the message of the call that failed
    (refused, or the built-in's own error), ``too_big`` True when its value outgrew ``value_limit``."""

    def __init__(self, value_limit: int) -> None:
        self.value_limit = value_limit
        self.error: str | None = None
        self.too_big = False

    def install(self, connection: sqlite3.Connection) -> None:
        """Replace the built-ins on ``connection`` (sqlite3 cannot remove a function again: they stay,
        and each install replaces the last)."""
        for (name, arguments), budget in PRODUCT_BUDGETS.items():
            connection.create_function(name, arguments, self._product_bounded(name, budget), deterministic=True)
        for name in _FORMATS:
            connection.create_function(name, -1, self._printf(name), deterministic=True)

    def _product_bounded(self, name: str, budget: int) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            first, second = (len(v) if isinstance(v, (str, bytes)) else _NUMBER_TEXT for v in args[:2])
            if first * second > budget:
                self._refuse(f"{name}() of a {first:,}-character value and a {second:,}-character one "
                             f"(over {budget:,} character pairs: SQLite cannot stop a call once begun)")
            return self._builtin(name, args)
        return call

    def _printf(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            widest = max(self._widths(args), default=0)
            if widest > self.value_limit:
                self._refuse(f"{name}() with a width or precision of {widest:,} (over the per-value limit "
                             f"of {self.value_limit:,} bytes)")
            return self._builtin(name, args)
        return call

    def _widths(self, args: tuple) -> Iterator[int]:
        """Each width and precision ``args``' format asks for (``*`` takes the next argument)."""
        if not args or not isinstance(args[0], (str, bytes)):
            return
        form = args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace")
        values = iter(args[1:])
        for conversion in _CONVERSION.finditer(form):
            width, precision, kind = conversion.groups()
            for part in (width, precision):
                if part == "*":
                    yield abs(self._as_integer(next(values, 0)))
                elif part:
                    yield int(part) if len(part) < 19 else 2**63
            if kind != "%":
                next(values, None)

    def _as_integer(self, value: Any) -> int:
        """``value`` as printf reads a ``*`` argument: SQLite's own conversion to an integer."""
        if isinstance(value, int):
            return value
        return self._builtin("CAST", (value,), " AS INTEGER") or 0

    def _builtin(self, name: str, args: tuple, cast: str = "") -> Any:
        connection = getattr(_private, "connection", None)
        if connection is None:
            connection = _private.connection = sqlite3.connect(":memory:")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_limit)
        sql = f"SELECT {name}({', '.join('?' * len(args))}{cast})"
        try:
            return connection.execute(sql, args).fetchone()[0]
        except sqlite3.Error as exc:
            self.too_big = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG
            self.error = str(exc)
            raise

    def _refuse(self, what: str) -> None:
        self.error = f"{what} is refused; select less of it (substr, length)"
        raise CallRefused(self.error)
