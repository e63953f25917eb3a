"""The one `Range` parser of the test file servers (`RangeHTTPServer`, `DataverseServer`).

A request's `Range: bytes=...` header over a body of `size` bytes is one of: absent or empty (200,
the whole body), one satisfiable byte range `a-b`, `a-` or `-n` (206, `[start, stop)`, `b` clipped to the
body), a range that starts at or past the end or ends before it starts (416 with
`Content-Range: bytes */size`), or not a single byte range at all (416, `malformed`).
"""
from __future__ import annotations

import re
from typing import NamedTuple

_BYTES = re.compile(r"bytes=(\d*)-(\d*)")


class ByteRange(NamedTuple):
    status: int  # 200 the whole body, 206 the part [start, stop), 416 no part
    start: int = 0
    stop: int = 0  # exclusive
    malformed: bool = False  # a 416 for a header that is not one byte range


def byte_range(header: str | None, size: int) -> ByteRange:
    if not header:
        return ByteRange(200, 0, size)
    match = _BYTES.fullmatch(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return ByteRange(416, malformed=True)
    first, last = match.groups()
    if first == "":  # a suffix: the last n bytes
        start, stop = max(size - int(last), 0), size
    else:
        start, stop = int(first), (min(int(last) + 1, size) if last else size)
    if start >= size or start >= stop:
        return ByteRange(416)
    return ByteRange(206, start, stop)
