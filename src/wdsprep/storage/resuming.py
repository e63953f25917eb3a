"""Remote reads that survive dropped connections by resuming at the byte offset (`http`, `s3`): the
one home of retries, Range resume, the rate floor and the same-object check of every remote read.

A `ResumingStream` reads a remote object sequentially, from a start offset to its end, or within a
bounded range when the scheme's `open_at(url, end)` asks for one. When the connection drops or a
transient error occurs mid-body, it re-requests the rest (`Range: bytes=<offset>-`, or
`bytes=<offset>-<end - 1>`) and carries on, up to `retries` times in a row with exponential backoff;
every request has connect/read timeouts. A body that keeps arriving, but too slowly, counts as such a
failure too (`RateFloor`: fewer than `min_rate` bytes/s over `rate_window` seconds spent waiting for
it), so a server that trickles bytes ends in one error instead of a read that never ends. Every
response must describe the same object (`ObjectCheck`: the same total size, the manifest row's where
the caller knows it, and the same ETag where the server gives one), so a shard replaced mid-read is
an error rather than a silent splice. Nothing is written to disk. A missing object (404 /
NoSuchKey) fails at once with an error naming the URL.

Bounded reads. `ResumingScheme.read_into(url, offset, view, check)` fills a buffer with one bounded
Range request, resumed within its range: what `storage.read_range` (an adopted shard's index in its
split's index file), random access (stream/reading/access.py: `wdsprep.MapDataset`, `wdsprep show`
and `inspect`) and the dataset's read-ahead (stream/reading/readahead.py: `fetch_range`, the
request both make) read remote bytes with, the last two in parallel over the scheme's pooled
connections. Bodies give what one read of the connection
gives (`readinto1` / `read1`, so a slow body is judged between reads), and `close()` gives a
connection read to its end back to the scheme's pool.

Settings. Retries, timeouts, the rate floor and `skip_by_reading` come from a `ReadOptions`
(wdsprep/readoptions.py): a scheme made for a dataset carries the dataset's
(`Scheme.configured(options)`); the schemes of the table (`storage.SCHEMES`) read the environment
when they are used (`ResumingScheme.options`), never at import.
"""
from __future__ import annotations

import copy
import io
import time
from typing import Callable

from ..errors import ShardError
from ..readoptions import ReadOptions
from .base import Scheme
from .files import fill

MAX_DELAY = 5.0
REMOTE_BUFFER = 256 << 10  # read-ahead of remote streams: small enough that skipping a large member skips its bytes


class RateFloor:
    """The time a stream spent waiting inside body reads and the bytes they brought, judged every
    `window` seconds of waiting: fewer than `rate` bytes per second is too slow (`slow` counts such
    windows in a row). Only waiting counts, so a consumer that pauses between reads (a training
    step) never makes a stream slow."""

    def __init__(self, rate: float, window: float):
        self.rate = rate
        self.window = window
        self.waited = 0.0
        self.got = 0
        self.slow = 0

    def add(self, got: int, seconds: float) -> str | None:
        """Count one read; a message when the window it completes was too slow, else None."""
        self.waited += seconds
        self.got += got
        if self.waited < self.window:
            return None
        waited, received = self.waited, self.got
        self.waited, self.got = 0.0, 0
        if received >= self.rate * waited:
            self.slow = 0
            return None
        self.slow += 1
        return (f"slower than {self.rate:g} bytes/s ({received} bytes in {waited:.1f} s of waiting; "
                "WDSPREP_MIN_RATE and WDSPREP_RATE_WINDOW set the limit)")


def wrong_size(url: str, size: int, expected: int) -> ShardError:
    """The one wording of a shard whose size is not its manifest row's (a response's total, a
    download into the cache, a local file)."""
    return ShardError(url, f"shard is {size} bytes, manifest says {expected}")


class ObjectCheck:
    """What every response for one object must agree on: its total size (`size`: the one the caller
    knows, a manifest row's, else the first response's) and its ETag (`etag`: the one the caller
    knows, an adopted shard's when it was indexed, else the first response's). One check may be
    shared by the requests of several ranges of the object (the read-ahead's)."""

    def __init__(self, size: int | None = None, etag: str | None = None):
        self.size, self.etag, self.known, self.indexed = size, etag, size is not None, etag is not None

    def check(self, url: str, total: int | None, etag: str | None) -> None:
        if self.size is not None and total is not None and total != self.size:
            if self.known:
                raise wrong_size(url, total, self.size)
            raise ShardError(url, f"object changed while reading (size {self.size} -> {total})")
        if self.etag and etag and etag != self.etag:
            if self.indexed:
                raise ShardError(url, f"changed since it was indexed (ETag {etag}; indexed: {self.etag}): "
                                      "run `wdsprep index` on it again")
            raise ShardError(url, f"object changed while reading (etag {self.etag} -> {etag})")
        if self.size is None:
            self.size = total
        if not self.etag:
            self.etag = etag


def range_header(offset: int, end: int | None) -> str | None:
    """The `Range` value for bytes [offset, end) (`end` None: to the object's end), None for all of it."""
    if end is not None:
        return f"bytes={offset}-{max(end, offset + 1) - 1}"
    return f"bytes={offset}-" if offset else None


class ResumingStream(io.RawIOBase):
    """`open_at(offset)` returns (a readable body, total size or None, etag or None) — or the legacy
    pair (body, total size); it raises `ShardError` on permanent errors, anything else is transient.
    `options` (a `ReadOptions`; default: the environment's now) give the retries, the rate floor and
    `skip_by_reading`.

    When the total size is known the stream is seekable: a forward seek of at most `skip_by_reading`
    bytes reads and discards from the open body; a longer one (or a backward one) closes it and asks
    for the object again from the new offset with `Range`, so skipping large members (resume inside a
    shard, a worker starting mid-shard) does not transfer them. Seeking costs nothing until the next read.
    """

    def __init__(self, url: str, open_at: Callable[[int], tuple], options: ReadOptions | None = None,
                 start: int = 0, check: ObjectCheck | None = None):
        options = ReadOptions.from_environment() if options is None else options
        self.url = url
        self._open_at = open_at
        self.retries = options.retries
        self.skip_by_reading = options.skip_by_reading
        self.offset = start  # the logical position (what tell() says)
        self._body_pos = 0  # where the open body's next byte lies
        self.resumes = 0  # how many times the stream re-requested after a failure (for tests and logs)
        self.rate = RateFloor(options.min_rate, options.rate_window)  # a too-slow window re-requests, like a dropped connection
        self.seeks = 0  # how many times a seek was served by a new Range request
        self.object = ObjectCheck() if check is None else check  # what every response must agree on
        self._body = None
        self._body = self._request(start)

    @property
    def size(self) -> int | None:
        return self.object.size

    @property
    def etag(self) -> str | None:
        return self.object.etag

    def _request(self, offset: int):
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                result = self._open_at(offset)
                body = result[0]
                try:
                    self.object.check(self.url, result[1], result[2] if len(result) > 2 else None)
                except ShardError:
                    close_quietly(body)
                    raise
                self._body_pos = offset
                return body
            except ShardError:
                raise
            except Exception as error:  # transient: connection refused/reset, timeouts, 5xx
                if attempt == self.retries:
                    raise ShardError(self.url, f"giving up after {self.retries + 1} attempts: {error}") from None
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY)
        raise AssertionError("unreachable")

    def readable(self) -> bool:
        return True

    # -- seeking (lazy: positions only move; the next read catches the body up)
    def seekable(self) -> bool:
        return self.size is not None

    def tell(self) -> int:
        return self.offset

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self.offset + offset
        elif whence == io.SEEK_END:
            if self.size is None:
                raise io.UnsupportedOperation(f"{self.url}: size unknown, cannot seek from the end")
            target = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if target < 0:
            raise ValueError(f"{self.url}: negative seek position {target}")
        self.offset = target
        return target

    def _catch_up(self) -> None:
        gap = self.offset - self._body_pos
        if gap == 0:
            return
        if 0 < gap <= self.skip_by_reading:
            target, self.offset = self.offset, self._body_pos
            scratch = bytearray(min(gap, 1 << 16))
            while self.offset < target:
                view = memoryview(scratch)[: min(len(scratch), target - self.offset)]
                if self._readinto_body(view) == 0:
                    break
            self.offset = target
            return
        close_quietly(self._body)
        self.seeks += 1
        self._body = self._request(self.offset)

    def readinto(self, buffer) -> int:
        if self.size is not None and self.offset >= self.size:
            return 0
        self._catch_up()
        return self._readinto_body(buffer)

    def _readinto_body(self, buffer) -> int:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                n = _read_some(self._body, buffer)
            except ShardError:
                raise
            except Exception as error:
                n, last_error = -1, error
            slow = self.rate.add(max(n, 0), time.monotonic() - started)
            if slow is not None:
                if self.rate.slow > self.retries:
                    raise ShardError(self.url, f"stream failed at byte {self.offset}: {slow}, {self.rate.slow} times in a row")
                n, last_error = -1, TimeoutError(slow)
            if n >= 0:
                if n or self.size is None or self.offset >= self.size:
                    self.offset += n
                    self._body_pos += n
                    return n
                last_error = EOFError(f"connection closed at byte {self.offset} of {self.size}")
            failures += 1
            if failures > self.retries:
                raise ShardError(self.url, f"stream failed at byte {self.offset}: {last_error}")
            close_quietly(self._body)
            self.resumes += 1
            time.sleep(min(0.05 * 2**failures, MAX_DELAY))
            self._body = self._request(self.offset)

    def close(self) -> None:
        if not self.closed and self._body is not None:
            close_quietly(self._body)
        super().close()


def _read_some(body, buffer) -> int:
    """Read into `buffer` what one read of the connection gives (`readinto1`, `read1`), so that a
    slow body is judged between reads (`readinto` would wait until the whole buffer is filled)."""
    readinto1 = getattr(body, "readinto1", None)
    if readinto1 is not None:
        return readinto1(buffer)
    data = (getattr(body, "read1", None) or body.read)(len(buffer))
    buffer[: len(data)] = data
    return len(data)


def close_quietly(body) -> None:
    try:
        body.close()
    except Exception:
        pass


def open_resuming(url: str, open_at: Callable[[int], tuple], start: int = 0,
                  options: ReadOptions | None = None) -> io.BufferedReader:
    """A buffered `ResumingStream` over `open_at`, from byte `start` (the first request asks for it)."""
    return io.BufferedReader(ResumingStream(url, open_at, options, start=start), REMOTE_BUFFER)


def read_into(url: str, open_at: Callable[[int], tuple], offset: int, view, check: ObjectCheck | None = None,
              options: ReadOptions | None = None) -> int:
    """Fill `view` with the object's bytes from `offset`, `open_at` asking for exactly that range
    (`ResumingScheme.open_at(url, end=offset + len(view))`): one request, resumed at its first
    missing byte after a drop or a too-slow window. Fewer bytes only where the object ends sooner;
    returns how many. Unbuffered: a read past the range would look like a dropped connection."""
    if not len(view):
        return 0
    stream = ResumingStream(url, open_at, options, start=offset, check=check)
    try:
        return fill(stream, view)
    finally:
        stream.close()


class ResumingScheme(Scheme):
    """A scheme read through `ResumingStream` (http(s), s3): a subclass gives `open_at(url, end)`,
    the function that opens the object's body at a byte offset (up to byte `end`, exclusive, when
    `end` is given: a bounded Range request; to the object's end otherwise), over connections it
    keeps alive (`connect` makes its pool), each request with `self.options.timeout`. Bounded ranges
    are what `supports_ranges` promises.

    `options`: the `ReadOptions` this scheme reads with. The instance in `storage.SCHEMES` has none
    of its own and reads the environment each time it is used; `configured(options)` gives a copy
    that reads with the given ones (a dataset's)."""

    supports_ranges = True
    _options: ReadOptions | None = None

    @property
    def options(self) -> ReadOptions:
        return ReadOptions.from_environment() if self._options is None else self._options

    def configured(self, options: ReadOptions | None) -> "ResumingScheme":
        if options is None or options is self._options:
            return self
        scheme = copy.copy(self)
        scheme._options = options
        return scheme

    def open_at(self, url: str, end: int | None = None) -> Callable[[int], tuple]:
        raise NotImplementedError

    def open(self, url: str) -> io.BufferedReader:
        options = self.options
        return open_resuming(url, self.configured(options).open_at(url), options=options)

    def open_from(self, url: str, offset: int) -> io.BufferedReader:
        options = self.options
        return open_resuming(url, self.configured(options).open_at(url), start=offset, options=options)

    def read_into(self, url: str, offset: int, view, check: ObjectCheck | None = None) -> int:
        """One bounded Range request for bytes [offset, offset + len(view)), resumed within its range."""
        options = self.options
        return read_into(url, self.configured(options).open_at(url, end=offset + len(view)), offset, view, check, options)
