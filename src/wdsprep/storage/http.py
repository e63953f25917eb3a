"""`http://` and `https://` URLs: read through a `ResumingStream` (Range requests on dropped
connections, and for `open_from`); not writable (a server is published to with `wdsprep upload` to
a store it serves, or with webdataset's own `http` writer)."""
from __future__ import annotations

import urllib.error
import urllib.request

from ..errors import ShardError
from . import resuming
from .files import BUFFER
from .resuming import ResumingScheme, close_quietly


def http_open_at(url: str, end: int | None = None):
    """`open_at(offset)` for `ResumingStream`: one GET (with `Range` past 0, or up to `end`
    exclusive when it is given) -> (body, total, etag)."""

    def open_at(offset: int):
        request = urllib.request.Request(url, headers={"User-Agent": "wdsprep"})
        if end is not None:
            request.add_header("Range", f"bytes={offset}-{max(end, offset + 1) - 1}")
        elif offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = urllib.request.urlopen(request, timeout=resuming.TIMEOUT)
        except urllib.error.HTTPError as error:
            close_quietly(error)  # its body holds the connection: close it before retrying (no socket per retry)
            if error.code in (404, 410, 403, 401, 416):
                raise ShardError(url, f"HTTP {error.code} {error.reason}") from None
            raise
        etag = response.headers.get("ETag")
        length = response.headers.get("Content-Length")
        if offset and response.status != 206:
            # the server ignored Range: read past what we already have (still no disk, bounded by offset)
            _discard(response, offset, url)
            return response, int(length) if length is not None else None, etag
        total = offset + int(length) if length is not None else None
        content_range = response.headers.get("Content-Range")
        if content_range and "/" in content_range and not content_range.endswith("/*"):
            total = int(content_range.rsplit("/", 1)[1])
        return response, total, etag

    return open_at


def _discard(response, count: int, url: str) -> None:
    while count > 0:
        block = response.read(min(count, BUFFER))
        if not block:
            raise ConnectionError(f"{url}: body ended while skipping to byte {count}")
        count -= len(block)


class HttpScheme(ResumingScheme):
    webdataset = True
    example = "https://HOST/PATH"

    def open_at(self, url: str, end: int | None = None):
        return http_open_at(url, end)


SCHEME = HttpScheme()
