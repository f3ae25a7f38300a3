"""Engine adapters: attach specscope's instrumentation to engines people serve with, beside
:mod:`specscope.instrumentation` (which they use through its public API only).

- :mod:`specscope.adapters.vllm`: a ``vllm.general_plugins`` entry point, active when ``SPECSCOPE_DB``
  is set in the server's environment.
- :mod:`specscope.adapters.hf_assisted`: Hugging Face transformers assisted generation (prompt lookup,
  assistant models, early exit) observed through its candidate-generator interface.
"""
