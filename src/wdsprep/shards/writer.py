"""The shard writer: whole samples, deterministic bytes, bounded size, atomic completion."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import FormatError
from . import tarformat
from .codec import Encoder
from .storage import output_error, remove_quietly


@dataclass
class ShardRow:
    name: str
    samples: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict:
        return {"name": self.name, "samples": self.samples, "bytes": self.bytes, "sha256": self.sha256}


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
        self._part = 0

    # -- internal
    def _name(self) -> str:
        return f"{self.stem}-{self._part:02d}.tar"

    def _open(self) -> None:
        path = os.path.join(self.directory, self._name() + ".tmp")
        try:
            self._file = open(path, "wb")
        except OSError as error:
            raise output_error(path, error) from None
        self._hash = hashlib.sha256()
        self._size = 0
        self._samples = 0
        self._keys = set()

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as error:
            raise output_error(self._file.name, error) from None
        self._hash.update(data)
        self._size += len(data)

    def _close_shard(self) -> None:
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
        row = ShardRow(name, self._samples, self._size, self._hash.hexdigest())
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
        blobs = []
        for member, data in members:
            name = f"{key}.{member}"
            blobs.append(tarformat.header(name, len(data)))
            blobs.append(data)
            blobs.append(tarformat.padding(len(data)))
        sample_size = sum(len(b) for b in blobs)
        if self._file is not None and self._samples and self._size + sample_size + len(tarformat.END_OF_ARCHIVE) > self.shard_bytes:
            self._close_shard()
        if self._file is None:
            self._open()
        if key in self._keys:
            raise FormatError(f"duplicate sample key {key!r} in shard {self._name()}")
        self._keys.add(key)
        for blob in blobs:
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
