"""A small target / EAGLE-3-style draft pair for hook tests: a residual target of a few layers that
hands the draft the hidden states entering its capture layers (or, as a port bug would, others)."""

from __future__ import annotations

import torch
from torch import nn

from specscope import RunConfig

HIDDEN, LAYERS, AUX = 8, 5, (0, 2, 3)
CONFIG = RunConfig(aux_layer_ids_resolved=AUX, target_hidden_size=HIDDEN, expected_fused_width=len(AUX) * HIDDEN,
                   k=2, num_target_layers=LAYERS)


class Layer(nn.Module):
    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + torch.tanh(self.proj(hidden_states))


class Target(nn.Module):
    """Keeps the hidden state entering each layer, as an engine's aux capture does; ``capture``:
    which of them it hands the draft (a port bug hands the wrong ones)."""

    def __init__(self, capture: tuple[int, ...] = AUX, hidden: int = HIDDEN, layers: int = LAYERS) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.capture = capture

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        entering = []
        for layer in self.layers:
            entering.append(hidden_states)
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states), torch.cat([entering[i] for i in self.capture], dim=-1)


class Draft(nn.Module):
    def __init__(self, hidden: int = HIDDEN, aux: int = len(AUX)) -> None:
        super().__init__()
        self.fc = nn.Linear(aux * hidden, hidden)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc(hidden_states)


def capture_graph(step) -> torch.cuda.CUDAGraph:
    """Capture ``step()`` after an eager warm-up on a side stream, as ``torch.cuda.graph`` asks."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph
