"""Fault switches: each reproduces a publicly reported speculative-decoding serving failure. All but
one change only the plumbing between target and draft: verification stays lossless (the output text is
unchanged) and acceptance is what suffers, silently. ``emit-draft-token`` breaks the verifier itself:
acceptance is untouched and the text is no longer the target's. specscope must make both visible.
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
}


LOSSY_FAULTS = ("emit-draft-token",)
"""The faults under which the output is no longer the target's (the others change acceptance only)."""


def check_fault(name: str | None) -> str | None:
    """Return ``name`` if it is a known fault (or None). Raises ConfigError listing the valid names."""
    if name is not None and name not in FAULTS:
        raise ConfigError(f"unknown fault {name!r}; choose one of: {', '.join(FAULTS)}")
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
