"""A small healthy EAGLE-3 draft checkpoint, built here so the inspector tests need nothing outside
the checkout (the same shapes as ../shared/cases/checkpoints/ok-eagle3: hidden 64, 3 aux layers,
draft vocabulary 128 of 1000, bfloat16 weights, int64 d2t offsets, bool t2d)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 4, 2, 16
VOCAB, DRAFT_VOCAB, N_AUX = 1000, 128, 3

CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
    "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM, "num_hidden_layers": 1, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
    "target_hidden_size": HIDDEN, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "max_position_embeddings": 2048,
}


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights in the SGLang / SpecForge key layout (``midlayer.*``, ``fc``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``): projections N(0, 0.05), norm weights near 1."""
    gen = torch.Generator().manual_seed(seed)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)

    def norm() -> torch.Tensor:
        return (1 + torch.randn(HIDDEN, generator=gen) * 0.09).to(torch.bfloat16)

    target_ids = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values  # (DRAFT_VOCAB,)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[target_ids] = True
    return {
        "fc.weight": weight(HIDDEN, N_AUX * HIDDEN),
        "midlayer.input_layernorm.weight": norm(), "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": weight(HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": weight(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": weight(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": weight(HIDDEN, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": weight(INTER, HIDDEN), "midlayer.mlp.up_proj.weight": weight(INTER, HIDDEN),
        "midlayer.mlp.down_proj.weight": weight(HIDDEN, INTER),
        "norm.weight": norm(), "lm_head.weight": weight(DRAFT_VOCAB, HIDDEN),
        "d2t": target_ids - torch.arange(DRAFT_VOCAB), "t2d": t2d,
    }


def write(folder: Path, seed: int = 0) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors(seed), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return folder
