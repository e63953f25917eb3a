"""Random access to the samples of a list of shards, each sample checked against its shard's index
before it is returned: what `wdsprep.MapDataset` reads with, and under it the map-style classes of
the sources (voxels, rawnind, minecraft) and noisebase's frame reader.

`ShardAccess(urls, rows)` reads samples by (shard, sample number): `read(wanted)` takes, for each
sample asked for, (shard, sample number, member names or None for all of them) and returns the raw
samples (`__key__`, `__url__`, member -> bytearray) in that order.

Indexes. A shard's index is loaded at its first use and kept: one read of the shard's tail (the
index member and the end-of-archive blocks; one bounded Range request remotely, a `pread` locally),
checked against the manifest row by the one index loader (`read.load_index`, handed this class's
bounded, counted request of the tail; `ShardIndex.from_tail`). The last `INDEX_CACHE` indexes are kept
per process, the least recently used dropped first; the indexes of one call are loaded together
(remote ones in parallel). A shard without an index (an older manifest) is hashed whole against its
row first when it is local or cached, and indexed in memory (`index_of_hashed`); a remote one is
refused with the line naming `wdsprep reindex`. An adopted shard's index (`wdsprep index`) is read
from its split's index file instead (`read.load_index`), and the shard, opened locally, must still
have the size and mtime it was indexed with (remotely: its ETag, on every response).

Reads. Each sample asked for is a span of its shard: its bytes from the header of its first wanted
member to the padding of its last (the whole sample when all members are wanted). A call's spans of
one shard, sorted by offset, that touch (or, in a remote shard, lie at most the `ReadOptions`'
`gap_bytes` apart: 256 KiB by default, the read-ahead's first range, whose transfer costs about what
one more round trip does) are merged, and each merged span is ONE read: an `os.pread`
of a local (or cached) shard, ONE bounded Range request of a remote one (the read-ahead's
`readahead.fetch_range` over `Scheme.read_into`,
storage/resuming.py: resumed at its first missing byte after a drop, every response checked for the
row's size and, per shard, one ETag). The bytes between two samples of a merged span are read and
dropped: never checked, never returned. A call's remote requests (of different shards, or of runs
of one shard too far apart to merge) go in parallel, sent by the read-ahead's engine (its fetching
threads and queue, `readahead.Requests`; local reads meanwhile in the caller's thread), at most
`max_connections` at once (default: the read-ahead's share per DataLoader worker,
`readahead.worker_connections`), over the scheme's pooled
keep-alive connections (storage/http.py, storage/s3.py: the ones the read-ahead uses), with the
`ReadOptions` given (`options`: retries, timeouts, the rate floor; None: the environment's, read when
the `ShardAccess` is made).

Checks. Every member in a sample's span, header, data and padding, is checked against its digest in
the index before the sample is returned, and a whole sample must end where the next one starts. A
mismatch is a `ShardError` naming the shard and the member, raised by the call that asked for that
sample; a sample elsewhere (in a gap of a merged span included) is never checked, so it fails no
call that does not ask for it. The checks and their wording are stream/reading/read.py's, the
streaming reader's (`_corrupt`, `truncated`: a read that comes back short, local or remote,
`miscounted`, `tiling_problem`): the same shard fault is the same line on every path.

Cache. With a `ShardCache` (stream/reading/cache.py), a remote shard is downloaded whole into the cache at its
first use (one request, the entry admitted only once the shard's size and sha256 match its row), and
read from there: its index and samples then cost no request, in this process or any other sharing
the directory, until the entry is evicted. A shard larger than the whole cache is read remotely. An
entry that fails a check as it is read is dropped (one warning line naming it) and the call made
again, the shard downloaded again (`_healing`); a shard whose fresh copy fails too is its URL's error.

Processes and threads. Calls may come from several threads at once (noisebase's batch threads). Open
descriptors (at most `OPEN_FILES`; one closes when the last read using it is done), the fetching
threads and the counters belong to the process: a pickled `ShardAccess` (DataLoader workers that
spawn) carries only its URLs, rows, cache and options, and a forked one opens its own, keeping the indexes
the parent loaded. `stats` counts what this process did: `requests` (data Range requests),
`index_requests`, `downloads` (whole shards fetched into the cache), `bytes` (received by all of
them), `reads` (preads of local or cached shards).
"""
from __future__ import annotations

import collections
import functools
import os
import threading
from typing import Sequence

from ...errors import ShardError
from ...readoptions import ReadOptions
from ...shards.index import ShardIndex, adopted, digest_of, has_index, member_span, miscounted, tiling_problem
from ...shards.tarformat import BLOCK, index_samples
from ...storage import local_path, scheme_for
from ...storage.files import open_to_read
from ...storage.resuming import ObjectCheck
from .cache import Entry
from .read import (UNINDEXED_REMOTE, IndexCache, check_identity, check_whole, load_index, object_check, truncated,
                   unreadable)
from .read import _corrupt as corrupt_member  # the one wording of a member that fails its digest
from .readahead import Requests, connect_clients, fetch_range, worker_connections
from .unpack import PackedRequests

INDEX_CACHE = 1024  # shard indexes kept per process
OPEN_FILES = 64  # descriptors of local or cached shards kept open per process


class _File:
    """One open descriptor, closed when the last holder lets it go (the table of open files may drop
    it while a thread still reads through it)."""

    __slots__ = ("fd",)

    def __init__(self, path: str):
        self.fd = open_to_read(path)

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, TypeError, AttributeError):  # at interpreter exit `os` may be gone
            pass


class _Span:
    """One sample asked for: bytes [low, high) of its shard, the members in them, the ones returned."""

    __slots__ = ("shard", "number", "low", "high", "members", "wanted", "whole")

    def __init__(self, index: ShardIndex, shard: int, number: int, names):
        self.shard, self.number, self.whole = shard, number, names is None
        members, at, k = [], index.offsets[number], index.first[number]
        for name in index.names(number):
            size, head = index.sizes[k], index.heads[k]
            members.append((name, k, at, size, head))
            at += member_span(size, head)
            k += 1
        if names is not None:
            names = set(names)
            wanted = [member for member in members if member[0] in names]
            self.members = members[members.index(wanted[0]) : members.index(wanted[-1]) + 1] if wanted else []
            self.wanted = {member[0] for member in wanted}
        else:
            self.members, self.wanted = members, None
        self.low = self.members[0][2] if self.members else 0
        self.high = self.low + sum(member_span(member[3], member[4]) for member in self.members)


class ShardAccess:
    """Random access to the samples of shards `urls` (their manifest `rows`): see the module docstring."""

    def __init__(self, urls: Sequence[str], rows: Sequence[dict], *, cache=None, options: ReadOptions | None = None,
                 indexes: IndexCache | None = None):
        self.urls, self.rows = list(urls), list(rows)
        if len(self.urls) != len(self.rows):
            raise ValueError(f"{len(self.urls)} shard URLs for {len(self.rows)} rows")
        self.cache = cache
        self.options = ReadOptions.from_environment() if options is None else options  # checked when made
        self._numbers: dict[str, int] | None = None  # URL -> shard (built by the first `shard` call)
        # the shards' indexes (by URL and index digest): its own, or the streaming readers' (`read.INDEXES`:
        # a worker reading a sample again after its cache entry failed)
        self._indexes = IndexCache(INDEX_CACHE) if indexes is None else indexes
        self._start_process()

    def _start_process(self) -> None:
        """This process's own state (a fork keeps the indexes: they are plain data)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the tables below and the counters
        self._loading = threading.Lock()  # one thread loads missing indexes at a time
        self._files: collections.OrderedDict = collections.OrderedDict()  # shard -> _File
        self._paths: dict[int, str | None] = {}  # shard -> the local file read (the shard's, or its cache entry), None: remote
        self._checks: dict[int, ObjectCheck] = {}  # shard -> what every response for it must agree on
        self._requests: Requests | None = None  # the read-ahead engine's threads, made at the first parallel call
        self._connections = 0
        self.stats = dict.fromkeys(("requests", "index_requests", "downloads", "bytes", "reads"), 0)

    def __getstate__(self) -> dict:
        return {"urls": self.urls, "rows": self.rows, "cache": self.cache, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._numbers = None
        self._indexes = IndexCache(INDEX_CACHE)
        self._start_process()

    def _process(self) -> None:
        if self._pid != os.getpid():
            self._start_process()

    def close(self) -> None:
        """Close this process's descriptors and stop its threads (they come back on the next read)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self._files.clear()
            requests, self._requests = self._requests, None
        if requests is not None:
            requests.close()

    def __len__(self) -> int:
        return len(self.urls)

    def shard(self, url: str) -> int:
        """The number of the shard at `url` (a `ShardError` if it is not one of these)."""
        numbers = self._numbers
        if numbers is None:
            numbers = self._numbers = {shard_url: shard for shard, shard_url in enumerate(self.urls)}
        if url not in numbers:
            raise ShardError(url, "not one of the shards this reader was given")
        return numbers[url]

    # -- indexes
    def index(self, shard: int) -> ShardIndex:
        """The shard's index, loaded at first use (one request remotely) and kept."""
        return self.indexes([shard])[shard]

    def indexes(self, shards) -> dict[int, ShardIndex]:
        """The indexes of `shards` (shard -> index), the missing ones loaded together (remote ones in parallel)."""
        return self._healing(self._load_indexes, shards)

    def _load_indexes(self, shards) -> dict[int, ShardIndex]:
        self._process()
        found = self._cached(shards)
        missing = [shard for shard in dict.fromkeys(shards) if shard not in found]
        if missing:
            with self._loading:
                found.update(self._cached(missing))
                missing = [shard for shard in missing if shard not in found]
                loaded = self._parallel([(self._load_index, shard) for shard in missing],
                                        remote=[self._is_remote(shard) for shard in missing])
                for shard, index in zip(missing, loaded):
                    self._indexes.put(self.urls[shard], self.rows[shard], index)
                found.update(zip(missing, loaded))
        return found

    def _cached(self, shards) -> dict[int, ShardIndex]:
        found = {}
        for shard in shards:
            row = self.rows[shard]
            index = self._indexes.get(self.urls[shard], row)
            if index is not None:
                found[shard] = index
        return found

    def _is_remote(self, shard: int) -> bool:
        """Whether reading the shard may make a request (remote and not in the cache yet)."""
        return self._paths.get(shard, local_path(self.urls[shard])) is None

    def _path(self, shard: int) -> str | None:
        """The local file the shard is read from (the shard, or its cache entry, downloaded now on a
        miss), or None: read remotely."""
        if shard in self._paths:
            return self._paths[shard]
        url, row = self.urls[shard], self.rows[shard]
        path = local_path(url)
        if path is None and self.cache is not None:
            path, downloaded = self.cache.fetch(url, row.get("sha256"), row["bytes"])
            if downloaded:
                self._count(downloads=1, bytes=row["bytes"])
        with self._lock:
            self._paths[shard] = path
        return path

    def _file(self, shard: int) -> _File | None:
        """The shard's open descriptor (opened now if needed), or None for a remote shard."""
        with self._lock:
            file = self._files.get(shard)
            if file is not None:
                self._files.move_to_end(shard)
                return file
        path = self._path(shard)
        if path is None:
            return None
        try:
            file = _File(path)
            if adopted(self.rows[shard]) and path == local_path(self.urls[shard]):  # not a cached copy
                check_identity(self.urls[shard], self.rows[shard], file.fd)
        except FileNotFoundError:
            if path == local_path(self.urls[shard]):
                raise ShardError(self.urls[shard], "no such file") from None
            with self._lock:  # its cache entry was evicted meanwhile: read it remotely
                self._paths[shard] = None
            return None
        except OSError as error:
            raise ShardError(self.urls[shard], f"cannot open ({error.strerror or error})") from None
        with self._lock:
            self._files[shard] = file
            while len(self._files) > OPEN_FILES:
                self._files.popitem(last=False)
        return file

    def _load_index(self, shard: int) -> ShardIndex:
        url, row = self.urls[shard], self.rows[shard]
        file = self._file(shard)
        if not has_index(row):
            if file is None:
                raise ShardError(url, UNINDEXED_REMOTE)
            return index_of_hashed(url, row, file.fd, self._paths[shard])
        # the one index loader (kept by `indexes`): an adopted shard's from its split's index file (one
        # read; the shard itself is not read), else the tail of the open file, or one bounded request
        fd = file.fd if file is not None and not adopted(row) else None
        if fd is not None:
            self._count(reads=1)
        return load_index(url, row, fd, cache=None,
                          read_tail=lambda: self._request(shard, row["index_offset"], row["bytes"], "index_requests"))

    def _check(self, shard: int) -> ObjectCheck:
        with self._lock:
            check = self._checks.get(shard)
            if check is None:
                check = self._checks[shard] = object_check(self.rows[shard])
            return check

    def _count(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                self.stats[name] += value

    # -- reading
    def read(self, wanted: Sequence[tuple[int, int, Sequence[str] | None]]) -> list[dict]:
        """The raw samples asked for, in that order: for each (shard, sample number, member names or
        None for all), `__key__`, `__url__` and each wanted member's bytes (a member the sample lacks
        is left out), every member read checked first (see the module docstring)."""
        return self._healing(self._read, wanted)

    def _healing(self, call, *arguments):
        """`call(*arguments)`, made again when it failed on a shard read from its cache entry: the
        entry dropped (`ShardCache.drop`: one warning line naming it), the shard then downloaded
        into the cache again. Once per shard and call: a shard whose fresh copy fails too is the
        shard's error, naming its URL."""
        healed = set()
        while True:
            try:
                return call(*arguments)
            except ShardError as error:
                shard = self._cached_shard(error.url)
                if shard is None or shard in healed:
                    raise
                healed.add(shard)
                self._drop_entry(shard, error)

    def _cached_shard(self, url: str) -> int | None:
        """The shard at `url` when it is read from its cache entry, else None."""
        try:
            shard = self.shard(url)
        except ShardError:
            return None
        path = self._paths.get(shard)
        return shard if path is not None and path != local_path(url) else None

    def _drop_entry(self, shard: int, error: ShardError) -> None:
        with self._lock:
            path, file = self._paths.pop(shard, None), self._files.pop(shard, None)
        if path is None:  # another thread dropped it meanwhile
            return
        try:
            status = os.fstat(file.fd) if file is not None else os.lstat(path)
        except FileNotFoundError:
            return
        self.cache.drop(Entry(path, status.st_dev, status.st_ino), self.urls[shard], error)

    def _read(self, wanted: Sequence[tuple[int, int, Sequence[str] | None]]) -> list[dict]:
        indexes = self.indexes([shard for shard, _, _ in wanted])
        packed = PackedRequests(indexes, wanted)  # a packed shard's samples: their entries (a block whole)
        spans = [_Span(indexes[shard], shard, int(number), names) for shard, number, names in packed.entries]
        runs = self._runs(spans)
        data = self._parallel([(self._fetch, shard, low, high) for shard, low, high, _ in runs],
                              remote=[self._is_remote(shard) for shard, _, _, _ in runs])
        out: list[dict | None] = [None] * len(spans)
        for (shard, low, _, items), buffer in zip(runs, data):
            for item in items:
                out[item] = self._sample(indexes[shard], spans[item], memoryview(buffer), low)
        for item, span in enumerate(spans):
            if out[item] is None:  # none of the wanted members is in this sample: nothing to read
                out[item] = {"__key__": indexes[span.shard].keys[span.number], "__url__": self.urls[span.shard]}
        return packed.samples(out, self.urls)

    def _runs(self, spans: list[_Span]) -> list[tuple[int, int, int, list[int]]]:
        """(shard, low, high, the spans it holds): spans of one shard merged where they touch (or, in
        a remote shard, lie at most `gap_bytes` apart); in order of shard, then offset."""
        order = sorted((span.shard, span.low, span.high, item) for item, span in enumerate(spans) if span.members)
        runs: list[tuple[int, int, int, list[int]]] = []
        for shard, low, high, item in order:
            gap = self.options.gap_bytes if self._is_remote(shard) else 0  # a local read costs no round trip
            if runs and runs[-1][0] == shard and low <= runs[-1][2] + gap:
                last = runs[-1]
                runs[-1] = (shard, last[1], max(last[2], high), last[3] + [item])
            else:
                runs.append((shard, low, high, [item]))
        return runs

    def _fetch(self, shard: int, low: int, high: int) -> bytes | bytearray:
        """Bytes [low, high) of the shard: one pread, or one bounded Range request."""
        file = self._file(shard)
        if file is None:
            return self._request(shard, low, high, "requests")
        url = self.urls[shard]
        self._count(reads=1)
        try:
            data = os.pread(file.fd, high - low, low)
        except OSError as error:
            raise unreadable(url, low, error) from None
        if len(data) != high - low:
            raise truncated(url, low, high, low + len(data))
        return data

    def _request(self, shard: int, low: int, high: int, counter: str) -> bytearray:
        """Bytes [low, high) of a remote shard: the read-ahead's one Range request, counted as `counter`."""
        url = self.urls[shard]
        self._count(**{counter: 1}, bytes=high - low)
        return fetch_range(url, scheme_for(url).configured(self.options), low, high, self._check(shard))

    def _sample(self, index: ShardIndex, span: _Span, view: memoryview, low: int) -> dict:
        """The span's sample from the bytes of its run (starting at shard byte `low`), each member checked."""
        url, key = self.urls[span.shard], index.keys[span.number]
        sample = {"__key__": key, "__url__": url}
        for name, k, at, size, head in span.members:
            part = view[at - low : at - low + member_span(size, head)]
            if digest_of(part) != index.digests[k]:
                raise corrupt_member(url, key, name)
            if span.wanted is None or name in span.wanted:
                sample[name] = bytearray(part[head : head + size])
        if span.whole and span.high != index.sample_end(span.number):
            raise ShardError(url, tiling_problem(key, span.high, index.sample_end(span.number)))
        return sample

    # -- parallel requests
    def _parallel(self, jobs: list[tuple], remote: list[bool]) -> list:
        """Each job's result, in order: local ones here, remote ones sent by the read-ahead's engine
        (`readahead.Requests`: at most `max_connections` at once). The first error, in job order, is
        raised once all are done."""
        if sum(remote) <= 1:
            return [job[0](*job[1:]) for job in jobs]
        requests = self._engine()
        sent = iter(requests.send([(self.urls[job[1]], functools.partial(*job)) for job, far in zip(jobs, remote) if far]))
        tickets = [next(sent) if far else None for far in remote]
        results, error = [], None
        for job, ticket in zip(jobs, tickets):
            try:
                results.append(requests.take(ticket) if ticket is not None else job[0](*job[1:]))
            except BaseException as caught:  # the others still finish (and are counted)
                error = error or caught
                results.append(None)
        if error is not None:
            raise error
        return results

    def _engine(self) -> Requests:
        with self._lock:
            if self._requests is None:
                from ..world import worker_info

                _, workers = worker_info()
                self._connections = worker_connections(self.options.max_connections, workers)
                connect_clients(self.urls, self.options, self._connections)
                self._requests = Requests(self._connections)
            return self._requests


def index_of_hashed(url: str, row: dict, fd: int, path: str) -> ShardIndex:
    """The index of a local shard written without one, made in memory once the whole shard matched
    its row (`read.check_whole`): where its members lie (`tarformat.index_samples`, from the headers)
    and the digests a written index would hold, so its reads are checked alike. Only wdsprep's own
    layout is indexed (one header per member, a sample's members back to back from byte 0)."""
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
        raise miscounted(url, len(keys), row)
    return ShardIndex(url, tuple(keys), tuple(offsets), tuple(layout), tuple(layouts), tuple(sizes), tuple(digests), end)
