"""The target served alone, as a replay reads it: a local Hugging Face folder through transformers
(full logits), or an OpenAI-compatible server that returns prompt log-probabilities (vLLM's
``prompt_logprobs``). Each scores one request with one forward over prompt + output
(docs/design.md, "Replay against the target")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx

from specscope.errors import ConfigError, SpecscopeError
from specscope.events import ReplayResult
from specscope.replay._score import NEAR_TIE_MARGIN, ReplayInput, score_logits, score_margins

SERVER_TIMEOUT_S = 120.0
"""Longest a server may take over one request's forward (seconds)."""


class ReplayError(SpecscopeError):
    """The target could not score a request (the server refused it or answered in another shape)."""


class TransformersTarget:
    """A local target folder loaded with transformers (float32 by default, on the CPU unless
    ``device`` says otherwise)."""

    def __init__(self, folder: str | Path, dtype: str = "float32", device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        path = Path(folder)
        if not (path / "config.json").is_file():
            raise ConfigError(f"--target {folder}: not a Hugging Face model folder (no config.json)")
        try:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--target {folder}: transformers cannot load it: {exc}") from exc
        self.device = device
        self.source = str(path)

    def score(self, item: ReplayInput, run_id: str, near_tie_margin: float = NEAR_TIE_MARGIN) -> ReplayResult:
        """One forward over prompt + output (the last output token needs no prediction of its own)."""
        import torch

        ids = torch.tensor([[*item.prompt_ids, *item.output_ids[:-1]]], device=self.device)  # (1, P + N - 1)
        with torch.no_grad():
            logits = self.model(ids).logits[0]  # (P + N - 1, V)
        start = len(item.prompt_ids) - 1
        return score_logits(item, logits[start:start + len(item.output_ids)], run_id, self.source, near_tie_margin)


class ServerTarget:
    """An OpenAI-compatible completions endpoint without speculation that returns prompt
    log-probabilities in vLLM's shape: ``choices[0].prompt_logprobs`` is one entry per prompt token,
    ``null`` for the first, else ``{token_id: {"logprob", "rank", "decoded_token"}}`` holding the token
    itself and the ``prompt_logprobs`` most probable (rank 1 = the argmax). ``model``: the served name
    (default: the first of ``/v1/models``); ``client``: an ``httpx.Client`` to send through."""

    def __init__(self, url: str, model: str | None = None, client: httpx.Client | None = None) -> None:
        self.base = url.rstrip("/").removesuffix("/v1")
        self.client = client or httpx.Client(timeout=SERVER_TIMEOUT_S)
        self.source = self.base
        self._model = model

    def _post_or_get(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, self.base + path, **kwargs)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ReplayError(f"{self.base}{path}: {type(exc).__name__}: {str(exc)[:200]}") from exc

    @property
    def model(self) -> str:
        """The served model's name: as given, else the first ``/v1/models`` lists (asked once)."""
        if self._model is None:
            data = self._post_or_get("GET", "/v1/models").get("data") or []
            if not data:
                raise ReplayError(f"{self.base}/v1/models lists no model")
            self._model = str(data[0]["id"])
        return self._model

    def score(self, item: ReplayInput, run_id: str, near_tie_margin: float = NEAR_TIE_MARGIN) -> ReplayResult:
        """One completion of one token over prompt + output, asking for the prompt's log-probabilities."""
        if not item.greedy:
            return score_margins(item, None, [], run_id, self.source, near_tie_margin)
        body = {"model": self.model, "prompt": [*item.prompt_ids, *item.output_ids], "max_tokens": 1,
                "temperature": 0, "prompt_logprobs": 1}
        answer = self._post_or_get("POST", "/v1/completions", json=body)
        try:
            entries = answer["choices"][0]["prompt_logprobs"][len(item.prompt_ids):]
            margins, argmax = [], []
            for token, entry in zip(item.output_ids, entries):
                best_id, best = min(entry.items(), key=lambda kv: kv[1]["rank"])
                margins.append(max(0.0, best["logprob"] - entry[str(token)]["logprob"]))
                argmax.append(int(best_id))
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as exc:
            raise ReplayError(f"{self.base}/v1/completions answered without vLLM's prompt_logprobs "
                              f"({type(exc).__name__}: {exc}); serve the target with vLLM") from exc
        if len(margins) != len(item.output_ids) or not all(math.isfinite(m) for m in margins):
            raise ReplayError(f"{self.base}/v1/completions gave {len(margins)} finite log-probabilities for "
                              f"{len(item.output_ids)} output tokens")
        return score_margins(item, margins, argmax, run_id, self.source, near_tie_margin)
