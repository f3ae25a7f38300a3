"""The losslessness audit at vLLM's verifier (docs/design.md, "Losslessness audit").

vLLM 0.32 verifies drafts in ``RejectionSampler.forward(metadata, draft_probs, logits,
sampling_metadata)`` (``vllm/v1/sample/rejection_sampler.py``), a module the model runner calls
eagerly whether the models are compiled or replayed from CUDA graphs. ``logits`` holds the target's
rows for every draft position (``metadata.target_logits_indices``) and every bonus position
(``metadata.bonus_logits_indices``); the result's ``sampled_token_ids`` (batch, max_spec_len + 1)
holds what each request emits, -1 in the slots it leaves empty. On an audited step specscope gathers
the rows of every slot before vLLM runs (vLLM may update ``logits`` in place), lets vLLM verify, then
hands rows, emitted tokens and each request's temperature / top-k / top-p to the tracer's audit: all
on the device, nothing read back on the engine thread.

A batch whose verifier applies more than temperature / top-k / top-p to the target's logits
(penalties, allowed or bad token lists) is not audited: the audit would judge it against another
distribution than the one vLLM samples from.
"""

from __future__ import annotations

from typing import Any

import torch

from specscope.adapters.vllm._swap import Swap
from specscope.events import sampling_label
from specscope.instrumentation import AuditSlot, Tracer

GREEDY_BELOW = 1e-5
"""vLLM's greedy requests carry temperature 0 in the batch (``gpu_input_batch.py``); anything below
this counts as greedy, as vLLM's own ``_SAMPLING_EPS``."""


def attach(runner: Any, tracer: Tracer) -> Swap:
    """Wrap ``runner.rejection_sampler``'s forward (the instance's, not the class's); returns the
    :class:`Swap` that takes the wrapper out again."""
    verifier = runner.rejection_sampler
    original = verifier.forward

    def forward(metadata: Any, draft_probs: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
        audit = None
        try:
            if not _warm_up(runner, metadata) and tracer.audit_due():
                audit = _gather(runner, metadata, logits, sampling_metadata)
        except Exception as exc:  # noqa: BLE001 - observing must not change what vLLM does
            tracer.hook_state.failed("vllm verifier audit", exc)
        output = original(metadata, draft_probs, logits, sampling_metadata)
        if audit is not None:
            rows, index, temperature, top_k, top_p, slots, drafted, kept, all_greedy = audit
            emitted = output.sampled_token_ids.reshape(-1)
            if kept is not None:  # other requests' slots read as empty: not audited
                emitted = torch.where(kept, emitted, -1)
            tracer.record_audit(rows, emitted, temperature, slots, top_k, top_p, drafted, all_greedy, index)
        return output

    return Swap(verifier, "forward", forward)


def _warm_up(runner: Any, metadata: Any) -> bool:
    """vLLM's warm-up verifies dummy drafts of requests that do not exist (``_dummy_sampler_run``, run by
    every GPU worker at start and by the CPU runner after compiling): nothing is served, nothing to audit."""
    return len(runner.input_batch.req_ids) < len(metadata.num_draft_tokens)


def plain_sampling(request: Any) -> bool:
    """The verifier's distribution for this request is the target's logits under temperature / top-k /
    top-p alone. vLLM applies penalties, allowed and banned tokens, min_tokens (the end of sequence
    masked until then) and a thinking budget to the verified rows, and min-p and logit bias to the bonus
    row only: the audit would test another distribution than the one verified, so such a request's
    slots are not audited (the batch's other requests are)."""
    params = request.sampling_params
    return (params.presence_penalty == 0 and params.frequency_penalty == 0 and params.repetition_penalty == 1
            and not params.logit_bias and params.min_p == 0 and not params.allowed_token_ids
            and not params.bad_words and params.thinking_token_budget is None
            and len(request.output_token_ids) >= params.min_tokens)


def _gather(runner: Any, metadata: Any, logits: torch.Tensor, sampling_metadata: Any) -> tuple:
    """``(rows, index, temperature, top_k, top_p, slots, drafted, kept, all_greedy)`` of every emitted-token
    slot of the batch, slot (i, j) = request i's position j: ``rows`` (B * W, V) copied from ``logits``
    and ``index`` None, or in a batch of greedy requests ``logits`` itself and ``index`` (B * W,) the
    row each slot reads (no copy: vLLM 0.32's verifier indexes copies of the rows it changes, and a
    greedy slot needs its row's maximum and the emitted token's logit alone); per-slot
    settings and the draft token verified there (-1 at the bonus slot) on the device; slot names from
    host-side values (the runner's request states); ``kept``: the slots of requests the audit can judge
    (:func:`plain_sampling`) on the device, None when that is all of them; ``all_greedy``: every request
    of the batch is greedy (vLLM's host-side flag); None instead of the tuple when none."""
    num_draft = list(metadata.num_draft_tokens)
    width = metadata.max_spec_len + 1
    device = logits.device
    starts, flat, is_draft, owner, slots, kept = 0, [], [], [], [], []
    req_ids = runner.input_batch.req_ids
    for i, n in enumerate(num_draft):
        request = runner.requests[req_ids[i]]
        params = request.sampling_params
        label = sampling_label(greedy_zero(params.temperature), params.top_p, params.top_k)
        kept += [plain_sampling(request)] * width
        for j in range(width):
            flat.append(starts + min(j, max(n - 1, 0)))
            is_draft.append(j < n)
            owner.append(i)
            slots.append(AuditSlot(req_ids[i], label, j))
        starts += n
    if not any(kept):
        return None
    flat = [min(f, max(starts - 1, 0)) for f in flat]  # a last request without drafts reads its bonus row
    owner_t = torch.tensor(owner).to(device, non_blocking=True)
    target_rows = metadata.target_logits_indices
    is_draft_t = torch.tensor(is_draft).to(device, non_blocking=True)
    if target_rows.numel():
        flat_t = torch.tensor(flat).to(device, non_blocking=True)
        draft_rows = target_rows[flat_t]
        drafted = torch.where(is_draft_t, metadata.draft_token_ids[flat_t].long(), -1)
    else:  # no request drafted this step: every slot reads its bonus row
        draft_rows = metadata.bonus_logits_indices[owner_t]
        drafted = torch.full((len(flat),), -1, device=device)
    index = torch.where(is_draft_t, draft_rows, metadata.bonus_logits_indices[owner_t])
    temperature = sampling_metadata.temperature
    all_greedy = bool(sampling_metadata.all_greedy) or temperature is None
    if all_greedy:
        rows = logits
        temperature = torch.zeros(len(num_draft), device=device)
    else:
        rows, index = logits[index].float(), None  # a copy: vLLM may change ``logits`` in place
    temperature = torch.where(temperature < GREEDY_BELOW, torch.zeros_like(temperature), temperature)
    top_k = None if sampling_metadata.top_k is None else sampling_metadata.top_k[owner_t]
    top_p = None if sampling_metadata.top_p is None else sampling_metadata.top_p[owner_t]
    kept_t = None if all(kept) else torch.tensor(kept).to(device, non_blocking=True)
    return rows, index, temperature[owner_t], top_k, top_p, slots, drafted, kept_t, all_greedy


def greedy_zero(temperature: float) -> float:
    """A request's temperature as specscope records it: 0 for vLLM's greedy requests."""
    return 0.0 if temperature < GREEDY_BELOW else float(temperature)
