"""Replay against the target alone (docs/design.md, "Replay against the target"): re-score a stored
run's requests with the target served without speculation, teacher-forced over prompt + output, one
forward per request, and store per request where the output departs from the target's own greedy
choice (with its logit margin: a near-tie is numerics, a large margin a bug) and, for sampled
requests, the audit's figures of the replayed distribution (``v_replay_audit``, the doctor's
``REPLAY_DIVERGENCE`` / ``REPLAY_AUDITED``).

- :func:`replay_run`: one run, through a :class:`TransformersTarget` (a local Hugging Face folder) or
  a :class:`ServerTarget` (an OpenAI-compatible server returning vLLM's ``prompt_logprobs``).
- :func:`score_logits` / :func:`score_margins`: one request's judgement from the target's logits or
  per-position margins; :data:`NEAR_TIE_MARGIN`, the default line between numerics and a bug.
"""

from specscope.replay._run import ReplayReport, Target, inputs, replay_run
from specscope.replay._score import NEAR_TIE_MARGIN, ReplayInput, departures, score_logits, score_margins
from specscope.replay._targets import ReplayError, ServerTarget, TransformersTarget

__all__ = ["NEAR_TIE_MARGIN", "ReplayError", "ReplayInput", "ReplayReport", "ServerTarget", "Target",
           "TransformersTarget", "departures", "inputs", "replay_run", "score_logits", "score_margins"]
