"""Hugging Face assisted generation observed on the real reference target: prompt lookup and an
assistant model, through transformers' own candidate generators (``specscope.adapters.hf_assisted``)."""

from __future__ import annotations

import pytest
import torch
from _list_sink import ListSink
from transformers import LlamaConfig, LlamaForCausalLM

from specscope import RunConfig, Tracer
from specscope.adapters.hf_assisted import AssistedGeneration
from specscope.events import RequestEnd, TensorEvent, VerifyStep

pytestmark = pytest.mark.slow

PROMPT = ("Copy this list exactly, twice: red apple, green pear, yellow banana, purple plum, "
          "orange mango, blue berry.")


def _tracer(sink, model, k: int) -> Tracer:
    hidden = model.config.hidden_size
    config = RunConfig(aux_layer_ids_resolved=(), target_hidden_size=hidden, expected_fused_width=0, k=k,
                       num_target_layers=model.config.num_hidden_layers)
    return Tracer(sink, engine="hf-assisted", engine_version="transformers", target_model="smollm2",
                  draft_model="assistant", config=config)


def _inputs(tokenizer):
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)


def _steps(sink) -> list[VerifyStep]:
    return [e for e in sink.events if isinstance(e, VerifyStep)]


def test_prompt_lookup_steps_and_output_unchanged(target_pair):
    model, tokenizer = target_pair
    inputs = _inputs(tokenizer)
    plain = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    sink = ListSink()
    tracer = _tracer(sink, model, k=4)
    observed = AssistedGeneration(tracer).generate(model, "lookup-0", **inputs, max_new_tokens=40,
                                                   do_sample=False, prompt_lookup_num_tokens=4)
    tracer.close()
    assert torch.equal(observed, plain)  # observing changes nothing the engine emits
    steps = _steps(sink)
    assert steps and all(1 <= s.proposed <= 4 and 0 <= s.accepted <= s.proposed for s in steps)
    assert sum(s.accepted for s in steps) > 0  # the list is copied: lookups hit
    (end,) = [e for e in sink.events if isinstance(e, RequestEnd)]
    assert end.output_tokens == plain.shape[-1] - inputs["input_ids"].shape[-1] and end.verify_steps == len(steps)


def test_assistant_model_shapes_and_every_token_accounted(target_pair):
    model, tokenizer = target_pair
    torch.manual_seed(0)
    assistant = LlamaForCausalLM(LlamaConfig(vocab_size=model.config.vocab_size, hidden_size=64,
                                             intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1)).eval()
    inputs = _inputs(tokenizer)
    sink = ListSink()
    tracer = _tracer(sink, model, k=5)
    observer = AssistedGeneration(tracer, assistant_model=assistant)
    out = observer.generate(model, "assist-0", **inputs, max_new_tokens=16, do_sample=False,
                            assistant_model=assistant)
    tracer.close()
    new_tokens = out.shape[-1] - inputs["input_ids"].shape[-1]
    steps = _steps(sink)
    # Each verify step emits its accepted drafts plus one token; only the last step, with one token
    # left to generate, may draft nothing (a plain decode step, not a verify step).
    assert 0 <= new_tokens - sum(s.accepted + 1 for s in steps) <= 1
    shapes = {e.hook_point: e.shape for e in sink.events if isinstance(e, TensorEvent)}
    assert shapes["draft.forward:input_ids"][0] == 1
    assert shapes["draft.forward:output.logits"][-1] == model.config.vocab_size
