"""The reference engine: chain speculative decoding with an EAGLE-3 draft, lossless, greedy or sampled.

Per verify step (k drafts), following SGLang's EAGLE worker (``python/sglang/srt/speculative/
eagle_worker.py``) reduced to a chain of top-1 drafts:

1. the draft proposes d_1..d_k: d_1 from its last target-fed call, each later d_j from a chained call
   that reads the draft's own previous hidden state;
2. the target verifies ``[x_n, d_1..d_k]`` in one forward on its KV cache. Greedy (temperature 0): the
   longest prefix with ``d_i == argmax`` is accepted plus one bonus token (the target's own choice), so
   the output equals the target's greedy decoding token for token. Sampled: speculative sampling with
   a deterministic (argmax) draft, as vLLM does: d_i is accepted with probability p(d_i) under the
   target's distribution at temperature T; the first rejected position emits a token drawn from p with
   d_i removed, and a fully accepted chain a bonus token drawn from p, so each emitted token is a draw
   from the target's own distribution;
3. both caches roll back: the target's drops the rejected positions, the draft's drops its chained
   entries and re-runs the accepted tokens with the target's aux hidden states ("draft extend").

The engine knows only the instrumentation API (``tracer.start_request / record_verify /
finish_request``) and runs identically without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from specscope import metrics
from specscope.engine.checkpoint import DEFAULT_DRAFT_DIR, DRAFT_MODEL_ID, LoadedDraft, load_draft
from specscope.engine.draft import DraftCache
from specscope.engine.faults import check_fault
from specscope.engine.target import TARGET_MODEL_ID, load_target
from specscope.errors import ConfigError
from specscope.events import RunConfig, sampling_label
from specscope.instrumentation import AuditSlot, truncate

NOISE_SCALE = 4.0
"""Size of the noise the ``request-aux-noise`` and ``aux-decay`` faults add to the draft's target
features, in standard deviations of the features: enough to leave the draft guessing."""

DECAY_NOISE_SCALE = 0.5
"""The ``aux-decay`` fault's noise after :data:`DECAY_STEPS` verify steps (feature standard deviations).
Measured on six held-out prompts (32 tokens each, constant noise): acceptance rate 0.153 at 0, 0.124
at 0.1, 0.097 at 0.2, 0.056 at 0.3, so the ramp takes a run from the healthy draft's acceptance to a
fraction of it, falling with every step rather than at once."""

DECAY_STEPS = 700
"""Verify steps the engine serves before the ``aux-decay`` fault's noise reaches :data:`DECAY_NOISE_SCALE`
(about the length of ``tests/test_engine_acceptance_faults.py``'s run: 48 requests of 24 tokens)."""

NOISY_EVERY = 3
"""Under ``request-aux-noise`` every third request (index 2, 5, ... of a ``generate`` call) is noisy."""

ENGINE_NAME = "specscope-reference"
ENGINE_VERSION = "0.1.0"


@dataclass
class RequestResult:
    """One served request. Token counts are in target-vocabulary tokens; durations in seconds."""

    request_id: str
    prompt: str
    prompt_tokens: int
    token_ids: list[int]
    text: str
    accepted: list[int] = field(default_factory=list)  # accepted drafts per verify step
    proposed: list[int] = field(default_factory=list)  # drafts verified per verify step
    duration_s: float = 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verify step, bonus included (docs/design.md, "Acceptance figures")."""
        return metrics.mean_acceptance_length(self.accepted)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens."""
        return metrics.acceptance_rate(self.accepted, self.proposed)


class Engine:
    """Target SmolLM2-135M-Instruct + reference EAGLE-3 draft, one request at a time on the CPU.

    Args:
        draft_dir: EAGLE-3 checkpoint folder (default: the head shipped with specscope).
        fault: a fault switch from :data:`specscope.engine.faults.FAULTS`, or None.
        k: draft tokens per verify step (>= 1).
        tracer: optional instrumentation (``specscope.instrumentation.Tracer``); None = not observed.
        target: an already loaded ``(model, tokenizer)`` pair to share between engines.

    Raises:
        ConfigError: unknown fault or k < 1. CheckpointError: the draft checkpoint does not load.
        ModelNotFoundError: the target model package is missing.
    """

    def __init__(self, draft_dir: str | Path = DEFAULT_DRAFT_DIR, fault: str | None = None, k: int = 4,
                 tracer=None, target=None) -> None:
        if k < 1:
            raise ConfigError(f"k must be at least 1, got {k}")
        self.fault = check_fault(fault)
        self.k = k
        self.tracer = tracer
        self.target, self.tokenizer = target if target is not None else load_target()
        self.loaded: LoadedDraft = load_draft(draft_dir, self.target.get_input_embeddings(), fault)
        self.draft = self.loaded.model
        cfg = self.draft.config
        shift = 1 if fault == "aux-off-by-one" else 0
        # Physical capture points: "hidden state entering layer i" = HF hidden_states[i].
        self.capture_ids = tuple(i + shift for i in cfg.aux_layer_ids)
        self.eos_id = self.tokenizer.eos_token_id
        self.steps_served = 0  # verify steps over the engine's lifetime: the aux-decay fault's clock
        self._served: tuple[float, float, int] | None = None  # the last request's settings (a fault reads them)

    def run_config(self) -> RunConfig:
        """The target/draft contract for instrumentation (widths in elements)."""
        cfg = self.draft.config
        return RunConfig(aux_layer_ids_configured=cfg.aux_layer_ids, aux_layer_ids_resolved=cfg.aux_layer_ids,
                         target_hidden_size=self.target.config.hidden_size,
                         expected_fused_width=self.draft.fc.in_features, k=self.k,
                         num_target_layers=self.target.config.num_hidden_layers, dtype="float32")

    @property
    def model_ids(self) -> tuple[str, str]:
        """``(target model id, draft model id)`` as recorded in runs."""
        return TARGET_MODEL_ID, DRAFT_MODEL_ID

    def encode(self, prompt: str) -> torch.Tensor:
        """Chat-template a user prompt: (1, P) token ids."""
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                 add_generation_prompt=True, return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]

    def _aux(self, hidden_states) -> torch.Tensor:
        """The draft's input features from a target forward: (1, T, W)."""
        if self.fault == "no-aux-capture":  # capture never activated: final (normed) hidden state
            return hidden_states[-1]
        return torch.cat([hidden_states[i] for i in self.capture_ids], dim=-1)

    def noise_scale(self, index: int) -> float:
        """Noise over the draft's features for request ``index`` of a call, in feature standard deviations
        (0 unless a noise fault is on)."""
        if self.fault == "request-aux-noise":
            return NOISE_SCALE if index % NOISY_EVERY == NOISY_EVERY - 1 else 0.0
        if self.fault == "aux-decay":
            return DECAY_NOISE_SCALE * min(1.0, self.steps_served / DECAY_STEPS)
        return 0.0

    @torch.no_grad()
    def generate(self, prompts: list[str], max_new_tokens: int = 64, request_ids: list[str] | None = None,
                 temperature: float = 0.0, seed: int = 0, top_p: float = 1.0, top_k: int = 0) -> list[RequestResult]:
        """Serve ``prompts`` one after another with speculative decoding.

        Returns one :class:`RequestResult` per prompt, in order; ``request_ids`` default to
        ``req-<index>``. ``temperature`` 0 decodes greedily; above 0 each request samples from the
        target's distribution at that temperature, truncated to ``top_k`` tokens (0: all) and then to
        ``top_p`` of the mass (vLLM's rule), with a generator seeded by ``seed`` and its index.
        """
        ids = request_ids or [f"req-{i}" for i in range(len(prompts))]
        if len(ids) != len(prompts):
            raise ConfigError(f"{len(prompts)} prompts but {len(ids)} request ids")
        if not temperature >= 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
        if not 0 < top_p <= 1 or not isinstance(top_k, int) or top_k < 0:
            raise ConfigError(f"top_p must be in (0, 1] and top_k an int >= 0 (0 = all), got {top_p!r}, {top_k!r}")
        return [self._serve(rid, p, max_new_tokens, self._sampler(temperature, seed, i, top_p, top_k), i)
                for i, (rid, p) in enumerate(zip(ids, prompts))]

    def _sampler(self, temperature: float, seed: int, index: int, top_p: float, top_k: int) -> _Sampler:
        """The sampler of request ``index``, built when it is served (the faults that cross requests act here)."""
        shared = self.fault == "shared-uniforms"  # one seed for all: every request draws the same uniforms
        sampler = _Sampler(temperature, seed if shared else seed + index, top_p, top_k, self.fault)
        if self.fault == "sampling-of-previous-request":  # a stale slot: the previous request's settings
            sampler.verify_settings, self._served = self._served or sampler.verify_settings, sampler.verify_settings
        return sampler

    def _serve(self, rid: str, prompt: str, max_new_tokens: int, sampler: _Sampler, index: int) -> RequestResult:
        start = time.perf_counter()
        prompt_ids = self.encode(prompt)
        if self.tracer is not None:
            self.tracer.start_request(rid, prompt_tokens=prompt_ids.shape[1], temperature=sampler.temperature,
                                      top_p=sampler.top_p, top_k=sampler.top_k, prompt=prompt_ids[0].tolist())
        result = RequestResult(rid, prompt, prompt_ids.shape[1], [], "")
        state = _State(self, prompt_ids, sampler, rid, index)
        out = state.tokens[-1:]
        while len(out) < max_new_tokens and out[-1] != self.eos_id:
            t0 = time.perf_counter()
            drafts = state.propose(self.k)
            t1 = time.perf_counter()
            accepted, new = state.verify(drafts)
            t2 = time.perf_counter()
            new = _truncate(new, max_new_tokens - len(out), self.eos_id)
            out += new
            result.accepted.append(accepted)
            result.proposed.append(len(drafts))
            self.steps_served += 1
            if self.tracer is not None:
                self.tracer.record_verify(rid, proposed=len(drafts), accepted=accepted, draft_s=t1 - t0,
                                          verify_s=t2 - t1, emitted=[self.tokenizer.decode([t]) for t in new])
        result.token_ids = out[:max_new_tokens]
        result.text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        result.duration_s = time.perf_counter() - start
        if self.tracer is not None:
            self.tracer.finish_request(rid, output_tokens=len(result.token_ids), text=result.text,
                                       output_ids=result.token_ids)
        return result

    @torch.no_grad()
    def greedy(self, prompt: str, max_new_tokens: int = 64) -> list[int]:
        """The target's own greedy decoding, one token per forward (the lossless reference)."""
        ids = self.encode(prompt)
        cache = DynamicCache(config=self.target.config)
        out: list[int] = []
        while len(out) < max_new_tokens and (not out or out[-1] != self.eos_id):
            logits = self.target(ids, past_key_values=cache, use_cache=True).logits
            out.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
        return out


class _Sampler:
    """One request's token choice from the target's logits: argmax at temperature 0, else a draw from
    the target's processed distribution (temperature, top-k, top-p) with a generator of its own
    (reproducible per request). ``fault``: the engine's fault switch; the lossy sampled ones break
    :meth:`verify` only, the first token is always drawn right. ``verify_settings``: the
    ``(temperature, top_p, top_k)`` the verify step applies, the request's own unless a fault swaps them."""

    def __init__(self, temperature: float, seed: int, top_p: float = 1.0, top_k: int = 0,
                 fault: str | None = None) -> None:
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.label = sampling_label(self.temperature, self.top_p, self.top_k)
        self.generator = torch.Generator().manual_seed(seed)
        self.fault = fault
        self.verify_settings = (self.temperature, self.top_p, self.top_k)

    def probs(self, logits: torch.Tensor, temperature: float | None = None, top_p: float | None = None,
              top_k: int | None = None) -> torch.Tensor:
        """(N, V) the target's processed distribution of (N, V) logits at this request's settings
        (or the ones given)."""
        t = self.temperature if temperature is None else temperature
        p = self.top_p if top_p is None else top_p
        k = self.top_k if top_k is None else top_k
        n = logits.shape[0]
        return truncate(logits / t, torch.full((n,), k) if k else None,
                        torch.full((n,), p) if p < 1 else None).softmax(dim=-1)

    def _verify_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the verify step samples from: the request's, unless a fault bends it."""
        temperature, top_p, top_k = self.verify_settings
        if self.fault == "temperature-twice":
            temperature = temperature ** 2
        if self.fault == "top-p-ignored":
            top_p = 1.0
        if self.fault == "top-k-ignored":
            top_k = 0
        return self.probs(logits, temperature, top_p, top_k)

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def choose(self, logits: torch.Tensor) -> int:
        """The next token from (V,) logits."""
        return int(logits.argmax()) if self.temperature == 0 else self.draw(self.probs(logits[None])[0])

    def verify(self, drafts: list[int], logits: torch.Tensor) -> tuple[int, int]:
        """``(accepted drafts m, the token emitted at position m)`` for drafts checked against the
        target's (k+1, V) logits: the greedy prefix rule, or speculative sampling with a deterministic
        draft (accept d_i with probability p_i(d_i); on rejection draw from p_i without d_i)."""
        k = len(drafts)
        if self.verify_settings[0] == 0 or self.fault == "temperature-ignored":
            greedy = logits.argmax(-1).tolist()  # (k+1,) the target's choice after each prefix
            m = 0
            while m < k and drafts[m] == greedy[m]:
                m += 1
            return m, greedy[m]
        probs = self._verify_probs(logits)  # (k+1, V)
        for m, token in enumerate(drafts):
            if float(torch.rand((), generator=self.generator)) >= float(probs[m, token]):
                residual = probs[m].clone()
                if self.fault != "recovered-from-p":
                    residual[token] = 0.0
                return m, self.draw(residual / residual.sum())
        return k, self.draw(probs[k])


def _truncate(new: list[int], room: int, eos: int) -> list[int]:
    new = new[:room]
    return new[: new.index(eos) + 1] if eos in new else new


class _State:
    """Caches and positions of one request. ``tokens`` holds every token so far; the target cache
    covers all but the last one; the draft cache holds one target-fed entry per position 1..n."""

    def __init__(self, engine: Engine, prompt_ids: torch.Tensor, sampler: _Sampler, request_id: str,
                 index: int) -> None:
        self.engine, self.target, self.draft = engine, engine.target, engine.draft
        self.sampler, self.request_id, self.index = sampler, request_id, index
        self.noise = torch.Generator().manual_seed(index)  # the noise faults' draws, reproducible per request
        self.cache = DynamicCache(config=self.target.config)
        self.dcache = DraftCache()
        out = self.target(prompt_ids, past_key_values=self.cache, use_cache=True, output_hidden_states=True)
        self.tokens = prompt_ids[0].tolist() + [sampler.choose(out.logits[0, -1])]
        self._extend(self.tokens[1:], start=1, aux=self._features(out.hidden_states))

    def _features(self, hidden_states) -> torch.Tensor:
        """The draft's target-fed input (1, T, W) as the engine's fault leaves it: a noise fault adds
        Gaussian noise of :meth:`Engine.noise_scale` feature standard deviations."""
        aux = self.engine._aux(hidden_states)
        scale = self.engine.noise_scale(self.index)
        if scale:
            aux = aux + scale * aux.std() * torch.randn(aux.shape, generator=self.noise, dtype=aux.dtype)
        return aux

    def _extend(self, new_tokens: list[int], start: int, aux: torch.Tensor) -> None:
        """Target-fed draft call: tokens at positions start.. with the target's features (1, T, W)."""
        ids = torch.tensor([new_tokens])
        positions = torch.arange(start, start + len(new_tokens))[None]
        logits, hidden = self.draft(ids, positions, aux, self.dcache)
        self.last_logits, self.last_hidden = logits[:, -1], hidden[:, -1:]

    def propose(self, k: int) -> list[int]:
        """k chained draft tokens (target ids)."""
        n = len(self.tokens) - 1
        logits, hidden, drafts = self.last_logits, self.last_hidden, []
        for j in range(k):
            token = self.draft.to_target_ids(logits.argmax(-1))  # (1,)
            drafts.append(int(token))
            if j + 1 < k:
                out, hidden = self.draft(token[None], torch.tensor([[n + 1 + j]]), hidden, self.dcache)
                logits, hidden = out[:, -1], hidden[:, -1:]
        return drafts

    def verify(self, drafts: list[int]) -> tuple[int, list[int]]:
        """Target forward on ``[x_n, d_1..d_k]``; returns (accepted drafts, emitted tokens)."""
        n, k = len(self.tokens) - 1, len(drafts)
        ids = torch.tensor([[self.tokens[-1], *drafts]])  # (1, k+1)
        out = self.target(ids, past_key_values=self.cache, use_cache=True, output_hidden_states=True)
        m, token = self.sampler.verify(drafts, out.logits[0])
        if self.engine.fault == "emit-draft-token" and m < k:
            token = drafts[m]  # the broken verifier: same acceptance, the draft's token instead of the target's
        new = drafts[:m] + [token]
        tracer = self.engine.tracer
        if tracer is not None and tracer.audit_due():
            slots = [AuditSlot(self.request_id, self.sampler.label, j) for j in range(m + 1)]
            sampler = self.sampler
            tracer.record_audit(out.logits[0, : m + 1], torch.tensor(new), torch.full((m + 1,), sampler.temperature),
                                slots, torch.full((m + 1,), sampler.top_k), torch.full((m + 1,), sampler.top_p),
                                torch.tensor([*drafts, -1][: m + 1]), all_greedy=sampler.temperature == 0)
        if k - m:
            self.cache.crop(-(k - m))  # transformers 5: a negative count of tokens to drop
        self.dcache.crop(n)  # drop the chained entries; the accepted tokens are re-run target-fed
        aux = self._features(out.hidden_states)[:, : m + 1]  # (1, m+1, W): positions n..n+m
        self.tokens += new
        self._extend(new, start=n + 1, aux=aux)
        return m, new
