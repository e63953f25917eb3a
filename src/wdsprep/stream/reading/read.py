"""Reading samples [start, stop) of one shard, checked against its manifest row before each yield.

Two paths, one contract: a sample is yielded only after every byte it occupies in the shard
(headers, data, padding of each member) was checked, and a shard whose sample count or tail bytes
differ from its manifest row raises `ShardError` before its first sample.

- Indexed shards (rows with `index_offset`/`index_bytes`/`index_digest`, see `shards/index.py`):
  the index and the end-of-archive blocks are read first (one read locally, one Range request
  remotely; one byte more than the row's size is asked for, so a longer shard is caught as well as
  a shorter) and checked against the row. No tar header is parsed after that.
  Local and cached shards are read with `os.preadv` from a descriptor of their own (`LocalShard`),
  never memory-mapped: a mapping turns a shard cut short under a reader into SIGBUS, which kills
  the process (no Python handler can recover from it), where a read returns short. So a shard cut
  or rewritten in place while it is read is a `ShardError` naming it (a short read, or a digest
  that no longer matches), raised in the process or DataLoader worker that reads it, and a shard
  replaced by rename is read to its end from the file that was opened. `LocalShard.checked()`
  reads whole samples, `WINDOW` bytes at a time, into buffers it reuses (pooled across shards:
  fresh memory costs a page fault per 4 KiB) and digests each member where it landed, reading the
  index's columns in place; each member's data is then copied once into its own bytearray (the one
  copy; decoders build writable arrays on it without another). With `lazy=True` (the dataset) the
  check is done as the sample is read but the copy only when `LocalShard.take(i)` is called, so a
  shuffle buffer of 1,000 samples holds sample numbers (plain ints: nothing the cyclic GC tracks),
  and each copy lands in memory the previous sample freed; the windows read for the block being
  shuffled are kept for those takes (at most `KEEP` bytes; they go back to the pool once the block
  was delivered), and a sample no longer among them is read and digested again.
  `decode_members(i, members(i), ...)` decodes each member straight from the buffer instead (the
  dataset's fused `wdsprep.decode()`): the same values as `decode_sample(take(i))`, without the raw
  sample in between. A sample larger than `WINDOW` is read alone, straight into its members' own bytearrays,
  and digested there: as `checked()` reaches it when the samples are taken in order, when it is
  taken otherwise (a shuffle buffer: a second read of a large sample would cost more than it
  saves), so for such samples the error comes when the sample is taken, still before it is yielded.
  What is taken is always what was digested.
  Remote shards are read sample by sample: each member's data straight into its own bytearray
  (`readinto`), its header and padding into a scratch block, the three digested as they arrive.
  The dataset's remote stream is a piece's own bytes fetched ahead (stream/reading/readahead.py), which hands
  over the shard's index with it; this check is the same on that stream as on any other.
  A mismatch names the shard and the member (`_corrupt`), a shard that ends before the bytes its
  index lists the range and where it ended (`truncated`): the one member check, in one wording,
  on every path (the random access and the read-ahead raise these same errors).
- Adopted shards (`wdsprep index`: tars other tools wrote, shards/index.py): the same path; the
  index comes from the split's index file beside the manifest (`load_index`: one bounded read of the
  row's bytes there, checked against its digest), a member's head may be longer than one header (its
  PAX or GNU records, `ShardIndex.heads`), and before any sample the shard must be the one indexed:
  a local one's size and mtime (`check_identity`), a remote one's size and ETag on every response
  (`object_check`).
- Shards without an index (older manifests, or a row that lost its index fields): no sample is
  yielded before the whole shard matched its row. A local or cached one (the stream is a file) is
  hashed whole (size and sha256) first, then walked by `tarformat.TarCursor` (samples grouped by
  `tarformat.group_samples`, the one grouping), its sample count checked at the end. A remote one
  is refused with one line naming `wdsprep reindex`, which gives it an index (spooling it to local
  disk first would break the rule that a remote read writes nothing locally unless a cache is asked
  for, and would make every piece of it download the whole shard).
- Every other reader of shard bytes goes through this module or checks alike, so no path yields an
  unchecked byte. Random access, the one way to read sample i (`wdsprep.MapDataset`, `wdsprep
  show` and `inspect`, the map-style classes, the noisebase loader, a sample read again after its
  cache entry failed), is stream/reading/access.py's: the index loaded once per shard by the one
  loader here (`load_index`, handed the access's own bounded, counted read of the tail), a read of
  samples one bounded read of their bytes, each member checked against its digest (`_corrupt`
  names one that fails) before anything is returned (an older local shard is hashed whole first,
  `check_whole`, and indexed in memory; an older remote one is refused with `UNINDEXED_REMOTE`).
  `checked_samples` opens a URL and reads it through `read_samples`, for readers that hold a
  shard's URL and row rather than a pipeline (`wdsprep inspect`, DeepReg's block recovery).
"""
from __future__ import annotations

import hashlib
import io
import os
from bisect import bisect_right
from typing import BinaryIO, Callable, Iterator

from ...errors import ShardError
from ...kept import Kept
from ...shards.codec import DECODE_ERRORS, member_decoder
from ...shards.index import (ROW_FIELDS, ShardIndex, adopted, check_index_fields, digest_of, has_index, member_span,
                            miscounted, tiling_problem,
                            xxh3_64)
from ...shards.tarformat import BLOCK, TarCursor, group_samples
from ...storage import BUFFER, local_path, open_from, open_url, read_range
from ...storage.files import fill
from ...storage.resuming import ObjectCheck, wrong_size
from .unpack import read_packed


# a remote shard without an index: refused (module docstring), on every read path
UNINDEXED_REMOTE = (f"has no sample index (its manifest row has no {'/'.join(ROW_FIELDS)}), so it cannot be checked "
                    "before its samples are streamed; run `wdsprep reindex` on its directory or URL once")


def _read_from(url: str, offset: int, length: int) -> bytes:
    """Up to `length` bytes of `url` from `offset` (one Range request remotely)."""
    with open_from(url, offset) as stream:
        return stream.read(length)


class IndexCache(Kept):
    """Loaded shard indexes by (URL, the row's index digest), the last `budget` used (a `Kept`:
    thread-safe, a forked child starts with the parent's). One per process for the streaming readers
    (`INDEXES`: the local reader and the read-ahead); a `ShardAccess` keeps its own, larger one. An
    index is only ever kept after it was checked against its row."""

    @staticmethod
    def _key(url: str, row: dict) -> tuple:
        return url, row.get("index_digest") or row.get("sha256")  # an older shard's index: made from its bytes

    def get(self, url: str, row: dict) -> ShardIndex | None:
        return super().get(self._key(url, row))

    def put(self, url: str, row: dict, index: ShardIndex) -> ShardIndex:
        return super().put(self._key(url, row), index)


INDEXES = IndexCache(64)  # the streaming readers' indexes in this process


def load_index(url: str, row: dict, fd: int | None = None, cache: IndexCache | None = INDEXES,
               read_tail: Callable[[], bytes | bytearray] | None = None) -> ShardIndex:
    """The shard's index: from `cache`, else read from the open file `fd` (local or cached shards),
    by `read_tail()` (the tail [index_offset, bytes) as its caller reads remote bytes: random
    access's bounded, counted request), or by its own request, checked, and kept there. The one
    way an index is loaded.

    From a file or by its own request, one byte more than the row's size is asked for, so a longer
    shard is caught as well as a shorter (a `read_tail` checks the object's size on its response).
    The row's index fields are checked to lie within its shard first (`check_index_fields`).
    """
    check_index_fields(url, row)
    found = cache.get(url, row) if cache is not None else None
    if found is not None:
        return found
    if adopted(row):  # its index is in the split's index file beside the manifest (shards/index.py)
        index = ShardIndex.from_adopted(url, row, _adopted_index_bytes(url, row))
    else:
        offset, length = row["index_offset"], row["bytes"] - row["index_offset"] + 1
        if fd is not None:
            tail = os.pread(fd, length, offset)
        else:
            tail = read_tail() if read_tail is not None else _read_from(url, offset, length)
        index = ShardIndex.from_tail(url, row, tail)
    return cache.put(url, row, index) if cache is not None else index


def _adopted_index_bytes(url: str, row: dict) -> bytes:
    """An adopted shard's index, read from its split's index file (one bounded read: a Range request
    remotely); a file that cannot be read is the shard's `ShardError`, naming both."""
    where = row.get("index_url")
    if where is None:
        raise ShardError(url, "an adopted shard's row without the place of its index file (not loaded from its manifest)")
    try:
        return read_range(where, row["index_offset"], row["index_bytes"])
    except ShardError as error:
        raise ShardError(url, f"its index cannot be read ({error})") from None


def check_identity(url: str, row: dict, fd: int) -> None:
    """An adopted shard opened locally (`fd`) must be the file `wdsprep index` read: its size and
    mtime (a shard replaced or rewritten since is refused before any of its samples)."""
    stat = os.fstat(fd)
    mtime = row.get("mtime_ns")
    if stat.st_size != row["bytes"] or (mtime is not None and stat.st_mtime_ns != mtime):
        raise ShardError(url, f"changed since it was indexed (now {stat.st_size} bytes, mtime_ns {stat.st_mtime_ns}; "
                              f"indexed: {row['bytes']} bytes, mtime_ns {mtime}): run `wdsprep index` on it again")


def object_check(row: dict) -> ObjectCheck:
    """What every response for the row's shard must agree on: its size, and the ETag an adopted
    shard had when it was indexed (else the first response's)."""
    return ObjectCheck(size=row["bytes"], etag=row.get("etag"))


def _fileno(stream: BinaryIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def read_samples(url: str, row: dict, start: int, stop: int, stream: BinaryIO, *, lazy: bool = False,
                 in_order: bool = True, index: ShardIndex | None = None) -> Iterator:
    """Raw samples `start` to `stop` (exclusive) of the shard `row` describes, read from `stream`.

    With `lazy`, a local (or cached) shard yields one `LocalShard` and nothing else: its `checked()`
    yields each sample's number (an int) once its bytes are checked, and `take(number)` copies it
    out when wanted; `in_order` says the numbers are taken in the order they come, each before the
    next is asked for (no shuffle buffer). Samples read from a stream are dicts either way. `index`:
    the shard's index, already loaded and checked against `row` (the read-ahead's: stream/reading/readahead.py),
    else it is read first.
    """
    if has_index(row):
        return _indexed(url, row, start, stop, stream, lazy, in_order, index)
    return _hashed(url, row, start, stop, stream)


def _indexed(url: str, row: dict, start: int, stop: int, stream: BinaryIO, lazy: bool, in_order: bool,
             index: ShardIndex | None, entries: bool = False) -> Iterator:
    fd = _fileno(stream)
    if fd is not None and adopted(row) and local_path(url) is not None:  # a cached copy matched its sha256
        check_identity(url, row, fd)
    if index is None:
        index = load_index(url, row, fd)
    if index.pack is not None and not entries:  # packed blocks: the entries holding [start, stop) (stream/unpack.py)
        yield from read_packed(url, index, start, stop, lambda first, end: _indexed(
            url, row, first, end, stream, lazy, in_order, index, entries=True))
        return
    stop = min(stop, len(index))
    if start >= stop:
        return
    if fd is not None:
        # local or cached: read with pread from a descriptor of the shard's own (it outlives this
        # loop and the stream: lazy samples are taken after it), closed when the LocalShard goes
        shard = LocalShard(url, index, fd, start, stop, in_order=in_order or not lazy)
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
    take = getattr(stream, "take", None)  # the read-ahead's in-memory blocks (stream/reading/readahead.py)
    indexed_etag = row.get("etag")  # an adopted shard's, read as one stream: its response is checked once read
    for i, end in zip(range(start, stop), ends):
        sample = _streamed(url, index, i, end, stream, scratch, take)
        if indexed_etag is not None:
            object_check(row).check(url, None, getattr(getattr(stream, "raw", None), "etag", None))
            indexed_etag = None
        yield sample


WINDOW = 256 << 10  # bytes of a local shard read at a time: whole samples; a larger sample is read alone
KEEP = 32 << 20  # bytes of read windows a LocalShard taken in any order keeps at most for `take` (and the pool keeps)
IOV_MAX = 1020  # buffers per preadv call (the kernel allows 1024)


def _preadv(url: str, fd: int, buffers: list, offset: int) -> None:
    """Fill `buffers` (memoryviews) from the shard's bytes at `offset`, or raise `ShardError`: a
    shard that ends early was cut (or is being rewritten) since its index was read."""
    want = sum(map(len, buffers))
    try:
        done = os.preadv(fd, buffers[:IOV_MAX], offset)
        while done < want:  # a read cut short (by a signal, the iovec limit or the end of the file)
            rest, skip = [], done
            for buffer in buffers:
                if skip >= len(buffer):
                    skip -= len(buffer)
                else:
                    rest.append(buffer[skip:])
                    skip = 0
            got = os.preadv(fd, rest[:IOV_MAX], offset + done)
            if got == 0:
                raise truncated(url, offset, offset + want, offset + done)
            done += got
    except OSError as error:
        raise unreadable(url, offset, error) from None


class _Buffers:
    """`WINDOW`-byte read buffers that LocalShards are done with, for the next ones (fresh memory
    costs a page fault per 4 KiB, about as much as copying into it): at most `KEEP` bytes. Lock-free
    (a list's append and pop are atomic): `LocalShard.__del__` gives its buffers back, and a
    finalizer the cyclic GC runs may interrupt any code, including this class's own."""

    def __init__(self):
        self.free: list[memoryview] = []

    def get(self) -> memoryview:
        while self.free:
            try:
                buffer = self.free.pop()
            except IndexError:  # taken meanwhile by another thread
                break
            if len(buffer) >= WINDOW:
                return buffer
        return memoryview(bytearray(WINDOW))

    def put(self, buffers) -> None:
        for buffer in buffers:
            if len(buffer) == WINDOW and len(self.free) * WINDOW < KEEP:
                self.free.append(buffer)


_buffers = _Buffers()


class LocalShard:
    """Samples [start, stop) of a local (or cached) shard: `checked()` checks them in order,
    `take(i)` copies sample i out as a raw sample and `decode_members(i, members(i), ...)` decodes
    it (only samples that `checked()` yielded). Holding it keeps a descriptor of the shard open.

    The file is read with `os.preadv` into buffers of its own, never mapped: a shard cut while it
    is read gives a short read and one rewritten gives a digest mismatch, each a `ShardError`
    naming it (a mapping would fault instead: SIGBUS kills the process). Samples of up to `WINDOW`
    bytes are read whole, `WINDOW` bytes at a time, digested where they landed as `checked()` goes,
    and copied or decoded from there by `take`; taken in order (`in_order`: the dataset without a
    shuffle buffer) one buffer is reused, taken in any order (a shuffle buffer holds sample
    numbers) the windows read stay until `release()` (a block was delivered), at most `KEEP`
    bytes of them. A larger sample, and a small one whose
    window was dropped, is read alone, straight into its members' own bytearrays, and digested
    there (no second copy): a large one taken in order as `checked()` reaches it, otherwise when it
    is taken (`checked()` then checks only that it ends where the next one starts). Either way what
    is taken is what was digested."""

    __slots__ = ("url", "index", "fd", "start", "stop", "plans", "in_order", "keep", "begins", "windows",
                 "ready", "limit")

    def __init__(self, url: str, index: ShardIndex, fd: int, start: int, stop: int, in_order: bool = True):
        self.fd = -1
        self.url, self.index, self.start, self.stop, self.in_order = url, index, start, stop, in_order
        self.plans: dict[tuple, tuple] = {}  # (layout, strip, torch) -> ((member, field, decode), ...)
        self.keep = 0 if in_order else KEEP
        self.begins: list[int] = []  # first byte of each window held, oldest first
        self.windows: list[tuple] = []  # (first byte, end byte, its WINDOW-byte buffer)
        self.ready: tuple | None = None  # (i, members): a large sample read straight into its bytearrays
        self.limit = index.sample_end(stop - 1)
        self.fd = os.dup(fd)

    def __del__(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.release(keep_newest=False)

    def release(self, keep_newest: bool = True) -> None:
        """Give the pool the windows read so far, all or all but the newest: the samples checked so
        far were all taken (a shuffle block was delivered), and the ones still to come, if any, lie
        in the newest window or later."""
        drop = len(self.windows) - 1 if keep_newest else len(self.windows)
        if drop > 0:
            _buffers.put([window[2] for window in self.windows[:drop]])
            del self.windows[:drop], self.begins[:drop]

    # -- reading
    def _window(self, i: int) -> tuple:
        """(first byte, end byte, buffer) of whole samples from sample i on (at most `WINDOW`
        bytes) read into a buffer, dropping (and reusing) the oldest held beyond `keep` bytes."""
        offsets = self.index.offsets
        begin = offsets[i]
        j = bisect_right(offsets, begin + WINDOW, i + 1, self.stop)  # samples i..j-1 start within WINDOW
        end = offsets[j - 1] if j - 1 > i else self.index.sample_end(i)  # samples i..j-2 end within it
        if j == self.stop and self.limit <= begin + WINDOW:
            end = self.limit
        buffer = None
        while self.windows and (len(self.windows) + 1) * WINDOW > self.keep:
            old = self.windows.pop(0)[2]
            del self.begins[0]
            if buffer is None:
                buffer = old
            else:
                _buffers.put([old])
        if buffer is None:
            buffer = _buffers.get()
        _preadv(self.url, self.fd, [buffer[: end - begin]], begin)
        window = (begin, end, buffer)
        self.begins.append(begin)
        self.windows.append(window)
        return window

    def _direct(self, i: int) -> list:
        """Sample i's members read straight into their own bytearrays (one preadv) and digested."""
        index = self.index
        k, names = index.first[i], index.names(i)
        heads = index.heads[k : k + len(names)]
        scratch = memoryview(bytearray(sum(heads) + BLOCK * len(names)))  # heads and paddings
        members, buffers, at = [], [], 0
        for head, size in zip(heads, index.sizes[k : k + len(names)]):
            data = bytearray(size)
            members.append(data)
            pad = -size % BLOCK
            buffers += (scratch[at : at + head], memoryview(data), scratch[at + head : at + head + pad])
            at += head + pad
        _preadv(self.url, self.fd, buffers, index.offsets[i])
        for m, name in enumerate(names):
            digest = xxh3_64()
            for part in buffers[3 * m : 3 * m + 3]:
                digest.update(part)
            if digest.intdigest() != index.digests[k + m]:
                raise _corrupt(self.url, index.keys[i], name)
        return members

    def members(self, i: int) -> tuple:
        """Sample i's bytes: (a buffer, where its first header is in it), or (its members' own
        bytearrays, None)."""
        ready = self.ready
        if ready is not None and ready[0] == i:
            self.ready = None
            return ready[1], None
        at = self.index.offsets[i]
        w = bisect_right(self.begins, at) - 1
        if w >= 0:
            begin, end, view = self.windows[w]
            if at < end:
                return view, at - begin
        return self._direct(i), None  # read alone and digested: large, or its window was dropped

    def checked(self, tag: int = 0) -> Iterator[int]:
        """`tag | i` for each sample i, once every byte it occupies (each member's header, data and
        padding) matched its digest in the index, and the sample ends where the next one starts."""
        index, url = self.index, self.url
        offsets, first, sizes, digests, heads = index.offsets, index.first, index.sizes, index.digests, index.heads
        count, k = len(offsets), first[self.start]
        begin = end = 0
        view = None
        for i in range(self.start, self.stop):
            at, last = offsets[i], first[i + 1]
            next_at = offsets[i + 1] if i + 1 < count else index.index_offset
            if at >= end:  # windows hold whole samples: sample i is in the current one or in none
                if next_at - at <= WINDOW:
                    begin, end, view = self._window(i)
                else:  # read alone: now when taken in order, else when taken
                    if self.in_order:
                        self.ready = (i, self._direct(i))
                    at += sum(map(member_span, sizes[k:last], heads[k:last]))
                    k, end = last, 0
            if k < last:
                at -= begin
                while k < last:
                    size = sizes[k]
                    stop = at + heads[k] + size + (-size % BLOCK)
                    if digest_of(view[at:stop]) != digests[k]:
                        raise _corrupt(url, index.keys[i], index.names(i)[k - first[i]])
                    at = stop
                    k += 1
                at += begin
            if at != next_at:
                raise ShardError(url, tiling_problem(index.keys[i], at, next_at))
            yield tag | i

    def take(self, i: int) -> dict:
        """Sample i, each member's data in its own bytearray (the caller's own, writable copy:
        decoders build arrays on it without another)."""
        index = self.index
        buffer, at = self.members(i)
        sample = {"__key__": index.keys[i], "__url__": self.url}
        if at is None:
            sample.update(zip(index.names(i), buffer))
            return sample
        k, sizes, heads = index.first[i], index.sizes, index.heads
        for name in index.names(i):
            size, start = sizes[k], at + heads[k]
            sample[name] = bytearray(buffer[start : start + size])
            at = start + size + (-size % BLOCK)
            k += 1
        return sample

    def decode_members(self, i: int, members: tuple, strip: bool, torch: bool, with_url: bool = True) -> dict:
        """Sample i decoded from `members(i)` (split from it so that a caller can tell a shard that
        cannot be read, raised by `members`, from a member that does not decode, raised here), with
        its `__url__` or (`with_url` False: a decode stage that drops it) without."""
        index = self.index
        layout = index.layout[i]
        plan = self.plans.get((layout, strip, torch))
        if plan is None:
            plan = self.plans[layout, strip, torch] = tuple(
                (name, *member_decoder(name, strip, torch)) for name in index.layouts[layout])
        buffer, at = members
        key = index.keys[i]
        sample = {"__key__": key, "__url__": self.url} if with_url else {"__key__": key}
        try:
            if at is None:
                for (name, field, decode), data in zip(plan, buffer):
                    sample[field] = decode(data)
                return sample
            k, sizes, heads = index.first[i], index.sizes, index.heads
            for name, field, decode in plan:
                size = sizes[k]
                start = at + heads[k]
                k += 1
                at = start + size + (-size % BLOCK)
                sample[field] = decode(buffer[start : start + size])
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
        size, expected, head = index.sizes[k], index.digests[k], index.heads[k]
        k += 1
        pad = -size % BLOCK
        span = take(head + size + pad) if take is not None else None
        where = at  # the shard byte the next part starts at
        if span is not None:
            if digest_of(span) != expected:
                raise _corrupt(url, key, name)
            data = bytearray(span[head : head + size])
        else:
            data = bytearray(size)
            digest = xxh3_64()
            before = scratch[:head] if head <= len(scratch) else memoryview(bytearray(head))  # an adopted member's records
            for part in (before, data, scratch[:pad]):
                got = fill(stream, part)
                if got != len(part):
                    raise truncated(url, at, at + head + size + pad, where + got, f"{key}.{name}")
                digest.update(part)
                where += got
            if digest.intdigest() != expected:
                raise _corrupt(url, key, name)
        sample[name] = data
        at += head + size + pad
    if at != end:
        raise ShardError(url, tiling_problem(key, at, end))
    return sample


def _corrupt(url: str, key: str, name: str) -> ShardError:
    """The one wording of a member that fails its digest."""
    return ShardError(url, f"member {key}.{name}: corrupt (its header, data or padding differ from the shard's index)")


def unreadable(url: str, offset: int, error: OSError) -> ShardError:
    """The one wording of a local shard whose read failed (an I/O error, not a short read)."""
    return ShardError(url, f"read error at byte {offset}: {error.strerror or error}")


def wrong_sha256(url: str) -> ShardError:
    """The one wording of a shard whose bytes are not the ones its row's sha256 names."""
    return ShardError(url, "sha256 differs from the manifest row (corrupt or changed shard)")


def truncated(url: str, start: int, stop: int, end: int, member: str | None = None) -> ShardError:
    """The one wording of a shard that ended at byte `end`, before all of bytes [start, stop) its
    index (or its manifest row) lists were read: on every read path, local or remote, streamed,
    read ahead or read at random (`member`: the member those bytes are, where one is known)."""
    what = f" (member {member})" if member is not None else ""
    return ShardError(url, f"truncated shard: bytes {start}-{stop - 1}{what} end at byte {end}: "
                           "cut or rewritten while being read")


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
    count, last = 0, None
    for index, sample in group_samples(cursor, url, start, stop):
        count = index + 1
        if sample is not None:
            if last is not None:
                yield last
            last = sample  # the piece's last sample goes once the shard's sample count was checked
    if count != row["samples"]:
        raise miscounted(url, count, row)
    if last is not None:
        yield last


def check_whole(url: str, row: dict, fd: int) -> None:
    """Raise `ShardError` unless the open file `fd` has exactly the row's size and sha256."""
    size = os.fstat(fd).st_size
    if size != row["bytes"]:
        raise wrong_size(url, size, row["bytes"])
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, BUFFER, offset):
        digest.update(chunk)
        offset += len(chunk)
    if offset != size or digest.hexdigest() != row["sha256"]:
        raise wrong_sha256(url)


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
