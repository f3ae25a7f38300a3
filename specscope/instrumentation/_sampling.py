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


class CallSite:
    """The calls of one hook (e.g. the draft forward's pre body): how many, and the call keys seen.

    A call key is what the hook read from its tensors (shape, dtype, device, expected width of each,
    in order); a call is sampled when it is a first call, every ``sample_every``-th, or its key is
    new here. ``calls``: calls so far (the next call's index, which is the ``call_index`` of every
    tensor event of that call); ``due``: the index of the next call sampled by count, so that the
    hot path (``HookState.sample``) decides "not sampled" with one comparison; ``seen``: call keys
    seen (up to ``max_signatures``, then it starts over); ``last``: the previous call's key (always
    in ``seen``: a repeated signature is recognised by one tuple comparison, without hashing). This
    class holds the state and the rarely taken branches (:meth:`schedule`, :meth:`remember`).
    """

    __slots__ = ("calls", "due", "seen", "last", "_first", "_every", "_max")

    def __init__(self, sampling: SamplingConfig) -> None:
        self.calls = self.due = 0
        self.seen: set[tuple] = set()
        self.last: tuple | None = None
        self._first, self._every, self._max = (
            sampling.first_calls, sampling.sample_every, sampling.max_signatures)

    def schedule(self) -> None:
        """After the sampled call ``due``: the next call index that is a first call (below
        ``first_calls``) or a multiple of ``sample_every``."""
        following = self.due + 1
        self.due = following if following < self._first else -(-following // self._every) * self._every

    def remember(self, key: tuple) -> None:
        """Add a new call key; start over when full (the key just added stays: ``last`` is in
        ``seen``)."""
        if len(self.seen) >= self._max:
            self.seen.clear()
        self.seen.add(key)


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
