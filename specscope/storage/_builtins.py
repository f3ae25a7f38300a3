"""SQLite built-ins whose one call can outlive a user statement's time limit, bounded per call.

SQLite never interrupts a function call (it looks at an interrupt between VM instructions), and
these grow faster than their arguments: ``instr`` and ``replace`` search naively (a 4 MB text and a
300 KB near-match took 22.8 s), ``trim`` / ``ltrim`` / ``rtrim`` scan their whole character set for
every character trimmed (100 KB by 100 KB: 29 s), ``json_patch`` compares every key with every key
(two 30,000-key objects: 1.6 s), ``LIKE`` / ``GLOB`` try the pattern's literal run after a wildcard at
every position (a 4 MB text and ``'%'`` then 20,000 characters: 102 s), and
``printf('%.*c', 2000000000, 'x')`` runs its repeat loop to the end even after the value outgrew the
length limit (10.9 s). :class:`Builtins` replaces them on a user statement's connection by Python
functions that refuse a call over its budget and hand every other call to the real built-in, on a
private in-memory connection: results are SQLite's own. A call costs 2 to 3 us more (measured here:
a LIKE over 1M rows takes 2.5 s, 0.33 s natively; SQLite's LIKE optimization for indexes is off).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

_NUMBER_TEXT = 32  # a number's text is shorter than this


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes)) else _NUMBER_TEXT


def _product(first: Any, second: Any, *_: Any) -> int:
    return _length(first) * _length(second)


def _pattern_cost(wildcard: str) -> Callable[..., int]:
    """``like(pattern, text)`` / ``glob(pattern, text)``: the text's length times the longest run of
    the pattern between two ``wildcard`` (an escape character may hide one: then the whole pattern)."""
    def cost(pattern: Any, text: Any, *escape: Any) -> int:
        if escape or not isinstance(pattern, (str, bytes)):
            return _product(pattern, text)
        parts = pattern.split(wildcard if isinstance(pattern, str) else wildcard.encode())
        return _length(text) * (1 + max(len(part) for part in parts))
    return cost


# (name, arguments) -> (what a call costs, the most it may cost): about 10 ms a call here (the
# measurements above: 5e10 character pairs a second for instr, replace and json_patch; 3.4e8 for the
# trims), LIKE and GLOB about 0.1 ms (3e8 a second), which lets a 4 MiB value meet a 6-character
# literal ('%cuda%')
BUDGETS: dict[tuple[str, int], tuple[Callable[..., int], int]] = {
    ("instr", 2): (_product, 2**29), ("replace", 3): (_product, 2**29), ("json_patch", 2): (_product, 2**29),
    ("trim", 2): (_product, 2**22), ("ltrim", 2): (_product, 2**22), ("rtrim", 2): (_product, 2**22),
    ("like", 2): (_pattern_cost("%"), 2**25), ("like", 3): (_pattern_cost("%"), 2**25),
    ("glob", 2): (_pattern_cost("*"), 2**25),
}
_FORMATS = ("printf", "format")  # format is printf's other name
# printf's conversions (https://sqlite.org/printf.html): flags, width, precision, length, type
_CONVERSION = re.compile(r"%[-+ #0!,]*(\*|\d*)(?:\.(\*|\d*))?(?:ll|l)?(.?)", re.DOTALL)
_private = threading.local()  # one in-memory connection per thread calls the real built-ins


def _call_sql(name: str, arguments: int) -> str:
    return f"SELECT {name}({', '.join('?' * arguments)})"


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
        for (name, arguments), (cost, budget) in BUDGETS.items():
            connection.create_function(name, arguments, self._bounded(name, arguments, cost, budget),
                                       deterministic=True)
        for name in _FORMATS:
            connection.create_function(name, -1, self._printf(name), deterministic=True)

    def _bounded(self, name: str, arguments: int, cost: Callable[..., int], budget: int) -> Callable[..., Any]:
        sql = _call_sql(name, arguments)

        def call(*args: Any) -> Any:
            if _product(*args) > budget and cost(*args) > budget:  # the product bounds every cost
                shown = args[::-1] if name in ("like", "glob") else args  # like(pattern, text)
                self._refuse(f"{name}() of a {_length(shown[0]):,}-character value and a "
                             f"{_length(shown[1]):,}-character one (over {budget:,} character pairs: "
                             "SQLite cannot stop a call once begun)")
            return self._builtin(sql, args)
        return call

    def _printf(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            widest = max(self._widths(args), default=0)
            if widest > self.value_limit:
                self._refuse(f"{name}() with a width or precision of {widest:,} (over the per-value limit "
                             f"of {self.value_limit:,} bytes)")
            return self._builtin(_call_sql(name, len(args)), args)
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
        return self._builtin("SELECT CAST(? AS INTEGER)", (value,)) or 0

    def _builtin(self, sql: str, args: tuple) -> Any:
        private = _private.__dict__
        if "cursor" not in private:
            private["cursor"] = sqlite3.connect(":memory:").cursor()
            private["limit"] = None
        cursor = private["cursor"]
        if private["limit"] != self.value_limit:
            cursor.connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.value_limit)
            private["limit"] = self.value_limit
        try:
            return cursor.execute(sql, args).fetchone()[0]
        except sqlite3.Error as exc:
            self.too_big = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_TOOBIG
            self.error = str(exc)
            raise

    def _refuse(self, what: str) -> None:
        self.error = f"{what} is refused; select less of it (substr, length)"
        raise CallRefused(self.error)
