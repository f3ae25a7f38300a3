"""Value statistics of floating-point tensors, read in chunks (one pass over the data).

Reading values is the only expensive part of an inspection; every value check (untrained weights,
non-finite values, fp16 range) uses these statistics, so each tensor is read once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specscope.checkpoint_reader import CheckpointReader


@dataclass(frozen=True)
class TensorStats:
    """Statistics of one tensor's values. ``nonfinite`` counts inf/nan elements; the moments
    (``mean``, ``std``, ``kurtosis`` = E[x^4] / E[x^2]^2 about zero: 3.0 for a centred normal law,
    1.8 for a centred uniform one) and ``absmax`` are over the finite elements. ``all_ones`` / ``all_zero``: every
    element exactly 1.0 / 0.0."""

    numel: int
    nonfinite: int
    absmax: float
    mean: float
    std: float
    kurtosis: float
    all_ones: bool
    all_zero: bool


def tensor_stats(reader: CheckpointReader, name: str) -> TensorStats:
    """Statistics of floating-point tensor ``name``, reading it chunk by chunk.

    Element-wise work is float32 on one chunk at a time (a few chunk-sized temporaries); the running
    sums are Python floats (float64).
    """
    n = nonfinite = 0
    s1 = s2 = s4 = 0.0
    absmax = 0.0
    all_ones = all_zero = True
    for chunk in reader.chunks(name):
        x = chunk.reshape(-1).astype(np.float32)
        finite = np.isfinite(x)
        bad = int(x.size - finite.sum())
        if bad:
            x = x[finite]
            all_ones = all_zero = False
        nonfinite += bad
        n += x.size
        if x.size:
            absmax = max(absmax, float(x.max()), -float(x.min()))
            all_ones = all_ones and bool((x == 1).all())
            all_zero = all_zero and bool((x == 0).all())
            s1 += float(x.sum())
            np.square(x, out=x)  # in place: one chunk-sized buffer for every moment
            s2 += float(x.sum())
            s4 += float(np.square(x, out=x).sum())
    mean = s1 / n if n else 0.0
    m2 = s2 / n if n else 0.0
    var = max(m2 - mean * mean, 0.0)
    kurtosis = (s4 / n) / (m2 * m2) if m2 > 0 else 0.0
    return TensorStats(n + nonfinite, nonfinite, absmax, mean, math.sqrt(var), kurtosis,
                       all_ones and n > 0, all_zero and n > 0)
