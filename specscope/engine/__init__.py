"""The reference engine: SmolLM2-135M-Instruct target + an EAGLE-3 draft, chain speculative decoding
on a CPU, with fault switches reproducing the silent failures of docs/design.md, "The failure"."""

from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR, load_draft, save_draft
from specscope.engine.core import ENGINE_NAME, ENGINE_VERSION, Engine, RequestResult
from specscope.engine.draft import DraftConfig, Eagle3Draft
from specscope.engine.faults import FAULTS, LOSSY_FAULTS
from specscope.engine.prompts import demo_prompts, heldout_prompts
from specscope.engine.target import load_target, target_folder

__all__ = [
    "DEFAULT_DRAFT_DIR",
    "ENGINE_NAME",
    "ENGINE_VERSION",
    "FAULTS",
    "LOSSY_FAULTS",
    "DraftConfig",
    "Eagle3Draft",
    "Engine",
    "RequestResult",
    "demo_prompts",
    "heldout_prompts",
    "load_draft",
    "load_target",
    "target_folder",
    "save_draft",
]
