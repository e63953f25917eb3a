"""Ranged reads of remote objects: `read_range` fills a buffer with bytes [start, stop) of an object,
over the scheme's pooled, kept-alive connections (storage/http.py: one `httpx.Client` per process;
storage/s3.py: one boto3 client per process), and survives dropped connections.

A scheme that can do this sets `supports_ranges = True` and gives `open_range(url)`: a function
`(start, stop) -> (body, total size, etag)` that sends one request for `bytes=start-(stop-1)`;
`body.readinto(view)` puts in a memoryview what one read of the connection gives (0 at the end of
the body; it does not wait to fill the view, so a slow body is judged between reads) and `body.close()` gives the
connection back to the pool once the body was read to its end (or drops it otherwise). A permanent
error (a missing object, no permission, a range past the end) is a `ShardError` naming the URL;
anything else is transient.

Failures. A transient error before or during the body is retried with exponential backoff and the
read goes on from the first byte not yet received (`Range`), so each byte lands in the buffer once;
`retries` failures in a row without progress give up with a `ShardError` naming the URL and the
range. Every response must describe the same object: its total size is the one the caller expects
(the manifest row's), and its ETag the one of the first response (an object replaced mid-read is an
error, never a splice).

Deadline. Besides the connect/read timeouts of every request (`WDSPREP_TIMEOUT`), a body must
bring at least `WDSPREP_MIN_RATE` bytes/s (default 1024) over every `WDSPREP_RATE_WINDOW` seconds
(default 30) spent waiting for it: a server that trickles a byte now and then, never tripping the
read timeout, is cut and the attempt counts as a failure. So one range read ends, one way or the
other, within about `(retries + 1) * (RATE_WINDOW + bytes / MIN_RATE)` plus the backoff.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import ShardError
from . import resuming

MIN_RATE = float(os.environ.get("WDSPREP_MIN_RATE", "1024"))  # bytes/s a body must arrive at...
RATE_WINDOW = float(os.environ.get("WDSPREP_RATE_WINDOW", "30"))  # ...over this many seconds of waiting for it


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


def read_range(url: str, open_range: Callable, start: int, view: memoryview, check: ObjectCheck,
               retries: int | None = None) -> int:
    """Fill `view` with the object's bytes from `start` on; returns the number of requests made."""
    retries = resuming.RETRIES if retries is None else retries
    stop = start + len(view)
    got = failures = slow = requests = 0  # slow: too-slow windows in a row (progress does not reset it)
    delay = 0.1
    while got < len(view):
        requests += 1
        before = got
        body = None
        try:
            body, total, etag = open_range(start + got, stop)
            check.check(url, total, etag)
            waited, arrived = 0.0, 0  # in this window of waiting for the body
            while got < len(view):
                began = time.monotonic()
                n = body.readinto(view[got:])  # what one read of the connection gives
                waited += time.monotonic() - began
                if not n:
                    raise EOFError(f"connection closed at byte {start + got}")
                got += n
                arrived += n
                if waited >= RATE_WINDOW:
                    if arrived < MIN_RATE * waited:
                        slow += 1
                        raise TimeoutError(f"slower than {MIN_RATE:g} bytes/s ({arrived} bytes in {waited:.1f} s of "
                                           "waiting; WDSPREP_MIN_RATE and WDSPREP_RATE_WINDOW set the limit)")
                    waited, arrived, slow = 0.0, 0, 0
            body.close()  # read to its end: the connection goes back to the pool
        except ShardError:
            resuming.close_quietly(body)
            raise
        except Exception as error:  # transient: refused, reset, timeouts, 5xx, a body cut short
            resuming.close_quietly(body)
            failures = 1 if got > before else failures + 1
            if failures > retries or slow > retries:
                raise ShardError(url, f"bytes {start}-{stop - 1}: giving up after {failures} failed attempts "
                                      f"at byte {start + got}: {error}") from None
            time.sleep(delay)
            delay = min(delay * 2, resuming.MAX_DELAY)
    return requests
