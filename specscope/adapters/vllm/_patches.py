"""Where specscope attaches to vLLM 0.32, and what each attach point relies on.

Scheduler (EngineCore process), ``vllm/v1/core/sched/scheduler.py`` ``Scheduler``:

- ``__init__``: the run's tracer is bound to the scheduler (``vllm_config`` gives the contract).
- ``add_request(request)``: a request entered (``request.request_id``, ``request.num_prompt_tokens``).
- ``make_spec_decoding_stats(..., num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
  request_id)``: called once per request and verify step with the values ``SpecDecodingStats`` sums
  into ``vllm:spec_decode_*``; specscope records the same step (drafts minus grammar-invalidated ones,
  accepted count; vLLM's rejection sampler accepts a prefix, so the per-position mask is the chain
  prefix). Plain Python ints: no device sync.
- ``_free_request(request)``: the request finished (``request.num_output_tokens``).
- ``add_request`` also records each request's sampling settings (``request.sampling_params``:
  temperature, top-p, top-k) and prompt key (``request.prompt_token_ids``).
- ``shutdown()``: the run's part in this process ends (also ``WorkerWrapperBase.shutdown`` in
  ``vllm/v1/worker/worker_base.py`` for worker processes, and at interpreter exit). The process that
  started them (the API server, ``vllm/v1/engine/core_client.py`` ``MPClient.shutdown``) ends the ranks
  they could not end themselves: vLLM SIGKILLs EngineCore and workers right after its SIGTERM.

Model runner (worker process), ``vllm/v1/worker/gpu_model_runner.py`` ``GPUModelRunner.load_model``
and ``vllm/v1/worker/cpu_model_runner.py`` ``CPUModelRunner.load_model``: after vLLM loaded the target
(``runner.model``) and the EAGLE-3 drafter (``runner.drafter.model``, ``Eagle3LlamaForCausalLM``),
specscope hooks:

- the draft's forward (``input_ids``, ``positions``, ``hidden_states`` post-fusion, outputs);
- the draft's ``model.fc`` input: the fused aux hidden states vLLM passes through
  ``combine_hidden_states`` (expected n_aux x target hidden);
- the target decoder layers ``model.layers[i]`` of the capture ids and their neighbours, whose call is
  ``(positions, hidden_states, residual)``: the captured value is ``hidden_states + residual``
  (``EagleModelMixin._maybe_add_hidden_state``), fingerprinted on sampled steps only; and the final
  ``model.norm``. Hooks on the ``LlamaModel`` modules themselves would never fire
  (``@support_torch_compile`` calls their forward directly).

and the model runner's ``rejection_sampler`` instance: the losslessness audit (``_verifier.py``). The
draft's inspection judges the ``d2t`` vLLM loaded (``Eagle3LlamaForCausalLM.draft_id_to_target_id``,
copied to the host once at load), not the checkpoint's file.

Lifecycle: when ``load_model`` raises, the run is recorded anyway, with the draft's inspection and its
rank ended 'crashed' with vLLM's error; when ``execute_model`` or ``sample_tokens`` raises, the rank
ends 'crashed' when vLLM shuts down (or at interpreter exit).

Every wrapper calls vLLM's own method first and unchanged, then records; a failure while recording is
logged once and counted, never raised; vLLM's own exceptions go on unchanged.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specscope.adapters.vllm import _session, _verifier
from specscope.adapters.vllm._swap import Swap

logger = logging.getLogger("specscope")

_TRACER = "_specscope_tracer"  # attribute set on vLLM's Scheduler instance
_PENDING = "_specscope_pending_steps"  # request id -> (drafts, accepted, output offset) of its last step
WRAPPED = "__specscope_wraps__"
"""Attribute of every method specscope put in place of vLLM's: the original function (tools and tests
ask whether a vLLM method is patched by its presence, not by where a file lives)."""
TARGET_COMPARE_BYTES = 4 << 30
"""Largest target (bytes of safetensors) whose shared tensors the load-time inspection compares by
value; a larger one is checked by its config (and key layout is not read)."""
_installed = False
_failed: set[str] = set()
_swaps: list[Swap] = []  # vLLM's methods specscope wrapped, in the order it wrapped them


def install() -> None:
    """Patch vLLM's scheduler and model runners (once per process). An attach point whose module,
    class or method moved in this vLLM version is skipped with one logged line naming it; the others
    still attach (acceptance without tensors, or the reverse, beats nothing)."""
    global _installed
    if _installed:
        return
    _installed = True
    if _session.runner_v2_requested():
        _warn_runner_v2()
    for module, cls, name, after in (
            ("vllm.v1.core.sched.scheduler", "Scheduler", "__init__", _after_scheduler_init),
            ("vllm.v1.core.sched.scheduler", "Scheduler", "add_request", _after_add_request),
            ("vllm.v1.core.sched.scheduler", "Scheduler", "make_spec_decoding_stats", _after_spec_stats),
            ("vllm.v1.core.sched.scheduler", "Scheduler", "_free_request", _after_free_request),
            ("vllm.v1.core.sched.scheduler", "Scheduler", "shutdown", _end_run),
            ("vllm.v1.engine.core_client", "MPClient", "shutdown", _after_engine_stopped),
            ("vllm.v1.worker.worker_base", "WorkerWrapperBase", "shutdown", _end_run),
            ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "load_model", _after_load_model),
            ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", "load_model", _after_load_model),
            ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model", None),
            ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens", None)):
        try:
            _wrap(getattr(importlib.import_module(module), cls), name, after, _FAILED.get(name))
        except Exception as exc:  # noqa: BLE001 - an attach point vLLM moved: say which, go on
            logger.warning("specscope: cannot attach to vLLM %s.%s.%s (%s: %s); what it records is "
                           "missing from the run", module, cls, name, type(exc).__name__, exc)


def _warn_runner_v2() -> None:
    """One logged line per process: vLLM's model runner v2 (``vllm/v1/worker/gpu/model_runner.py``)
    has none of the worker attach points below."""
    if "runner v2" not in _failed:
        _failed.add("runner v2")
        logger.warning("specscope: vLLM model runner v2 (VLLM_USE_V2_MODEL_RUNNER) is not supported: "
                       "the draft-input widths, capture layers, provenance and the losslessness audit "
                       "are not recorded; acceptance from the scheduler is (the run's findings say so: "
                       "RUNNER_NOT_ATTACHED)")


def _once(what: str, exc: BaseException) -> None:
    if what not in _failed:
        _failed.add(what)
        logger.warning("specscope: %s failed (%s: %s); vLLM goes on, later failures there are not logged",
                       what, type(exc).__name__, exc)


def _wrap(cls: type, name: str, after: Callable[..., None] | None,
          failed: Callable[[Any, BaseException], None] | None = None) -> None:
    """Replace ``cls.name`` (its own attribute) with a wrapper that calls it, then ``after(call)``.

    ``call`` maps each parameter to the call's argument (``self`` included, defaults applied), so
    positional and keyword calls read the same. ``after`` runs guarded: it never raises into vLLM.
    When vLLM's method raises, ``failed(self, exc)`` records it (guarded) and the exception goes on
    unchanged.
    """
    original = cls.__dict__[name]
    signature = inspect.signature(original)
    label = f"{cls.__name__}.{name}"
    plain = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in signature.parameters.values())
    names = tuple(signature.parameters)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if failed is not None:
                try:
                    failed(args[0], exc)
                except Exception as inner:  # noqa: BLE001 - observing must not change what vLLM does
                    _once(f"recording the failure of {label}", inner)
            raise
        if after is None:
            return result
        try:
            # Every argument named in the call (vLLM's per-step calls): read as bind would, at a
            # fraction of its cost; defaults to fill in take the long way.
            call = dict(zip(names, args), **kwargs)
            if not plain or len(call) != len(names):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                call = bound.arguments
            after(call)
        except Exception as exc:  # noqa: BLE001 - observing must not change what vLLM does
            _once(f"recording after {label}", exc)
        return result

    setattr(wrapper, WRAPPED, original)
    _swaps.append(Swap(cls, name, wrapper))


def take_out() -> None:
    """vLLM's own methods again, where :func:`install` wrapped them (the plugin's ``paused()``)."""
    for swap in reversed(_swaps):
        swap.take_out()


def put_back() -> None:
    """The wrappers :func:`take_out` took out, back in place."""
    for swap in _swaps:
        swap.put_back()


# -- scheduler (EngineCore) ------------------------------------------------------------------------------

def _after_scheduler_init(call: dict[str, Any]) -> None:
    scheduler = call["self"]
    if scheduler.vllm_config.speculative_config is None or not _session.enabled():
        return  # nothing to observe, or specscope switched off for engines built from now on
    if _session.model_runner(scheduler.vllm_config) == "v2":  # vLLM's default choice too, on GPUs
        _warn_runner_v2()
    tracer = _session.session(scheduler.vllm_config, has_model=False).tracer
    setattr(scheduler, _TRACER, tracer)


def _after_add_request(call: dict[str, Any]) -> None:
    tracer = getattr(call["self"], _TRACER, None)
    if tracer is not None:
        request = call["request"]
        params = request.sampling_params
        settings = {} if params is None else {
            "temperature": _verifier.greedy_zero(params.temperature), "top_p": params.top_p, "top_k": params.top_k}
        tracer.start_request(request.request_id, prompt_tokens=request.num_prompt_tokens,
                             prompt=request.prompt_token_ids, **settings)


def _after_spec_stats(call: dict[str, Any]) -> None:
    scheduler = call["self"]
    tracer = getattr(scheduler, _TRACER, None)
    drafts = call["num_draft_tokens"]
    if tracer is None or not drafts:  # vLLM counts no step without drafts either
        return
    request_id = call["request_id"]
    invalid = call["num_invalid_spec_tokens"]
    if invalid:
        drafts -= invalid.get(request_id, 0)
    # vLLM appends this step's tokens right after this call: the step is recorded once they are in
    # (at the request's next step or its end), with them.
    pending = scheduler.__dict__.setdefault(_PENDING, {})
    request = scheduler.requests.get(request_id)
    _record_pending(tracer, pending, request_id, request)
    pending[request_id] = (drafts, call["num_accepted_tokens"], None if request is None else request.num_output_tokens)


def _record_pending(tracer: Any, pending: dict[str, tuple], request_id: str, request: Any) -> None:
    """Record ``request_id``'s pending verify step, with the tokens it emitted: the accepted drafts,
    then the bonus token (fewer when a stop condition cut the step)."""
    step = pending.pop(request_id, None)
    if step is None:
        return
    drafts, accepted, offset = step
    emitted = None if request is None or offset is None else request.output_token_ids[offset:offset + accepted + 1]
    tracer.record_verify(request_id, proposed=drafts, accepted=accepted, emitted_ids=emitted)


def _after_free_request(call: dict[str, Any]) -> None:
    scheduler = call["self"]
    tracer = getattr(scheduler, _TRACER, None)
    if tracer is not None:
        request = call["request"]
        _record_pending(tracer, scheduler.__dict__.get(_PENDING, {}), request.request_id, request)
        tracer.finish_request(request.request_id, output_tokens=request.num_output_tokens,
                              output_ids=request.output_token_ids)


def _end_run(call: dict[str, Any]) -> None:
    """vLLM shut the scheduler or a worker down: end this process's part of the run (its requests'
    last verify steps recorded, final status, hooks removed, everything written)."""
    scheduler = call["self"]
    tracer = getattr(scheduler, _TRACER, None)
    pending = scheduler.__dict__.get(_PENDING, {})
    for request_id in list(pending) if tracer is not None else ():
        _record_pending(tracer, pending, request_id, scheduler.requests.get(request_id))
    _session.close_all()


def _after_engine_stopped(call: dict[str, Any]) -> None:
    if _session.enabled():
        _session.end_stopped_run()


# -- model runner (worker) ---------------------------------------------------------------------------------

def _after_load_model(call: dict[str, Any]) -> None:
    runner = call["self"]
    config = runner.vllm_config
    spec = config.speculative_config
    if spec is None or getattr(runner, "drafter", None) is None or not _session.enabled():
        return
    eagle3 = spec.method == "eagle3"
    session = _session.session(config, has_model=True,
                               active=_active_capture(runner.model) if eagle3 else None)
    session.tracer.start()
    session.attached(_verifier.attach(runner, session.tracer))
    if not eagle3:
        logger.info("specscope: speculative method %s: acceptance only (tensor hooks are for eagle3)",
                    spec.method)
        return
    from specscope.instrumentation import instrument

    draft = runner.drafter.model
    instrument(session.tracer, draft=draft, target=runner.model, layers="model.layers",
               layer_input=_layer_input, layer_value=_layer_value, fused_input="model.fc",
               draft_hidden_size=int(draft.config.hidden_size))
    if session.tracer.rank == 0:
        threading.Thread(target=_inspect_draft, args=(session, spec, config.model_config.model, _loaded_d2t(draft)),
                         name="specscope-inspect", daemon=True).start()


def _loaded_d2t(draft: Any) -> Any:
    """The ``d2t`` offsets vLLM serves, as loaded (numpy, copied off the device here, on the engine
    thread, once); None where vLLM keeps no map (a draft vocabulary as large as the target's)."""
    loaded = getattr(draft, "draft_id_to_target_id", None)
    return None if loaded is None else loaded.detach().to("cpu", copy=True).numpy()


def _load_failed(runner: Any, exc: BaseException) -> None:
    """vLLM could not load the models: the run still starts, with the draft's inspection (what names
    the cause, e.g. a refused checkpoint) and the rank ended 'crashed' with vLLM's error."""
    config = runner.vllm_config
    spec = config.speculative_config
    if spec is None or not _session.enabled():
        return
    session = _session.session(config, has_model=True)
    session.tracer.start()
    if session.tracer.rank == 0:
        _inspect_draft(session, spec, config.model_config.model)
    session.crashed(exc)
    _session.close_all()


def _step_failed(runner: Any, exc: BaseException) -> None:
    """A forward of the serving loop raised: the rank ends 'crashed' when vLLM shuts down."""
    session = _session.current()
    if session is not None:
        session.crashed(exc)


_FAILED = {"load_model": _load_failed, "execute_model": _step_failed, "sample_tokens": _step_failed}


def _active_capture(target: Any) -> tuple[int, ...] | None:
    """The capture layers the loaded target will return aux hidden states for: the
    ``aux_hidden_state_layers`` of its ``EagleModelMixin`` (``target.model``), set by the runner's
    ``set_aux_hidden_state_layers`` call during ``load_model``; None when the model has no such part."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "aux_hidden_state_layers", None)
    return None if layers is None else tuple(int(i) for i in layers)


def _layer_input(args: tuple, kwargs: dict) -> Any:
    """vLLM decoder layers take ``(positions, hidden_states, residual)``: the hidden-state argument."""
    return args[1] if len(args) > 1 else kwargs.get("hidden_states")


def _layer_value(args: tuple, kwargs: dict) -> Any:
    """The residual stream entering the layer, ``hidden_states + residual`` (vLLM's captured value;
    ``residual`` is None before layer 0)."""
    hidden = _layer_input(args, kwargs)
    residual = args[2] if len(args) > 2 else kwargs.get("residual")
    return hidden if residual is None else hidden + residual


def _target_argument(target: Path) -> dict[str, Any]:
    """How the inspector sees the served target: the whole folder (config, keys, and the values of the
    tensors the draft shares) when its weights are small enough to compare in float32 next to a
    running server, else its config alone; nothing for a target that is not a local folder."""
    if not (target / "config.json").is_file():
        return {}
    weights = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    if weights <= TARGET_COMPARE_BYTES:
        return {"target": target}
    return {"target_config": target / "config.json"}


def _inspect_draft(session: _session.Session, spec: Any, target: str, loaded_d2t: Any = None) -> None:
    """Store the checkpoint inspector's findings for the draft vLLM loaded (with ``loaded_d2t``, the
    map vLLM holds, where it was read) and the target it serves, with the run (off the engine thread:
    reading values takes a moment on a large checkpoint)."""
    import dataclasses

    from specscope.inspector import inspect_checkpoint

    try:
        path = Path(str(spec.draft_model_config.model))
        if not path.is_dir():
            logger.info("specscope: draft %s is not a local folder; checkpoint checks skipped", path)
            return
        report = inspect_checkpoint(path, engine="vllm", loaded_d2t=loaded_d2t, **_target_argument(Path(str(target))))
        for finding in report.findings:
            session.collector.emit(dataclasses.replace(finding, run_id=session.run_id))
    except Exception as exc:  # noqa: BLE001 - a checkpoint we cannot read is the inspector's finding
        _once("inspecting the draft checkpoint", exc)
