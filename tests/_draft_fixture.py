"""Real small models for the instrumentation tests: a random Llama target, an EAGLE-3-shaped draft and
a chain-drafting loop that feeds the draft real aux hidden states (no engine code involved).

``ListSink`` (re-exported from ``_list_sink``) is a test-only sink; the package's real one is
``specscope.collector.Collector``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from _list_sink import ListSink  # noqa: F401 - re-exported for the tests
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from specscope.events import RunConfig

HIDDEN = 64
LAYERS = 8
VOCAB = 256
AUX = (2, 4, 6)
K = 3


class TinyEagle3Draft(nn.Module):
    """EAGLE-3 shape contract (SGLang ``llama_eagle3.py``): ``fc`` fuses (B, T, n_aux*H) -> (B, T, H)
    only when the input width differs from the embedding width; one decoder-ish layer ``midlayer``
    over ``cat(embeds, hidden)``; ``forward(input_ids, positions, hidden_states, cache=None) ->
    (logits (B, T, vocab), hidden_out (B, T, H))``."""

    def __init__(self, hidden: int = HIDDEN, n_aux: int = len(AUX), vocab: int = VOCAB) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=hidden)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.fc = nn.Linear(n_aux * hidden, hidden, bias=False)
        self.midlayer = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, positions, hidden_states, cache=None):
        embeds = self.embed_tokens(input_ids)  # (B, T, H)
        if hidden_states.shape[-1] != embeds.shape[-1]:
            hidden_states = self.fc(hidden_states)  # (B, T, 3H) -> (B, T, H)
        hidden = hidden_states + self.midlayer(torch.cat([embeds, hidden_states], dim=-1))  # (B, T, H)
        return self.lm_head(self.norm(hidden)), hidden


def make_models(seed: int = 0) -> tuple[LlamaForCausalLM, TinyEagle3Draft]:
    torch.manual_seed(seed)
    target = LlamaForCausalLM(LlamaConfig(
        hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB)).eval()
    return target, TinyEagle3Draft().eval()


def run_config() -> RunConfig:
    return RunConfig(aux_layer_ids_resolved=AUX, target_hidden_size=HIDDEN,
                     expected_fused_width=len(AUX) * HIDDEN, k=K, num_target_layers=LAYERS)


def _aux(hidden_states: tuple, capture: str) -> torch.Tensor:
    """What the "engine" hands the draft: healthy (hidden_states[i]), shifted (i + 1) or capture off."""
    if capture == "off":
        return hidden_states[-1]  # (B, T, H): final norm output, fc skipped
    shift = 1 if capture == "shifted" else 0
    return torch.cat([hidden_states[i + shift] for i in AUX], dim=-1)  # (B, T, 3H)


@torch.no_grad()
def run_engine(target, draft, tracer=None, *, capture: str = "ok", requests: int = 2, steps: int = 3,
               prompt_len: int = 6, seed: int = 0, draft_kwargs: dict | None = None,
               first_request: int = 0) -> list[torch.Tensor]:
    """Chain drafting with greedy verification over requests ``req-{first_request}`` on; returns every
    draft and target output in order."""
    generator = torch.Generator().manual_seed(seed)
    outputs: list[torch.Tensor] = []
    extra = draft_kwargs or {}
    for r in range(requests):
        request_id = f"req-{first_request + r}"
        ids = torch.randint(0, VOCAB, (1, prompt_len), generator=generator)  # (1, T)
        if tracer is not None:
            tracer.start_request(request_id, prompt_len)
        out = target(ids, output_hidden_states=True)
        outputs.append(out.logits)
        feed, fed_ids = _aux(out.hidden_states, capture), ids
        for _ in range(steps):
            length = ids.shape[1]
            positions = torch.arange(length - fed_ids.shape[1], length).unsqueeze(0)
            logits, hidden = draft(fed_ids, positions, feed, **extra)  # target-fed
            outputs += [logits, hidden]
            proposal = [logits[:, -1].argmax(-1, keepdim=True)]  # (1, 1)
            hidden = hidden[:, -1:]
            for j in range(1, K):
                logits, hidden = draft(proposal[-1], torch.tensor([[length + j]]), hidden, **extra)  # chained
                outputs += [logits, hidden]
                proposal.append(logits[:, -1].argmax(-1, keepdim=True))
            out = target(torch.cat([ids, *proposal], dim=1), output_hidden_states=True)  # verify
            outputs.append(out.logits)
            predicted = out.logits[0, length - 1:].argmax(-1).tolist()  # (K + 1,)
            accepted = 0
            while accepted < K and proposal[accepted].item() == predicted[accepted]:
                accepted += 1
            new = torch.tensor([[*predicted[:accepted], predicted[accepted]]])  # accepted + bonus
            ids = torch.cat([ids, new], dim=1)
            if tracer is not None:
                tracer.record_verify(request_id, K, accepted, draft_s=0.001, verify_s=0.002)
            # Next round: rows of the verified positions only, a subset of the verify forward.
            feed, fed_ids = _aux(out.hidden_states, capture)[:, length - 1:length + accepted], new
        if tracer is not None:
            tracer.finish_request(request_id, ids.shape[1] - prompt_len)
    return outputs
