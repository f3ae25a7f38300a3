"""Test-only patches of vLLM 0.32's CPU build, applied in this process (vLLM served in-process by
``specscope.adapters.vllm_demo``): its sampled verify path corrected, and verifier shifts injected into it.

The correction (docs/engines.md, "vLLM's sampled verify on CPU"): the CPU stand-in for the rejection
sampler's ``expand_kernel`` fills an int64 copy of its output and drops it, so every per-token
temperature / top-p / top-k the verifier uses is an uninitialised buffer. :func:`expand_kernel` does
what the Triton kernel does; vLLM picks it up when its worker registers the CPU stand-ins.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import torch

SHIFTS: dict[str, str] = {
    "temperature-ignored": "the verify step accepts and emits as if greedy (the bonus token still sampled)",
    "temperature-twice": "the target's logits divided by the temperature twice before verifying",
    "top-p-ignored": "the verify step samples from the whole distribution, not the request's top-p nucleus",
    "recovered-from-p": "a rejected draft position's recovered token drawn from p, where p without the draft "
                        "token belongs (vLLM's drafts carry no probabilities: q is one-hot)",
}


PROMPT_COUNT = 12
# Per 6 prompts: one greedy, four T=0.8 and one T=0.8 top-p 0.9 request. The T=0.8 group's 8 x 128
# tokens are sized for the weakest shift (temperature twice: a mean emitted probability about 0.05
# high, measured), which 300 tokens could not tell from chance (by the mean test; the surprise test
# added since needs half the tokens in simulation, tests/test_lossless_audit.py: not re-measured here).
BATCH = {"temperatures": (0.0, 0.8, 0.8, 0.8, 0.8, 0.8), "top_ps": (1.0, 1.0, 1.0, 1.0, 1.0, 0.9)}
TOKENS = 128


def serve(db: str, folder: Path, shift: str | None = None, compiled: bool = False):
    """The batch of greedy and sampled requests served by the corrected vLLM (with ``shift`` injected
    into its verifier; ``compiled``: vLLM's default mode) into ``db``, audited at every verify step."""
    from specscope.adapters import vllm_demo
    from specscope.adapters.vllm import ENV_AUDIT_EVERY
    from specscope.engine import demo_prompts

    os.environ[ENV_AUDIT_EVERY] = "1"
    try:
        with corrected_sampler(), shifted(shift) if shift else nullcontext():
            return vllm_demo.run(db, prompts=demo_prompts(PROMPT_COUNT), max_new_tokens=TOKENS, compiled=compiled,
                                 workdir=folder / f"work-{shift or ('compiled' if compiled else 'eager')}", **BATCH)
    finally:
        del os.environ[ENV_AUDIT_EVERY]


def expand_kernel(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                  replace_from: float, replace_to: float, MAX_NUM_TOKENS: int | None = None) -> None:  # noqa: N803 - the kernel's name
    """``vllm.v1.sample.rejection_sampler.expand_kernel``: request i's value (``replace_from`` read as
    ``replace_to``) written over its tokens of ``output``, in ``output``'s own dtype."""
    ends = cu_num_tokens.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output.copy_(torch.repeat_interleave(values, counts))


@contextmanager
def corrected_sampler() -> Iterator[None]:
    """vLLM engines built inside verify sampled requests with their own temperature / top-p / top-k."""
    from vllm.utils import cpu_triton_utils

    with patch.object(cpu_triton_utils, "_expand_kernel_impl", expand_kernel):
        yield


@contextmanager
def shifted(name: str) -> Iterator[None]:
    """vLLM's verifier broken as ``SHIFTS[name]`` while inside (the rejection sampler's module
    functions, looked up at every verify step)."""
    from vllm.v1.sample import rejection_sampler as module

    attr, make = _SHIFTERS[name]
    with patch.object(module, attr, make(getattr(module, attr))):
        yield


def _as_greedy(rejection_sample: Callable) -> Callable:
    def broken(*args, **kwargs):
        args = list(args)
        args[7] = replace(args[7], all_greedy=True, all_random=False)  # sampling_metadata
        return rejection_sample(*args, **kwargs)
    return broken


def _constraints(edit: Callable) -> Callable[[Callable], Callable]:
    """``apply_sampling_constraints`` called with ``edit(sampling_metadata)`` on sampled batches."""
    def make(apply: Callable) -> Callable:
        def broken(logits, cu_num_draft_tokens, sampling_metadata):
            if not sampling_metadata.all_greedy:
                sampling_metadata = edit(sampling_metadata)
            return apply(logits, cu_num_draft_tokens, sampling_metadata)
        return broken
    return make


def _from_p(sample_recovered_tokens: Callable) -> Callable:
    def broken(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
               *args, **kwargs):
        return torch.multinomial(target_probs, 1)[:, 0].to(draft_token_ids.dtype)
    return broken


_SHIFTERS = {
    "temperature-ignored": ("rejection_sample", _as_greedy),
    "temperature-twice": ("apply_sampling_constraints",
                          _constraints(lambda sm: replace(sm, temperature=sm.temperature * sm.temperature))),
    "top-p-ignored": ("apply_sampling_constraints", _constraints(lambda sm: replace(sm, top_p=None))),
    "recovered-from-p": ("sample_recovered_tokens", _from_p),
}
