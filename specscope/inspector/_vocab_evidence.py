"""Which vocabulary map is broken when ``d2t`` and ``t2d`` disagree, decided from evidence.

Engines serve ``d2t`` and never read ``t2d`` (docs/design.md, "EAGLE-3 conventions"), so the
verdict matters only when it names ``d2t``. The evidence, strongest first:

- form: ``t2d`` of the wrong length or marking the wrong number of ids cannot be a map of the draft
  vocabulary (an invalid ``d2t`` has findings of its own and never reaches here);
- head rows (``--target`` with the target's weights): a draft head is trained from the target's
  features and usually initialised from its head rows, so draft row i points the way of the target's
  row for its real token; a sign test over the rows where the maps differ says which map names it;
- pattern: a frequency-pruned vocabulary is an irregular id set, never an arithmetic run (identity,
  a contiguous block, a stride), which is what a default or a wrongly built map gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specscope.inspector._checks_shared import target_rows, target_tensor
from specscope.inspector._context import CheckContext

HEAD_EVIDENCE_P = 1e-3
"""Largest sign-test p-value that decides: the chance that a head aligned with neither map splits
its differing rows at least this unevenly (as rare as the losslessness audit's false alarms)."""
MIN_PATTERN_IDS = 16
"""Fewest ids in which an arithmetic run means a default or a formula, not chance."""


@dataclass(frozen=True)
class MapVerdict:
    """``broken``: ``"d2t"``, ``"t2d"`` or None (undecided); ``certainty``: ``"form"``, ``"measured"``
    (head rows), ``"pattern"`` or ``"undecided"``; ``reason``: one phrase saying why."""

    broken: str | None
    certainty: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def _arithmetic(ids: np.ndarray) -> bool:
    return ids.size >= MIN_PATTERN_IDS and bool((np.diff(ids) == ids[1] - ids[0]).all())


def _head_evidence(ctx: CheckContext, d2t_ids: np.ndarray, t2d_ids: np.ndarray) -> dict[str, Any] | None:
    """Sign test of the draft's lm_head rows against the target's head rows at the ids of each map:
    ``{"head_rows_compared", "head_rows_closer_to_d2t", "head_rows_closer_to_t2d", "head_p_value"}``,
    or None when there is nothing to compare (no target weights, no draft head, widths differ)."""
    weights, shape = ctx.target_weights, ctx.shape("lm_head.weight")
    key = None if weights is None else target_tensor(weights, "lm_head",
                                                     bool(ctx.target and ctx.target.tie_word_embeddings))
    if key is None or shape is None or shape != (d2t_ids.size, weights.tensors[key].shape[-1]):
        return None
    rows = weights.tensors[key].shape[0]
    differ = np.flatnonzero((d2t_ids != t2d_ids) & (d2t_ids < rows) & (t2d_ids < rows))
    if not differ.size:
        return None
    head = ctx.reader.get("lm_head.weight").astype(np.float32)[differ]  # (differing rows, hidden)
    head /= np.maximum(np.linalg.norm(head, axis=1, keepdims=True), 1e-12)
    ids = np.concatenate([d2t_ids[differ], t2d_ids[differ]])
    cos = np.zeros(ids.size, np.float32)  # d2t's rows first, then t2d's
    for where, found in target_rows(weights, key, ids):
        norms = np.maximum(np.linalg.norm(found, axis=1), 1e-12)
        cos[where] = (found * head[where % differ.size]).sum(axis=1) / norms
    from scipy.stats import binomtest  # only a comparison with target weights pays for scipy's import

    by_d2t, by_t2d = cos[:differ.size], cos[differ.size:]
    closer_d2t, closer_t2d = int((by_d2t > by_t2d).sum()), int((by_t2d > by_d2t).sum())
    p = binomtest(closer_d2t, closer_d2t + closer_t2d).pvalue if closer_d2t + closer_t2d else 1.0
    return {"head_rows_compared": int(differ.size), "head_rows_closer_to_d2t": closer_d2t,
            "head_rows_closer_to_t2d": closer_t2d, "head_p_value": float(p)}


def broken_map(ctx: CheckContext, d2t_ids: np.ndarray | None, t2d_ids: np.ndarray, *,
               t2d_malformed: bool) -> MapVerdict:
    """Which of two disagreeing maps is broken. ``d2t_ids``: ``arange + d2t`` (in range and
    increasing; None without a ``d2t`` to pair), ``t2d_ids``: ``nonzero(t2d)``; ``t2d_malformed``:
    its length or count is wrong."""
    if t2d_malformed or d2t_ids is None:
        return MapVerdict("t2d", "form", "its size cannot map the draft vocabulary")
    head = _head_evidence(ctx, d2t_ids, t2d_ids)
    if head is not None and head["head_p_value"] < HEAD_EVIDENCE_P:
        right, wrong = (("d2t", "t2d") if head["head_rows_closer_to_d2t"] > head["head_rows_closer_to_t2d"]
                        else ("t2d", "d2t"))
        return MapVerdict(wrong, "measured", (
            f"the draft's lm_head rows point the way of the target's rows at {right}'s ids in "
            f"{head[f'head_rows_closer_to_{right}']} of {head['head_rows_compared']} differing rows, at "
            f"{wrong}'s in {head[f'head_rows_closer_to_{wrong}']}"), head)
    patterned = {"d2t_ids_arithmetic": int(_arithmetic(d2t_ids)), "t2d_ids_arithmetic": int(_arithmetic(t2d_ids))}
    evidence = {**(head or {}), **patterned}
    if patterned["d2t_ids_arithmetic"] != patterned["t2d_ids_arithmetic"]:
        wrong = "d2t" if patterned["d2t_ids_arithmetic"] else "t2d"
        other = "t2d" if wrong == "d2t" else "d2t"
        return MapVerdict(wrong, "pattern", (
            f"{wrong}'s ids are an arithmetic run, a default rather than a pruned vocabulary; {other}'s "
            f"are irregular, as token frequencies give; likely, not measured: inspect with --target "
            f"<model folder> to compare the draft's head rows"), evidence)
    why = ("the draft's lm_head rows favour neither map" if head is not None else
           "inspect with --target <model folder> to compare the draft's lm_head rows with the target's")
    return MapVerdict(None, "undecided", f"both id sets look like pruned vocabularies; {why}", evidence)
