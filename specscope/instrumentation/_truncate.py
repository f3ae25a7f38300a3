"""Top-k / top-p truncation as vLLM's sampler applies it, at a fraction of its cost on the CPU.

vLLM's ``apply_top_k_top_p`` sorts the whole vocabulary of every row. The audit needs the same kept
set on one verify step in four, where a sort of 5 rows of 49k logits costs as much as 5% of the
verify forward on a CPU (docs/performance.md). Top-k keeps few tokens and top-p at chat-model settings
keeps few more, so the cut is found among each row's ``candidates`` largest logits (``torch.topk``);
a row whose cut lies beyond them (a top-k past them, or candidates whose mass stays under top-p) is
sorted as vLLM does. That fallback is decided on the host, which on the CPU waits for nothing; on an
accelerator every row is sorted, so the audit never waits for the device (a GPU sorts the few audited
rows in microseconds, and vLLM's sampler sorts every row of every step).
"""

from __future__ import annotations

import torch

TRUNCATE_CANDIDATES = 256
"""Logits per row among which :func:`truncate` looks for the cut before sorting the row."""


def truncate(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
             candidates: int = TRUNCATE_CANDIDATES) -> torch.Tensor:
    """``logits`` (N, V) with the tokens outside each row's top-k and top-p set to -inf.

    ``top_k`` (N,): tokens whose logit is below the k-th largest are dropped (ties with it kept), 0 or
    less (or V and more) for none; then ``top_p`` (N,): over an ascending sort of the remaining
    distribution, tokens whose cumulative mass is at most 1 - p are dropped, the most probable token
    always kept, 1 for none. The rule, and its arithmetic, of vLLM's own sampler
    (``apply_top_k_top_p``), so the audit judges by the distribution the engine samples from; the
    only freedom taken is at exact ties with the top-p cut, all kept here where vLLM keeps those its
    sort happens to put last (its order among equal logits is unspecified). ``candidates``: see the
    module's docstring.
    """
    if top_k is None and top_p is None:
        return logits
    k, p = _settings(logits, top_k, top_p)
    cut = _cut(logits, k, p, candidates)
    if cut is None:
        return _sorted(logits, k, p)
    values, _, threshold, covered, _ = cut
    out = torch.where(logits < threshold, float("-inf"), logits)
    if not bool(covered.all()):  # a CPU tensor: read on the host, no device to wait for
        rows = (~covered).nonzero()[:, 0]
        out[rows] = _sorted(logits[rows], k[rows], p[rows])
    return out


def truncated_support(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                      rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`truncate`'s result in as few columns as it can: ``(kept (N, C), ids (N, C))``, each
    row's candidates with -inf where cut, when every row of ``rows`` (N,) bool is cut among its
    candidates (the other rows' columns are not meant to be read); else ``(truncate(...) (N, V), None)``.
    A truncated distribution then costs the audit C columns per row instead of the vocabulary."""
    if top_k is None and top_p is None:
        return logits, None
    k, p = _settings(logits, top_k, top_p)
    cut = _cut(logits, k, p, TRUNCATE_CANDIDATES)
    if cut is None or not bool((cut[4] | ~rows.to(logits.device)).all()):  # CPU tensors, read on the host
        return truncate(logits, top_k, top_p), None
    values, ids, threshold, _, _ = cut
    return torch.where(values < threshold, float("-inf"), values), ids


def _settings(logits: torch.Tensor, top_k: torch.Tensor | None,
              top_p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, p)`` (N,) on the logits' device, k = V where top-k is off and p = 1 where top-p is."""
    vocab = logits.shape[-1]
    k = torch.full(logits.shape[:1], vocab, device=logits.device) if top_k is None else top_k.to(logits.device).long()
    k = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))
    p = torch.ones(logits.shape[:1], device=logits.device) if top_p is None else top_p.to(logits.device).float()
    return k, p


def _sorted(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM's rule over a full ascending sort of each row (``k`` = V and ``p`` = 1 where off)."""
    ordered, order = logits.sort(dim=-1, descending=False)  # (N, V) ascending
    vocab = ordered.shape[-1]
    kth = ordered.gather(-1, (vocab - k)[:, None])  # (N, 1)
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - p[:, None]
    drop[:, -1] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    return logits.scatter(-1, order, ordered)


def _cut(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, candidates: int) -> tuple | None:
    """``(values, ids (N, C) descending, threshold (N, 1), covered (N,), inside (N,))``: each row keeps
    its logits >= threshold (-inf where nothing is cut); ``covered`` False where the cut may lie past
    the row's C largest logits, ``inside`` where the row is cut and keeps only candidates. None on an
    accelerator (where reading ``covered`` would wait for the device) or where C would be the vocabulary."""
    vocab = logits.shape[-1]
    if logits.device.type != "cpu":
        return None
    # on the CPU the host reads settings for free: a row whose top-k is on needs its k + 1 largest
    # logits only (the one more shows a tie with the k-th)
    candidates = int(torch.where(k < vocab, k + 1, candidates).max())
    if candidates >= vocab:
        return None
    values, ids = logits.topk(candidates, dim=-1)  # (N, C) descending
    k_on, p_on = k < vocab, p < 1
    kth = values.gather(-1, (k.clamp(max=candidates) - 1)[:, None])  # (N, 1), the k-th largest where k <= C
    # every token top-k keeps is a candidate: k within them and no logit past them tying the k-th
    k_inside = k_on & (k <= candidates) & (values[:, -1] < kth[:, 0])
    kept = values.masked_fill(k_on[:, None] & (values < kth), float("-inf"))
    # the distribution top-p reads: top-k's survivors (all candidates), or the whole row
    log_total = kept.logsumexp(dim=-1)
    if not bool(k_on.all()):  # a CPU tensor, read on the host
        log_total = torch.where(k_on, log_total, logits.logsumexp(dim=-1))
    probs = (kept - log_total[:, None]).exp()  # (N, C)
    # vLLM's ascending cumulative mass at each candidate is 1 minus the mass of those above it
    below = 1 - (probs.cumsum(dim=-1) - probs)
    keep = (below > 1 - p[:, None]) & torch.isfinite(kept)
    keep[:, 0] = True
    cut_p = values.gather(-1, (keep.sum(dim=-1, keepdim=True) - 1))  # keep is a prefix of the candidates
    threshold = torch.where(p_on[:, None], cut_p, torch.where(k_on[:, None], kth, torch.full_like(kth, float("-inf"))))
    inside = k_inside | (~k_on & p_on & ~keep[:, -1])
    return values, ids, threshold, inside | (~k_on & ~p_on), inside
