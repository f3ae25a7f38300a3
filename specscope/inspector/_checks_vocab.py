"""The vocabulary maps (docs/design.md, "EAGLE-3 conventions"): ``d2t`` int64 [draft_vocab] holds
offsets, target id = i + d2t[i], strictly increasing and in range; ``t2d`` bool [target_vocab] marks
the same ids.

SGLang ``llama_eagle3.py`` builds ``hot_token_id = d2t + arange``; vLLM ``compute_logits`` scatters
logits to ``arange + draft_id_to_target_id``. Both add the index, so absolute ids are shifted.
"""

from __future__ import annotations

import numpy as np

from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext
from specscope.inspector._vocab_evidence import broken_map

_OFFSETS_FIX = ("Store offsets exactly once: d2t = target_ids - arange(draft_vocab_size). Rebuild d2t "
                "from the token frequency list (or from nonzero(t2d)) rather than converting it again.")
_T2D_FIX = "Derive t2d from d2t (t2d[arange + d2t] = True over a target-vocabulary-sized zero tensor)."
_D2T_FIX = ("Rebuild d2t from t2d, which marks the draft's tokens: d2t = nonzero(t2d) - "
            "arange(draft_vocab_size); then serve the rebuilt draft.")


def _problems(ids: np.ndarray, vocab: int | None) -> tuple[int, int]:
    """(out-of-range ids, non-increasing steps) of a candidate target-id sequence."""
    out = int((ids < 0).sum()) + (int((ids >= vocab).sum()) if vocab is not None else 0)
    steps = int((ids[1:] <= ids[:-1]).sum()) if ids.size > 1 else 0
    return out, steps


def _subtractions(d2t: np.ndarray, t2d_ids: np.ndarray | None, vocab: int | None) -> int | None:
    """How many times ``arange`` was subtracted from the true ids: 1 is right; 0 (absolute ids) or 2
    (converted twice) are the known mistakes; ``None`` when no reading explains the values."""
    ar = np.arange(d2t.size, dtype=np.int64)
    candidates = {k: d2t + (k * ar if k else 0) for k in (1, 0, 2)}
    if t2d_ids is not None:
        for k, ids in candidates.items():
            if ids.shape == t2d_ids.shape and np.array_equal(ids, t2d_ids):
                return k
    for k, ids in candidates.items():
        if _problems(ids, vocab) == (0, 0):
            return k
    return None


def _t2d_ids(ctx: CheckContext) -> np.ndarray | None:
    return np.flatnonzero(ctx.value("t2d").astype(bool)) if ctx.has("t2d") else None


def check_d2t(ctx: CheckContext) -> list[Finding]:
    """D2T_NOT_OFFSETS, D2T_INVALID, D2T_IDENTITY_WITH_PRUNED_VOCAB and the d2t length against the
    draft vocabulary (DRAFT_VOCAB_MISMATCH)."""
    if not ctx.has("d2t"):
        return []
    d2t, vocab, out = ctx.d2t(), ctx.target_vocab_size, []
    if not np.issubdtype(d2t.dtype, np.integer) or d2t.ndim != 1:
        return [checkpoint_finding("D2T_INVALID", f"d2t is {d2t.dtype} of shape {list(d2t.shape)}, not int64 [draft_vocab]",
                        {"d2t_is_integer": 0, "d2t_dims": d2t.ndim}, _OFFSETS_FIX)]
    d2t = d2t.astype(np.int64)
    if ctx.draft_vocab_size is not None and d2t.size != ctx.draft_vocab_size:
        out.append(checkpoint_finding("DRAFT_VOCAB_MISMATCH",
                           f"d2t has {d2t.size} entries, draft_vocab_size is {ctx.draft_vocab_size}",
                           {"d2t_length": d2t.size, "draft_vocab_size": ctx.draft_vocab_size},
                           "Export d2t, lm_head and draft_vocab_size from the same vocabulary pruning run."))
    ids = d2t + np.arange(d2t.size, dtype=np.int64)
    out_of_range, non_increasing = _problems(ids, vocab)
    k = _subtractions(d2t, _t2d_ids(ctx), vocab)
    evidence = {"out_of_range_ids": out_of_range, "non_increasing_ids": non_increasing,
                "min_target_id": int(ids.min()) if ids.size else None,
                "max_target_id": int(ids.max()) if ids.size else None,
                "target_vocab_size": vocab}
    if k in (0, 2):
        what = "absolute target ids" if k == 0 else "offsets converted twice"
        out.append(checkpoint_finding(
            "D2T_NOT_OFFSETS",
            f"d2t holds {what}: the engine adds the index again and maps draft ids to target ids up to "
            f"{int(ids.max())} ({out_of_range} outside the vocabulary of {vocab})",
            {**evidence, "offset_subtractions_observed": k, "offset_subtractions_expected": 1}, _OFFSETS_FIX))
    elif out_of_range or non_increasing:
        out.append(checkpoint_finding(
            "D2T_INVALID",
            f"d2t + index gives {out_of_range} target ids outside [0, {vocab}) and "
            f"{non_increasing} non-increasing steps",
            evidence, _OFFSETS_FIX))
    elif ctx.config.pruned_vocab and d2t.size and not bool(d2t.any()):
        out.append(checkpoint_finding(
            "D2T_IDENTITY_WITH_PRUNED_VOCAB",
            f"d2t is all zeros (identity) while the draft vocabulary is pruned to "
            f"{ctx.config.draft_vocab_size} of {ctx.config.vocab_size}: draft id i becomes target id i",
            {"nonzero_offsets": 0, "draft_vocab_size": ctx.config.draft_vocab_size,
             "vocab_size": ctx.config.vocab_size},
            "Rebuild d2t from the draft's token frequency list; an identity map is right only when "
            "draft_vocab_size equals vocab_size."))
    return out


def _loaded_note(ctx: CheckContext) -> str:
    return f" (as {ctx.engine} loaded it)" if ctx.loaded_d2t is not None else ""


def check_t2d(ctx: CheckContext, d2t_findings: list[Finding]) -> list[Finding]:
    """VOCAB_MAP_MISMATCH: ``t2d`` length vs the target vocabulary, ``t2d.sum()`` vs the draft
    vocabulary, ``nonzero(t2d)`` vs ``arange + d2t``, and which map is the broken one
    (:func:`~specscope.inspector._vocab_evidence.broken_map`): an error when the target's head rows
    show it is ``d2t``, the map engines serve. Skipped when d2t itself is wrong (one cause, one
    finding; a d2t of the wrong length has its own)."""
    t2d_ids = _t2d_ids(ctx)
    if t2d_ids is None or any(f.code in ("D2T_NOT_OFFSETS", "D2T_INVALID", "DRAFT_VOCAB_MISMATCH")
                              for f in d2t_findings):
        return []
    evidence, problems = {}, []
    length, vocab = ctx.shape("t2d")[0], ctx.target_vocab_size
    if vocab is not None and length != vocab:
        evidence.update(t2d_length=length, target_vocab_size=vocab)
        problems.append(f"t2d covers {length} target ids, the target vocabulary has {vocab}")
    draft = ctx.d2t().size if ctx.has("d2t") else ctx.draft_vocab_size
    ids = None
    if draft is not None and t2d_ids.size != draft:
        evidence.update(t2d_count=t2d_ids.size, draft_vocab_size=draft)
        problems.append(f"t2d marks {t2d_ids.size} ids, the draft vocabulary has {draft}")
    elif ctx.has("d2t"):
        ids = ctx.d2t().astype(np.int64) + np.arange(draft, dtype=np.int64)
        mismatched = int((ids != t2d_ids).sum())
        if mismatched:
            evidence.update(mismatched_ids=mismatched, draft_vocab_size=draft)
            problems.append(f"{mismatched} of {draft} ids of nonzero(t2d) differ from arange + d2t{_loaded_note(ctx)}")
    if not problems:
        return []
    verdict = broken_map(ctx, ids, t2d_ids, t2d_malformed="t2d_length" in evidence or "t2d_count" in evidence)
    evidence.update(verdict.evidence, broken_map=verdict.broken, certainty=verdict.certainty,
                    d2t_read_from="loaded" if ctx.loaded_d2t is not None else "checkpoint")
    said = "; ".join(problems)
    if verdict.broken == "t2d":
        return [checkpoint_finding(
            "VOCAB_MAP_MISMATCH",
            f"{said}; t2d is the broken map ({verdict.reason}). Serving is unaffected: vLLM 0.32 and "
            f"SGLang never read t2d (their loaders skip it); tools that rebuild d2t from t2d would spread "
            f"the error", evidence, _T2D_FIX)]
    if verdict.broken == "d2t":
        return [checkpoint_finding(
            "VOCAB_MAP_MISMATCH",
            f"{said}; d2t is the broken map ({verdict.reason}): {ctx.engine} serves d2t{_loaded_note(ctx)}, "
            f"so the draft tokens at those ids are proposed as other target tokens and acceptance falls "
            f"(to AL 1.0 when all differ)",
            evidence, _D2T_FIX, severity="error" if verdict.certainty == "measured" else None)]
    return [checkpoint_finding(
        "VOCAB_MAP_MISMATCH",
        f"{said}; which map is broken is undecided ({verdict.reason}). {ctx.engine} serves d2t: if d2t is "
        f"the broken one, the draft tokens at those ids are proposed as other target tokens and acceptance "
        f"falls (a served run's acceptance settles it)", evidence,
        f"If a run of this draft collapsed, d2t is the broken map: {_D2T_FIX} Otherwise: {_T2D_FIX}")]


def check_vocab_maps(ctx: CheckContext) -> list[Finding]:
    """All vocabulary-map findings, d2t first."""
    d2t_findings = check_d2t(ctx)
    return d2t_findings + check_t2d(ctx, d2t_findings)
