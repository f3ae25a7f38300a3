"""Fault switches: each reproduces a publicly reported speculative-decoding serving failure. All but
the lossy ones change only the plumbing between target and draft: verification stays lossless (the
output text is unchanged) and acceptance is what suffers, silently. The lossy ones (:data:`LOSSY_FAULTS`)
break the verifier itself the ways real verifiers break: the text is no longer the target's (greedy) or
no longer drawn from the target's distribution (sampled), while acceptance looks healthy or better.
specscope must make both visible.
"""

from __future__ import annotations

from specscope.errors import ConfigError

FAULTS: dict[str, str] = {
    "no-aux-capture": "aux capture never activated: the draft receives the target's final hidden state "
                      "(width H) and fc is skipped because that width equals the embedding width",
    "aux-off-by-one": "capture ids shifted by +1 (an explicit-id convention mix-up between engines)",
    "unrenamed-keys": "the draft layer is stored as layers.0.* while the loader maps midlayer.* "
                      "non-strictly, so the layer silently keeps its random init",
    "d2t-absolute": "d2t holds absolute target ids, so adding the index again maps drafts to wrong tokens",
    "lm-head-missing": "the draft's lm_head is missing from the checkpoint and stays at random init",
    "emit-draft-token": "the verifier emits the draft's token at the first rejected position instead of "
                        "the target's: acceptance unchanged, output no longer the target's",
    "temperature-ignored": "the sampled verify step ignores the request's temperature: it accepts and emits "
                           "as if greedy (acceptance rises, the output distribution narrows)",
    "temperature-twice": "the sampled verify step divides the logits by the temperature twice",
    "top-p-ignored": "the sampled verify step samples from the untruncated distribution (top-p lost)",
    "top-k-ignored": "the sampled verify step samples from the distribution before top-k",
    "request-aux-noise": "every third request (the 3rd, 6th, ...) feeds the draft noise over the target's "
                         "features, as a per-request state mix-up would: those requests accept next to "
                         "nothing, the others are healthy, the output stays the target's",
    "aux-decay": "noise over the draft's target features grows with every verify step the engine serves "
                 "(state that degrades while a server stays up), to 0.5 feature standard deviations after "
                 "700 steps: acceptance falls slowly over the run, the output stays the target's",
    "recovered-from-p": "a rejected draft position draws the recovered token from p, where max(p - q, 0) "
                        "normalised belongs (for an argmax draft: p without the draft's token)",
    "sampling-of-previous-request": "the verify step reads the sampling settings (temperature, top-k, top-p) "
                                    "of the request served before this one, as a per-slot settings cache "
                                    "not refreshed when the slot is reused; the first token is drawn right",
    "shared-uniforms": "every request's generator is seeded alike (not per request), so all requests draw "
                       "the same uniforms: each request's tokens are still draws from the target, but "
                       "requests with the same prompt and settings return the same text",
}


LOSSY_FAULTS = ("emit-draft-token", "temperature-ignored", "temperature-twice", "top-p-ignored", "top-k-ignored",
                "recovered-from-p", "sampling-of-previous-request", "shared-uniforms")
"""The faults under which the output is no longer the target's (the others change acceptance only);
under ``shared-uniforms`` each request's marginal is still the target's, only the joint law across
requests is not."""


SAMPLED_PATH_FAULTS = LOSSY_FAULTS[1:]
"""The faults that change nothing where every request is greedy (``sampling-of-previous-request``
breaks a greedy request served after a sampled one)."""


def check_fault(name: str | None, greedy: bool = False) -> str | None:
    """Return ``name`` if it is a known fault (or None); ``greedy``: the caller serves greedily, so a
    fault of the sampled path would change nothing. Raises ConfigError naming the valid choice."""
    if name is not None and name not in FAULTS:
        raise ConfigError(f"unknown fault {name!r}; choose one of: {', '.join(FAULTS)}")
    if greedy and name in SAMPLED_PATH_FAULTS:
        raise ConfigError(f"fault {name!r} breaks the sampled verify step only and this serves greedily: "
                          "serve sampled requests (Engine.generate(temperature=0.8)) to see it")
    return name


def parse_rank_fault(text: str) -> tuple[int, str]:
    """``"RANK:NAME"`` (e.g. ``"1:no-aux-capture"``) -> ``(1, "no-aux-capture")``: a fault switched on
    for one rank of a multi-rank run, as when one worker of a tensor- or data-parallel group captures
    differently from the others (sglang issue 16274: AL 2.35 on TP4 vs 1.48 with DP attention).

    Raises:
        ConfigError: not ``RANK:NAME``, a negative rank, or an unknown fault (the valid names listed).
    """
    rank, sep, name = text.partition(":")
    if not sep or not rank.strip().isdigit():
        raise ConfigError(f"rank fault {text!r} is not RANK:NAME (e.g. 1:no-aux-capture)")
    return int(rank), check_fault(name.strip())
