"""Token ids to text, in the collector's writer thread: engines hand token ids (cheap to copy on the
engine thread) and the text is decoded here, never where the engine waits.

The tokenizer is anything with Hugging Face's ``decode(ids, skip_special_tokens=...) -> str``; per
verify step each emitted token is decoded alone (the Requests page marks each token as draft-accepted
or bonus), a request's text in one call; special tokens are skipped in both, as engines return text.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from specscope.events import Event, RequestEnd, VerifyStep

logger = logging.getLogger("specscope.collector")


class Decoder:
    """Decodes the token ids of :class:`VerifyStep` (``emitted_ids``) and :class:`RequestEnd`
    (``output_ids``) events with ``tokenizer``. A failing tokenizer leaves the event without text,
    logged once; an event without ids passes unchanged."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._failed = False

    def __call__(self, event: Event) -> Event:
        if isinstance(event, VerifyStep) and event.emitted_ids is not None and event.emitted is None:
            tokens = self._decode(lambda t: tuple(t.decode([i], skip_special_tokens=True) for i in event.emitted_ids))
            return dataclasses.replace(event, emitted=tokens, emitted_ids=None)
        if isinstance(event, RequestEnd) and event.output_ids is not None and event.text is None:
            text = self._decode(lambda t: t.decode(list(event.output_ids), skip_special_tokens=True))
            return dataclasses.replace(event, text=text, output_ids=None)
        return event

    def _decode(self, how) -> Any:
        try:
            return how(self._tokenizer)
        except Exception as exc:  # noqa: BLE001 - text is a courtesy: the event is stored without it
            if not self._failed:
                self._failed = True
                logger.warning("specscope: decoding token ids failed (%s: %s); requests are stored without "
                               "their text", type(exc).__name__, exc)
            return None
