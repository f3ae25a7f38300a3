"""Hugging Face transformers assisted generation, observed through its candidate-generator interface.

transformers drafts with a ``CandidateGenerator`` (``transformers/generation/candidate_generator.py``):
prompt lookup (``prompt_lookup_num_tokens``), an assistant model (``assistant_model``) or the target's
own early layers (``assistant_early_exit``). Each verify step of ``GenerationMixin._assisted_decoding``
(``transformers/generation/utils.py``) ends with ``candidate_generator.update_candidate_strategy(
input_ids, scores, num_matches)``, where ``scores`` is ``(1, drafts + 1, vocab)`` and ``num_matches``
a Python int (the accepted prefix, after any length / EOS crop). specscope records that step: proposed
= ``scores.shape[1] - 1`` (shape only, no device sync), accepted = ``num_matches``; acceptance is a
chain prefix. Steps that proposed nothing (prompt lookup found no match) are plain decode steps and
are not verify steps (vLLM's ``SpecDecodingStats`` counts only steps with drafts, likewise).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from specscope.instrumentation import Tracer, instrument

logger = logging.getLogger("specscope")


class AssistedGeneration:
    """Report ``model.generate(...)`` calls with assisted generation to ``tracer``, one request each.

    ``assistant_model``: the draft model passed to ``generate(assistant_model=...)``, if any; its
    forward is hooked (``draft.forward:input_ids`` ``(1, T)``, ``draft.forward:output.logits``
    ``(1, T, vocab)``, ...), so its shapes are recorded. ``generate`` is for one sequence at a time
    (transformers' assisted decoding supports batch size 1 only) and one thread: while it runs, the
    candidate generators' ``update_candidate_strategy`` report to this tracer.
    """

    def __init__(self, tracer: Tracer, *, assistant_model: nn.Module | None = None) -> None:
        self.tracer = tracer
        self._request: str | None = None
        self._failed = False
        if assistant_model is not None:
            instrument(tracer, draft=assistant_model)

    def generate(self, model: Any, request_id: str, **kwargs: Any) -> torch.Tensor:
        """``model.generate(**kwargs)`` observed as request ``request_id``; returns its output ids
        ``(1, prompt + new)``. Raises whatever ``generate`` raises (nothing from specscope)."""
        prompt = kwargs.get("input_ids")
        prompt_tokens = int(prompt.shape[-1]) if prompt is not None else 0
        self.tracer.start_request(request_id, prompt_tokens=prompt_tokens)
        self._request = request_id
        try:
            with _reporting(self):
                output = model.generate(**kwargs)
        finally:
            self._request = None
        ids = output if isinstance(output, torch.Tensor) else output.sequences
        self.tracer.finish_request(request_id, output_tokens=int(ids.shape[-1]) - prompt_tokens)
        return output

    def _step(self, scores: torch.Tensor, num_matches: int) -> None:
        proposed = int(scores.shape[1]) - 1
        if self._request is not None and proposed > 0:
            self.tracer.record_verify(self._request, proposed=proposed, accepted=int(num_matches))


def _generator_classes() -> list[type]:
    from transformers.generation.candidate_generator import CandidateGenerator

    found, todo = [], [CandidateGenerator]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if "update_candidate_strategy" in cls.__dict__]


@contextmanager
def _reporting(observer: AssistedGeneration) -> Iterator[None]:
    """Wrap every candidate generator's own ``update_candidate_strategy`` for the ``with`` block."""
    originals = {cls: cls.__dict__["update_candidate_strategy"] for cls in _generator_classes()}
    depth = 0  # a subclass calling super() runs two wrappers: the outermost one reports

    def wrap(original):
        @functools.wraps(original)
        def update_candidate_strategy(self, input_ids, scores, num_matches):
            nonlocal depth
            depth += 1
            try:
                result = original(self, input_ids, scores, num_matches)
            finally:
                depth -= 1
            if depth == 0:
                try:
                    observer._step(scores, num_matches)
                except Exception as exc:  # noqa: BLE001 - observing must not break generation
                    if not observer._failed:
                        observer._failed = True
                        logger.warning("specscope: recording an assisted-generation step failed "
                                       "(%s: %s); generation goes on", type(exc).__name__, exc)
            return result
        return update_candidate_strategy

    try:
        for cls, original in originals.items():
            cls.update_candidate_strategy = wrap(original)
        yield
    finally:
        for cls, original in originals.items():
            cls.update_candidate_strategy = original
