"""Which hook calls become events: first calls, new signatures, every Nth call; opt-in value statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specscope.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How often hooks emit events and whether they may read tensor values.

    - ``first_calls``: the first N calls of every hook point are recorded.
    - ``sample_every``: after those, every Nth call (call index divisible by N) is recorded.
    - A call whose (shape, dtype, device, expected shape) was not seen before at that hook point is
      always recorded; each hook point remembers up to ``max_signatures`` of them (then starts over).
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


class TensorPoint:
    """One hook point (e.g. ``draft.forward:hidden_states``): its call count and the signatures seen.

    The sampling decision itself is inlined in ``Tracer._observe`` (the hot path); this class only
    holds the state and the rarely taken "new signature" branch.
    """

    __slots__ = ("name", "calls", "seen", "_max")

    def __init__(self, name: str, sampling: SamplingConfig) -> None:
        self.name = name
        self.calls = 0
        self.seen: set[tuple] = set()
        self._max = sampling.max_signatures

    def remember(self, signature: tuple) -> None:
        """Add a new (shape, dtype, device, expected width) signature; start over when full."""
        if len(self.seen) >= self._max:
            self.seen.clear()
        self.seen.add(signature)


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
