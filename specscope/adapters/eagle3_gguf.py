"""An EAGLE-3 draft in the standard layout (``midlayer.*``, ``fc``, ``d2t``; docs/design.md, "EAGLE-3
conventions") written as the GGUF llama.cpp's ``draft-eagle3`` loads, with the PyPI ``gguf`` package.

What this llama.cpp build (xllamacpp 2026.10) expects, found by loading attempts (its loader names the
first thing it misses); the PyPI ``gguf`` package has no EAGLE-3 architecture, so keys and tensor
names are written by hand:

- architecture ``eagle3``; the Llama hyperparameters under ``eagle3.*``; the captured target layers
  as ``eagle3.target_layers`` (exactly 3; llama.cpp captures the hidden state entering layer i, the
  convention of vLLM and of the reference engine) and ``eagle3.target_hidden_size``; the target's
  tokenizer (the draft reads and writes target-token ids).
- a pruned head (``lm_head`` rows for the draft vocabulary) as ``output.weight`` plus a tensor ``d2t``
  of **absolute** target ids (``i + d2t[i]``), where the checkpoint stores offsets: measured, this
  build reads ``d2t`` as the target id itself (offsets as written in the checkpoint make every draft
  token wrong: AL 1.0); without ``d2t`` it checks ``output.weight`` against the tokenizer's size.
- ``midlayer.hidden_norm`` as ``blk.0.attn_norm_2``; q / k rows permuted for llama.cpp's rotary
  layout, as its own Llama conversion does; no ``token_embd`` (the target's embedding is used).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_NAMES = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def _rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """q / k projection rows reordered from Hugging Face's rotary halves to llama.cpp's interleaved
    pairs: (heads, 2, d/2, in) -> (heads, d/2, 2, in)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_eagle3_gguf(draft_dir: str | Path, target_gguf: str | Path, out: str | Path) -> Path:
    """Write the draft in ``draft_dir`` (``config.json`` + ``model.safetensors``) as an EAGLE-3 GGUF
    for the target ``target_gguf`` (whose tokenizer it copies) at ``out``; return ``out``.

    Raises:
        KeyError: the draft lacks a tensor or config field of the standard layout.
        OSError: a file cannot be read or written.
    """
    import gguf
    from safetensors.numpy import load_file

    draft_dir, out = Path(draft_dir), Path(out)
    config = json.loads((draft_dir / "config.json").read_text())
    weights = load_file(str(draft_dir / "model.safetensors"))
    target = gguf.GGUFReader(str(target_gguf))
    vocab = int(config["vocab_size"])
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))

    writer = gguf.GGUFWriter(str(out), "eagle3")
    writer.add_block_count(1)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_rope_freq_base(float(config["rope_theta"]))
    writer.add_rope_dimension_count(int(config.get("head_dim", hidden // heads)))
    writer.add_vocab_size(vocab)
    writer.add_array("eagle3.target_layers", [int(i) for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]])
    writer.add_uint32("eagle3.target_hidden_size", int(config.get("target_hidden_size", hidden)))
    for name, field in target.fields.items():
        if name.startswith("tokenizer.ggml."):
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), kind, sub_type=sub)

    for source, name in _NAMES.items():
        writer.add_tensor(name, weights[source].astype(np.float32))
    writer.add_tensor("blk.0.attn_q.weight",
                      _rotary_rows(weights["midlayer.self_attn.q_proj.weight"].astype(np.float32), heads))
    writer.add_tensor("blk.0.attn_k.weight",
                      _rotary_rows(weights["midlayer.self_attn.k_proj.weight"].astype(np.float32), kv_heads))
    writer.add_tensor("output.weight", weights["lm_head.weight"].astype(np.float32))  # (draft_vocab, hidden)
    if "d2t" in weights:
        offsets = weights["d2t"].astype(np.int64)
        writer.add_tensor("d2t", np.arange(len(offsets), dtype=np.int64) + offsets)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
