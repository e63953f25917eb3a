"""Reading samples [start, stop) of one shard, checked against its manifest row before each yield.

Two paths, one contract: a sample is yielded only after every byte it occupies in the shard
(headers, data, padding of each member) was checked, and a shard whose sample count or tail bytes
differ from its manifest row raises `ShardError` before its first sample.

- Indexed shards (rows with `index_offset`/`index_bytes`/`index_digest`, see `shards/index.py`):
  the index and the end-of-archive blocks are read first (one read locally, one Range request
  remotely) and checked against the row. No tar header is parsed after that.
  Local and cached shards are memory-mapped: `MappedShard.checked()` digests each member's bytes
  (header, data, padding) where they lie, reading the index's columns in place, then each member's
  data is copied once into its own bytearray (the one copy; decoders build writable arrays on it
  without another). With `lazy=True` (the dataset) the check is done as the sample is read but the
  copy only when `MappedShard.take(i)` is called, so a shuffle buffer of 1,000 samples holds sample
  numbers (plain ints: no bytes, and nothing the cyclic GC tracks), and each copy lands in memory
  the previous sample freed. `take_decoded(i)` decodes each member straight from the mapping
  instead (the dataset's fused `wdsprep.decode()`): the same values as `decode_sample(take(i))`,
  without the raw sample in between. The mapping is unmapped when its last view goes. A shard must
  not be truncated in place while mapped (shards are immutable; cache entries are replaced by
  rename, never rewritten).
  Remote shards are read sample by sample: each member's data straight into its own bytearray
  (`readinto`), its header and padding into a scratch block, the three digested as they arrive.
  The dataset's remote stream is a piece's own bytes fetched ahead (stream/remote.py), which hands
  over the shard's index with it; this check is the same on that stream as on any other.
  A mismatch names the shard and the member.
- Shards without an index (older manifests): the tar is walked by `tarformat.TarCursor` (samples
  grouped by `tarformat.group_samples`, the one grouping) while its bytes are hashed with sha256; the piece's last sample is held back until the whole shard was
  read and its size, sha256 and sample count match the row. Corruption inside a sample is then
  reported before the shard's last sample, not before the sample itself; every piece of such a
  shard reads the whole shard.
"""
from __future__ import annotations

import hashlib
import io
import mmap
import os
from typing import BinaryIO, Iterator

from ..errors import ShardError
from ..shards.codec import DECODE_ERRORS, member_decoder
from ..shards.index import ShardIndex, digest_of, has_index, xxh3_64
from ..shards.tarformat import BLOCK, TarCursor, group_samples
from ..storage import open_from


def _read_from(url: str, offset: int, length: int) -> bytes:
    """Up to `length` bytes of `url` from `offset` (one Range request remotely)."""
    with open_from(url, offset) as stream:
        return stream.read(length)


def load_index(url: str, row: dict, fd: int | None = None) -> ShardIndex:
    """The shard's index, read from the open file `fd` (local or cached shards) or by its own request.

    One byte more than the row's size is asked for, so a longer shard is caught as well as a shorter.
    """
    offset, length = row["index_offset"], row["bytes"] - row["index_offset"] + 1
    tail = os.pread(fd, length, offset) if fd is not None else _read_from(url, offset, length)
    return ShardIndex.from_tail(url, row, tail)


def _fileno(stream: BinaryIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def read_samples(url: str, row: dict, start: int, stop: int, stream: BinaryIO, *, lazy: bool = False,
                 index: ShardIndex | None = None) -> Iterator:
    """Raw samples `start` to `stop` (exclusive) of the shard `row` describes, read from `stream`.

    With `lazy`, a mapped (local or cached) shard yields one `MappedShard` and nothing else: its
    `checked()` yields each sample's number (an int) once its bytes are checked, and `take(number)`
    copies it out when wanted. Samples read from a stream are dicts either way. `index`: the shard's
    index, already loaded and checked against `row` (the read-ahead's: stream/remote.py), else it is
    read first.
    """
    if has_index(row):
        return _indexed(url, row, start, stop, stream, lazy, index)
    return _hashed(url, row, start, stop, stream)


def _indexed(url: str, row: dict, start: int, stop: int, stream: BinaryIO, lazy: bool, index: ShardIndex | None) -> Iterator:
    fd = _fileno(stream)
    if index is None:
        index = load_index(url, row, fd)
    stop = min(stop, len(index))
    if start >= stop:
        return
    if start == 0 and index.offsets[0] != 0:
        raise ShardError(url, f"index: the first sample starts at byte {index.offsets[0]}, not 0")
    if fd is not None:
        # local or cached: check and copy members straight out of the mapped shard; the mapping is
        # not closed here but unmapped when its last view goes (lazy samples may outlive this loop)
        shard = MappedShard(url, index, memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ)), start, stop)
        if lazy:
            yield shard
            return
        for i in shard.checked():
            yield shard.take(i)
        return
    ends = list(index.offsets[start + 1 : stop])
    ends.append(index.sample_end(stop - 1))
    if index.offsets[start]:
        stream.seek(index.offsets[start])
    scratch = memoryview(bytearray(BLOCK))
    take = getattr(stream, "take", None)  # the read-ahead's in-memory blocks (stream/remote.py)
    for i, end in zip(range(start, stop), ends):
        yield _streamed(url, index, i, end, stream, scratch, take)


def _copy_out(url: str, index: ShardIndex, i: int, view: memoryview) -> dict:
    """The checked sample i of a mapped shard, each member's data in its own bytearray (the
    caller's own, writable copy: decoders build arrays on it without another)."""
    at, k, sizes = index.offsets[i], index.first[i], index.sizes
    sample = {"__key__": index.keys[i], "__url__": url}
    for name in index.layouts[index.layout[i]]:
        size = sizes[k]
        sample[name] = bytearray(view[at + BLOCK : at + BLOCK + size])
        at += BLOCK + size + (-size % BLOCK)
        k += 1
    return sample


class MappedShard:
    """Samples [start, stop) of a mapped shard: `checked()` checks them in order, `take(i)` copies
    sample i out as a raw sample and `take_decoded(i, ...)` as a decoded one (only samples that
    `checked()` yielded). Holding it keeps the shard mapped."""

    __slots__ = ("url", "index", "view", "start", "stop", "plans")

    def __init__(self, url: str, index: ShardIndex, view: memoryview, start: int, stop: int):
        self.url, self.index, self.view, self.start, self.stop = url, index, view, start, stop
        self.plans: dict[tuple, tuple] = {}  # (layout, strip, torch) -> ((member, field, decode), ...)

    def checked(self, tag: int = 0) -> Iterator[int]:
        """`tag | i` for each sample i, once every byte it occupies (each member's header, data and
        padding) matched its digest in the index, and the sample ends where the next one starts."""
        index, view, url = self.index, self.view, self.url
        offsets, first, sizes, digests = index.offsets, index.first, index.sizes, index.digests
        count, k = len(offsets), first[self.start]
        for i in range(self.start, self.stop):
            at, last = offsets[i], first[i + 1]
            while k < last:
                size = sizes[k]
                end = at + BLOCK + size + (-size % BLOCK)
                if digest_of(view[at:end]) != digests[k]:
                    raise _corrupt(url, index.keys[i], index.names(i)[k - first[i]])
                at = end
                k += 1
            if at != (offsets[i + 1] if i + 1 < count else index.index_offset):
                raise ShardError(url, f"index: sample {index.keys[i]!r} ends at byte {at}, the next one starts at {index.sample_end(i)}")
            yield tag | i

    def take(self, i: int) -> dict:
        return _copy_out(self.url, self.index, i, self.view)

    def take_decoded(self, i: int, strip: bool, torch: bool) -> dict:
        """Sample i decoded (`member_decoder`) straight from the mapping: what `decode_sample(take(i))`
        gives, without the raw sample in between (decoders copy what they keep: arrays stay writable)."""
        index, view = self.index, self.view
        layout = index.layout[i]
        plan = self.plans.get((layout, strip, torch))
        if plan is None:
            plan = self.plans[layout, strip, torch] = tuple(
                (name, *member_decoder(name, strip, torch)) for name in index.layouts[layout])
        key, at, k, sizes = index.keys[i], index.offsets[i], index.first[i], index.sizes
        sample = {"__key__": key, "__url__": self.url}
        try:
            for name, field, decode in plan:
                size = sizes[k]
                k += 1
                start = at + BLOCK
                at = start + size + (-size % BLOCK)
                sample[field] = decode(view[start : start + size])
        except DECODE_ERRORS as error:
            raise ShardError(self.url, f"member {key}.{name}: {error}") from None
        return sample


def _streamed(url: str, index: ShardIndex, i: int, end: int, stream: BinaryIO, scratch: memoryview, take=None) -> dict:
    """Sample i read from `stream`: each member's data straight into its own bytearray, its header
    and padding into `scratch`, all three digested on the way (the only copy). With `take` (the
    read-ahead stream's `take(n)`: a view of its next n bytes where they lie in one fetched block,
    else None), a member's header, data and padding are digested where they lie, in one call, and
    its data is copied out once, after the check."""
    key, at, k = index.keys[i], index.offsets[i], index.first[i]
    sample = {"__key__": key, "__url__": url}
    for name in index.layouts[index.layout[i]]:
        size, expected = index.sizes[k], index.digests[k]
        k += 1
        pad = -size % BLOCK
        span = take(BLOCK + size + pad) if take is not None else None
        if span is not None:
            if digest_of(span) != expected:
                raise _corrupt(url, key, name)
            data = bytearray(span[BLOCK : BLOCK + size])
        else:
            data = bytearray(size)
            digest = xxh3_64()
            for part in (scratch, data, scratch[:pad]):
                got = _fill(stream, part)
                if got != len(part):
                    raise ShardError(url, f"truncated shard: member {key}.{name} ends early (at byte {at + got})")
                digest.update(part)
            if digest.intdigest() != expected:
                raise _corrupt(url, key, name)
        sample[name] = data
        at += BLOCK + size + pad
    if at != end:
        raise ShardError(url, f"index: sample {key!r} ends at byte {at}, the next one starts at {end}")
    return sample


def _corrupt(url: str, key: str, name: str) -> ShardError:
    return ShardError(url, f"member {key}.{name}: corrupt (its header, data or padding differ from the shard's index)")


def _fill(stream: BinaryIO, buffer) -> int:
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        n = stream.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled


class Sha256Reader(io.RawIOBase):
    """Hashes what is read through it (`verify`, and the fallback check of shards without an index)."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.digest = hashlib.sha256()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
            self.count += n
        return n


def _hashed(url: str, row: dict, start: int, stop: int, stream: BinaryIO) -> Iterator[dict]:
    hashing = Sha256Reader(stream)
    cursor = TarCursor(io.BufferedReader(hashing, 1 << 20), url)
    held: dict | None = None
    count = 0
    for index, sample in group_samples(cursor, url, start, stop):
        count = index + 1
        if sample is not None:
            if held is not None:
                yield held
            held = sample
    cursor.skip()
    while hashing.readinto(bytearray(1 << 20)):
        pass
    if "samples" in row and count != row["samples"]:
        raise ShardError(url, f"shard holds {count} samples, manifest says {row['samples']}")
    if "bytes" in row and hashing.count != row["bytes"]:
        raise ShardError(url, f"shard is {hashing.count} bytes, manifest says {row['bytes']}")
    if row.get("sha256") and hashing.digest.hexdigest() != row["sha256"]:
        raise ShardError(url, "sha256 differs from the manifest row (corrupt or changed shard)")
    if held is not None:
        yield held
