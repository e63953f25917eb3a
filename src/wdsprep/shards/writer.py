"""The shard writer: whole samples, deterministic bytes, bounded size, atomic completion.

Every shard ends with its sample index (`shards/index.py`: member `__wdsprep_index__`, then the
end-of-archive blocks); the index's position, size and digest go in the shard's manifest row. That
holds by construction: `ShardFile` is the one place a shard's bytes are written, and its `finish()`
is the only way a shard is completed, index included. `ShardWriter` (encoding, roll-over and the
balance of the last two shards) and `wdsprep reindex` (older shards) both write through it.

Balance. A writer that rolls over keeps its latest full shard complete but unpublished (under its
temporary name) until it knows whether the next shard is the last one. When the last shard ends
under half of `shard_bytes`, the two are written again through `ShardFile`, their samples (read
back from the two files, already encoded) split where their bytes halve as closely as whole
samples allow with both within `shard_bytes`; a unit whose samples overran its size estimate thus
ends in two balanced shards, not a full one and a near-empty one. The split is a function of the
samples' bytes, so shards stay byte-identical on every executor and worker count.

Per-sample work is kept to what varies per sample (issue #15 measures it against MosaicML MDS):
field names are checked and codecs picked once per (field, value class) (`Encoder`), the
size-dependent part of a tar header is cached (`tarformat.header`), and a shard reaches the disk
through a 1 MiB buffer. None of it changes a byte (tests/core/test_writer_bytes.py pins them).

Packing (`pack=True`, `wdsprep convert --pack`): small samples are gathered into blocks, each
written as one member (shards/packed.py says which samples and the block's format). A block is an
entry like a sample (one index entry per member group, `rows` naming its samples), so roll-over and
balance move whole blocks; a shard's `samples` counts the samples inside them. Blocks close at the
same samples whatever the executor or worker count: the bytes stay deterministic.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..errors import FormatError, OutputError
from . import tarformat
from .codec import Encoder
from .index import FRAMING_BOUND, INDEX_MEMBER, IndexBuilder, digest_text, entry_bound
from .packed import PACK_BLOCK_BYTES, PACK_FIELD, PACK_MEMBER, encode_block, packable
from ..storage.files import open_regular, output_error, refuse_unless_regular, remove_quietly


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
    """The key rule readers hold every member name to (`tarformat.split_key`): no dot, and a plain
    name, never a path."""
    if not key or "." in key:
        raise FormatError(f"sample key {key!r} is empty or contains a dot (webdataset splits keys at the first dot)")
    if not tarformat.KEY.fullmatch(key):
        raise FormatError(f"sample key {key!r} is not a plain name (no '/', '\\', NUL or leading '__': readers refuse paths)")


class ShardFile:
    """One shard being written at `<directory>/<name>.tmp`: encoded samples appended in order, then
    `finish()` appends the index member and the end-of-archive blocks, fsyncs (when `durable`) and
    returns the row (index fields included); `publish()` renames it to `name`; `abort()` removes it.
    A conversion writes its shards not `durable` and makes them durable all at once before its
    manifest (`Store.sync`): one fsync per tiny shard kept its workers waiting on the disk."""

    def __init__(self, directory: str, name: str, durable: bool = True, packing: bool = False):
        self.name = name
        self.durable = durable
        self.path = os.path.join(directory, name)
        self.temporary = self.path + ".tmp"
        # a temporary name that is a symlink or a FIFO (not ours) is refused, never followed or waited on
        fd = open_regular(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._file = open(fd, "wb", buffering=WRITE_BUFFER)
        self._hash = hashlib.sha256()
        self.size = 0
        self.index = IndexBuilder(packing)
        self._keys: set[str] = set()
        self.row: ShardRow | None = None

    @property
    def samples(self) -> int:
        return len(self.index.sample_keys)

    @property
    def entries(self) -> int:
        """Samples stored whole and packed blocks: what roll-over and balance move."""
        return len(self.index.keys)

    def _write(self, data: bytes | bytearray) -> None:
        try:
            self._file.write(data)
        except OSError as error:
            raise output_error(self.temporary, error) from None
        self._hash.update(data)
        self.size += len(data)

    def append(self, key: str, blob: bytes | bytearray, spans: list[tuple[str, int, int, int]],
               rows: list[str] | None = None) -> None:
        """Sample `key` as its tar bytes `blob`; `spans`: (member, data size, start, end) in `blob`;
        `rows`: the keys of the samples it holds when it is a packed block."""
        for sample_key in rows or (key,):
            if sample_key in self._keys:
                raise FormatError(f"duplicate sample key {sample_key!r} in shard {self.name}")
            self._keys.add(sample_key)
        self.index.add(key, self.size, blob, spans, rows)
        self._write(blob)

    def finish(self, reindexed_from: str | None = None) -> ShardRow:
        """Append the index and the end blocks and make the file durable (under its temporary name);
        `reindexed_from`: see `IndexBuilder.encode`."""
        index = self.index.encode(reindexed_from)
        index_offset = self.size
        member = tarformat.header(INDEX_MEMBER, len(index)) + index + tarformat.padding(len(index))
        self._write(member)
        self._write(tarformat.END_OF_ARCHIVE)
        try:
            self._file.flush()
            if self.durable:
                os.fsync(self._file.fileno())
            self._file.close()
        except OSError as error:
            raise output_error(self.temporary, error) from None
        self._file = None
        self.row = ShardRow(self.name, self.samples, self.size, self._hash.hexdigest(), index_offset, len(member), digest_text(member))
        return self.row

    def publish(self) -> str:
        """Rename the finished file to its final name (refused if that name is not a regular file);
        returns that path."""
        refuse_unless_regular(self.path)
        try:
            os.replace(self.temporary, self.path)
        except OSError as error:
            raise output_error(self.temporary, error) from None
        return self.path

    def abort(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # flushing the buffer onto a full disk fails again; the file goes anyway
            self._file = None
        remove_quietly(self.temporary)

    def sample_bytes(self) -> list[int]:
        """Bytes each sample occupies (its members' headers, data and padding), in order."""
        ends = [*self.index.offsets[1:], self.size - self.row.index_bytes - len(tarformat.END_OF_ARCHIVE)]
        return [end - start for start, end in zip(self.index.offsets, ends)]

    def detach(self) -> Iterator[tuple[str, bytes, list]]:
        """(key, blob, spans) of each sample of the finished file, read back one at a time. The file
        is opened and unlinked here (its bytes live until the last sample is read), so its name is
        free at once for the shard that replaces it."""
        handle = open(self.temporary, "rb")
        remove_quietly(self.temporary)
        return self._read_back(handle)

    def _read_back(self, handle) -> Iterator[tuple[str, bytes, list, list | None]]:
        with handle:
            for (key, offset, names, sizes, rows), length in zip(self.index.entries(), self.sample_bytes()):
                blob = os.pread(handle.fileno(), length, offset)
                if len(blob) != length:
                    raise OutputError(f"{self.temporary}: shorter than written")
                yield key, blob, _spans(names, sizes), rows


def _spans(names: tuple, sizes: list[int]) -> list[tuple[str, int, int, int]]:
    """(member, data size, start, end) of a sample's members laid out back to back."""
    spans, at = [], 0
    for name, size in zip(names, sizes):
        end = at + tarformat.BLOCK + size + (-size % tarformat.BLOCK)
        spans.append((name, size, at, end))
        at = end
    return spans


def balance_cut(first: ShardFile, last: ShardFile, shard_bytes: int) -> int:
    """How many entries (samples, or packed blocks) the first of two finished shards keeps so that the
    two halve their bytes as closely as whole entries allow, the second (with the first's moved
    entries) within `shard_bytes` by an upper bound on its index. `first.entries` when no cut does better."""
    spans = first.sample_bytes() + last.sample_bytes()
    packing = first.index.packing
    entries = [entry_bound(key, len(names), rows, packing)
               for key, _, names, _, rows in (*first.index.entries(), *last.index.entries())]
    total = sum(spans)
    # the second shard's one index framing, the layouts of both shards' samples, its end blocks
    fixed = first.index.layout_bound() + last.index.layout_bound() - FRAMING_BOUND + len(tarformat.END_OF_ARCHIVE)
    head = sum(spans[: first.entries])
    tail = total - head + sum(entries[first.entries :])  # the second shard's samples and index entries
    best, best_gap = first.entries, abs(total - 2 * head)
    for k in range(first.entries - 1, 0, -1):  # one more of the first shard's samples moves each step
        head -= spans[k]
        tail += spans[k] + entries[k]
        if tail + fixed > shard_bytes:
            break
        gap = abs(total - 2 * head)
        if gap >= best_gap:
            break  # past the middle: moving more only unbalances
        best, best_gap = k, gap
    return best


class ShardWriter:
    """Writes samples into shards `<stem>-<part:02d>.tar`, rolling over at `shard_bytes`.

    Size is counted on the bytes actually written (headers, padding, index and end blocks
    included); a shard holds at least one sample, so a sample bigger than the target gets a shard
    of its own. Each shard is written to `<name>.tmp` (a `ShardFile`) and renamed when complete, so
    a final name never points at a partial shard; the last two are balanced (module docstring)
    before they are renamed. A failed write (a full disk) raises `OutputError` naming the shard;
    leaving the `with` block on any error removes the temporary files.
    """

    def __init__(
        self,
        directory: str,
        stem: str,
        *,
        shard_bytes: int,
        encoder: Encoder,
        on_complete: Callable[[str, ShardRow], None] | None = None,
        durable: bool = True,
        pack: bool = False,
    ):
        self.directory = directory
        self.durable = durable  # each shard fsynced when finished (see ShardFile)
        self.stem = stem
        self.shard_bytes = shard_bytes
        self.encoder = encoder
        self.on_complete = on_complete
        self.rows: list[ShardRow] = []
        self._shard: ShardFile | None = None  # the shard being written
        self._held: ShardFile | None = None  # the latest full shard: finished, not yet renamed
        self._part = 0
        self.pack = pack
        # a block closes at this many bytes of rows: a few blocks per shard even at a small --shard-bytes
        self.block_bytes = max(1, min(PACK_BLOCK_BYTES, shard_bytes // 8))
        self._pending: list[tuple[str, list]] = []  # the block being gathered: (key, members) of its samples
        self._pending_bytes = 0

    # -- internal
    def _name(self, part: int) -> str:
        return f"{self.stem}-{part:02d}.tar"

    def _publish(self, shard: ShardFile) -> None:
        path = shard.publish()
        self.rows.append(shard.row)
        if self.on_complete:
            self.on_complete(path, shard.row)

    def _roll_over(self) -> None:
        """The current shard is full: finish and hold it; the one held before is renamed."""
        self._shard.finish()
        if self._held is not None:
            self._publish(self._held)
        self._held, self._shard = self._shard, None
        self._part += 1

    def _balance(self) -> None:
        """The held shard and the last one written again through new `ShardFile`s of the same names,
        their samples split at `balance_cut` (nothing changes when no cut does better)."""
        first, last = self._held, self._shard
        keep = balance_cut(first, last, self.shard_bytes)
        if keep == first.entries:
            return
        samples = itertools.chain(first.detach(), last.detach())
        self._held = ShardFile(self.directory, first.name, self.durable, self.pack)
        for sample in itertools.islice(samples, keep):
            self._held.append(*sample)
        self._held.finish()
        self._shard = ShardFile(self.directory, last.name, self.durable, self.pack)
        for sample in samples:
            self._shard.append(*sample)
        self._shard.finish()

    # -- public
    def write(self, key: str, fields: dict[str, Any]) -> None:
        check_key(key)
        members = self.encoder.encode_fields(key, fields)
        if not members:
            raise FormatError(f"sample {key!r} has no fields")
        if self.pack:
            if any(member.split(".", 1)[0] == PACK_FIELD for member, _ in members):
                raise FormatError(f"sample {key!r}: the field {PACK_FIELD!r} is reserved when packing (--pack)")
            if packable(members):
                if self._pending and [name for name, _ in self._pending[0][1]] != [name for name, _ in members]:
                    self._flush_block()  # a block's rows share their member names
                self._pending.append((key, members))
                self._pending_bytes += sum(len(data) for _, data in members)
                if self._pending_bytes >= self.block_bytes:
                    self._flush_block()
                return
            self._flush_block()
        self._append(key, members)

    def _flush_block(self) -> None:
        """The gathered samples written as one packed block (shards/packed.py), keyed by its first."""
        if not self._pending:
            return
        keys = [key for key, _ in self._pending]
        names = [name for name, _ in self._pending[0][1]]
        block = encode_block(keys, names, [[data for _, data in members] for _, members in self._pending])
        self._pending, self._pending_bytes = [], 0
        self._append(keys[0], [(PACK_MEMBER, block)], keys)

    def _append(self, key: str, members: list, rows: list[str] | None = None) -> None:
        """A sample's members (or a block's one member, `rows` its samples' keys) as one entry, rolling over first when it would not fit."""
        blob = bytearray()  # the sample's bytes, written (and hashed) in one call
        spans = []
        stem = key + "."
        header, padding = tarformat.header, tarformat.padding
        for member, data in members:
            start = len(blob)
            size = len(data)
            blob += header(stem + member, size)
            blob += data
            blob += padding(size)
            spans.append((member, size, start, len(blob)))
        shard = self._shard
        if shard is not None and shard.samples:
            tail = shard.index.bound_after(key, spans, rows) + len(tarformat.END_OF_ARCHIVE)
            if shard.size + len(blob) + tail > self.shard_bytes:
                self._roll_over()
        if self._shard is None:
            self._shard = ShardFile(self.directory, self._name(self._part), self.durable, self.pack)
        self._shard.append(key, blob, spans, rows)

    def close(self) -> list[ShardRow]:
        self._flush_block()
        if self._shard is not None:
            self._shard.finish()
            if self._held is not None and self._shard.size < self.shard_bytes / 2:
                self._balance()
        for shard in (self._held, self._shard):
            if shard is not None:
                self._publish(shard)
        self._held = self._shard = None
        return self.rows

    def abort(self) -> None:
        for shard in (self._held, self._shard):
            if shard is not None:
                shard.abort()
        self._held = self._shard = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
