"""Target model classes for the vLLM faults of :mod:`specscope.engine.vllm_run`: vLLM's own
``LlamaForCausalLM`` with the aux-capture plumbing broken the way third-party model wrappers break it.
Imported by vLLM's ``ModelRegistry`` only (it imports vLLM)."""

from vllm.model_executor.models.llama import LlamaForCausalLM


class NoAuxCaptureLlamaForCausalLM(LlamaForCausalLM):
    """Accepts ``set_aux_hidden_state_layers`` and captures nothing (vLLM's runner asked for EAGLE-3
    aux outputs; ``vllm/model_executor/models/interfaces.py`` ``SupportsEagle3``)."""

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        return None


class AuxOffByOneLlamaForCausalLM(LlamaForCausalLM):
    """Captures layer i + 1 for every configured i: SGLang's explicit-id convention (capture the output
    of layer i) applied inside a vLLM model."""

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        super().set_aux_hidden_state_layers(tuple(i + 1 for i in layers))
