"""Target model classes for the vLLM faults of :mod:`specscope.engine.vllm_run`: vLLM's own
``LlamaForCausalLM`` with the aux-capture plumbing broken the way third-party model wrappers break it.
Imported by vLLM's ``ModelRegistry`` only (it imports vLLM)."""

from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


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


class NoResidualLlamaModel(LlamaModel):
    """Captures the right layers' sublayer output without the residual stream added (a port that
    forgot ``hidden_states + residual``, ``EagleModelMixin._maybe_add_hidden_state``)."""

    def _maybe_add_hidden_state(self, aux_hidden_states, layer_idx, hidden_states, residual):
        if layer_idx in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states)
        return aux_hidden_states


class FirstRepeatedLlamaModel(LlamaModel):
    """Captures the right layer ids but hands the first one's value for every one of them (a capture
    buffer written once and read three times)."""

    def _maybe_add_hidden_state(self, aux_hidden_states, layer_idx, hidden_states, residual):
        if layer_idx in self.aux_hidden_state_layers:
            value = hidden_states + residual if residual is not None else hidden_states
            aux_hidden_states.append(aux_hidden_states[0] if aux_hidden_states else value)
        return aux_hidden_states


class NoResidualLlamaForCausalLM(LlamaForCausalLM):
    def _init_model(self, vllm_config, prefix: str = "", layer_type=LlamaDecoderLayer):
        return NoResidualLlamaModel(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)


class FirstRepeatedLlamaForCausalLM(LlamaForCausalLM):
    def _init_model(self, vllm_config, prefix: str = "", layer_type=LlamaDecoderLayer):
        return FirstRepeatedLlamaModel(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)
