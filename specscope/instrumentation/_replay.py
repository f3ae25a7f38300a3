"""Evidence that survives CUDA-graph replay: a static device buffer the captured graph writes, read
by the host later, off the step path (docs/design.md, "Where the engines let us in").

A replayed CUDA graph runs no Python, so neither a hook nor the ``specscope::observe`` op's body
sees a replayed step. What a replay does run are the kernels recorded at capture. So while a graph
is captured (the hook bodies see ``capturing``), each observed value is handed to
:meth:`ReplayRecorder.write`, which issues only device tensor ops on preallocated tensors: they
become part of the graph and write, on every replay, the site's call counter, the value's shape and
its row fingerprints into :attr:`ReplayRecorder.meta` / :attr:`ReplayRecorder.prints`. The same
function runs unchanged on any device: on a CPU (tests) its ops execute at once, exactly what a
replay executes.

Sites: one per hooked target layer (firing and, with provenance, its fingerprints), the final norm,
and the draft's target-fed input, whose rows are matched chunk by chunk against the layers'
fingerprints as :class:`~specscope.instrumentation._provenance.Provenance` matches eager ones. Once a
capture wrote to the buffer, the draft input is written there on eager calls too (device ops, no
sync): in vLLM the target is replayed while the draft's ``fc`` runs eagerly.

Reading (:meth:`ReplayRecorder.poll` from the tracer's periodic status, :meth:`~ReplayRecorder.drain`
at close): the buffer
is copied asynchronously to pinned host memory on a stream of its own, with an event; a later poll
decodes the copy once the event has completed (``Event.query``: no sync). No poll touches the device
in the status interval after a hook ran under capture: the engine may still be capturing on
another thread, and a query from this one would break that capture. The copy is not ordered
with the engine's stream, so a record may be read while a replay rewrites it: every record carries
its sequence number at its head (written first) and tail (written last), and the copy reads the
tails, then the fingerprints, then the heads; a record whose tail is not its later head was being
rewritten and waits for the next poll (a seqlock). Per record only the latest write is kept, so
provenance from replays is sampled at the poll rate, and per-call value statistics are not
observed. Rows past :data:`MAX_ROWS` of a value are not fingerprinted (CUDA graphs hold decode
batches; vLLM's largest captured size is 512 tokens by default).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from specscope.events import ProvenanceEvent, TensorEvent
from specscope.instrumentation._provenance import FINGERPRINT_DIM

if TYPE_CHECKING:
    from specscope.events import Event
    from specscope.instrumentation._provenance import Provenance

MAX_ROWS = 512
"""Rows of one value fingerprinted per write (the first ones)."""

HEAD, CALLS, WRITES, ROWS, WIDTH, TAIL = range(6)
"""Fields of a site's record in :attr:`ReplayRecorder.meta` (int64): sequence number written first,
replayed calls so far (captured writes), all writes so far (eager ones too), rows and width of the
last value, sequence number written last."""

REPLAY_PHASE = "replay"
"""``graph_phase`` of the tensor events decoded from the buffer."""


class Owner(Protocol):
    """What the recorder reports to (the tracer's :class:`~specscope.instrumentation._state.HookState`)."""

    run_id: str
    rank: int
    replay_calls: int
    capture_calls: int

    def emit(self, event: Event) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplaySite:
    """One observed value: ``point`` (hook point its tensor events are named by; None: none, e.g. a
    neighbour layer fingerprinted for provenance only), ``expected_width`` (the contract's last
    dimension), ``layer`` (the provenance candidate it is, as :class:`Provenance` numbers them; None
    for the draft's target-fed input, the site that is matched)."""

    point: str | None
    expected_width: int | None
    layer: int | None


class ReplayRecorder:
    """The static buffer of one tracer's target-side sites, its writer and its host reader."""

    def __init__(self, state: Owner, sites: list[ReplaySite], device: torch.device | str,
                 hidden_size: int, chunks: int, provenance: Provenance | None) -> None:
        self._state, self.sites, self._provenance = state, sites, provenance
        self.device = torch.device(device)
        self.hidden_size, self.chunks = hidden_size, max(1, chunks)
        dim = FINGERPRINT_DIM if provenance is not None else 0
        self.meta = torch.zeros(len(sites), TAIL + 1, dtype=torch.int64, device=self.device)
        self.prints = torch.zeros(len(sites), MAX_ROWS, self.chunks, dim, device=self.device)
        self._seq = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._projection = provenance.projection(self.device) if provenance is not None else None
        # Set by the first captured write: from then on hooks write on eager calls too, so the buffer
        # always holds the latest target forward and draft input, whichever way each ran.
        self.armed = False
        self._shapes: dict[tuple[int, int, int], tuple[tuple[int, ...], str, str]] = {}
        self._calls = [0] * len(sites)
        self._draft_seq = 0  # sequence number of the draft record last decoded
        self._captures = 0  # the owner's capture_calls at the previous poll
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        if self._stream is not None:  # the reader's first copy must see the zeros written above
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in (self.meta, self.prints, self.meta)]
        self._lock = threading.Lock()  # the status thread polls, close drains
        self._pending: torch.cuda.Event | None = None
        self._waiting = False

    # -- writer: device ops only (captured into the graph, run by every replay) -----------------

    def write(self, site: int, value: torch.Tensor, capturing: bool) -> None:
        """Write ``value``'s record for ``site``: pure device ops on preallocated tensors, no sync.
        A captured write counts a call (every replay runs it); an eager one only refreshes the
        record (its call is counted by the hook). A captured write keeps the value's shape on the
        host by (site, rows, width), known while Python runs (one entry per captured graph)."""
        width = int(value.shape[-1]) if value.dim() else 1
        rows = value.numel() // width if width else 0
        if capturing:
            self.armed = True
            self._shapes[(site, rows, width)] = (tuple(value.shape), str(value.dtype).removeprefix("torch."),
                                                 str(value.device))
        meta = self.meta[site]
        self._seq.add_(1)
        meta[HEAD:HEAD + 1].copy_(self._seq)
        hidden = self.hidden_size
        chunks = width // hidden if width % hidden == 0 else 0
        if self._projection is not None and 0 < chunks <= self.chunks and rows:
            kept = min(rows, MAX_ROWS)
            values = value.detach().reshape(rows, chunks, hidden)[:kept].float()
            self.prints[site, :kept, :chunks].copy_(values @ self._projection)
        meta[ROWS].fill_(rows)
        meta[WIDTH].fill_(width)
        if capturing:
            meta[CALLS].add_(1)
        meta[WRITES].add_(1)
        meta[TAIL:TAIL + 1].copy_(self._seq)

    # -- reader: host side, off the step path -----------------------------------------------------

    def poll(self) -> None:
        """Decode the last copy if it has arrived, then start the next one. Never synchronises the
        device. Does nothing while a graph may be being captured: this thread's stream capturing,
        or any hook call under capture since the previous poll (the engine may be capturing on
        another thread, in CUDA's global mode, where this thread's event query would invalidate
        its capture; vLLM captures its graphs in one burst at start-up)."""
        captures = self._state.capture_calls
        if captures != self._captures:
            self._captures = captures
            return
        if not self.armed or (self._stream is not None and torch.cuda.is_current_stream_capturing()):
            return
        with self._lock:
            self._poll()

    def _poll(self) -> None:
        if self._waiting:
            if self._pending is not None and not self._pending.query():
                return
            self._waiting = False
            self._decode(*self._host)
        self._copy()

    def drain(self) -> None:
        """At close: copy the buffer, wait for the copy (a sync, once) and decode it."""
        if not self.armed or (self._stream is not None and torch.cuda.is_current_stream_capturing()):
            return
        with self._lock:
            self._copy()  # on the same stream as a pending copy: it lands after it, in the same memory
            if self._pending is not None:
                self._pending.synchronize()
            self._waiting = False
            self._decode(*self._host)

    def _copy(self) -> None:
        tails, prints, heads = self._host
        if self._stream is None:
            tails.copy_(self.meta)
            prints.copy_(self.prints)
            heads.copy_(self.meta)
        else:
            with torch.cuda.stream(self._stream):
                tails.copy_(self.meta, non_blocking=True)
                prints.copy_(self.prints, non_blocking=True)
                heads.copy_(self.meta, non_blocking=True)
                self._pending = torch.cuda.Event()
                self._pending.record(self._stream)
        self._waiting = True

    def _decode(self, tails: torch.Tensor, prints: torch.Tensor, heads: torch.Tensor) -> None:
        state = self._state
        complete: dict[int, int] = {}  # site -> sequence number of its consistent record
        for site, spec in enumerate(self.sites):
            seq = int(tails[site, TAIL])
            if not seq or seq != int(heads[site, HEAD]):
                continue  # never written, or rewritten while copied: read at the next poll
            complete[site] = seq
            calls = int(tails[site, CALLS])
            new = calls - self._calls[site]
            if new <= 0:
                continue
            self._calls[site] = calls
            state.replay_calls += new
            shape = self._shapes.get((site, int(tails[site, ROWS]), int(tails[site, WIDTH])))
            if spec.point is None or shape is None:
                continue
            shape, dtype, device = shape
            expected = None if spec.expected_width is None else (-1,) * (len(shape) - 1) + (spec.expected_width,)
            state.emit(TensorEvent(state.run_id, state.rank, spec.point, calls - 1, shape, dtype, device,
                                   expected, None, None, None, None, None, REPLAY_PHASE))
        if self._provenance is not None:
            self._check(tails, prints, complete)

    def _check(self, tails: torch.Tensor, prints: torch.Tensor, complete: dict[int, int]) -> None:
        """Match the draft's latest consistent record against the layers' records written before it."""
        provenance, state = self._provenance, self._state
        for site, spec in enumerate(self.sites):
            seq = complete.get(site)
            if spec.layer is not None or seq is None or seq <= self._draft_seq:
                continue
            layers = {}
            for other, candidate in enumerate(self.sites):
                if candidate.layer is None:
                    continue
                if other not in complete:
                    if int(tails[other, TAIL]):
                        return  # a written layer caught mid-rewrite: matching without it would read None
                    continue
                if complete[other] > seq:
                    return  # a newer target forward began: its rows are not what this draft call got
                layers[candidate.layer] = prints[other, :min(int(tails[other, ROWS]), MAX_ROWS), 0]
            if not layers:
                return
            self._draft_seq = seq
            rows, width = int(tails[site, ROWS]), int(tails[site, WIDTH])
            hidden = self.hidden_size
            if width % hidden or width // hidden > self.chunks:
                received = (None,) * max(1, width // hidden)
            else:
                kept = prints[site, :min(rows, MAX_ROWS)]
                received = provenance.match([kept[:, chunk] for chunk in range(width // hidden)], layers)
            state.emit(ProvenanceEvent(state.run_id, state.rank, int(tails[site, WRITES]) - 1,
                                       provenance.configured, received, width))
