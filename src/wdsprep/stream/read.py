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
  A mismatch names the shard and the member. `sample_at` reads one sample alone the same way
  (one bounded read of its bytes: what `wdsprep show` fetches of a picked sample).
- Shards without an index (older manifests, or a row that lost its index fields): no sample is
  yielded before the whole shard matched its row. A local or cached one (the stream is a file) is
  hashed whole (size and sha256) first, then walked by `tarformat.TarCursor` (samples grouped by
  `tarformat.group_samples`, the one grouping), its sample count checked at the end. A remote one
  is refused with one line naming `wdsprep reindex`, which gives it an index (spooling it to local
  disk first would break the rule that a remote read writes nothing locally unless a cache is asked
  for, and would make every piece of it download the whole shard).
- Every other reader of shard bytes goes through this module too, so no path yields an unchecked
  byte. Random access (`CheckedShard`: map-style datasets, the noisebase loader): the index is
  loaded once per shard, and a read of sample i is one bounded read of the members asked for, each
  member in it checked against its digest before anything is returned (an older local shard is
  hashed whole first and indexed in memory; an older remote one is refused the same way).
  `checked_samples` opens a URL and reads it through `read_samples`, for readers that hold a
  shard's URL and row rather than a pipeline (`wdsprep inspect`, DeepReg's block recovery).
"""
from __future__ import annotations

import hashlib
import io
import mmap
import os
from typing import BinaryIO, Iterator

from ..errors import ShardError
from ..shards.codec import DECODE_ERRORS, member_decoder
from ..shards.index import ROW_FIELDS, ShardIndex, digest_of, has_index, member_span, xxh3_64
from ..shards.tarformat import BLOCK, TarCursor, group_samples, index_samples
from ..storage import BUFFER, local_path, open_from, open_url, read_range


# a remote shard without an index: refused (module docstring), on every read path
UNINDEXED_REMOTE = (f"has no sample index (its manifest row has no {'/'.join(ROW_FIELDS)}), so it cannot be checked "
                    "before its samples are streamed; run `wdsprep reindex` on its directory or URL once")


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


def read_samples(url: str, row: dict, start: int, stop: int, stream: BinaryIO, *, lazy: bool = False) -> Iterator:
    """Raw samples `start` to `stop` (exclusive) of the shard `row` describes, read from `stream`.

    With `lazy`, a mapped (local or cached) shard yields one `MappedShard` and nothing else: its
    `checked()` yields each sample's number (an int) once its bytes are checked, and `take(number)`
    copies it out when wanted. Samples read from a stream are dicts either way.
    """
    if has_index(row):
        return _indexed(url, row, start, stop, stream, lazy)
    return _hashed(url, row, start, stop, stream)


def _indexed(url: str, row: dict, start: int, stop: int, stream: BinaryIO, lazy: bool) -> Iterator:
    fd = _fileno(stream)
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
    for i, end in zip(range(start, stop), ends):
        yield _streamed(url, index, i, end, stream, scratch)


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
                    name = index.names(i)[k - first[i]]
                    raise ShardError(url, f"member {index.keys[i]}.{name}: corrupt (its header, data or padding differ from the shard's index)")
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


def _streamed(url: str, index: ShardIndex, i: int, end: int, stream: BinaryIO, scratch: memoryview) -> dict:
    """Sample i read from `stream`: each member's data straight into its own bytearray, its header
    and padding into `scratch`, all three digested on the way (the only copy)."""
    key, at, k = index.keys[i], index.offsets[i], index.first[i]
    sample = {"__key__": key, "__url__": url}
    for name in index.layouts[index.layout[i]]:
        size, expected = index.sizes[k], index.digests[k]
        k += 1
        data = bytearray(size)
        pad = -size % BLOCK
        digest = xxh3_64()
        for part in (scratch, data, scratch[:pad]):
            got = _fill(stream, part)
            if got != len(part):
                raise ShardError(url, f"truncated shard: member {key}.{name} ends early (at byte {at + got})")
            digest.update(part)
        if digest.intdigest() != expected:
            raise ShardError(url, f"member {key}.{name}: corrupt (its header, data or padding differ from the shard's index)")
        sample[name] = data
        at += BLOCK + size + pad
    if at != end:
        raise ShardError(url, f"index: sample {key!r} ends at byte {at}, the next one starts at {end}")
    return sample


def sample_at(url: str, index: ShardIndex, i: int) -> dict:
    """Raw sample i of an indexed shard, fetched alone: one bounded read of exactly its bytes (a
    Range request remotely), checked against the index like every streamed sample."""
    start, end = index.offsets[i], index.sample_end(i)
    data = read_range(url, start, end - start)
    return _streamed(url, index, i, end, io.BytesIO(data), memoryview(bytearray(BLOCK)))


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
    """Hashes what is read through it (`wdsprep verify`)."""

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
    """Samples of a shard without an index, only once the whole shard matched its row (module docstring)."""
    fd = _fileno(stream)
    if fd is None:
        raise ShardError(url, UNINDEXED_REMOTE)
    check_whole(url, row, fd)
    stream.seek(0)
    cursor = TarCursor(stream, url)
    count = 0
    for index, sample in group_samples(cursor, url, start, stop):
        count = index + 1
        if sample is not None:
            yield sample
    if count != row["samples"]:
        raise ShardError(url, f"shard holds {count} samples, manifest says {row['samples']}")


def check_whole(url: str, row: dict, fd: int) -> None:
    """Raise `ShardError` unless the open file `fd` has exactly the row's size and sha256."""
    size = os.fstat(fd).st_size
    if size != row["bytes"]:
        raise ShardError(url, f"shard is {size} bytes, manifest says {row['bytes']}")
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, BUFFER, offset):
        digest.update(chunk)
        offset += len(chunk)
    if offset != size or digest.hexdigest() != row["sha256"]:
        raise ShardError(url, "sha256 differs from the manifest row (corrupt or changed shard)")


# ------------------------------------------------------------------ random access, checked
def checked_samples(url: str, row: dict, start: int = 0, stop: int | None = None) -> Iterator[dict]:
    """Raw samples `start` to `stop` of the shard `row` describes, opened here and read through
    `read_samples` (each checked before it is yielded): for readers that hold a URL and its row
    rather than a pipeline (`wdsprep inspect`, a stage re-reading the start of a shard)."""
    stop = row["samples"] if stop is None else min(stop, row["samples"])
    if start >= stop:
        return
    with open_url(url) as stream:
        yield from read_samples(url, row, start, stop, stream)


class CheckedShard:
    """One shard opened for random access (map-style datasets, per-sequence readers): `read(i,
    names)` gives members of sample i, each member's bytes (header, data, padding) checked against
    its digest in the shard's index before anything is returned.

    The index comes from `load_index` (checked against the row). A local shard without one (an older
    manifest) is hashed whole against its row first (`check_whole`), as the streaming path does, and
    its index is then made in memory from its headers and members (`_index_of_hashed`), so its reads
    are checked the same way; a remote one is refused with the line naming `wdsprep reindex`.
    A read is one bounded read of the bytes from the first to the last member asked for (`pread`
    locally, a Range request remotely); every member inside that span is checked. A local shard
    keeps one descriptor open (`pread` needs no shared offset: threads and forked workers share it);
    a pickled one (spawned workers) opens and loads again where it is unpickled; `close()` closes the
    descriptor, and the next read opens it again.
    """

    def __init__(self, url: str, row: dict):
        self.url, self.row, self.fd = url, row, None
        self.path = local_path(url)
        self.fd = None if self.path is None else os.open(self.path, os.O_RDONLY)
        try:
            if has_index(row):
                self.index = load_index(url, row, self.fd)
            elif self.fd is not None:
                self.index = _index_of_hashed(url, row, self.fd, self.path)
            else:
                raise ShardError(url, UNINDEXED_REMOTE)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        return {"url": self.url, "row": self.row}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], state["row"])

    def close(self) -> None:
        """Close the descriptor of a local shard (the next read opens it again)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit `os` may be gone already
            pass

    def read(self, i: int, names=None) -> dict:
        """Raw sample i (`__key__`, `__url__`, member -> bytearray), with only the members in `names`
        (all by default); every member in the span read is checked first."""
        index, url = self.index, self.url
        key, at, k = index.keys[i], index.offsets[i], index.first[i]
        spans = []  # (member, its number in the columns, first byte, data size)
        for name in index.names(i):
            size = index.sizes[k]
            spans.append((name, k, at, size))
            at += member_span(size)
            k += 1
        sample = {"__key__": key, "__url__": url}
        wanted = [span for span in spans if names is None or span[0] in names]
        if not wanted:
            return sample
        low, high = wanted[0][2], wanted[-1][2] + member_span(wanted[-1][3])
        if self.path is None:
            data = read_range(url, low, high - low)
        else:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDONLY)
            data = os.pread(self.fd, high - low, low)
        if len(data) != high - low:
            raise ShardError(url, f"truncated shard: sample {key!r} ends early (at byte {low + len(data)})")
        view = memoryview(data)
        for name, k, start, size in spans:
            if low <= start < high:
                part = view[start - low : start - low + member_span(size)]
                if digest_of(part) != index.digests[k]:
                    raise ShardError(url, f"member {key}.{name}: corrupt (its header, data or padding differ from the shard's index)")
                if names is None or name in names:
                    sample[name] = bytearray(part[BLOCK : BLOCK + size])
        return sample


def _index_of_hashed(url: str, row: dict, fd: int, path: str) -> ShardIndex:
    """The index of a local shard written without one, made in memory once the whole shard matched
    its row: where its members lie (`tarformat.index_samples`, from the headers) and the digests a
    written index would hold, so `CheckedShard` checks its reads alike. Only wdsprep's own layout is
    indexed (one header per member, a sample's members back to back from byte 0)."""
    check_whole(url, row, fd)
    keys, offsets, layout, sizes, digests = [], [], [], [], []
    layouts: dict[tuple, int] = {}
    end = 0
    for key, members in index_samples(path):
        keys.append(key)
        offsets.append(end)
        layout.append(layouts.setdefault(tuple(members), len(layouts)))
        for name, (at, size) in members.items():
            if at != end + BLOCK:
                raise ShardError(url, f"member {key}.{name} is not where a wdsprep shard has it; "
                                      "run `wdsprep reindex` on its directory once")
            start, end = end, at + size + (-size % BLOCK)
            sizes.append(size)
            digests.append(digest_of(os.pread(fd, end - start, start)))
    if len(keys) != row["samples"]:
        raise ShardError(url, f"shard holds {len(keys)} samples, manifest says {row['samples']}")
    return ShardIndex(url, tuple(keys), tuple(offsets), tuple(layout), tuple(layouts), tuple(sizes), tuple(digests), end)
