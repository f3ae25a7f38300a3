"""specscope inside a vLLM server or offline ``LLM``: install, set ``SPECSCOPE_DB``, serve.

``pip install specscope[vllm]`` registers :func:`register` under vLLM's ``vllm.general_plugins`` entry
point group, which vLLM loads in every process it starts (API server, EngineCore, workers;
``vllm/plugins/__init__.py``; ``VLLM_PLUGINS`` can filter it by the name ``specscope``). Without
``SPECSCOPE_DB`` in the environment it returns at once and imports nothing: vLLM behaves and performs as
without specscope. With it (a SQLite path or any SQLAlchemy URL), every process records into one run:

- the worker holding the models: the draft-input contract (the fused aux width entering the draft's
  ``fc``, ``draft.model.fc:input``, vs n_aux x target hidden), the draft's input ids, positions and
  output shapes, the target's capture layers as vLLM resolved them, with provenance fingerprints on
  sampled steps, and the checkpoint inspector's findings for the draft vLLM loaded;
- the verifier (``RejectionSampler``): the losslessness audit of what each request emits;
- the EngineCore holding the scheduler: each request with its sampling settings, and each verify step's proposed / accepted draft
  tokens, from the very values vLLM's ``SpecDecodingStats`` aggregates (so specscope's acceptance
  equals ``vllm:spec_decode_*`` exactly, with no device sync).

Environment: ``SPECSCOPE_DB`` (required to activate), ``SPECSCOPE_RUN_ID`` (default: a new id, shared
with the processes vLLM starts), ``SPECSCOPE_PROVENANCE_EVERY`` (default 16: fingerprint every 16th
fused draft input, one device sync each time; 0 turns it off), ``SPECSCOPE_AUDIT_EVERY`` (default
4: audit every 4th verify batch's emitted tokens against the target's distribution at vLLM's
verifier, no device sync; 0 turns it off), ``SPECSCOPE_TOKEN_REQUESTS`` (default 256: while the
audit is on, the scheduler keeps the prompt and output token ids of this many requests for
``specscope replay``; 0 keeps none), ``SPECSCOPE_LABEL`` (a label shown
with the run, stored in its ``fault`` column). Supported: vLLM 0.32 (the attach points
are listed in :mod:`specscope.adapters.vllm._patches`); on another version whatever cannot attach is
logged once and counted in the run, and vLLM serves as usual.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from specscope.adapters.vllm._env import (
    ENV_AUDIT_EVERY,
    ENV_DB,
    ENV_LABEL,
    ENV_PROVENANCE_EVERY,
    ENV_RUN_ID,
    ENV_TOKEN_REQUESTS,
)

__all__ = ["ENV_AUDIT_EVERY", "ENV_DB", "ENV_LABEL", "ENV_PROVENANCE_EVERY", "ENV_RUN_ID", "ENV_TOKEN_REQUESTS", "close",
           "configure", "flush", "paused", "register"]

logger = logging.getLogger("specscope")


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; never raises into vLLM.

    Does nothing unless ``SPECSCOPE_DB`` is set. Then fixes the run id for this process and the ones it
    starts (``SPECSCOPE_RUN_ID``, inherited through the environment) and patches vLLM's scheduler and
    model runners so that, when they come up, they report to specscope.
    """
    if not os.environ.get(ENV_DB):
        return
    try:
        from specscope.adapters.vllm import _patches, _session

        _session.run_id()  # fixed here, in the first process: the ones vLLM starts inherit it
        _patches.install()
    except Exception as exc:  # noqa: BLE001 - a broken observer must never stop the server
        logger.warning("specscope: not attached to vLLM (%s: %s); vLLM serves without it",
                       type(exc).__name__, exc)


def close() -> None:
    """End this process's part of the current run now: remove the hooks, write the final status and
    every pending event. vLLM's own shutdown does this; call it when an embedding keeps vLLM objects
    alive after it stops using them (tests, notebooks)."""
    from specscope.adapters.vllm import _session

    _session.close_all()


_depth = 0  # paused() blocks entered and not yet left: the outermost one switches


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Inside the block, vLLM in this process records nothing; on leaving it, specscope observes again
    and the run goes on.

    Inside: every vLLM method the plugin wrapped is vLLM's own again, and the hooks on the models and
    the verifier's wrapper are out, so nothing of specscope runs on the engine thread of an eager
    engine (the rank's status thread still writes every few seconds). On a compiled target the
    hooks' wrappers stay in place and pass through, and the ``specscope::observe`` op vLLM compiled
    into its graph returns at once (:meth:`~specscope.instrumentation.Tracer.pause`). Enter and
    leave it between batches: a request in flight across an edge is recorded in part. Blocks nest
    (the outermost switches). For side-by-side measurements (``benchmarks.vllm_decode``).
    """
    global _depth
    from specscope.adapters.vllm import _patches, _session

    _depth += 1
    if _depth == 1:
        _patches.take_out()
        for each in _session.live():
            each.pause()
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _patches.put_back()
            for each in _session.live():
                each.resume()


def configure(*, audit_every: int | None = None, token_requests: int | None = None) -> None:
    """Change the running audit from the next verify step, as ``SPECSCOPE_AUDIT_EVERY`` and
    ``SPECSCOPE_TOKEN_REQUESTS`` set it at start (None leaves a setting as it is; token ids are kept
    only while the audit is on), for every run this process records. Raises ConfigError for a bad
    value."""
    from specscope.adapters.vllm import _session

    for each in _session.live():
        each.tracer.set_audit(audit_every, token_requests)


def flush(timeout_s: float | None = None) -> bool:
    """Wait until what this process recorded so far is written (at most ``timeout_s`` seconds per
    run); True when all of it was. Recording is asynchronous: the writer thread lags the engine."""
    from specscope.adapters.vllm import _session

    return all([each.collector.flush(timeout_s) for each in _session.live()])
