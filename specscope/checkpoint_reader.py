"""The one checkpoint reader: lazy, header-first access to a folder, a sharded set or one .safetensors file.

Shared by the checkpoint inspector (:mod:`specscope.inspector`) and the runtime load check
(:func:`specscope.instrumentation.check_load`), so both find the same files, keys and errors.
Shapes and dtypes come from the safetensors headers (``safe_open`` + ``get_slice``), no tensor data is
read for them. Values are numpy arrays (the safetensors numpy framework; ``ml_dtypes`` gives numpy the
``bfloat16`` and float8 dtypes), so reading a checkpoint never imports torch. Values are read only
when asked, and large tensors in row chunks, each through a fresh ``safe_open`` so that no more than
one chunk of the file is mapped at a time: peak memory stays near one chunk however large the
checkpoint (see ``benchmarks/inspect_memory.py``).
"""

from __future__ import annotations

import json
import math
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 / float8 with numpy for safetensors' numpy framework
import numpy as np
from safetensors import SafetensorError, safe_open

from specscope.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
CHUNK_BYTES = 4 * 2**20
"""Bytes of one value-reading chunk (row slices of a large tensor). Larger chunks read faster but
fragment the allocator: on a 1.8 GB draft, 8 MiB chunks raised peak RSS by ~220 MiB, 4 MiB by ~110 MiB, 2 MiB by ~70 MiB (but ran 2x slower)."""

SPARSE_MIN_BYTES = 64 * 2**20
"""Files declaring at least this much tensor data are refused when less than a quarter of it is
stored on disk (a sparse file: reading its holes takes as long as reading real weights, a 4 KB file
can declare a TiB). Checkpoints do not compress below that on a compressing file system (weights are
near-random bits)."""

MAX_JSON_BYTES = 64 * 2**20
"""Largest ``config.json`` or shard index read (an index of 100k tensors is ~8 MB): a larger file is
not a checkpoint's, and reading it whole would hold it all in memory."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and lists read from a JSON file (Hugging Face configs nest a few
levels): deeper values would reach Python's recursion limit in whatever walks them next (the
``--json`` writer at ~900 levels, ``json.loads`` itself past ~990)."""

MAX_ELEMENTS = 2**63 // 8
"""Most elements a tensor's shape may declare counting zero-length dimensions as 1: beyond it no
array of any dtype can be made (numpy's limit), so a header with ``[0, 2**62, 2**62]`` is refused
rather than met later as an array that cannot exist."""

_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorInfo:
    """Header facts of one tensor: ``file`` it lives in, ``dtype`` (safetensors name, e.g. ``BF16``),
    ``shape`` (elements per dimension) and ``nbytes`` (bytes of its data)."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPE_BYTES.get(self.dtype, 4)

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("F", "BF"))


def _open(file: Path):
    try:
        return safe_open(str(file), framework="numpy")
    except FileNotFoundError as exc:
        raise CheckpointError(f"missing safetensors file {file}") from exc
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file} is not a readable safetensors file ({exc})") from exc


def file_kind(path: Path, error: type[Exception] = CheckpointError) -> str | None:
    """``"file"`` (a regular file), ``"folder"``, ``"other"`` (a pipe, socket or device: opening
    one can block for ever or never end) or None when nothing is there. Raises ``error`` when the
    system cannot say (a name too long, a folder without permission)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from exc
    return "file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode) else "other"


def is_regular_file(path: Path, what: str, error: type[Exception] = CheckpointError) -> bool:
    """Whether ``path`` is a regular file (False when absent). Raises ``error`` for anything else
    there: checked before opening, so a pipe named ``model.safetensors`` is refused, not waited on."""
    kind = file_kind(path, error)
    if kind not in (None, "file"):
        raise error(f"{what} {path} is not a regular file")
    return kind == "file"


def read_json(file: Path, what: str, error: type[Exception] = CheckpointError) -> dict[str, Any]:
    """The JSON object in ``file`` (``what`` names it in messages). Raises ``error`` for a missing or
    non-regular file, one over :data:`MAX_JSON_BYTES`, text that is not UTF-8 JSON, nesting deeper
    than Python's recursion limit or an integer over Python's digit limit, or a value that is not an
    object."""
    if not is_regular_file(file, what, error):
        raise error(f"no {what} at {file}")
    size = file.stat().st_size
    if size > MAX_JSON_BYTES:
        raise error(f"{what} {file} is {size:,} bytes, more than the {MAX_JSON_BYTES:,} such a file can be; not read")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {file}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{what} {file} is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise error(f"{what} {file} nests its values more than {MAX_JSON_DEPTH} levels deep") from exc
    except ValueError as exc:  # an integer literal past Python's digit limit
        raise error(f"{what} {file} holds an integer of more than {sys.get_int_max_str_digits():,} "
                    "digits") from exc
    if not isinstance(data, dict):
        raise error(f"{what} {file} is not a JSON object")
    if _nesting(data) > MAX_JSON_DEPTH:
        raise error(f"{what} {file} nests its values more than {MAX_JSON_DEPTH} levels deep")
    return data


def _nesting(value: Any) -> int:
    """Levels of objects and lists in ``value``, counted level by level (no recursion), up to one past
    :data:`MAX_JSON_DEPTH`."""
    depth, level = 0, [value]
    while level and depth <= MAX_JSON_DEPTH:
        depth += 1
        level = [v for item in level for v in (item.values() if isinstance(item, dict) else item)
                 if isinstance(v, (dict, list))]
    return depth


def _weight_files(path: Path) -> tuple[list[Path], dict[str, Path] | None]:
    """The safetensors files of ``path`` and, for a sharded set, the index's key -> file map."""
    kind = file_kind(path)
    if kind == "file":
        return [path], None
    if kind != "folder":
        raise CheckpointError(f"{path} is neither a folder nor a regular file")
    index = path / INDEX_NAME
    if is_regular_file(index, "shard index"):
        weight_map = read_json(index, "shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"shard index {index} has no weight_map")
        bad = next((f"{k!r}: {v!r}" for k, v in weight_map.items()
                    if not isinstance(v, str) or not v or Path(v).name != v), None)
        if bad is not None:  # a shard is a file name beside the index, nothing else
            raise CheckpointError(f"shard index {index} maps a key to something that is not a shard file "
                                  f"name: {bad[:120]}")
        by_key = {k: path / v for k, v in weight_map.items()}
        for shard in sorted(set(by_key.values())):
            if not is_regular_file(shard, "shard"):
                raise CheckpointError(f"shard index {index} names a missing shard {shard.name}")
        return sorted(set(by_key.values())), by_key
    single = path / SINGLE_NAME
    if is_regular_file(single, "weights file"):
        return [single], None
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors in {path}")
    for file in found:
        is_regular_file(file, "weights file")
    return found, None


class CheckpointReader:
    """A checkpoint (draft or target) opened lazily: headers read at construction, values on demand.

    ``path``: a folder (``config.json`` + ``model.safetensors`` or a ``model.safetensors.index.json``
    sharded set) or one ``.safetensors`` file (its folder's ``config.json`` is used when present).
    Raises :class:`CheckpointError` for a missing path, an unreadable or truncated safetensors file, or
    an index naming a missing shard or key (and, from :attr:`config`, a ``config.json`` that is not JSON).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if file_kind(self.path) is None:
            raise CheckpointError(f"no such checkpoint: {self.path}")
        self.files, index = _weight_files(self.path)
        self.tensors: dict[str, TensorInfo] = {}
        for file in self.files:
            self._read_header(file)
        if index is not None:
            absent = sorted(k for k, f in index.items() if k not in self.tensors or self.tensors[k].file != f)
            if absent:
                raise CheckpointError(f"shard index lists {len(absent)} keys its shards lack, e.g. {absent[0]}")
        folder = self.path if self.path.is_dir() else self.path.parent
        config = folder / CONFIG_NAME
        self.config_path = config if is_regular_file(config, "config") else None

    @cached_property
    def config(self) -> dict[str, Any] | None:
        """The folder's ``config.json`` as a dict, ``None`` when there is none; read on first use (a
        load check that only needs keys never reads it). Raises :class:`CheckpointError` when it is not
        a JSON object."""
        return read_json(self.config_path, "config") if self.config_path is not None else None

    def _read_header(self, file: Path) -> None:
        # safetensors itself refuses a header whose tensors do not exactly cover the file's length
        declared = 0
        with _open(file) as f:
            for key in f.keys():
                sl = f.get_slice(key)
                info = self.tensors[key] = TensorInfo(key, file, sl.get_dtype(), tuple(sl.get_shape()))
                if math.prod(max(d, 1) for d in info.shape) > MAX_ELEMENTS:
                    raise CheckpointError(f"tensor {key} of {file} declares shape {list(info.shape)}, more "
                                          "elements than any array can hold: not a checkpoint to read")
                declared += info.nbytes
        stored = file.stat().st_blocks * 512
        if declared >= SPARSE_MIN_BYTES and 0 < stored < declared // 4:  # 0: a file system that does not say
            raise CheckpointError(f"{file} declares {declared:,} bytes of tensor data but stores only {stored:,} "
                                  "on disk (a sparse file): not a checkpoint to read")

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data over all files."""
        return sum(t.nbytes for t in self.tensors.values())

    def get(self, name: str, max_bytes: int | None = None) -> np.ndarray:
        """The whole tensor ``name`` (use for small tensors: ``d2t``, ``t2d``, norm weights).

        Raises:
            CheckpointError: its header declares more than ``max_bytes`` (checked before reading).
        """
        info = self.tensors[name]
        if max_bytes is not None and info.nbytes > max_bytes:
            raise CheckpointError(f"tensor {name} of {info.file} declares shape {list(info.shape)} "
                                  f"({info.nbytes:,} bytes), more than the {max_bytes:,} such a tensor can "
                                  "be; not read")
        with _open(info.file) as f:
            try:
                return f.get_tensor(name)
            except (SafetensorError, RuntimeError) as exc:
                raise CheckpointError(f"cannot read tensor {name} from {info.file} ({exc})") from exc

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of tensor ``name`` (dim 0; ``stop`` is clamped to the row count, which
        the numpy framework's slices do not do), read through their own ``safe_open``."""
        info = self.tensors[name]
        with _open(info.file) as f:
            try:
                return f.get_slice(name)[start:min(stop, info.shape[0])]
            except (SafetensorError, RuntimeError) as exc:
                raise CheckpointError(f"cannot read tensor {name} from {info.file} ({exc})") from exc

    def chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """Tensor ``name`` in row slices of about ``chunk_bytes`` bytes, dim 0 first.

        Each slice is read through its own ``safe_open`` so the mapping is released between slices.
        """
        info = self.tensors[name]
        if len(info.shape) == 0 or info.nbytes <= chunk_bytes:
            yield self.get(name)
            return
        row_bytes = max(1, info.nbytes // info.shape[0])
        step = max(1, chunk_bytes // row_bytes)
        for start in range(0, info.shape[0], step):
            yield self.rows(name, start, start + step)
