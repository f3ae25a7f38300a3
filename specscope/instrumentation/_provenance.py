"""Which target layers the draft's aux hidden states came from, by row fingerprints.

A hook firing on a configured capture layer proves only that the layer ran (every layer runs in a
forward pass), not that the engine captured it. On sampled steps the tracer fingerprints the inputs of
the configured capture layers, their neighbours and the target's final norm output during the target
forward, then matches every target-width chunk of the draft's target-fed hidden states against them.
The draft receives rows for a subset of the positions the target processed (the accepted tokens), so
rows are matched one by one (nearest fingerprint), never whole tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

FINGERPRINT_DIM = 8
"""Floats per token row: a fixed random projection of the row (float32)."""

RELATIVE_TOLERANCE = 2e-2
"""Largest row distance, relative to the matched row's fingerprint norm, that still counts as the same
hidden state; covers a bf16/fp16 round trip (~4e-3 relative) and is far below the change one decoder
layer makes to the residual stream."""


class Provenance:
    """Fingerprints of the most recent target forward and the matching of draft input chunks.

    ``configured``: capture points ("hidden state entering layer i"); ``candidates``: every layer
    index fingerprinted, configured ones first (then neighbours, and ``num_layers`` for the final norm output, HF
    ``hidden_states[-1]``); ``hidden_size``: target hidden width H; ``every``: sample every Nth
    target-fed draft call. Memory: ``len(candidates) x rows of the last target forward x 8`` floats.
    """

    def __init__(self, configured: tuple[int, ...], candidates: tuple[int, ...], hidden_size: int,
                 every: int, seed: int = 0) -> None:
        self.configured = configured
        self.candidates = candidates
        self.hidden_size = hidden_size
        self._every = every
        self.fed_calls = 0  # target-fed draft calls seen
        self._prints: dict[int, torch.Tensor] = {}
        generator = torch.Generator().manual_seed(seed)
        self._projection = torch.randn(hidden_size, FINGERPRINT_DIM, generator=generator) / hidden_size ** 0.5
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @property
    def due(self) -> bool:
        """True when the next target-fed draft call is a sampled one (fingerprint this target forward)."""
        return self.fed_calls % self._every == 0

    def new_target_forward(self) -> None:
        """Forget the previous forward's fingerprints (bounded memory: one forward kept)."""
        self._prints.clear()

    def record(self, layer: int, hidden: torch.Tensor) -> None:
        """Fingerprint the rows of one target hidden state ``(..., H)``; no sync (device matmul)."""
        self._prints[layer] = self.fingerprint(hidden)

    def check(self, hidden: torch.Tensor) -> tuple[int | None, ...] | None:
        """Count one target-fed draft call; on sampled calls match its ``(..., W)`` input.

        Returns, per target-width chunk of ``hidden`` (``W // H`` of them), the candidate layer whose
        rows it matches, or None; returns None on unsampled calls, and when no target layer was
        fingerprinted since the last target forward (nothing to compare against: e.g. the target runs
        compiled and its layer hooks are no-ops — no evidence is not "no match"). Synchronises the
        device.
        """
        sampled = self.due
        self.fed_calls += 1
        if not sampled or not self._prints:
            return None
        width = hidden.shape[-1]
        if width % self.hidden_size:
            return (None,) * max(1, width // self.hidden_size)
        chunks = hidden.detach().split(self.hidden_size, dim=-1)
        return self.match([self.fingerprint(chunk) for chunk in chunks], self._prints)

    def projection(self, device: torch.device) -> torch.Tensor:
        """The ``(H, 8)`` fingerprint projection on ``device`` (copied there once; call it outside a
        CUDA-graph capture first, where a host-to-device copy is not allowed)."""
        projection = self._on_device.get(device)
        if projection is None:
            projection = self._on_device[device] = self._projection.to(device)
        return projection

    def fingerprint(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(rows, 8)`` fingerprints of the rows of ``hidden`` ``(..., H)``; device ops, no sync."""
        return hidden.detach().reshape(-1, self.hidden_size).float() @ self.projection(hidden.device)

    def match(self, chunks: Sequence[torch.Tensor], prints: dict[int, torch.Tensor]) -> tuple[int | None, ...]:
        """Per chunk of fingerprints ``(draft rows, 8)`` (one draft input's chunks, as many rows each),
        the candidate layer whose fingerprints ``prints[layer]`` ``(target rows, 8)`` hold a near row
        for every one of its rows, or None. Every chunk against every candidate in one batch of device
        ops, read back once: synchronises the device."""
        rows = torch.stack(list(chunks))  # (K, R, 8)
        layers = [layer for layer in self.candidates if layer in prints and prints[layer].shape[0]]
        if not layers or rows.shape[1] == 0:
            return (None,) * rows.shape[0]
        # (C, T, 8), a layer with fewer rows padded with rows at infinite distance; the direct
        # distance, as the matrix-product form would read inf - inf there
        targets = pad_sequence([prints[layer].to(rows.device) for layer in layers], batch_first=True,
                               padding_value=math.inf)
        distance = torch.cdist(rows[:, None], targets[None], compute_mode="donot_use_mm_for_euclid_dist")
        nearest, index = distance.min(dim=-1)  # (K, C, R)
        layer = torch.arange(len(layers), device=rows.device)[:, None]
        scale = targets.norm(dim=-1)[layer, index].clamp_min(1e-12)  # each nearest row's norm
        scores = (nearest / scale).amax(dim=-1).nan_to_num(nan=math.inf)  # (K, C): a chunk's worst row
        # Candidates in configured-first order, the first of a tie: a tie keeps the configured layer.
        best_score, best = scores.min(dim=-1)
        return tuple(layers[b] if score <= RELATIVE_TOLERANCE else None
                     for b, score in zip(best.tolist(), best_score.tolist()))
