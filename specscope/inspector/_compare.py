"""``inspect NEW --compare OLD``: what changed between two drafts of the same target (a warm start, a
conversion): tensors added / removed / reshaped, config contract settings, vocabulary maps, and whether
the ``lm_head`` rows still stand for the tokens the new maps give them.

Findings: CONTRACT_CHANGED (a contract setting differs: a converter dropped or rewrote it) and
HEAD_ROWS_STALE (``d2t`` regenerated while ``lm_head`` rows were copied unpermuted, so row i still
holds the weights of the token it meant before; SpecForge PR 534).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specscope.checkpoint_reader import CheckpointReader
from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._config import DraftConfig, draft_config
from specscope.inspector._context import CheckContext

_CONFIG_FIELDS = ("vocab_size", "draft_vocab_size", "target_hidden_size", "hidden_size", "aux_layer_ids",
                  "tie_word_embeddings")
_SETTING_FIELDS = ("rope_theta", "rope_scaling", "max_position_embeddings", "sliding_window", "layer_types",
                   "head_dim")


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _config_changes(new: DraftConfig, old: DraftConfig) -> dict[str, dict[str, Any]]:
    out = {}
    for name in _CONFIG_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            out[name] = {"old": _jsonable(a), "new": _jsonable(b)}
    for name in _SETTING_FIELDS:
        a, b = getattr(old.settings, name), getattr(new.settings, name)
        if a != b:
            out[name] = {"old": _jsonable(a), "new": _jsonable(b)}
    behaviour_old, behaviour_new = dict(old.behaviour), dict(new.behaviour)
    for key in sorted(set(behaviour_old) | set(behaviour_new)):
        if behaviour_old.get(key) != behaviour_new.get(key):
            out[key] = {"old": behaviour_old.get(key), "new": behaviour_new.get(key)}
    return out


def _target_ids(reader: CheckpointReader) -> np.ndarray | None:
    """Target ids of the draft vocabulary (``arange + d2t``), ``None`` without an integer 1-D ``d2t``."""
    if "d2t" not in reader.tensors or len(reader.tensors["d2t"].shape) != 1:
        return None
    d2t = reader.get("d2t")
    if not np.issubdtype(d2t.dtype, np.integer):
        return None
    return np.arange(d2t.size, dtype=np.int64) + d2t.astype(np.int64)


def _head_rows(ctx: CheckContext, old: CheckpointReader, new_ids: np.ndarray,
               old_ids: np.ndarray) -> dict[str, int] | None:
    """Of the rows whose target id changed: how many new head rows equal the old row at the same index
    (``stale``) or the old row of the same token (``moved``)."""
    key = "lm_head.weight"
    if not (ctx.has(key) and key in old.tensors) or ctx.shape(key)[1:] != old.tensors[key].shape[1:]:
        return None
    if ctx.shape(key)[0] != new_ids.size or old.tensors[key].shape[0] != old_ids.size:
        return None
    new_head, old_head = ctx.reader.get(key).astype(np.float32), old.get(key).astype(np.float32)
    n = min(new_ids.size, old_ids.size)
    changed = np.flatnonzero(new_ids[:n] != old_ids[:n])
    stale = int((new_head[changed] == old_head[changed]).all(axis=1).sum())
    old_row = {t: i for i, t in enumerate(old_ids.tolist())}
    moved = sum(1 for i in changed.tolist() if int(new_ids[i]) in old_row
                and bool((new_head[i] == old_head[old_row[int(new_ids[i])]]).all()))
    return {"remapped_rows": int(changed.size), "stale_rows": stale, "moved_rows": moved}


def compare(ctx: CheckContext, old_path: str) -> tuple[dict[str, Any], list[Finding]]:
    """``(report, findings)`` of NEW (``ctx``) against the draft at ``old_path``. ``report``:
    ``{"old", "tensors": {"added", "removed", "reshaped", "dtype_changed"}, "config": {name: {"old",
    "new"}}, "vocab": {...}, "lm_head": {...} | None}``. Raises
    :class:`~specscope.errors.CheckpointError` for an unreadable OLD checkpoint."""
    old = CheckpointReader(old_path)
    new_t, old_t = ctx.reader.tensors, old.tensors
    reshaped = [{"key": k, "old": list(old_t[k].shape), "new": list(new_t[k].shape)}
                for k in sorted(set(new_t) & set(old_t)) if new_t[k].shape != old_t[k].shape]
    tensors = {"added": sorted(set(new_t) - set(old_t)), "removed": sorted(set(old_t) - set(new_t)),
               "reshaped": reshaped,
               "dtype_changed": [{"key": k, "old": old_t[k].dtype, "new": new_t[k].dtype}
                                 for k in sorted(set(new_t) & set(old_t)) if new_t[k].dtype != old_t[k].dtype]}
    changes = _config_changes(ctx.config, draft_config(old.config))
    new_ids, old_ids = _target_ids(ctx.reader), _target_ids(old)
    vocab: dict[str, Any] = {}
    head = None
    if new_ids is not None and old_ids is not None:
        a, b = set(old_ids.tolist()), set(new_ids.tolist())
        vocab = {"old_draft_vocab": len(old_ids), "new_draft_vocab": len(new_ids), "common_ids": len(a & b),
                 "added_ids": len(b - a), "removed_ids": len(a - b)}
        head = _head_rows(ctx, old, new_ids, old_ids)
    report = {"old": str(old_path), "tensors": tensors, "config": changes, "vocab": vocab, "lm_head": head}
    findings = []
    if changes:
        findings.append(checkpoint_finding(
            "CONTRACT_CHANGED",
            f"{len(changes)} config setting(s) differ from {old_path}: " + ", ".join(
                f"{k} {v['old']} -> {v['new']}" for k, v in changes.items()),
            {"changed": sorted(changes), **{f"old_{k}": v["old"] for k, v in changes.items()},
             **{f"new_{k}": v["new"] for k, v in changes.items()}},
            "Confirm each change is intended; a conversion or warm start should carry RoPE, positions, "
            "window and aux settings over unchanged (restore the old values where it did not)."))
    if head and head["stale_rows"]:
        findings.append(checkpoint_finding(
            "HEAD_ROWS_STALE",
            f"{head['stale_rows']} of {head['remapped_rows']} lm_head rows whose token changed (new d2t) "
            f"still hold the old row for that index: they score the wrong token",
            head,
            "When d2t is regenerated, permute lm_head rows with it (new row i = old row of token "
            "i + d2t[i], fresh init for new tokens), or keep the old d2t for a warm start."))
    return report, findings
