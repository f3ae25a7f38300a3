"""What a store can hold, and the value checks every event runs when it is made (any producer:
tracer, adapters, tests). Each raises :class:`~specscope.errors.InvalidEvent` with one line naming
the field."""

from __future__ import annotations

import math
import re
from array import array
from typing import Any

from specscope.errors import InvalidEvent

MAX_PROPOSED = 64  # draft tokens per verify step the store holds a mask for (verify_steps.accepted_mask)
MAX_COUNT = 2**31 - 1  # PostgreSQL's int4: larger counts are refused, never wrapped by a binary COPY
MAX_REQUEST_ID = 128  # characters of a request id every store holds (schema.py's request_id columns)
MAX_NAME = 64  # characters of a run id, engine, engine version, fault label or device every store holds
MAX_HOST = 255  # characters of a host name every store holds (runs.host, run_ranks.host)
PIT_BINS = 10  # equal-width bins of the losslessness audit's PIT histogram (LosslessAudit.pit)
SURPRISE_COLUMNS = ("surprise_sum", "entropy_sum", "surprise_var_sum", "entropy_max")
"""The losslessness audit's surprise-test figures (LosslessAudit fields, lossless_audit columns)."""
RECOVERED_COLUMNS = ("recovered", "recovered_as_draft", "recovered_p_sum")
"""The losslessness audit's recovered-token figures (LosslessAudit fields, lossless_audit columns):
sampled steps that ended on a rejection, those whose recovered token is the rejected draft token, and
the target probability of the draft tokens there (summed)."""

SEVERITIES = ("error", "warning", "info")
FINDING_SOURCES = ("doctor", "inspect")

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_counts(what: str, **counts: Any) -> None:
    for name, value in counts.items():
        if not is_int(value) or value < 0:
            raise InvalidEvent(f"{what}: {name} must be an int >= 0, got {value!r}")


def storable_text(text: str) -> str:
    """``text`` as every store (and a UTF-8 page) takes it: NUL removed, lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text.replace("\x00", ""))


def _token_ids(ids: Any, most: int) -> bool:
    return isinstance(ids, tuple) and len(ids) <= most and all(is_int(i) and 0 <= i <= MAX_COUNT for i in ids)


def _texts(value: Any, width: int = 1) -> bool:
    """A tuple or list of strings (``width`` 1), or of tuples / lists of ``width`` strings."""
    if not isinstance(value, (tuple, list)):
        return False
    if width == 1:
        return all(isinstance(item, str) for item in value)
    return all(isinstance(item, (tuple, list)) and len(item) == width and _texts(item) for item in value)


def check_names(what: str, **names: Any) -> None:
    """Each text of ``names`` fits its column on PostgreSQL too (``host``: :data:`MAX_HOST` characters,
    the others :data:`MAX_NAME`): a longer one is refused there, and with it the run's row, while
    SQLite would keep it."""
    for name, value in names.items():
        most = MAX_HOST if name == "host" else MAX_NAME
        if isinstance(value, str) and len(value) > most:
            raise InvalidEvent(f"{what}: {name} {value[:40]!r}... is {len(value)} characters; a store holds {most}")


def check_run_start(e: Any) -> None:
    """Its names fit the store (:func:`check_names`); the run's RankStart names the same run and host,
    and its device is the tracer's, checked there."""
    check_names("run start", run_id=e.run_id, engine=e.engine, engine_version=e.engine_version, fault=e.fault,
                host=e.host)


def check_rank_status(e: Any) -> None:
    """Counts up to :data:`MAX_COUNT`; ``finished`` a bool, ``graph_mode`` text, ``error`` text or None."""
    check_counts("rank status", hook_calls=e.hook_calls, hook_errors=e.hook_errors)
    if max(e.hook_calls, e.hook_errors) > MAX_COUNT:
        raise InvalidEvent(f"rank status: hook_calls={e.hook_calls}, hook_errors={e.hook_errors}: counts go "
                           f"up to {MAX_COUNT}")
    if not isinstance(e.finished, bool) or not isinstance(e.graph_mode, str) \
            or not isinstance(e.error, (str, type(None))):
        raise InvalidEvent(f"rank status: finished {e.finished!r:.40}, graph_mode {e.graph_mode!r:.40}, "
                           f"error {e.error!r:.40}: a bool, text, and text or None")


def check_load_report(e: Any) -> None:
    """``loaded`` a count; ``module`` / ``source`` text, ``strict`` a bool; ``missing`` /
    ``unexpected`` strings (keys), ``renamed`` pairs of them: the doctor matches keys as text."""
    check_counts("load report", loaded=e.loaded)
    if not (isinstance(e.module, str) and isinstance(e.source, str) and isinstance(e.strict, bool)):
        raise InvalidEvent(f"load report: module {e.module!r:.40}, source {e.source!r:.40}, strict "
                           f"{e.strict!r:.40}: text, text and a bool")
    for name, width in (("missing", 1), ("unexpected", 1), ("renamed", 2)):
        value = getattr(e, name)
        if not _texts(value, width):
            what = "keys (strings)" if width == 1 else "(checkpoint key, parameter) pairs of strings"
            raise InvalidEvent(f"load report: {name} {value!r:.80} is not a sequence of {what}")


def check_request_end(e: Any) -> None:
    check_counts("request end", output_tokens=e.output_tokens, verify_steps=e.verify_steps)
    if e.output_ids is not None and not _token_ids(e.output_ids, MAX_COUNT):
        raise InvalidEvent(f"request end: output_ids must be a tuple of token ids, got {repr(e.output_ids)[:80]}")


def check_verify_step(e: Any) -> None:
    """Counts in range, ``emitted`` / ``emitted_ids`` at most ``accepted + 1`` long (fewer when EOS or
    the token budget cut the step), a mask of ``proposed`` '0'/'1' accepting ``accepted`` positions."""
    if not (is_int(e.proposed) and is_int(e.accepted) and is_int(e.step)):
        raise InvalidEvent(f"verify step: proposed, accepted and step must be ints, got "
                           f"{e.proposed!r}, {e.accepted!r}, {e.step!r}")
    if not 0 <= e.step <= MAX_COUNT and e.step != -1:
        raise InvalidEvent(f"verify step: step={e.step} outside 0..{MAX_COUNT}")
    if not 0 <= e.proposed <= MAX_PROPOSED:
        raise InvalidEvent(f"verify step: proposed={e.proposed} outside 0..{MAX_PROPOSED}")
    if not 0 <= e.accepted <= e.proposed:
        raise InvalidEvent(f"verify step: accepted={e.accepted} outside 0..proposed={e.proposed}")
    emitted = e.emitted
    if emitted is not None and (not isinstance(emitted, tuple) or len(emitted) > e.accepted + 1
                                or not all(isinstance(token, str) for token in emitted)):
        raise InvalidEvent(f"verify step: emitted must be a tuple of at most accepted + 1 = "
                           f"{e.accepted + 1} decoded tokens (str), got {repr(emitted)[:80]}")
    if e.emitted_ids is not None and not _token_ids(e.emitted_ids, e.accepted + 1):
        raise InvalidEvent(f"verify step: emitted_ids must be a tuple of at most accepted + 1 = "
                           f"{e.accepted + 1} token ids, got {repr(e.emitted_ids)[:80]}")
    mask = e.accepted_mask
    if mask is None:
        return
    if not isinstance(mask, str) or len(mask) != e.proposed or mask.strip("01"):
        raise InvalidEvent(f"verify step: accepted_mask {mask!r} is not {e.proposed} characters "
                           "of '0'/'1' (one per proposed draft token)")
    if mask.count("1") != e.accepted:
        raise InvalidEvent(f"verify step: accepted_mask {mask!r} accepts {mask.count('1')} "
                           f"position(s) but accepted={e.accepted}")


def check_verify_group(e: Any) -> None:
    """Counts up to :data:`MAX_COUNT`, at most :data:`MAX_PROPOSED` proposed per step, and a mask
    (possibly empty) whose accepted positions times ``steps`` are ``accepted``."""
    check_counts("verify group", steps=e.steps, proposed=e.proposed, accepted=e.accepted)
    if max(e.steps, e.proposed) > MAX_COUNT or e.accepted > e.proposed or e.proposed > e.steps * MAX_PROPOSED:
        raise InvalidEvent(f"verify group: steps={e.steps}, proposed={e.proposed}, accepted={e.accepted}: "
                           f"counts go up to {MAX_COUNT}, accepted cannot exceed proposed, nor proposed "
                           f"{MAX_PROPOSED} per step")
    mask = e.accepted_mask
    if not isinstance(mask, str) or mask.strip("01") or len(mask) > MAX_PROPOSED:
        raise InvalidEvent(f"verify group: accepted_mask {mask!r:.80} is not a string of at most {MAX_PROPOSED} '0'/'1'")
    if mask and e.accepted != e.steps * mask.count("1"):
        raise InvalidEvent(f"verify group: {e.steps} steps of mask {mask!r} accept {e.steps * mask.count('1')} "
                           f"drafts, not {e.accepted}")


def check_lossless_audit(e: Any) -> None:
    """``tokens`` in 1..MAX_COUNT, ``mismatches`` / ``rare`` / ``recovered`` within it,
    ``recovered_as_draft`` within ``recovered``, sums finite and >= 0, sums of probabilities at most
    their count, ``epsilon`` in [0, 1), ``pit`` empty or :data:`PIT_BINS` counts summing to at most
    ``tokens``."""
    if not (is_int(e.tokens) and 1 <= e.tokens <= MAX_COUNT):
        raise InvalidEvent(f"lossless audit: tokens must be an int in 1..{MAX_COUNT}, got {e.tokens!r}")
    for name in ("mismatches", "rare", "recovered"):
        value = getattr(e, name)
        if not (is_int(value) and 0 <= value <= e.tokens):
            raise InvalidEvent(f"lossless audit: {name}={value!r} outside 0..tokens={e.tokens}")
    if not (is_int(e.recovered_as_draft) and 0 <= e.recovered_as_draft <= e.recovered):
        raise InvalidEvent(f"lossless audit: recovered_as_draft={e.recovered_as_draft!r} outside "
                           f"0..recovered={e.recovered}")
    for name in ("rare_expected", "p_sum", "p2_sum", "p_var_sum", "epsilon", *SURPRISE_COLUMNS, "recovered_p_sum"):
        value = getattr(e, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise InvalidEvent(f"lossless audit: {name} must be a finite number >= 0, got {value!r}")
    if not e.epsilon < 1:  # a probability threshold; 0: no junk tail judged
        raise InvalidEvent(f"lossless audit: epsilon must lie in [0, 1), got {e.epsilon!r}")
    # a probability per token: float32 sums of them may pass the count by rounding, never by more
    for name, count in (("p_sum", e.tokens), ("p2_sum", e.tokens), ("recovered_p_sum", e.recovered)):
        if getattr(e, name) > count * (1 + 1e-3) + 1e-6:
            raise InvalidEvent(f"lossless audit: {name}={getattr(e, name)!r} exceeds its {count} probabilities")
    if e.example is not None and not isinstance(e.example, dict):
        raise InvalidEvent(f"lossless audit: example must be a dict or None, got {type(e.example).__name__}")
    pit = e.pit
    if not (isinstance(pit, tuple) and len(pit) in (0, PIT_BINS) and all(is_int(n) and n >= 0 for n in pit)
            and sum(pit) <= e.tokens):
        raise InvalidEvent(f"lossless audit: pit must be () or {PIT_BINS} counts >= 0 summing to at most "
                           f"tokens={e.tokens}, got {pit!r}")


def check_request_tokens(e: Any) -> None:
    """Ids in tuples, each an int in 0..2**32 - 1, and a prompt: one pass in C per tuple (an unsigned
    32-bit array refuses anything else), since this runs on the engine thread for up to 8192 ids."""
    for name in ("prompt_ids", "output_ids"):
        ids = getattr(e, name)
        try:
            ok = isinstance(ids, tuple) and array("I", ids) is not None
        except (TypeError, OverflowError):
            ok = False
        if not ok:
            raise InvalidEvent(f"request tokens: {name} must be a tuple of token ids, got {repr(ids)[:80]}")
    if not e.prompt_ids:
        raise InvalidEvent("request tokens: prompt_ids is empty (a replay needs the prompt)")


def check_replay_result(e: Any) -> None:
    """``audit`` a :class:`~specscope.events.LosslessAudit` of the same request, ``near_ties`` <=
    ``departures`` <= its ``tokens``, margins finite and >= 0, ``first_departure`` set exactly when
    something departed."""
    audit = e.audit
    if type(audit).__name__ != "LosslessAudit" or (audit.run_id, audit.request_id) != (e.run_id, e.request_id):
        raise InvalidEvent(f"replay result: audit must be the LosslessAudit of request {e.request_id!r}, "
                           f"got {repr(audit)[:80]}")
    check_counts("replay result", departures=e.departures, near_ties=e.near_ties)
    if not e.near_ties <= e.departures <= audit.tokens:
        raise InvalidEvent(f"replay result: near_ties {e.near_ties} <= departures {e.departures} <= tokens "
                           f"{audit.tokens} does not hold")
    for name in ("near_tie_margin", "first_margin", "max_margin"):
        value = getattr(e, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):
            raise InvalidEvent(f"replay result: {name} must be a finite number >= 0, got {value!r}")
    if (e.first_departure is None) != (e.departures == 0):
        raise InvalidEvent("replay result: first_departure is set exactly when there are departures")


def check_finding(e: Any) -> None:
    """``code``, ``message`` and ``fix`` text; ``severity`` in :data:`SEVERITIES`; ``source`` in
    :data:`FINDING_SOURCES`; ``run_id`` text or None; ``evidence`` a dict of text keys, whose
    ``as_inspected`` (an inspection a run settled, ``doctor/_causes.py``) holds a severity and a
    message: every reading of a finding (its sort, the doctor's settling of checkpoint findings)
    trusts these."""
    if not all(isinstance(value, str) for value in (e.code, e.message, e.fix)):
        raise InvalidEvent(f"finding: code {e.code!r:.40}, message {e.message!r:.40} and fix {e.fix!r:.40} "
                           "must be text")
    if e.severity not in SEVERITIES:
        raise InvalidEvent(f"finding {e.code}: severity {e.severity!r:.40} is not one of {', '.join(SEVERITIES)}")
    if e.source not in FINDING_SOURCES:
        raise InvalidEvent(f"finding {e.code}: source {e.source!r:.40} is not one of {', '.join(FINDING_SOURCES)}")
    if not isinstance(e.run_id, (str, type(None))):
        raise InvalidEvent(f"finding {e.code}: run_id {e.run_id!r:.40} must be text or None")
    if not (isinstance(e.evidence, dict) and all(isinstance(key, str) for key in e.evidence)):
        raise InvalidEvent(f"finding {e.code}: evidence {e.evidence!r:.80} must be a dict with text keys")
    original = e.evidence.get("as_inspected")
    if original is not None and not (isinstance(original, dict) and original.get("severity") in SEVERITIES
                                     and isinstance(original.get("message"), str)):
        raise InvalidEvent(f"finding {e.code}: evidence as_inspected {original!r:.80} must hold the inspection's "
                           "severity and message")
