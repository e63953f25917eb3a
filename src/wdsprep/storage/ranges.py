"""Ranged reads of remote objects: `read_range` fills a buffer with bytes [start, stop) of an object,
over the scheme's pooled, kept-alive connections (storage/http.py: one `httpx.Client` per process;
storage/s3.py: one boto3 client per process), and survives dropped connections.

A scheme that can do this sets `supports_ranges = True` and gives `open_range(url)`: a function
`(start, stop) -> (body, total size, etag)` that sends one request for `bytes=start-(stop-1)`;
`body.readinto(view)` fills a memoryview (0 at the end of the body) and `body.close()` gives the
connection back to the pool once the body was read to its end (or drops it otherwise). A permanent
error (a missing object, no permission, a range past the end) is a `ShardError` naming the URL;
anything else is transient.

Failures. A transient error before or during the body is retried with exponential backoff and the
read goes on from the first byte not yet received (`Range`), so each byte lands in the buffer once;
`retries` failures in a row without progress give up with a `ShardError` naming the URL and the
range. Every response must describe the same object: its total size is the one the caller expects
(the manifest row's), and its ETag the one of the first response (an object replaced mid-read is an
error, never a splice).

Deadline. Besides the connect/read timeouts of every request (`WDSPREP_TIMEOUT`), each attempt must
average at least `WDSPREP_MIN_RATE` bytes/s (default 64 KiB/s) after its first `WDSPREP_TIMEOUT`
seconds: a server that trickles a byte now and then, never tripping the read timeout, is cut and
the attempt counts as a failure. So one range read ends, one way or the other, within
`(retries + 1) * (TIMEOUT + bytes / MIN_RATE)` plus the backoff.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import ShardError
from . import resuming

MIN_RATE = float(os.environ.get("WDSPREP_MIN_RATE", 64 << 10))  # bytes/s an attempt must average


@dataclass
class ObjectCheck:
    """What every response for one object must agree on: its size (when the caller knows it) and the
    ETag of the first response (filled in by it)."""

    total: int | None = None
    etag: str | None = None

    def check(self, url: str, total: int | None, etag: str | None) -> None:
        if self.total is not None and total is not None and total != self.total:
            raise ShardError(url, f"shard is {total} bytes, manifest says {self.total}")
        if self.etag and etag and etag != self.etag:
            raise ShardError(url, f"object changed while reading (etag {self.etag} -> {etag})")
        if self.total is None:
            self.total = total
        if not self.etag:
            self.etag = etag


def attempt_deadline(nbytes: int, now: float | None = None) -> float:
    """When an attempt to read `nbytes` more is cut for being too slow (see the module docstring)."""
    return (time.monotonic() if now is None else now) + resuming.TIMEOUT + nbytes / MIN_RATE


def read_range(url: str, open_range: Callable, start: int, view: memoryview, check: ObjectCheck,
               retries: int | None = None) -> int:
    """Fill `view` with the object's bytes from `start` on; returns the number of requests made."""
    retries = resuming.RETRIES if retries is None else retries
    stop = start + len(view)
    got = failures = requests = 0
    delay = 0.1
    while got < len(view):
        requests += 1
        before = got
        body = None
        try:
            body, total, etag = open_range(start + got, stop)
            check.check(url, total, etag)
            deadline = attempt_deadline(len(view) - got)
            while got < len(view):
                n = body.readinto(view[got:])
                if not n:
                    raise EOFError(f"connection closed at byte {start + got}")
                got += n
                if time.monotonic() > deadline:
                    raise TimeoutError(f"slower than {MIN_RATE:.0f} B/s (WDSPREP_MIN_RATE)")
            body.close()  # read to its end: the connection goes back to the pool
        except ShardError:
            resuming.close_quietly(body)
            raise
        except Exception as error:  # transient: refused, reset, timeouts, 5xx, a body cut short
            resuming.close_quietly(body)
            failures = 1 if got > before else failures + 1
            if failures > retries:
                raise ShardError(url, f"bytes {start}-{stop - 1}: giving up after {failures} failed attempts "
                                      f"at byte {start + got}: {error}") from None
            time.sleep(delay)
            delay = min(delay * 2, resuming.MAX_DELAY)
    return requests
