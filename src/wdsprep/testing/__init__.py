"""Test services started by the tests themselves, on 127.0.0.1 with free ports.

- `S3Server`: moto's S3 in a thread, wrapped to log requests, count completed uploads per key,
  hold uploads at a gate (to kill an uploader "halfway" deterministically) and drop a GET body
  mid-stream (to exercise Range resume).
- `RangeHTTPServer`: a plain HTTP file server with `Range` support and the same fault injection.

Both are context managers; `S3Server.environment()` sets the standard AWS variables so boto3 (and
`wdsprep.stream` in subprocesses that inherit `os.environ`) talk to it.

Also here, imported on their own: `wdsprep.testing.conformance.SourceTests`, the source conformance
suite every source's tests subclass (needs pytest), and `wdsprep.testing.edits`, in-place edits and
the bad-input check it uses.
"""
from __future__ import annotations

from .httpserver import RangeHTTPServer
from .s3server import S3Server

__all__ = ["S3Server", "RangeHTTPServer"]
