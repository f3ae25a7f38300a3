"""Engine adapters: attach specscope's instrumentation to engines people serve with, beside
:mod:`specscope.instrumentation` (which they use through its public API only).

- :mod:`specscope.adapters.vllm`: a ``vllm.general_plugins`` entry point, active when ``SPECSCOPE_DB``
  is set in the server's environment.
- :mod:`specscope.adapters.hf_assisted`: Hugging Face transformers assisted generation (prompt lookup,
  assistant models, early exit) observed through its candidate-generator interface.
- :mod:`specscope.adapters.recorder`: an ``httpx`` transport recording each request's acceptance from
  what a server returns (llama.cpp ``timings``, SGLang ``meta_info``), for servers we cannot hook.
- :mod:`specscope.adapters.llamacpp`: a real llama.cpp server in process (``xllamacpp``) serving the
  reference target with draft-model or n-gram speculation.
- :mod:`specscope.adapters.reference`: the demo job, specscope's own reference engine instrumented
  into a store (``specscope demo``): like the adapters, it stands above the engine it serves.
- :mod:`specscope.adapters.prometheus_watch`: ``specscope watch``, a server's acceptance from its
  Prometheus endpoint (vLLM, SGLang, TensorRT-LLM, llama.cpp), with no hooks in it; each engine's
  metrics in specscope's definitions in :mod:`specscope.adapters.prometheus_metrics` (for a check
  against an engine's own counters: ``window(parse_exposition(before)[i], parse_exposition(after)[i])``).
"""
