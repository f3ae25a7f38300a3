"""The tensors a draft shares with its target (``embed_tokens``, ``lm_head``), compared with the target's
weights when ``--target`` is a model folder holding safetensors.

Which side the engine serves each from is :func:`specscope.conventions.served_from`. Findings:
SHARED_TENSOR_REPLACED (the draft ships its own, different tensor and the engine serves the target's)
and DRAFT_HEAD_IS_TARGET_HEAD (the draft's head rows are bit-identical to the target's rows for the
same tokens: overwritten by the target's head, or never trained; vLLM PR 38493, SGLang PR 30456).
Values are compared in row slices (one chunk of each side at a time) after a cast to float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from specscope.checkpoint_reader import CheckpointReader
from specscope.conventions import SHARED_TENSORS, served_from
from specscope.events import Finding
from specscope.findings import checkpoint_finding
from specscope.inspector._context import CheckContext

_DRAFT_KEYS = {"embed_tokens": ("embed_tokens.weight", "model.embed_tokens.weight"),
               "lm_head": ("lm_head.weight",)}


def _first(keys, names) -> str | None:
    return next((k for k in names if k in keys), None)


def target_tensor(reader: CheckpointReader, tensor: str, tied: bool) -> str | None:
    """The target key holding ``tensor`` (``embed_tokens`` / ``lm_head``): ``model.embed_tokens.weight``
    (or any ``*embed_tokens.weight``) and ``lm_head.weight``, the embedding standing in for a tied head."""
    embed = _first(reader.tensors, ("model.embed_tokens.weight", "embed_tokens.weight")) or next(
        (k for k in sorted(reader.tensors) if k.endswith("embed_tokens.weight")), None)
    if tensor == "embed_tokens":
        return embed
    return "lm_head.weight" if "lm_head.weight" in reader.tensors else (embed if tied else None)


def target_rows(target: CheckpointReader, key: str, ids: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(where, rows)`` per row chunk of target tensor ``key``: ``rows[j]`` (float32) is its row
    ``ids[where[j]]``. One chunk is held at a time; ids outside the tensor never come."""
    start = 0
    for chunk in target.chunks(key):  # (rows, hidden), rows [start, start + len)
        stop = start + chunk.shape[0]
        where = np.flatnonzero((ids >= start) & (ids < stop))
        if where.size:
            yield where, chunk[ids[where] - start].astype(np.float32)
        start = stop


def _identical_rows(draft: CheckpointReader, dkey: str, target: CheckpointReader, tkey: str,
                    ids: np.ndarray) -> int:
    """How many rows ``i`` of draft ``dkey`` equal row ``ids[i]`` (int64 [draft_rows]) of target
    ``tkey`` exactly."""
    head = draft.get(dkey).astype(np.float32)  # (draft_rows, hidden)
    return sum(int((rows == head[where]).all(axis=1).sum()) for where, rows in target_rows(target, tkey, ids))


def _mapped_ids(ctx: CheckContext, rows: int) -> np.ndarray:
    """Target ids of the draft head's rows: ``arange + d2t`` for a pruned head, else ``arange``."""
    ar = np.arange(rows, dtype=np.int64)
    d2t = ctx.d2t() if ctx.shape("d2t") == (rows,) else None
    if d2t is not None and d2t.shape == (rows,) and np.issubdtype(d2t.dtype, np.integer):
        return ar + d2t.astype(np.int64)
    return ar


def shared_rows(ctx: CheckContext) -> list[dict[str, Any]]:
    """For ``embed_tokens`` and ``lm_head``: ``{"tensor", "draft_key", "target_key", "identical_rows",
    "rows", "served_from", "rule", "source"}``; ``target_key`` is ``None`` without target weights, and
    ``identical_rows`` / ``rows`` are ``None`` when the tensors were not compared (no target weights, a
    side missing, or widths differ); ``served_from`` is ``"unknown"`` where it depends on that
    comparison."""
    out = []
    for tensor in ("embed_tokens", "lm_head"):
        dkey = _first(ctx.reader.tensors, _DRAFT_KEYS[tensor])
        tkey = None if ctx.target_weights is None else target_tensor(
            ctx.target_weights, tensor, bool(ctx.target and ctx.target.tie_word_embeddings))
        same = rows = None
        dshape = ctx.shape(dkey) if dkey else None
        tshape = ctx.target_weights.tensors[tkey].shape if tkey else None
        if dshape and tshape and len(dshape) == 2 and len(tshape) == 2 and dshape[1] == tshape[1]:
            ids = _mapped_ids(ctx, dshape[0])
            if int(ids.max()) < tshape[0] and int(ids.min()) >= 0:
                rows = dshape[0]
                same = _identical_rows(ctx.reader, dkey, ctx.target_weights, tkey, ids)
        fact = SHARED_TENSORS[ctx.engine][tensor]
        src = served_from(ctx.engine, tensor, draft_has=dkey is not None,
                          identical=None if same is None else same == rows,
                          draft_vocab_size_set=ctx.config.draft_vocab_size is not None)
        out.append({"tensor": tensor, "draft_key": dkey, "target_key": tkey, "identical_rows": same,
                    "rows": rows, "served_from": src, "rule": fact.read_from, "source": fact.source})
    return out


def check_shared(ctx: CheckContext) -> list[Finding]:
    """SHARED_TENSOR_REPLACED and DRAFT_HEAD_IS_TARGET_HEAD from :func:`shared_rows`."""
    out = []
    for row in ctx.shared:
        t, same, rows = row["tensor"], row["identical_rows"], row["rows"]
        if row["draft_key"] and row["served_from"] == "target" and same is not None and same < rows:
            out.append(checkpoint_finding(
                "SHARED_TENSOR_REPLACED",
                f"the draft ships its own {row['draft_key']} ({rows - same} of {rows} rows differ from the "
                f"target's) but {ctx.engine} serves the target's {t} ({row['source']})",
                {"tensor": t, "differing_rows": rows - same, "rows": rows},
                f"If the draft was trained with its own {t}, serve it with an engine that keeps it; "
                f"otherwise drop {row['draft_key']} from the checkpoint so the report matches what runs."))
        if t == "lm_head" and same is not None and rows and same == rows:
            out.append(checkpoint_finding(
                "DRAFT_HEAD_IS_TARGET_HEAD",
                f"every one of the draft's {rows} lm_head rows is bit-identical to the target's "
                f"{row['target_key']} row for the same token: the draft head was overwritten by the "
                f"target's or never trained",
                {"identical_rows": same, "rows": rows},
                "Re-export the trained draft head (a prefix filter or a tie may have replaced it with the "
                "target's); a draft head should differ from the target's after training."))
    return out
