"""Value checks (one chunked pass over every floating-point tensor): weights that look never trained,
non-finite values, values beyond the fp16 range."""

from __future__ import annotations

import math

from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext
from specscope.inspector._stats import TensorStats

FP16_MAX = 65504.0
MIN_INIT_NUMEL = 4096
"""Smallest projection whose moments say anything about its init (fewer elements: too noisy)."""
STD_TOLERANCE = 0.05
"""Relative distance of a projection's std to an init std that counts as "still at init"."""
NORMAL_KURTOSIS, UNIFORM_KURTOSIS, KURTOSIS_TOLERANCE = 3.0, 1.8, 0.15
_PROJECTIONS = ("_proj.weight", "fc.weight", "lm_head.weight")


def _near(value: float, ref: float, tol: float) -> bool:
    return ref > 0 and abs(value / ref - 1.0) < tol


def _init_std(ctx: CheckContext, key: str, s: TensorStats) -> float | None:
    """The init std ``key``'s values still match, or ``None`` when they look trained.

    Signatures: all zeros; torch ``nn.Linear`` default (kaiming uniform, bound 1/sqrt(fan_in), std
    bound/sqrt(3), nothing beyond the bound); HF Llama ``_init_weights`` (normal, std
    ``initializer_range``). Trained weights drift from the init std and grow heavier tails.
    """
    shape = ctx.shape(key)
    if s.all_zero:
        return 0.0
    if len(shape) != 2 or s.numel < MIN_INIT_NUMEL or abs(s.mean) > 0.1 * s.std:
        return None
    bound = 1.0 / math.sqrt(shape[1])
    if (s.absmax <= bound * 1.01 and _near(s.std, bound / math.sqrt(3), STD_TOLERANCE)
            and abs(s.kurtosis - UNIFORM_KURTOSIS) < KURTOSIS_TOLERANCE):
        return bound / math.sqrt(3)
    r = ctx.config.initializer_range
    if _near(s.std, r, STD_TOLERANCE) and abs(s.kurtosis - NORMAL_KURTOSIS) < KURTOSIS_TOLERANCE:
        return r
    return None


def check_untrained(ctx: CheckContext) -> list[Finding]:
    """UNTRAINED_WEIGHTS: norm weights exactly 1.0 everywhere, projections still at init scale."""
    ones, at_init = [], []
    for key in ctx.float_keys():
        s = ctx.stats(key)
        if key.endswith("norm.weight") and s.all_ones:
            ones.append(key)
        elif key.endswith(_PROJECTIONS):
            init = _init_std(ctx, key, s)
            if init is not None:
                at_init.append({"name": key, "std": s.std, "init_std": init, "kurtosis": s.kurtosis})
    if not ones and not at_init:
        return []
    names = ones + [d["name"] for d in at_init]
    message = (f"{len(names)} tensors look never trained ({len(ones)} norm weights exactly 1.0, "
               f"{len(at_init)} projections at init scale), e.g. {names[0]}")
    evidence = {"untrained_tensors": len(names), "ones_norms": len(ones),
                "init_scale_projections": len(at_init), "tensors": names, "projections": at_init}
    fix = ("Check that the export saved the trained state (not a freshly built model) and that training "
           "updated these tensors (frozen or detached modules); re-export from the last training step.")
    return [checkpoint_finding("UNTRAINED_WEIGHTS", message, evidence, fix)]


def check_nonfinite(ctx: CheckContext) -> list[Finding]:
    """NONFINITE_WEIGHTS: inf or nan in any floating-point tensor."""
    bad = {k: ctx.stats(k).nonfinite for k in ctx.float_keys() if ctx.stats(k).nonfinite}
    if not bad:
        return []
    first = next(iter(bad))
    message = f"{sum(bad.values())} inf/nan values in {len(bad)} tensors, e.g. {first} ({bad[first]})"
    evidence = {"nonfinite_values": sum(bad.values()), "tensors": len(bad), "per_tensor": bad}
    fix = ("Re-export from a checkpoint taken before the loss diverged, or find the overflow in the "
           "conversion (fp32 -> fp16 casts of large values give inf).")
    return [checkpoint_finding("NONFINITE_WEIGHTS", message, evidence, fix)]


def check_fp16_range(ctx: CheckContext) -> list[Finding]:
    """FP16_OVERFLOW_RISK: with ``--serve-dtype fp16``, finite values beyond 65504 become inf."""
    if ctx.serve_dtype != "fp16":
        return []
    over = {k: ctx.stats(k).absmax for k in ctx.float_keys() if ctx.stats(k).absmax > FP16_MAX}
    if not over:
        return []
    worst = max(over, key=over.get)
    message = (f"{len(over)} tensors exceed the fp16 range (max |x| {over[worst]:g} in {worst} > {FP16_MAX:g}); "
               f"served in fp16 they become inf")
    evidence = {"absmax": over[worst], "fp16_max": FP16_MAX, "tensors": len(over), "per_tensor": over}
    fix = "Serve in bf16 (or fp32), or rescale the affected weights before casting to fp16."
    return [checkpoint_finding("FP16_OVERFLOW_RISK", message, evidence, fix)]
