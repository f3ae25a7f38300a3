"""Where the tracer runs: host, pid, torch.distributed rank / world size, device, CUDA-graph capture."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class ProcessContext:
    """The engine process (rank) a tracer lives in."""

    host: str
    pid: int
    rank: int
    world_size: int


def process_context() -> ProcessContext:
    """Host, pid, and ``torch.distributed`` rank / world size (0 / 1 when not initialised)."""
    rank, world_size = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return ProcessContext(socket.gethostname(), os.getpid(), rank, world_size)


def module_device(module: nn.Module) -> str | None:
    """Device of the module's first parameter or buffer (``"cpu"``, ``"cuda:0"``), None when it has none."""
    for tensor in module.parameters():
        return str(tensor.device)
    for tensor in module.buffers():
        return str(tensor.device)
    return None


def default_device() -> str:
    """The current CUDA device when CUDA is initialised, else ``"cpu"``."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _cuda_capturing() -> bool:
    # is_initialized first: querying the capture state must not initialise CUDA from a hook.
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def capture_probe() -> Callable[[], bool] | None:
    """A cheap ``() -> bool``: is the current CUDA stream capturing a graph right now? None where
    CUDA is unavailable (nothing can be captured; hooks then skip the call).

    Chosen once (at tracer construction). Module hooks run while a CUDA graph is captured, never
    when it is replayed (docs/design.md, "Where the engines let us in"), so events seen under
    capture are tagged ``graph_phase="capture"``.
    """
    return _cuda_capturing if torch.cuda.is_available() else None
