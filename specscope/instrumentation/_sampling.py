"""Which hook calls become events: first calls, new signatures, every Nth call; opt-in value statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specscope.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How often hooks emit events and whether they may read tensor values.

    - ``first_calls``: the first N calls of every hook are recorded.
    - ``sample_every``: after those, every Nth call (call index divisible by N) is recorded.
    - A call in which any tensor's (shape, dtype, device, expected shape) was not seen before at that
      hook, or a new combination of them, is always recorded; each hook remembers up to
      ``max_signatures`` call keys (then starts over).
    - Counts are per hook call (a module call): all tensors read in one call share its
      ``call_index`` and are sampled together.
    - ``value_stats``: add absmax / mean / non-finite count to recorded float tensors. Reads values,
      so it synchronises the device on every recorded call; off by default.
    - ``provenance_every``: fingerprint the aux hidden states on every Nth target-fed draft call
      (0 = never). Also synchronises the device on those calls.
    Raises :class:`ConfigError` for a negative count or ``sample_every < 1``.
    """

    first_calls: int = 8
    sample_every: int = 64
    value_stats: bool = False
    provenance_every: int = 0
    max_signatures: int = 256

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ConfigError(f"sample_every must be >= 1, got {self.sample_every}")
        if min(self.first_calls, self.provenance_every, self.max_signatures) < 0:
            raise ConfigError("first_calls, provenance_every and max_signatures must be >= 0")


class CallCount:
    """The calls of one wrapped module, shared by its hook bodies, and which are sampled by count.

    ``calls``: module calls so far (the next call's index: the ``call_index`` of every tensor event
    of that call, at every body of the module); ``due``: the index of the next call sampled by count
    (a first call below ``first_calls``, then every ``sample_every``-th), so that the wrapper decides
    "sampled by count" with one comparison per module call; ``bodies``: hook bodies run per module
    call (1 or 2), so that hook calls are ``calls * bodies`` without counting each one.
    """

    __slots__ = ("calls", "due", "bodies", "_first", "_every")

    def __init__(self, sampling: SamplingConfig, bodies: int) -> None:
        self.calls = self.due = 0
        self.bodies = bodies
        self._first, self._every = sampling.first_calls, sampling.sample_every

    def schedule(self) -> None:
        """After the sampled call ``due``: the next call index that is a first call (below
        ``first_calls``) or a multiple of ``sample_every``."""
        following = self.due + 1
        self.due = following if following < self._first else -(-following // self._every) * self._every


class CallSite:
    """The call keys one hook body has seen.

    A call key is what the body read from its tensors (shape, dtype, device, expected width of each,
    in order). ``last``: the previous call's key (always in ``seen``), so that a repeated signature
    is recognised by one tuple comparison, without hashing; ``seen``: keys seen (up to
    ``max_signatures``, then it starts over). A body's common call (not due by count, the previous
    call's key) costs one comparison and no call into this class:
    ``if (due or key != site.last) and site.sampled(key, due): record``.
    """

    __slots__ = ("seen", "last", "_max")

    def __init__(self, sampling: SamplingConfig) -> None:
        self.seen: set[tuple] = set()
        self.last: tuple | None = None
        self._max = sampling.max_signatures

    def sampled(self, key: tuple, due: bool) -> bool:
        """Is a call with ``key`` sampled, given that it is ``due`` by count or that ``key`` differs
        from the previous call's: when due, or when ``key`` was not seen here before (it is then
        remembered; a full set starts over, keeping the key just added)."""
        self.last = key
        if key in self.seen:
            return due
        if len(self.seen) >= self._max:
            self.seen.clear()
        self.seen.add(key)
        return True


def value_stats(tensor: torch.Tensor) -> tuple[float | None, float | None, int | None]:
    """``(absmax, mean, nonfinite)`` of a float tensor, ``(None, None, None)`` for other dtypes.

    Synchronises the device (three ``.item()`` reads); only called on sampled calls when asked for.
    ``absmax`` and ``mean`` are over all elements in float32, so an inf or nan propagates into them.
    """
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None, None, None
    values = tensor.detach().float()
    nonfinite = int((~torch.isfinite(values)).sum().item())
    return float(values.abs().max().item()), float(values.mean().item()), nonfinite
