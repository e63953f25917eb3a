"""Read-ahead of remote shards: a worker's pieces fetched ahead of its reader by parallel Range
requests over pooled connections, within a byte budget.

A worker's stream is a list of pieces (shard, first sample, end sample; stream/planning/plan.py), all known
before its first sample. `ReadAhead(jobs, max_connections=...)` fetches them in that order while
the reader consumes them, and hands each piece to the reader (`open`) as a stream of exactly its
own bytes, with its shard's index.

What is fetched: each piece's own bytes, and its shard's index, once.
- The piece's body is [offsets[first], end), `end` being the next sample's first header, or the
  index member's for a piece that ends its shard. Nothing before the piece's first byte or after
  its last is requested, so a shard split between workers (or ranks) crosses the wire once.
- The index (the tail [index_offset, bytes): index member and end-of-archive blocks). A piece that
  is a whole shard knows its bytes from the manifest row, so its index comes in the same request as
  the body's last bytes (one range from somewhere before `index_offset` to the end): one request for
  a shard smaller than a range, no request for the index alone. A piece that starts or ends
  mid-shard needs the index to know where its bytes lie: that is one small request of its own,
  before its body's. Indexes are kept per process (stream/reading/read.py's `INDEXES`, by URL and the row's
  index digest), so a shard's index is fetched once per worker.

An adopted shard's index (`wdsprep index`) is not in the shard but in its split's index file: a
piece of one waits, like a mid-shard piece, for its index, which a fetching thread loads
(`read.load_index`: one bounded read of that file) before the piece's body is planned; the body
ends at the row's `data_end`, and every response must give the ETag the shard had when indexed.

At the start, only the pieces the first shuffle block needs (`first_jobs`: a worker's first
`shuffle_buffer` samples, at least one; one more when reader stages sit before the counting point,
the sample the stream makes before it hands over the one before, stream/worker.py) are fetched; the
reader `widen`s the window to every piece as soon as the consumer, holding its first sample, asks for
the next (at the latest once the block is made). So a rank's first sample
waits for no request of a shard it reads later (manifest.json, the table, its first shard's index
and body: four requests at most), and each rank of a large job starts with a handful of requests,
not a budget's worth.

How: bodies are cut into requests of `range_bytes` (the first requests of a stream smaller,
growing from `FIRST_RANGE`, so that the first sample comes early) and fetched by `max_connections`
threads over the process's pooled keep-alive connections (storage/http.py, storage/s3.py; the
client is made before the first piece), in the order the reader consumes them. A request is sent
only while the bytes held stay within `prefetch_bytes` (the per-worker memory budget): held =
requests in flight + fetched and not yet read (the one being read included), released as the
reader moves past them (besides, the HTTP client holds a few 64 KiB socket reads per connection
while they are copied in). `range_bytes` is half the budget over the connections, so the reader's
current range, and the range holding the index, always fit beside a full set of requests in flight.
The one exception: a single index larger than the budget is fetched anyway (the reader cannot go on
without it), the budget then being exceeded by that index alone.

Integrity and order are the reader's (stream/reading/read.py): every member is checked against the index
before its sample is yielded, exactly as on a sequential stream; the row's index fields must lie
within the shard before anything is requested (`check_index_fields`; else the piece's error), and the
index is checked against the manifest row (`ShardIndex.from_tail`); every response must give the row's total size and, within a
piece, one ETag (`ObjectCheck`). Each request is the scheme's one bounded read (`read_into`,
storage/resuming.py): retried after a dropped connection, a transient error or a window below the
rate floor (`WDSPREP_MIN_RATE` / `WDSPREP_RATE_WINDOW`), resuming at its first missing byte.
A request that cannot be read becomes the `ShardError` of its piece, raised when the reader reaches
that piece (the dataset's handler then skips the piece or ends the stream); later pieces go on.

Settings: the budget and every request's retries, timeout and rate floor are the dataset's
`ReadOptions` (wdsprep/readoptions.py), handed to `ReadAhead` (`options`) and to the schemes
(`Scheme.configured`); nothing here reads the environment.

Random access (stream/reading/access.py) sends its requests by the same engine: `Requests` gives
a caller the engine's fetching threads and queue for calls it waits on at once (no pieces, no
budget: what a call asks for, it needs now).

Many tiny pieces (one-sample shards): each is one request of its whole shard (its index included),
and requests of consecutive pieces are in flight together, up to `max_connections` (the fetching
threads wait on a condition of their own, woken one at a time, so a finished request wakes the
reader and not every idle thread). A shard is an object of its own: one request per shard is the
floor, and past that the cost is the client's CPU per request (BENCHMARKS.md, *tiny shards*).
"""
from __future__ import annotations

import collections
import functools
import io
import threading
from typing import Iterable

from ... import readoptions
from ...errors import ShardError
from ...readoptions import ReadOptions
from ...shards.index import ShardIndex, adopted, check_index_fields, has_index, samples_end
from ...storage import scheme_for, scheme_of
from ...storage.resuming import ObjectCheck
from .read import INDEXES, load_index, object_check, truncated

MIB = 1 << 20
# Range requests at once. By default a rank (a process and its DataLoader workers) sends up to
# RANK_CONNECTIONS, shared by its workers, each at least MIN_WORKER_CONNECTIONS: on a link whose
# connections are slower than the whole, more requests in flight keep it full while each waits for its
# first byte, and with more workers each needs fewer. `max_connections` (or WDSPREP_MAX_CONNECTIONS)
# sets a number per worker instead.
RANK_CONNECTIONS = 32
MIN_WORKER_CONNECTIONS = 8
FIRST_RANGE = 256 << 10  # the first request of a stream; each next one twice as large, up to range_bytes
MAX_RANGE = 16 * MIB


def range_bytes(prefetch_bytes: int, max_connections: int) -> int:
    """Bytes per request: half the budget over the connections, between `readoptions.MIN_RANGE`
    (64 KiB; `ReadOptions` holds `prefetch_bytes` to two of them at least) and 16 MiB."""
    return max(readoptions.MIN_RANGE, min(MAX_RANGE, prefetch_bytes // (2 * max_connections)))


def worker_connections(max_connections: int | None, num_workers: int) -> int:
    """Range requests at once for each of a rank's `num_workers` workers: `max_connections` when
    given (the dataset's `ReadOptions`: its keyword, else WDSPREP_MAX_CONNECTIONS), else the
    worker's share of RANK_CONNECTIONS."""
    if max_connections is not None:
        return max_connections
    return max(MIN_WORKER_CONNECTIONS, RANK_CONNECTIONS // max(1, num_workers))


def connect_clients(urls: Iterable[str], options: ReadOptions, connections: int) -> None:
    """The client of each scheme among `urls` made now, in this process, with room for `connections`
    requests at once, so that the first read does not pay for it (`Scheme.connect`)."""
    for name in {scheme_of(url) for url in urls}:
        scheme_for(f"{name}://" if name else ".").configured(options).connect(connections)


def reads_ahead(url: str, row: dict) -> bool:
    """Whether a piece of this shard is read by `ReadAhead`: a scheme with byte ranges, a row with
    an index (without one, the shard is read whole, sequentially: stream/reading/read.py)."""
    try:
        return has_index(row) and scheme_for(url).supports_ranges
    except ShardError:
        return False


def _parse_index(url: str, row: dict, tail) -> ShardIndex:
    """The index from the shard's bytes [index_offset, bytes) (checked against the row), kept."""
    return INDEXES.put(url, row, ShardIndex.from_tail(url, row, bytes(tail)))


def fetch_range(url: str, scheme, start: int, stop: int, check: ObjectCheck) -> bytearray:
    """Bytes [start, stop) of the shard at `url`: the one Range request of the read side (the
    read-ahead's ranges, and random access's runs and index tails, stream/reading/access.py), the
    scheme's bounded read (`read_into`: resumed within the range, every response checked by `check`).
    Fewer bytes than asked is the shard's one truncation error (`read.truncated`)."""
    buffer = bytearray(stop - start)
    got = scheme.read_into(url, start, memoryview(buffer), check)
    if got != len(buffer):
        raise truncated(url, start, stop, start + got)
    return buffer


# states of a range
QUEUED, FETCHING, READY, FAILED, RELEASED = range(5)


class _Range:
    """Bytes [start, stop) of a job's shard: one request (more after a dropped connection), or the
    `work` that stands for it (an adopted shard's index loaded from its split's index file; a random
    read's call, `Requests`), whose result is the range's buffer."""

    __slots__ = ("job", "start", "stop", "work", "buffer", "state", "error", "urgent")

    def __init__(self, job: "_Job | _Call", start: int, stop: int, work=None):
        self.job, self.start, self.stop, self.work = job, start, stop, work
        self.buffer: bytearray | None = None
        self.state = QUEUED
        self.error: BaseException | None = None
        self.urgent = False  # the reader waits for it: sent even beyond the budget (see the docstring)

    @property
    def size(self) -> int:
        return self.stop - self.start


class _Job:
    """One piece: samples [start, stop) of the shard at `url`, read with `options`."""

    def __init__(self, url: str, row: dict, start: int, stop: int, options: ReadOptions):
        self.url, self.row, self.start, self.stop = url, row, start, stop
        self.scheme = scheme_for(url).configured(options)
        self.check = object_check(row)  # every response: the row's size, one ETag (an adopted shard's own)
        self.index: ShardIndex | None = None
        self.error: BaseException | None = None
        try:  # offsets outside the shard are never requested: the piece's error, raised when it is opened
            check_index_fields(url, row)
        except ShardError as error:
            self.error = error
        self.ranges: list[_Range] = []  # the body's ranges in byte order (known once `planned`)
        self.tail: _Range | None = None  # the range holding the index: with the body's last bytes, or alone
        self.planned = False
        self.closed = False
        self.number = 0  # its place among the read-ahead's jobs

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.row["samples"]

    def body(self) -> tuple[int, int]:
        """The piece's bytes (needs the index, except for a whole shard)."""
        if self.whole:
            return 0, samples_end(self.row)
        index, start, stop = self.index, self.start, self.stop
        if index.pack is not None:  # the entries holding the piece's samples (stream/unpack.py)
            start, stop = index.pack.entries(start, stop)
        end = index.offsets[stop] if stop < len(index) else index.index_offset
        return index.offsets[start], end


class _Engine:
    """The state the reader and the fetching threads share (the threads hold this, not the
    `ReadAhead`, so that a reader dropped without `close()` still stops them when collected)."""

    def __init__(self, jobs: list[_Job], budget: int, connections: int, window: int | None = None):
        lock = threading.Lock()
        self.cond = threading.Condition(lock)  # the reader waits on it: a range fetched, a piece planned
        self.work = threading.Condition(lock)  # the fetching threads wait on it: a range to send
        self.pending = collections.deque(jobs)  # jobs whose ranges are not planned yet
        for number, job in enumerate(jobs):
            job.number = number
        # at the start only the jobs the first shuffle block needs are planned (`widen` lifts it)
        self.window = len(jobs) if window is None else window
        self.queue: collections.deque[_Range] = collections.deque()  # planned, not sent, in reading order
        self.blocked: _Job | None = None  # a job whose body waits for its index request
        self.budget, self.range_bytes = budget, range_bytes(budget, connections)
        self.next_size = min(FIRST_RANGE, self.range_bytes)
        self.held = self.peak = 0  # bytes held by ranges (sent or fetched, not released)
        self.in_flight = self.peak_in_flight = 0
        self.closed = False

    # -- planning (under cond)
    def _size(self) -> int:
        size = self.next_size
        self.next_size = min(self.range_bytes, size * 2)
        return size

    def _cut(self, job: _Job, begin: int, end: int) -> list[_Range]:
        ranges = []
        while begin < end:
            size = self._size()
            stop = end if end - begin < size + size // 4 else begin + size  # no sliver at the end
            ranges.append(_Range(job, begin, stop))
            begin = stop
        return ranges

    def widen(self) -> None:
        """Every job may be fetched now (the consumer has its first sample)."""
        with self.cond:
            self.window = 1 << 62
            self.work.notify()

    def _plan(self) -> None:
        while not self.queue and self.blocked is None and self.pending and self.pending[0].number < self.window:
            job = self.pending.popleft()
            if job.closed or job.error is not None:
                continue
            job.index = INDEXES.get(job.url, job.row)
            row = job.row
            if job.index is None and adopted(row):  # its index is in its split's index file: loaded by a thread
                job.tail = _Range(job, 0, 0, work=functools.partial(load_index, job.url, row))
                self.queue.append(job.tail)
                self.blocked = job
                return
            if job.index is None and job.whole:
                index_offset, total = row["index_offset"], row["bytes"]
                tail_start = max(0, min(index_offset, total - self._size()))
                job.tail = _Range(job, tail_start, total)
                job.ranges = [*self._cut(job, 0, tail_start), job.tail]
                self.queue.extend([job.tail, *job.ranges[:-1]])
            elif job.index is None:
                job.tail = _Range(job, row["index_offset"], row["bytes"])  # the index alone
                self.queue.append(job.tail)
                self.blocked = job
                return
            else:
                job.ranges = self._cut(job, *job.body())
                self.queue.extend(job.ranges)
            job.planned = True

    def _index_arrived(self, job: _Job) -> None:
        """A mid-shard piece's index request is done (under cond): parse it, plan the body."""
        tail = job.tail
        job.tail = None
        if tail.state == FAILED:
            job.error = tail.error
        else:
            try:
                job.index = tail.buffer if adopted(job.row) else _parse_index(job.url, job.row, tail.buffer)
            except ShardError as error:
                job.error = error
        self._release(tail)
        if job.error is None and not job.closed:
            job.ranges = self._cut(job, *job.body())
            self.queue.extend(job.ranges)
        job.planned = True
        self.blocked = None

    # -- sending (threads)
    def _take(self) -> _Range | None:
        with self.cond:
            while True:
                if self.closed:
                    return None
                self._plan()
                if self.queue:
                    r = self.queue[0]
                    if r.job.closed:
                        self.queue.popleft()
                        r.state = RELEASED
                        if self.blocked is r.job:  # its index will not be needed: plan what follows
                            self.blocked, r.job.planned = None, True
                        continue
                    if self.held == 0 or self.held + r.size <= self.budget or r.urgent:
                        self.queue.popleft()
                        r.state = FETCHING
                        self.held += r.size
                        self.peak = max(self.peak, self.held)
                        self.in_flight += 1
                        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                        if self.queue:
                            self.work.notify()  # more to send: wake the next idle thread (a chain, not a herd)
                        return r
                self.work.wait()

    def fetch(self) -> None:
        while (r := self._take()) is not None:
            job = r.job
            try:
                if r.work is not None:
                    buffer = r.work()
                else:
                    buffer = fetch_range(job.url, job.scheme, r.start, r.stop, job.check)
                error = None
            except BaseException as caught:  # handed to the reader, raised where it reaches this range
                buffer, error = None, caught
            with self.cond:
                self.in_flight -= 1
                r.buffer, r.error = buffer, error
                r.state = READY if error is None else FAILED
                if self.blocked is job and r is job.tail:
                    self._index_arrived(job)
                    self.work.notify()
                elif job.closed or self.closed:
                    self._release(r)
                self.cond.notify_all()

    # -- reading (the reader's thread)
    def _release(self, r: _Range) -> None:
        if r.state in (FETCHING, READY, FAILED):
            self.held -= r.size
        r.state, r.buffer = RELEASED, None
        self.work.notify()  # room in the budget

    def wait_ready(self, r: _Range) -> None:
        """Until `r` is fetched (under cond); its error raised here."""
        while r.state in (QUEUED, FETCHING):
            if self.closed:
                raise ShardError(r.job.url, "read-ahead closed")
            if r.state == QUEUED and not r.urgent:
                r.urgent = True
                self.work.notify()
            self.cond.wait()
        if r.state == FAILED:
            raise r.error
        if r.state == RELEASED:
            raise ShardError(r.job.url, f"bytes {r.start}-{r.stop - 1} were released before they were read")

    def close_job(self, job: _Job) -> None:
        with self.cond:
            job.closed = True
            for r in job.ranges:
                if r.state in (READY, FAILED):
                    self._release(r)
            self.work.notify_all()  # its queued ranges are dropped by whoever takes them

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for r in self.queue:
                r.state = RELEASED
            self.queue.clear()
            self.cond.notify_all()
            self.work.notify_all()


class PieceStream(io.RawIOBase):
    """One piece's bytes [begin, end), read from its fetched ranges in order (each released as the
    reader moves past it); `index` is its shard's index. Seeks go forward only, within the piece."""

    def __init__(self, engine: _Engine, job: _Job):
        self.engine, self.job = engine, job
        self.index = job.index
        self.position, self.end = job.body()
        self._next = 0  # job.ranges[_next] holds `position`

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self.position
        if whence == io.SEEK_END or not self.position <= offset <= self.end:
            raise io.UnsupportedOperation(f"{self.job.url}: a piece is read forward, within bytes "
                                          f"{self.position}-{self.end} (asked {offset})")
        self._advance(offset - self.position, None)
        return offset

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        return self._advance(min(len(view), self.end - self.position), view)

    def take(self, count: int) -> memoryview | None:
        """The next `count` bytes as a view of the range that holds them all (moving on past them),
        or None (nothing moved) when they are not in one range: read them with `readinto` then."""
        ranges = self.job.ranges
        if self._next >= len(ranges) or self.position + count > self.end:
            return None
        r = ranges[self._next]
        if self.position + count > r.stop:
            return None
        if r.state != READY:
            with self.engine.cond:
                self.engine.wait_ready(r)
        at = self.position - r.start
        view = memoryview(r.buffer)[at : at + count]  # keeps the buffer alive while the reader uses it
        self.position += count
        if self.position >= min(r.stop, self.end):
            with self.engine.cond:
                self.engine._release(r)
            self._next += 1
        return view

    def _advance(self, count: int, view: memoryview | None) -> int:
        """Move `count` bytes on, copying them into `view` (None: skipping them)."""
        done = 0
        engine, ranges = self.engine, self.job.ranges
        while done < count:
            r = ranges[self._next]
            if r.state != READY:
                with engine.cond:
                    engine.wait_ready(r)
            n = min(count - done, r.stop - self.position)
            if view is not None:
                at = self.position - r.start
                view[done : done + n] = memoryview(r.buffer)[at : at + n]
            done += n
            self.position += n
            if self.position >= min(r.stop, self.end):
                with engine.cond:
                    engine._release(r)
                self._next += 1
        return done

    def close(self) -> None:
        if not self.closed:
            self.engine.close_job(self.job)
        super().close()


class ReadAhead:
    """Reads `jobs` ((url, row, first sample, end sample), in the order they will be opened) ahead of
    the reader: `open(url, first, stop)` for each in turn; `close()` when done (or dropped).
    `options` (a dataset's `ReadOptions`): the budget (`prefetch_bytes`, > 0) and what every
    request retries, waits and floors by; `max_connections`: requests at once (`worker_connections`)."""

    def __init__(self, jobs: Iterable[tuple[str, dict, int, int]], *, options: ReadOptions, max_connections: int,
                 first_jobs: int | None = None):
        self.jobs = collections.deque(_Job(*job, options) for job in jobs)
        self.engine = _Engine(list(self.jobs), options.prefetch_bytes, max_connections, first_jobs)
        connect_clients((job.url for job in self.jobs), options, max_connections)  # before the first piece
        self.threads = _start_threads(self.engine, max_connections if self.jobs else 0, "wdsprep-read-ahead")

    def open(self, url: str, start: int, stop: int) -> PieceStream:
        """The next piece's stream (its index loaded and checked); a ShardError if it cannot be read.
        Pieces before it that were not opened are dropped."""
        engine = self.engine
        while self.jobs:
            job = self.jobs.popleft()
            if (job.url, job.start, job.stop) == (url, start, stop):
                break
            engine.close_job(job)
        else:
            raise RuntimeError(f"{url}: samples {start}-{stop} are not a piece this read-ahead was given")
        with engine.cond:
            engine.window = max(engine.window, job.number + 1)  # the reader needs it now
            while not job.planned and job.error is None:
                engine._plan()
                if job.tail is not None and job.tail.state == QUEUED and not job.tail.urgent:
                    job.tail.urgent = True
                    engine.work.notify()
                if job.planned or job.error is not None:
                    break
                engine.cond.wait()
            if job.error is None and job.index is None:  # a whole shard: its index is in its last range
                try:
                    engine.wait_ready(job.tail)
                except BaseException as error:
                    job.error = error
        if job.error is not None:
            engine.close_job(job)
            raise job.error
        if job.index is None:
            tail, offset = job.tail, job.row["index_offset"]
            try:
                job.index = _parse_index(url, job.row, memoryview(tail.buffer)[offset - tail.start :])
            except ShardError:
                engine.close_job(job)
                raise
        return PieceStream(engine, job)

    def widen(self) -> None:
        """Lift the start's window: read ahead over every piece (within the budget)."""
        self.engine.widen()

    def close(self) -> None:
        self.engine.close()

    def __del__(self) -> None:
        self.engine.close()


def _start_threads(engine: _Engine, count: int, name: str) -> list[threading.Thread]:
    """`count` fetching threads of `engine` (daemons: they hold the engine, not its owner, and end
    when it is closed)."""
    threads = [threading.Thread(target=engine.fetch, name=f"{name}-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


class _Call:
    """What a `Requests` range belongs to: the shard it reads, never closed on its own."""

    __slots__ = ("url",)
    closed = False
    tail = None

    def __init__(self, url: str):
        self.url = url


class Requests:
    """The engine's fetching threads for a caller that waits for what it asks: random access
    (stream/reading/access.py). `send(calls)` queues each (url, call) as a range of the engine, sent
    at once (a range of no bytes: no budget holds it back; the caller needs every one now), at most
    `connections` at a time, over the same threads, queue and hand-over the read-ahead uses;
    `take(sent)` waits for one and gives its call's result (or raises its error). A `Requests`
    belongs to one process (the caller makes a new one after a fork)."""

    def __init__(self, connections: int):
        self.engine = _Engine([], 1, connections)
        self.threads = _start_threads(self.engine, connections, "wdsprep-access")

    def send(self, calls) -> list[_Range]:
        ranges = [_Range(_Call(url), 0, 0, work=call) for url, call in calls]  # no bytes of the budget: sent at once
        with self.engine.cond:
            self.engine.queue.extend(ranges)
            self.engine.work.notify()  # each thread that takes one wakes the next (`_take`)
        return ranges

    def take(self, r: _Range):
        with self.engine.cond:
            try:
                self.engine.wait_ready(r)
                return r.buffer
            finally:
                self.engine._release(r)

    def close(self) -> None:
        self.engine.close()

    def __del__(self) -> None:
        self.engine.close()
