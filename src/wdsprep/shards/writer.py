"""The shard writer: whole samples, deterministic bytes, bounded size, atomic completion.

Every shard ends with its sample index (`shards/index.py`: member `__wdsprep_index__`, then the
end-of-archive blocks); the index's position, size and digest go in the shard's manifest row.

Per-sample work is kept to what varies per sample (issue #15 measures it against MosaicML MDS):
field names are checked and codecs picked once per (field, value class) (`Encoder`), the
size-dependent part of a tar header is cached (`tarformat.header`), and a shard reaches the disk
through a 1 MiB buffer. None of it changes a byte (tests/core/test_writer_bytes.py pins them).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import FormatError
from . import tarformat
from .codec import Encoder
from .index import INDEX_MEMBER, IndexBuilder, digest_text
from ..storage.files import output_error, remove_quietly


@dataclass
class ShardRow:
    name: str
    samples: int
    bytes: int
    sha256: str
    index_offset: int | None = None  # the index member (see shards/index.py); absent in older manifests
    index_bytes: int | None = None
    index_digest: str | None = None

    def as_dict(self) -> dict:
        row = {"name": self.name, "samples": self.samples, "bytes": self.bytes, "sha256": self.sha256}
        if self.index_offset is not None:
            row.update(index_offset=self.index_offset, index_bytes=self.index_bytes, index_digest=self.index_digest)
        return row


WRITE_BUFFER = 1 << 20  # small samples reach the disk in ~1 MiB writes, not one system call per 8 KiB


def check_key(key: str) -> None:
    if not key or "." in key:
        raise FormatError(f"sample key {key!r} is empty or contains a dot (webdataset splits keys at the first dot)")
    if key.startswith("/") or key.endswith("/") or "//" in key or key.startswith("__"):
        raise FormatError(f"sample key {key!r} is not a clean relative name")


class ShardWriter:
    """Writes samples into shards `<stem>-<part:02d>.tar`, rolling over at `shard_bytes`.

    Size is counted on the bytes actually written (headers, padding and end blocks included); a
    shard holds at least one sample, so a sample bigger than the target gets a shard of its own.
    Each shard is written to `<name>.tmp` and renamed when complete, so a final name never points
    at a partial shard. A failed write (a full disk) raises `OutputError` naming the shard; leaving
    the `with` block on any error removes the temporary file.
    """

    def __init__(
        self,
        directory: str,
        stem: str,
        *,
        shard_bytes: int,
        encoder: Encoder,
        on_complete: Callable[[str, ShardRow], None] | None = None,
    ):
        self.directory = directory
        self.stem = stem
        self.shard_bytes = shard_bytes
        self.encoder = encoder
        self.on_complete = on_complete
        self.rows: list[ShardRow] = []
        self._file = None
        self._hash = None
        self._size = 0
        self._samples = 0
        self._keys: set[str] = set()
        self._index = IndexBuilder()
        self._part = 0

    # -- internal
    def _name(self) -> str:
        return f"{self.stem}-{self._part:02d}.tar"

    def _open(self) -> None:
        path = os.path.join(self.directory, self._name() + ".tmp")
        try:
            self._file = open(path, "wb", buffering=WRITE_BUFFER)
        except OSError as error:
            raise output_error(path, error) from None
        self._hash = hashlib.sha256()
        self._size = 0
        self._samples = 0
        self._keys = set()
        self._index = IndexBuilder()

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as error:
            raise output_error(self._file.name, error) from None
        self._hash.update(data)
        self._size += len(data)

    def _close_shard(self) -> None:
        index = self._index.encode()
        index_offset = self._size
        member = tarformat.header(INDEX_MEMBER, len(index)) + index + tarformat.padding(len(index))
        self._write(member)
        self._write(tarformat.END_OF_ARCHIVE)
        name = self._name()
        final = os.path.join(self.directory, name)
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(final + ".tmp", final)
        except OSError as error:
            raise output_error(final + ".tmp", error) from None
        self._file = None
        row = ShardRow(name, self._samples, self._size, self._hash.hexdigest(), index_offset, len(member), digest_text(member))
        self.rows.append(row)
        if self.on_complete:
            self.on_complete(final, row)
        self._part += 1

    # -- public
    def write(self, key: str, fields: dict[str, Any]) -> None:
        check_key(key)
        members = self.encoder.encode_fields(key, fields)
        if not members:
            raise FormatError(f"sample {key!r} has no fields")
        blob = bytearray()  # the sample's bytes, written (and hashed) in one call
        spans = []
        entry_bound = len(key) + 16  # msgpack bytes of its index entry, at most
        stem = key + "."
        header, padding = tarformat.header, tarformat.padding
        for member, data in members:
            start = len(blob)
            size = len(data)
            blob += header(stem + member, size)
            blob += data
            blob += padding(size)
            spans.append((member, size, start, len(blob)))
            entry_bound += len(member) + 24
        tail = self._index.bound + entry_bound + len(tarformat.END_OF_ARCHIVE)
        if self._file is not None and self._samples and self._size + len(blob) + tail > self.shard_bytes:
            self._close_shard()
        if self._file is None:
            self._open()
        if key in self._keys:
            raise FormatError(f"duplicate sample key {key!r} in shard {self._name()}")
        self._keys.add(key)
        self._index.add(key, self._size, blob, spans)
        self._write(blob)
        self._samples += 1

    def close(self) -> list[ShardRow]:
        if self._file is not None:
            self._close_shard()
        return self.rows

    def abort(self) -> None:
        if self._file is not None:
            path = self._file.name
            try:
                self._file.close()
            except OSError:
                pass  # flushing the buffer onto a full disk fails again; the file goes anyway
            self._file = None
            remove_quietly(path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
