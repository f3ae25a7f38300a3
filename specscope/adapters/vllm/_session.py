"""One run per vLLM server: the collector and tracer of this process, and the run's contract read from
vLLM's own configuration.

Every process of one server records into the same run (``SPECSCOPE_RUN_ID``). A process that holds the
models (a worker, or the single process of ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) owns its rank's row:
counters, hook errors and graph mode. A process that holds only the scheduler (EngineCore of a
multiprocess server) records requests and verify steps under the same rank but sends no rank row of its
own, which would overwrite the worker's counters.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from typing import Any

from specscope.adapters.vllm._env import (
    ENV_AUDIT_EVERY,
    ENV_DB,
    ENV_LABEL,
    ENV_PROVENANCE_EVERY,
    ENV_RUN_ID,
    ENV_TOKEN_REQUESTS,
)
from specscope.adapters.vllm._swap import Swap
from specscope.conventions import physical_capture_layers
from specscope.events import Event, RankStart, RankStatus, RunConfig, RunStart

logger = logging.getLogger("specscope")

ENGINE = "vllm"
ENV_RUNNER_V2 = "VLLM_USE_V2_MODEL_RUNNER"
DEFAULT_PROVENANCE_EVERY = 16
STATUS_INTERVAL_S = 5.0
ERROR_CHARS = 2000  # of a crash's text kept with the run


def enabled() -> bool:
    """``SPECSCOPE_DB`` is set: engines built now report to specscope (one process may also build an
    engine with it unset, e.g. a bare baseline beside an observed one)."""
    return bool(os.environ.get(ENV_DB))


def run_id() -> str:
    """The run of this server: ``SPECSCOPE_RUN_ID``, set to a new id (and inherited by the processes
    vLLM starts after this one) when absent."""
    current = os.environ.get(ENV_RUN_ID)
    if not current:
        current = os.environ[ENV_RUN_ID] = uuid.uuid4().hex
    return current


def end_stopped_run() -> None:
    """vLLM stopped its engine processes (the API server's ``MPClient.shutdown``, on SIGTERM / SIGINT
    or exit): end the ranks of this server's run that could not say so themselves (vLLM SIGKILLs
    EngineCore and workers shortly after asking them to stop), and store the run's verdict."""
    from specscope.readmodel import store_verdict
    from specscope.storage import open_store

    current = os.environ.get(ENV_RUN_ID)
    if not current:
        return
    with open_store(os.environ[ENV_DB]) as store:
        ended = store.end_open_ranks(current)
        if ended:
            store_verdict(store, current)
    if ended:
        logging.getLogger("vllm.specscope").info(
            "specscope: vLLM stopped its engine processes; run %s ended (rank(s) %s were stopped before "
            "they could record their end)", current, ended)


def compiled(vllm_config: Any) -> bool:
    """vLLM runs the models through torch.compile: not ``enforce_eager`` and a compilation mode
    other than none (0; vLLM 0.32 ``CompilationConfig.mode``, older ``level``)."""
    if vllm_config.model_config.enforce_eager:
        return False
    compilation = vllm_config.compilation_config
    mode = getattr(compilation, "mode", None)
    if mode is None:
        mode = getattr(compilation, "level", 0)
    return int(mode or 0) > 0


def runner_v2_requested() -> bool:
    """``VLLM_USE_V2_MODEL_RUNNER`` asks for vLLM's second model runner (read as vLLM reads it:
    unset or 0 is no)."""
    return os.environ.get(ENV_RUNNER_V2, "0").strip().lower() not in ("", "0", "false")


def model_runner(vllm_config: Any) -> str:
    """``"v2"`` when vLLM builds its second model runner (``vllm/v1/worker/gpu/model_runner.py``, its
    CPU twin ``vllm/v1/worker/cpu/model_runner.py``), else ``"v1"``. vLLM 0.32 decides in
    ``VllmConfig.use_v2_model_runner``: ``VLLM_USE_V2_MODEL_RUNNER`` when set, else v2 wherever
    Triton is present and the run uses no feature v2 lacks (on GPUs, by default); a version without
    that property reads the variable alone."""
    try:
        chosen = vllm_config.use_v2_model_runner
    except AttributeError:
        chosen = runner_v2_requested()
    return "v2" if chosen else "v1"


def aux_layer_ids(vllm_config: Any) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``(resolved, configured)`` EAGLE-3 capture layers, as vLLM 0.32 resolves them.

    ``configured``: the draft config's ``eagle_aux_hidden_state_layer_ids`` (top level, or inside
    ``eagle_config``), None when absent. ``resolved``: those ids sorted and deduplicated, else the
    target's default ``(2, n // 2, n - 3)``; vLLM captures "the hidden state entering layer i" for each
    (``GPUModelRunner._get_eagle3_aux_layers_from_config`` and
    ``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``, ``vllm/model_executor/models/
    interfaces.py``).
    """
    n = vllm_config.model_config.get_total_num_hidden_layers()
    hf = vllm_config.speculative_config.draft_model_config.hf_config
    ids = getattr(hf, "eagle_aux_hidden_state_layer_ids", None)
    if not ids:
        ids = (getattr(hf, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")
    configured = tuple(int(i) for i in ids) if ids else None
    return physical_capture_layers("vllm", configured, n), configured


def run_config(vllm_config: Any, active: tuple[int, ...] | None = None) -> RunConfig:
    """The draft-target contract of a vLLM config (EAGLE-3: fused width = n_aux x target hidden);
    ``active``: the capture layers the loaded target reports (None where no model is at hand); the
    model runner vLLM builds (:func:`model_runner`)."""
    spec = vllm_config.speculative_config
    model = vllm_config.model_config
    hidden = model.get_hidden_size()
    # Other methods (n-gram, MTP, draft models) have no aux capture: acceptance only.
    resolved, configured = aux_layer_ids(vllm_config) if spec.method == "eagle3" else ((), None)
    return RunConfig(aux_layer_ids_resolved=resolved, target_hidden_size=hidden,
                     expected_fused_width=len(resolved) * hidden, k=int(spec.num_speculative_tokens),
                     num_target_layers=model.get_total_num_hidden_layers(),
                     aux_layer_ids_configured=configured,
                     dtype=str(model.dtype).removeprefix("torch."), aux_layer_ids_active=active,
                     model_runner=model_runner(vllm_config))


def _rank(vllm_config: Any, has_model: bool) -> tuple[int, int]:
    """``(rank, world size)``: a worker's place in vLLM's world group (tensor x pipeline x data
    parallel, ``vllm/distributed/parallel_state.py``); the scheduler's data-parallel rank, whose
    requests it schedules."""
    parallel = vllm_config.parallel_config
    if has_model:
        from vllm.distributed.parallel_state import get_world_group

        group = get_world_group()
        return group.rank_in_group, group.world_size
    return parallel.data_parallel_rank, max(parallel.data_parallel_size, 1)


class _SchedulerOnlySink:
    """The collector minus run and rank rows, for a process that observes no model (see the module
    doc): the worker, which loads the models before EngineCore builds its scheduler, writes them,
    with the capture layers it found active."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector

    def emit(self, event: Event) -> None:
        if not isinstance(event, (RunStart, RankStart, RankStatus)):
            self._collector.emit(event)

    def flush(self, timeout_s: float | None = None) -> bool:
        return self._collector.flush(timeout_s)

    def close(self) -> None:
        self._collector.close()


class LazyTokenizer:
    """The target's tokenizer, loaded on the first ``decode`` (in the collector's writer thread, never
    on vLLM's engine thread) with vLLM's own tokenizer settings; a load that fails fails every call."""

    def __init__(self, name: str, revision: str | None, trust_remote_code: bool) -> None:
        self._args = (name, revision, trust_remote_code)
        self._tokenizer: Any = None
        self._error: Exception | None = None

    @classmethod
    def of(cls, model_config: Any) -> LazyTokenizer | None:
        """For vLLM's ``model_config``; None when vLLM runs without a tokenizer (token ids only)."""
        if getattr(model_config, "skip_tokenizer_init", False) or not model_config.tokenizer:
            return None
        return cls(str(model_config.tokenizer), model_config.tokenizer_revision,
                   bool(model_config.trust_remote_code))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if self._tokenizer is None and self._error is None:
            from transformers import AutoTokenizer

            name, revision, trust = self._args
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust)
            except Exception as exc:  # noqa: BLE001 - kept, so a missing tokenizer is not reloaded per call
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class Session:
    """This process's collector and tracer for one run. ``has_model``: the tracer hooks models here.

    Under model runner v2 no worker attaches (none of its attach points exist there), so the
    scheduler's session owns the run and rank rows: the run then exists, with its config naming the
    runner (``model_runner: "v2"``), and the doctor says what is missing (``RUNNER_NOT_ATTACHED``).
    """

    def __init__(self, vllm_config: Any, *, has_model: bool,
                 active: tuple[int, ...] | None = None) -> None:
        import vllm

        from specscope.collector import Collector
        from specscope.instrumentation import Tracer
        from specscope.readmodel import store_verdict

        self.run_id = run_id()
        self.has_model = has_model
        self.collector_target = os.environ[ENV_DB]
        # Requests carry token ids (from the scheduler, which may share this process's session);
        # the tokenizer loads only when the first ids reach the writer thread. A rank's end stores the
        # run's verdict there too, so v_run_summary and the run picker count what the doctor says.
        self.collector = Collector(self.collector_target, tokenizer=LazyTokenizer.of(vllm_config.model_config),
                                   on_run_end=store_verdict)
        config = run_config(vllm_config, active)
        owns_run = has_model or config.model_runner == "v2"
        sink = self.collector if owns_run else _SchedulerOnlySink(self.collector)
        spec = vllm_config.speculative_config
        every = int(os.environ.get(ENV_PROVENANCE_EVERY, DEFAULT_PROVENANCE_EVERY))
        # the audit's rate and the token ids kept for a replay; unset: the tracer's defaults
        audit = {name: int(os.environ[env]) for name, env in (("audit_every", ENV_AUDIT_EVERY),
                                                              ("token_requests", ENV_TOKEN_REQUESTS))
                 if os.environ.get(env) is not None}
        rank, world_size = _rank(vllm_config, has_model)
        self.tracer = Tracer(sink, engine=ENGINE, engine_version=vllm.__version__, rank=rank,
                             world_size=world_size,
                             # the name clients and vLLM's own metrics use (--served-model-name, else the path)
                             target_model=str(vllm_config.model_config.served_model_name
                                              or vllm_config.model_config.model),
                             draft_model=str(spec.model), config=config,
                             run_id=self.run_id, provenance_every=every, **audit,
                             compiled=owns_run and compiled(vllm_config),
                             fault=os.environ.get(ENV_LABEL) or None)
        # under vLLM's own logger tree, so the line appears in the server log at INFO like vLLM's
        logging.getLogger("vllm.specscope").info("specscope: recording this vLLM %s into %s as run %s",
                       "worker" if has_model else "scheduler", self.collector_target, self.run_id)

        self._stop = threading.Event()
        self._swaps: list[Swap] = []
        self.error: str | None = None
        if has_model:
            # The worker reports no verify step (the scheduler, elsewhere, does), so nothing on the
            # engine thread would send the periodic rank status: a daemon thread does. vLLM may
            # SIGKILL workers at shutdown; the rank row then holds the last status sent.
            threading.Thread(target=self._report, name="specscope-status", daemon=True).start()

    def _report(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL_S):
            self.tracer.status()

    def crashed(self, exc: BaseException) -> None:
        """vLLM failed with ``exc`` in this process: the run's rank ends 'crashed' with its text."""
        self.error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]

    def attached(self, swap: Swap) -> None:
        """``swap`` put a wrapper into a vLLM object of this session's: out while paused, out for
        good at close."""
        self._swaps.append(swap)

    def pause(self) -> None:
        """Take the hooks and wrappers of this session out of vLLM until :meth:`resume`."""
        self.tracer.pause()
        for swap in self._swaps:
            swap.take_out()

    def resume(self) -> None:
        """Put back what :meth:`pause` took out (nothing once closed)."""
        if self.tracer.closed:
            return
        for swap in self._swaps:
            swap.put_back()
        self.tracer.resume()

    def close(self) -> None:
        """Remove the hooks, send the final status, flush and close the collector."""
        self._stop.set()
        for swap in self._swaps:
            swap.take_out()
        self._swaps.clear()
        self.tracer.close(error=self.error)
        self.collector.close()


_lock = threading.Lock()
_sessions: dict[tuple[str, str], Session] = {}


def session(vllm_config: Any, *, has_model: bool, active: tuple[int, ...] | None = None) -> Session:
    """The session of this process for the current ``SPECSCOPE_DB`` / run (created on first use).

    In one process holding both (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the worker loads the models
    before EngineCore builds its scheduler, so the session is made with ``has_model=True`` and the
    scheduler shares it.
    """
    key = (os.environ[ENV_DB], run_id())
    with _lock:
        current = _sessions.get(key)
        if current is None:
            current = _sessions[key] = Session(vllm_config, has_model=has_model, active=active)
            # Registered after the Collector's own exit handler (its module is imported by Session):
            # handlers run last-in first-out, so the final status is written before it closes.
            atexit.register(close_all)
        return current


def current() -> Session | None:
    """This process's session for the current ``SPECSCOPE_DB`` / run, if one was made."""
    with _lock:
        return _sessions.get((os.environ.get(ENV_DB, ""), run_id()))


def live() -> list[Session]:
    """Every session of this process (one per database and run), for the plugin's switches."""
    with _lock:
        return list(_sessions.values())


def close_all() -> None:
    """Close every session of this process: at vLLM's shutdown of the scheduler or worker, and at
    interpreter exit (registered after the collector's own exit handler, so it runs before it)."""
    with _lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for each in sessions:
        try:
            each.close()
        except Exception as exc:  # noqa: BLE001 - shutting down must not fail because of us
            logger.warning("specscope: closing the vLLM run failed (%s: %s)", type(exc).__name__, exc)
