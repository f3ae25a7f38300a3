"""The EAGLE-3 draft head, laid out like the checkpoints EAGLE / SpecForge / SGLang write.

Module names equal checkpoint keys (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, buffers ``d2t`` and
``t2d``) so hooks and loaders find them by name. The computation follows SGLang
``python/sglang/srt/models/llama_eagle3.py`` (``LlamaModel.forward`` and the Eagle3 decoder layer):

- ``fc`` (``Linear(n_aux * target_hidden -> hidden, bias=False)``) is applied only when the incoming
  hidden state is not already ``hidden`` wide, exactly the engine condition that hides a missing aux
  capture (docs/design.md, "The failure");
- the single decoder layer attends over ``cat(input_layernorm(embeds), hidden_norm(hidden))``
  (``2 * hidden`` wide), with the un-normed hidden state as the residual;
- the output hidden state (before the final ``norm``) is what the next chained draft step receives.

Token embeddings are the target's (not stored in the checkpoint); ``lm_head`` maps to the draft
vocabulary, and ``d2t`` (int64 offsets, ``target_id = i + d2t[i]``) maps draft ids to target ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaConfig,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from specscope.errors import ConfigError


@dataclass(frozen=True)
class DraftConfig:
    """The draft's ``config.json`` (EAGLE-3 / SGLang field names).

    ``aux_layer_ids``: capture points as "hidden state entering target layer i" (HF ``hidden_states[i]``),
    stored as ``eagle_config.eagle_aux_hidden_state_layer_ids``.
    """

    hidden_size: int = 576
    target_hidden_size: int = 576
    intermediate_size: int = 1536
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    vocab_size: int = 49152
    draft_vocab_size: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192
    aux_layer_ids: tuple[int, ...] = (2, 15, 27)
    torch_dtype: str = "float16"
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def fused_width(self) -> int:
        """Expected width of the fused aux hidden states: ``n_aux * target_hidden_size`` (elements)."""
        return len(self.aux_layer_ids) * self.target_hidden_size

    def to_json(self) -> dict:
        """The ``config.json`` dict, in the layout SGLang's ``LlamaForCausalLMEagle3`` reads."""
        d = asdict(self)
        aux = list(d.pop("aux_layer_ids"))
        d.pop("extra")
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "hidden_act": "silu", "tie_word_embeddings": False, **d,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux}}

    @classmethod
    def from_json(cls, data: dict) -> DraftConfig:
        """Parse a ``config.json`` dict. Raises ConfigError naming a missing or mistyped field."""
        names = {f for f in cls.__dataclass_fields__ if f not in ("aux_layer_ids", "extra")}
        try:
            kwargs = {k: type(getattr(cls, k))(data[k]) for k in names if k in data}
            aux = data.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids", cls.aux_layer_ids)
            return cls(**kwargs, aux_layer_ids=tuple(int(i) for i in aux))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"draft config.json is malformed: {exc}") from exc

    @classmethod
    def load(cls, folder: str | Path) -> DraftConfig:
        """Read ``folder/config.json``. Raises ConfigError if it is missing or not JSON."""
        path = Path(folder) / "config.json"
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read draft config {path}: {exc}") from exc

    def llama_config(self) -> LlamaConfig:
        """The transformers LlamaConfig used to build the layer's MLP, norms and rotary embedding."""
        return LlamaConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings, hidden_act="silu",
                           vocab_size=self.vocab_size)


class DraftCache:
    """Key/value cache of the draft's single attention layer: ``(B, kv_heads, S, head_dim)`` each."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(B, kv_heads, T, head_dim)`` keys/values; returns the whole cache."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (rolls back rejected speculative entries)."""
        if self.k is not None:
            self.k, self.v = self.k[..., :length, :], self.v[..., :length, :]


class Eagle3Attention(nn.Module):
    """Grouped-query attention whose q/k/v projections read ``2 * hidden`` (embeds ++ hidden)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        width = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``x`` (B, T, 2H) -> q (B, heads, T, d), k and v (B, kv_heads, T, d), rotary applied."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def output(self, attn: torch.Tensor) -> torch.Tensor:
        """Attention result (B, heads, T, d) -> (B, T, H)."""
        b, _, t, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Eagle3DecoderLayer(nn.Module):
    """The draft's one decoder layer (``midlayer``), SGLang ``llama_eagle3.py`` layout."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        lcfg = cfg.llama_config()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = LlamaMLP(lcfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) embeds and hidden -> (B, T, 2H) attention input."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Residual + MLP block after attention: (B, T, H) -> (B, T, H)."""
        hidden = attn_out + residual
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft head over a target's token embeddings.

    Args:
        cfg: the draft config.
        embed_tokens: the target's embedding module (shared, not part of this module's state dict).
    """

    def __init__(self, cfg: DraftConfig, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(cfg.fused_width, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(cfg)
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(cfg.llama_config())
        object.__setattr__(self, "embed_tokens", embed_tokens)  # shared with the target, never saved

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``positions`` (B, T) in ``like``'s dtype: each (B, T, head_dim)."""
        return self.rotary(like, positions)

    def fuse(self, hidden_states: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Apply ``fc`` when the input is not already ``hidden`` wide (SGLang's condition).

        (B, T, n_aux*H_target) -> (B, T, H); an H-wide input passes through untouched.
        """
        if hidden_states.shape[-1] != embeds.shape[-1]:
            hidden_states = self.fc(hidden_states)
        return hidden_states

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                cache: DraftCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over T tokens.

        Args:
            input_ids: (B, T) target-vocabulary token ids.
            positions: (B, T) absolute positions (rotary).
            hidden_states: (B, T, W): the target's fused aux states (W = n_aux * H_target) on the first
                call after the target ran, the draft's own previous output (W = H) on chained calls.
            cache: the draft KV cache; keys/values of these T tokens are appended to it.

        Returns:
            ``(logits (B, T, draft_vocab), hidden_out (B, T, H))``.
        """
        embeds = self.embed_tokens(input_ids)  # (B, T, H)
        hidden = self.fuse(hidden_states, embeds)  # (B, T, H)
        x = self.midlayer.attn_input(embeds, hidden)  # (B, T, 2H)
        cos, sin = self.rope(positions, x)
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(x, cos, sin)
        if cache is not None:
            past = len(cache)
            k, v = cache.append(k, v)
        else:
            past = 0
        out = _attend(q, k, v, _causal_mask(q.shape[-2], past, q.device))
        hidden_out = self.midlayer.finish(attn.output(out), hidden)  # (B, T, H)
        return self.lm_head(self.norm(hidden_out)), hidden_out

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids with the ``d2t`` offsets: ``i + d2t[i]``.

        The modulo keeps a corrupted map (e.g. absolute ids, fault ``d2t-absolute``) inside the target
        vocabulary so the engine keeps running and the failure stays silent, as in the engines.
        """
        return (draft_ids + self.d2t[draft_ids]) % self.config.vocab_size


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain grouped-query attention: q (B, h, T, d), k/v (B, kvh, S, d), mask (T, S) -> (B, h, T, d).

    Written out because torch's CPU SDPA kernel costs ~10 ms for the draft's 1-token queries, several
    times the whole draft step done this way.
    """
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, h, T, S)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _causal_mask(t: int, past: int, device: torch.device) -> torch.Tensor:
    """(T, past + T) boolean mask: query i sees every cached key and new keys up to itself."""
    return torch.ones(t, past + t, dtype=torch.bool, device=device).tril(diagonal=past)
