"""The losslessness audit (docs/design.md, "Losslessness audit"): is each emitted token one the target
itself would emit?

On an audited verify step the engine hands over, for every emitted-token slot, the target's logits at
that position (what its verifier reads, before temperature), the token it emitted there (-1 for a slot
left empty) and the request's sampling settings. :func:`token_stats` judges every slot on the device
in one batch; the few numbers per slot are copied to the host asynchronously and summed per request
later (:class:`Auditor`), so the engine thread never waits on the device:

- greedy slots (temperature 0): a mismatch when the emitted token's logit is below the row's maximum
  (the target would have emitted another token; ties are no mismatch);
- sampled slots: the emitted token's probability under the target's processed distribution
  (temperature, then top-k / top-p), whether it is below ``epsilon`` ("rare"), the target's total mass
  below ``epsilon`` (how often a lossless engine emits a rare token there), the row's sum of squared
  probabilities and the variance of the probability of a token drawn from it (sum p^3 - (sum p^2)^2),
  the token's randomized probability integral transform (PIT): uniform on [0, 1) for a token
  drawn from the target, whatever the distribution, so its histogram tests any shift; and the token's
  surprise ``-log p`` (capped at ``-log epsilon``) with its expectation, the row's entropy (of the
  capped surprise), and variance: the score of a temperature-type shift (p^a renormalised, a != 1),
  the test most powerful against a verifier that sharpens or flattens the target's distribution;
- recovered slots (sampled): a step that ends at a draft position ended on a rejection, and the token
  emitted there, the recovered token, can never be the rejected draft token under any correct chain
  verifier (rejection sampling draws it from max(p - q, 0), zero at the draft token whenever it can be
  rejected; sample-and-match verifiers stop only on a token that differs from the draft). The count of
  recovered tokens equal to their draft token is 0 for a lossless engine, with no false alarm to bound;
  ``p(draft token)`` summed over recovered slots is how many a verifier drawing recovered tokens from
  p itself would have emitted there on average (the test's power).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specscope.errors import ConfigError, InvalidEvent
from specscope.events import PIT_BINS, LosslessAudit
from specscope.instrumentation._truncate import truncated_support

DEFAULT_AUDIT_EVERY = 4
"""Audit every n-th verify step (or verify batch) by default: 0 turns the audit off."""
DEFAULT_EPSILON = 1e-4
"""Target probability under which an emitted token counts as rare."""

# Columns of token_stats' result.
(_VALID, _GREEDY, _MISMATCH, _P, _RARE, _RARE_MASS, _P2, _EMITTED, _TARGET, _VARIANCE, _PIT, _SURPRISE, _ENTROPY,
 _SURPRISE_VAR, _DRAFTED, _P_DRAFTED) = range(16)


def token_stats(logits: torch.Tensor, emitted: torch.Tensor, temperature: torch.Tensor,
                top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                epsilon: float = DEFAULT_EPSILON, uniform: torch.Tensor | None = None,
                drafted: torch.Tensor | None = None, all_greedy: bool = False,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """Judge each emitted-token slot against the target (float32 (N, 16), on the logits' device).

    Args:
        logits: (N, V) the target's logits at each slot's position, before temperature (or with
            ``rows``, (R, V) and the slots' rows named there).
        emitted: (N,) the token the engine emitted there, -1 (or any negative id) for an empty slot.
        temperature: (N,) the request's temperature, 0 for greedy.
        top_k, top_p: (N,) per-slot truncation, or None (see :func:`truncate`).
        epsilon: the target probability under which a token counts as rare.
        uniform: (N,) draws on [0, 1) that randomize the PIT within the emitted token's atom (the
            tokens as probable as it); None puts it mid-atom (not exactly uniform: for tests only).
        drafted: (N,) the draft token verified at each slot, negative where none was (the bonus
            slot); None: no draft known (a replay). Read by :class:`Auditor` at each step's last slot.
        all_greedy: the caller knows on the host that every temperature is 0 (vLLM's
            ``SamplingMetadata.all_greedy``): the result is the same (column 8 aside, below),
            without the distributions' passes over the vocabulary that only sampled slots read (a
            greedy slot needs its row's maximum alone).
        rows: (N,) the row of ``logits`` each slot reads (``logits`` is then (R, V), any R), or None:
            slot i reads row i. A greedy batch reads its rows in place, sampled slots a copy of them.

    Column 8 holds the target's token (the argmax, first of a tie). In a greedy batch it is read only
    for a mismatch's example: on the host it is computed only when a slot mismatched, as an argmax
    pass costs more than the rest of a greedy audit there, and reading the mismatches on the host
    waits on no device; where none did, the column holds the emitted token (a maximum too).

    The PIT orders the vocabulary by target probability, most probable first, tokens of equal
    probability forming one atom: ``u = mass of more probable tokens + uniform * mass of the atom``.
    No sort: two masked sums per row. A truncated distribution is read over its candidates only
    (:func:`truncated_support`), where every sampled row's cut lies among them.
    """
    emitted = emitted.to(logits.device).long()
    temperature = temperature.to(logits.device).float()
    valid = emitted >= 0
    greedy = temperature == 0
    drafted = torch.full_like(emitted, -1) if drafted is None else drafted.to(logits.device).long()
    where = torch.arange(emitted.shape[0], device=logits.device) if rows is None else rows.to(logits.device)
    if all_greedy:  # amax: a reduction without indices is a fraction of max's pass on the host
        top = logits.amax(dim=-1)[where]
    else:
        top, target = (values[where] for values in logits.max(dim=-1))  # the first of a tie, as argmax
    mismatch = greedy & valid & (logits[where, emitted.clamp(min=0)] < top)
    if all_greedy:
        on_host_all_match = logits.device.type == "cpu" and not bool(mismatch.any())
        target = emitted if on_host_all_match else logits.argmax(dim=-1)[where]
        zero = torch.zeros(emitted.shape, device=logits.device)
        return torch.stack([valid.float(), greedy.float(), mismatch.float(), zero, zero, zero, zero,
                            emitted.float(), target.float(), zero, zero, zero, zero, zero, drafted.float(), zero],
                           dim=-1)
    logits = (logits if rows is None else logits[where]).float()
    token = emitted.clamp(min=0)[:, None]  # (N, 1)
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    sampled = ~greedy & valid
    # (N, M): the vocabulary, or where every sampled row is truncated, its candidates (ids: their
    # vocabulary ids); a token outside them has probability 0
    kept, ids = truncated_support(scaled, top_k, top_p, sampled)
    log_probs = kept.log_softmax(dim=-1)
    probs = log_probs.exp()
    column, present = _column(token, ids)
    p = probs.gather(-1, column)[:, 0] * present
    draft_column, draft_present = _column(drafted.clamp(min=0)[:, None], ids)
    p_drafted = probs.gather(-1, draft_column)[:, 0] * (draft_present & (drafted >= 0))
    sampled = sampled.float()
    rare = (p < epsilon).float() * sampled
    rare_mass = torch.where(probs < epsilon, probs, 0).sum(dim=-1) * sampled
    squares = probs.square()
    p2 = squares.sum(dim=-1) * sampled
    variance = ((squares * probs).sum(dim=-1) - p2.square()).clamp(min=0) * sampled  # Var of a draw's probability
    above = torch.where(probs > p[:, None], probs, 0).sum(dim=-1)
    atom = torch.where(probs == p[:, None], probs, 0).sum(dim=-1)
    draw = torch.full_like(p, 0.5) if uniform is None else uniform.to(logits.device).float()
    pit = (above + draw * atom).clamp(0, 1 - 1e-7) * sampled
    surprise = log_probs.neg_().clamp_(max=-math.log(epsilon))  # (N, M), -inf log-probabilities capped
    weighted = probs * surprise
    entropy = weighted.sum(dim=-1)
    surprise_var = (weighted.mul_(surprise).sum(dim=-1) - entropy.square()).clamp(min=0) * sampled
    return torch.stack([valid.float(), greedy.float(), mismatch.float(), p * sampled, rare, rare_mass, p2,
                        emitted.float(), target.float(), variance, pit,
                        torch.where(present, surprise.gather(-1, column)[:, 0], -math.log(epsilon)) * sampled,
                        entropy * sampled, surprise_var, drafted.float(), p_drafted * sampled], dim=-1)


def _column(token: torch.Tensor, ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row's ``token`` (N, 1) sits in the distribution's columns, and (N,) whether it is
    there at all: its vocabulary id, or its place among the candidate ``ids`` of a truncated one."""
    if ids is None:
        return token, torch.ones(token.shape[0], dtype=torch.bool, device=token.device)
    match = ids == token
    return match.int().argmax(dim=-1, keepdim=True), match.any(dim=-1)


@dataclass(frozen=True)
class Slot:
    """Who an emitted-token slot belongs to: request, its sampling group, position in the step."""

    request_id: str
    sampling: str
    position: int


class Auditor:
    """Counts verify steps, says which are audited, and turns judged slots into
    :class:`~specscope.events.LosslessAudit` events, one per request and audited step.

    ``emit`` sends an event; ``every``: audit every n-th call of :meth:`due` (0: never);
    ``epsilon``: see :func:`token_stats`. The host copy of a batch is read once the device finished it
    (CUDA: an event queried without blocking; CPU: at once), at the next :meth:`submit` or at
    :meth:`drain` with ``wait=True`` (close). The PIT's draws come from generators of the auditor's
    own (one per device, seeded by ``seed``): the engine's random streams are never touched.
    """

    def __init__(self, emit: Callable[[LosslessAudit], None], run_id: str, rank: int,
                 every: int = DEFAULT_AUDIT_EVERY, epsilon: float = DEFAULT_EPSILON, seed: int | None = None) -> None:
        self.set_every(every)
        if not 0 < epsilon < 1:
            raise ConfigError(f"audit epsilon must be between 0 and 1, got {epsilon!r}")
        self._emit, self.run_id, self.rank = emit, run_id, rank
        self.epsilon = epsilon
        self._calls = 0
        self._seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._pending: list[tuple[torch.Tensor, object, Sequence[Slot]]] = []

    def set_every(self, every: int) -> None:
        """Audit every ``every``-th call of :meth:`due` from the next one on (0: never)."""
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ConfigError(f"audit_every must be an int >= 0 (0 turns the audit off), got {every!r}")
        self.every = every

    def due(self) -> bool:
        """Count one verify step (or batch); True when this one is to be audited."""
        if not self.every:
            return False
        self._calls += 1
        return self._calls % self.every == 0

    def submit(self, logits: torch.Tensor, emitted: torch.Tensor, temperature: torch.Tensor,
               slots: Sequence[Slot], top_k: torch.Tensor | None = None,
               top_p: torch.Tensor | None = None, drafted: torch.Tensor | None = None,
               all_greedy: bool = False, rows: torch.Tensor | None = None) -> None:
        """Judge one audited step's slots (arguments of :func:`token_stats`, ``slots`` naming each row,
        a request's slots in the order of their positions) on the device and queue the asynchronous
        copy of the result."""
        stats = token_stats(logits, emitted, temperature, top_k, top_p, self.epsilon,
                            torch.rand(len(slots), device=logits.device, generator=self._generator(logits.device)),
                            drafted, all_greedy, rows)
        ready = None
        if stats.is_cuda:
            # PyTorch's caching host allocator hands back a pinned block whose last copy completed:
            # no cudaHostAlloc per audited batch after the first few
            host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            host.copy_(stats, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host = stats
        self._pending.append((host, ready, tuple(slots)))
        self.drain()

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            if self._seed is None:
                generator.seed()
            else:
                generator.manual_seed(self._seed)
            self._generators[device] = generator
        return generator

    def drain(self, wait: bool = False) -> None:
        """Emit the audits whose copies are done (all of them, waiting, with ``wait``)."""
        while self._pending:
            host, ready, slots = self._pending[0]
            if ready is not None and not ready.query():
                if not wait:
                    return
                ready.synchronize()
            self._pending.pop(0)
            self._report(host.tolist(), slots)

    def _report(self, rows: list[list[float]], slots: Sequence[Slot]) -> None:
        per_request: dict[tuple[str, str], dict] = {}
        last: dict[tuple[str, str], tuple[list[float], Slot]] = {}  # each request's last emitted slot
        for row, slot in zip(rows, slots):
            if not row[_VALID]:
                continue
            total = per_request.setdefault((slot.request_id, slot.sampling), {
                "tokens": 0, "mismatches": 0, "rare": 0, "rare_expected": 0.0, "p_sum": 0.0, "p2_sum": 0.0,
                "p_var_sum": 0.0, "pit": [0] * PIT_BINS, "surprise_sum": 0.0, "entropy_sum": 0.0,
                "surprise_var_sum": 0.0, "entropy_max": 0.0, "recovered": 0, "recovered_as_draft": 0,
                "recovered_p_sum": 0.0, "example": None})
            last[slot.request_id, slot.sampling] = row, slot
            total["tokens"] += 1
            total["mismatches"] += int(row[_MISMATCH])
            total["rare"] += int(row[_RARE])
            total["rare_expected"] += row[_RARE_MASS]
            total["p_sum"] += row[_P]
            total["p2_sum"] += row[_P2]
            if not row[_GREEDY]:
                total["p_var_sum"] += row[_VARIANCE]
                total["pit"][min(PIT_BINS - 1, int(row[_PIT] * PIT_BINS))] += 1
                total["surprise_sum"] += row[_SURPRISE]
                total["entropy_sum"] += row[_ENTROPY]
                total["surprise_var_sum"] += row[_SURPRISE_VAR]
                total["entropy_max"] = max(total["entropy_max"], row[_ENTROPY])
            if total["example"] is None and (row[_MISMATCH] or row[_RARE]):
                total["example"] = {"position": slot.position, "emitted_token": int(row[_EMITTED]),
                                    "target_argmax": int(row[_TARGET]),
                                    "target_probability": None if row[_GREEDY] else row[_P]}
        for key, (row, slot) in last.items():
            if row[_DRAFTED] < 0 or row[_GREEDY]:  # a bonus slot, or greedy: the argmax check judges it
                continue
            total = per_request[key]  # the step ended on a rejection at this draft position
            total["recovered"] += 1
            total["recovered_p_sum"] += row[_P_DRAFTED]
            if row[_EMITTED] == row[_DRAFTED]:
                total["recovered_as_draft"] += 1
                if total["example"] is None:
                    total["example"] = {"position": slot.position, "emitted_token": int(row[_EMITTED]),
                                        "draft_token": int(row[_DRAFTED]), "target_argmax": int(row[_TARGET]),
                                        "target_probability": row[_P]}
        refused = None
        for (request_id, sampling), total in per_request.items():
            total["pit"] = tuple(total["pit"])
            try:
                audit = LosslessAudit(self.run_id, self.rank, request_id, sampling, epsilon=self.epsilon, **total)
            except InvalidEvent as exc:  # one request's non-finite logits: the batch's other audits still count
                refused = exc
                continue
            self._emit(audit)
        if refused is not None:
            raise refused
