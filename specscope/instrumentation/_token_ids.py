"""Which requests keep their token ids, and how many (docs/design.md, "Replay against the target").

A replay re-scores a stored request with the target alone, so it needs the request's prompt and
output token ids; the store would otherwise hold only counts, a prompt key and decoded text. The
volume is bounded three ways: ids are kept only while the losslessness audit is on (the replay is
its second half), for at most :data:`DEFAULT_TOKEN_REQUESTS` requests per rank and run (the first
that finish), and at most :data:`MAX_REQUEST_TOKENS` ids per request (prompt + output: a longer
prompt is not kept at all, a teacher-forced replay needs all of it; a longer output is cut, the cut
said in ``output_truncated``). Ids are kept on the host as the engine already holds them: no device
read.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from specscope.errors import ConfigError
from specscope.events import RequestTokens

DEFAULT_TOKEN_REQUESTS = 256
"""Requests per rank and run whose token ids are kept by default (0: none)."""
MAX_REQUEST_TOKENS = 8192
"""Token ids kept per request, prompt and output together: at most about 64 KB of JSON per request."""


class TokenRecorder:
    """Holds the prompt ids of requests in flight and turns a finished one into a
    :class:`~specscope.events.RequestTokens` event while its budget lasts.

    ``requests``: how many requests of this rank keep their ids (0: none); ``max_tokens``: ids per
    request (see the module docstring).
    """

    def __init__(self, run_id: str, requests: int = DEFAULT_TOKEN_REQUESTS,
                 max_tokens: int | None = None) -> None:
        self.run_id = run_id
        self.max_tokens = MAX_REQUEST_TOKENS if max_tokens is None else max_tokens
        self.set_left(requests)
        self._prompts: dict[str, tuple[int, ...]] = {}

    def set_left(self, requests: int) -> None:
        """Keep the ids of the next ``requests`` requests to finish (0: none); ConfigError otherwise."""
        if not isinstance(requests, int) or isinstance(requests, bool) or requests < 0:
            raise ConfigError(f"token_requests must be an int >= 0, got {requests!r}")
        self.left = requests

    def start(self, request_id: str, prompt: str | Sequence[int] | None) -> None:
        """Remember ``prompt`` (token ids; text or None: nothing to replay) of ``request_id``."""
        if self.left <= len(self._prompts) or prompt is None or isinstance(prompt, str):
            return
        ids = tuple(prompt)
        if 0 < len(ids) < self.max_tokens:
            self._prompts[request_id] = ids

    def finish(self, request_id: str, rank: int, output_ids: Sequence[int] | None) -> RequestTokens | None:
        """The event of a finished request whose prompt was kept and whose output ids are given
        (None otherwise; the request is forgotten either way)."""
        prompt = self._prompts.pop(request_id, None)
        if prompt is None or output_ids is None or self.left <= 0:
            return None
        room = self.max_tokens - len(prompt)
        output = tuple(islice(output_ids, room + 1))
        self.left -= 1
        return RequestTokens(self.run_id, rank, request_id, prompt, output[:room], len(output) > room)
