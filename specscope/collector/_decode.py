"""Token ids to text, in the collector's writer thread: engines hand token ids (cheap to copy on the
engine thread) and the text is decoded here, never where the engine waits.

The tokenizer is anything with Hugging Face's ``decode(ids, skip_special_tokens=...) -> str``; per
verify step each emitted token is decoded alone (the Requests page marks each token as draft-accepted
or bonus), a request's text as a whole; special tokens are skipped in both, as engines return text.
A request's text ends where a streaming detokenizer's ends: engines decode as they stream and withhold
the tokens' text while it ends in U+FFFD (an incomplete UTF-8 sequence a later token may finish), so a
request that stops mid-character never returns its last tokens' text (vLLM's ``DecodeStream`` and its
slow path alike), and neither is it stored.
Decoded text is made storable (no NUL, no lone surrogate: every database takes it); anything else
a tokenizer returns, or raises, leaves the event without text: the event itself is always kept.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from specscope.events import Event, RequestEnd, VerifyStep, storable_text

logger = logging.getLogger("specscope.collector")

WITHHELD = "\ufffd"
"""What a streaming detokenizer holds back at the end of a request's text (see above)."""

ENDING_TOKENS = 8
"""Tokens whose text decides how a decoding ends: the last character is at most 4 UTF-8 bytes, and a
token holds at least one."""

TOKEN_CACHE = 1 << 16
"""Most single tokens whose text a decoder keeps (the least recently emitted go first): a few MB."""


class Decoder:
    """Decodes the token ids of :class:`VerifyStep` (``emitted_ids``) and :class:`RequestEnd`
    (``output_ids``) events with ``tokenizer``. Never raises: a failing tokenizer, or one that
    returns something other than text, leaves the event without its text (logged once)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._failed = False
        # A token's text alone depends on its id only: decoded once, as the writer holds the GIL the
        # engine thread waits for while a tokenizer's Python wrapper runs
        self._token = functools.lru_cache(maxsize=TOKEN_CACHE)(self._decode_token)

    def __call__(self, event: Event) -> Event:
        try:
            if isinstance(event, VerifyStep) and event.emitted_ids is not None:
                tokens = event.emitted if event.emitted is not None else self._tokens(event.emitted_ids)
                return dataclasses.replace(event, emitted=tokens, emitted_ids=None)
            if isinstance(event, RequestEnd) and event.output_ids is not None:
                text = event.text if event.text is not None else self._text(event.output_ids)
                return dataclasses.replace(event, text=text, output_ids=None)
        # text is a courtesy: the event is stored without it. BaseException too: a tokenizer's
        # SystemExit raised in this thread would end the writer, not the process, and every event with it
        except BaseException as exc:  # noqa: BLE001
            self._warn(exc)
            return dataclasses.replace(event, emitted_ids=None) if isinstance(event, VerifyStep) else \
                dataclasses.replace(event, output_ids=None)
        return event

    def _tokens(self, ids: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(map(self._token, ids))

    def _decode_token(self, token_id: int) -> str:
        return storable_text(self._decoded((token_id,)))

    def _text(self, ids: tuple[int, ...]) -> str:
        # the text of the longest prefix whose decoding does not end in WITHHELD. Tokens without text
        # of their own (special ones, skipped) end nothing: withheld with what precedes them. Each
        # ending is read off the last ENDING_TOKENS tokens with text (output ending in a long run of
        # stray bytes walks back over all of them: one short decode per token, not of the prefix)
        end = len(ids)
        while end:
            last = end
            while last and not self._token(ids[last - 1]):
                last -= 1
            if not last or not self._decoded(ids[max(0, last - ENDING_TOKENS):last]).endswith(WITHHELD):
                break
            end = last - 1
        return storable_text(self._decoded(ids[:end]))

    def _decoded(self, ids: tuple[int, ...]) -> str:
        return self._checked(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    @staticmethod
    def _checked(text: Any) -> str:
        if not isinstance(text, str):
            raise TypeError(f"the tokenizer's decode returned {type(text).__name__}, not str")
        return text

    def _warn(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            logger.warning("specscope: decoding token ids failed (%s: %s); requests are stored without "
                           "their text", type(exc).__name__, exc)
