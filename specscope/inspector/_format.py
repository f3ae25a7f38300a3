"""Checkpoint layout detection and the CKPT_FORMAT finding."""

from __future__ import annotations

from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext

FORMATS = {
    "eagle3": "EAGLE-3 draft, EAGLE/SpecForge/SGLang layout (midlayer.*)",
    "speculators": "EAGLE-3 draft, speculators layout (layers.0.*)",
    "unknown": "no EAGLE-3 draft layer found (neither midlayer.* nor layers.0.*)",
}
_LOADS = {
    "eagle3": "SGLang, EAGLE and the reference engine load midlayer.* as is; vLLM renames it to layers.0.*",
    "speculators": "vLLM and speculators load layers.0.*; SGLang, EAGLE and the reference engine "
                   "expect midlayer.* and drop it",
    "unknown": "re-export the draft with its decoder layer under midlayer.* (or layers.0.* for vLLM)",
}


def _count(keys, prefix: str) -> int:
    return sum(1 for k in keys if k.startswith(prefix))


def detect_format(keys, raw_config: dict | None) -> str:
    """``"speculators"`` (``layers.0.*`` or a ``speculators_config``), ``"eagle3"`` (``midlayer.*``)
    or ``"unknown"``; the tensor keys decide over the config when they disagree."""
    midlayer, layers0 = _count(keys, "midlayer."), _count(keys, "layers.0.")
    if midlayer >= layers0 and midlayer:
        return "eagle3"
    if layers0 or (raw_config and "speculators_config" in raw_config):
        return "speculators"
    return "unknown"


def check_format(ctx: CheckContext) -> list[Finding]:
    """CKPT_FORMAT: the layout, tensor and file counts, bytes, and which loaders take it."""
    keys = ctx.reader.tensors
    evidence = {"tensors": len(keys), "files": len(ctx.reader.files), "total_bytes": ctx.reader.total_bytes,
                "midlayer_keys": _count(keys, "midlayer."), "layers0_keys": _count(keys, "layers.0.")}
    message = (f"{FORMATS[ctx.format]}: {len(keys)} tensors in {len(ctx.reader.files)} file(s), "
               f"{ctx.reader.total_bytes} bytes")
    return [checkpoint_finding("CKPT_FORMAT", message, evidence, f"Nothing to fix: {_LOADS[ctx.format]}.")]
