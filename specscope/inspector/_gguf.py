"""A GGUF file's metadata (its keys and tensor names), read within bounds the file itself sets.

The ``gguf`` package's ``GGUFReader`` trusts every count it reads and walks array items one Python
step at a time: a 49-byte file declaring a 2**62-item array keeps it looping for ever, a record past
the end raises ``IndexError``, and a million-item array takes it 22 s. Here the layout (GGUF v2 and
v3, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) is walked from a memory map: every
length must fit in the bytes left before it is used, arrays of numbers are stepped over whole, and
keys, array items and tensor records together stay under :data:`MAX_ENTRIES`. Only scalar values,
array lengths and tensor names are kept; no tensor data is read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope.checkpoint_reader import is_regular_file
from specscope.errors import ConfigError

MAX_ENTRIES = 2**21
"""Keys, array items and tensor records one GGUF may hold: ~2.7x a 262k-token vocabulary's tokens,
scores and token types, ~4x Llama 3's tokens, types and merges."""
MAX_DEPTH = 3
"""Deepest nesting of arrays (tokenizers use one level)."""

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFMetadata:
    """``values``: each scalar or string key's value; ``array_lengths``: each array key's item count;
    ``tensors``: the tensor names, in file order."""

    values: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: tuple[str, ...]


class _Cursor:
    """Reads forward through ``data``; every read is checked against what is left."""

    def __init__(self, data: mmap.mmap, file: Path) -> None:
        self.data, self.file, self.pos, self.order, self.entries = data, file, 0, "<", 0

    def skip(self, n: int, what: str) -> int:
        if n > len(self.data) - self.pos:
            raise ConfigError(f"GGUF {self.file} declares {what} past its end (at byte {self.pos:,} of "
                              f"{len(self.data):,})")
        start, self.pos = self.pos, self.pos + n
        return start

    def number(self, code: str, what: str) -> Any:
        return struct.unpack_from(self.order + code, self.data, self.skip(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        n = self.number("Q", what)
        start = self.skip(n, what)
        return self.data[start:start + n].decode("utf-8", errors="replace")

    def count(self, n: int, what: str) -> None:
        self.entries += n
        if self.entries > MAX_ENTRIES:
            raise ConfigError(f"GGUF {self.file} declares {n:,} {what}, past the {MAX_ENTRIES:,} keys, array "
                              "items and tensors a model's GGUF holds")

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        """A scalar or string value; for an array, its length."""
        if kind in _SCALARS:
            return self.number(_SCALARS[kind], f"the value of {key}")
        if kind == _STRING:
            return self.string(f"the value of {key}")
        if kind != _ARRAY:
            raise ConfigError(f"GGUF {self.file} gives {key} an unknown value type {kind}")
        if depth == MAX_DEPTH:
            raise ConfigError(f"GGUF {self.file} nests arrays in {key} deeper than {MAX_DEPTH} levels")
        item, n = self.number("I", f"the array {key}"), self.number("Q", f"the array {key}")
        self.count(n, f"items in {key}")
        if item in _SCALARS:
            self.skip(n * struct.calcsize(_SCALARS[item]), f"{n:,} items of {key}")
        else:
            for _ in range(n):  # each item takes 8 bytes or more: bounded by the file and MAX_ENTRIES
                self.value(item, key, depth + 1)
        return n


def read_gguf_metadata(file: Path) -> GGUFMetadata:
    """The metadata of the GGUF ``file``. Raises :class:`ConfigError` for a missing or non-regular
    file, one that is not GGUF v2/v3, or a layout that overruns the file or :data:`MAX_ENTRIES`."""
    if not is_regular_file(file, "GGUF", ConfigError):
        raise ConfigError(f"no GGUF at {file}")
    with file.open("rb") as f:
        if file.stat().st_size < 24:  # magic, version, two counts
            raise ConfigError(f"{file} is not a readable GGUF file (too short)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk(_Cursor(data, file))


def _walk(cur: _Cursor) -> GGUFMetadata:
    if cur.data[:4] != _MAGIC:
        raise ConfigError(f"{cur.file} is not a readable GGUF file (no GGUF magic)")
    cur.pos = 4
    version = struct.unpack_from("<I", cur.data, 4)[0]
    if version not in _VERSIONS:  # the reader's own test: a byte-swapped version is a big-endian file
        cur.order, version = ">", struct.unpack_from(">I", cur.data, 4)[0]
    if version not in _VERSIONS:
        raise ConfigError(f"GGUF {cur.file} is version {version}; versions 2 and 3 are read")
    cur.number("I", "the version")
    tensor_count, kv_count = cur.number("Q", "the tensor count"), cur.number("Q", "the key count")
    cur.count(kv_count + tensor_count, "keys and tensors")
    values: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(kv_count):
        key = cur.string("a key")
        if key in values or key in lengths:
            raise ConfigError(f"GGUF {cur.file} holds the key {key!r} twice")
        kind = cur.number("I", f"the type of {key}")
        (lengths if kind == _ARRAY else values)[key] = cur.value(kind, key)
    names = []
    for _ in range(tensor_count):
        names.append(cur.string("a tensor name"))
        dims = cur.number("I", f"the dimensions of tensor {names[-1]}")
        cur.skip(8 * dims + 4 + 8, f"the shape, type and offset of tensor {names[-1]}")
    return GGUFMetadata(values, lengths, tuple(names))
