"""Draft checkpoint inspector: the silent loader failures, found before any GPU is spent.

``inspect_checkpoint(path, engine=..., target=..., compare=...)`` reads a draft checkpoint lazily
(safetensors headers; values only where a check needs them, in chunks), works out what the engine's
loader does with every key (:func:`specscope.conventions.plan_load`), checks the draft-target contract
(:data:`specscope.conventions.CONTRACT`) and runs the checkpoint checks of docs/design.md, "Finding
codes".
"""

from specscope.findings import CODES as _CODES
from specscope.findings import SEVERITY as _SEVERITY
from specscope.inspector._config import DraftConfig, ModelSettings, TargetConfig, draft_config
from specscope.inspector._inspect import CHECKS, SERVE_DTYPES, inspect_checkpoint
from specscope.inspector._report import InspectionReport, render_text
from specscope.inspector._target import load_target_config

CODES = _CODES["inspect"]
SEVERITY = {code: _SEVERITY[code] for code in CODES}

__all__ = [
    "CODES", "CHECKS", "DraftConfig", "InspectionReport", "ModelSettings", "SERVE_DTYPES", "SEVERITY",
    "TargetConfig", "draft_config", "inspect_checkpoint", "load_target_config", "render_text",
]
