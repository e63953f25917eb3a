"""`http://` and `https://` URLs, read over one pooled, kept-alive `httpx.Client` per process: whole
objects and bounded byte ranges through a `ResumingStream` (`open_at(url, end)`: Range requests
on dropped connections, for `open_from`, and for the ranges of `read_range` / `read_into` that
`wdsprep show` and the read-ahead of stream/reading/readahead.py ask for). Not writable (a server is published to with `wdsprep upload` to a store it serves, or with webdataset's
own `http` writer).

Connections. Every request of a process goes through `http_client()`: HTTP/1.1 keep-alive, at most
`max(POOL, the largest max_connections asked for)` connections at once, an idle one reused before a
new one is opened, so a worker that reads many shards (or many ranges of one) opens a handful of TCP
(and TLS) connections, not one per request. A body read to its end gives its connection back; a
body closed early (a piece that ends mid-shard on the sequential path) closes it. The client is
made per process (a DataLoader worker forked from a process that has one makes its own: sockets
are never shared across a fork), from one SSL context that forked workers inherit.
`Accept-Encoding: identity`: byte offsets are the object's own, so a response that comes with any
other `Content-Encoding` (a server that gzips whatever it sends) is refused with a `ShardError` naming
the encoding, never read as the object's bytes (a manifest would read as "not valid JSON").
"""
from __future__ import annotations

import os
import threading

from ..errors import ShardError
from ..readoptions import ReadOptions
from .files import BUFFER
from .resuming import ResumingScheme, range_header

POOL = 32  # connections per process at least; raised by `http_client(connections)`
PERMANENT = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 410: "Gone", 416: "Range Not Satisfiable"}
HEADERS = {"User-Agent": "wdsprep", "Accept-Encoding": "identity"}

_client = None  # (pid, pool size, httpx.Client)
_client_lock = threading.Lock()
_ssl = None  # httpx's default SSL context, made once: forked workers inherit it (100 ms a client otherwise)


def http_client(connections: int = 0):
    """This process's pooled client, with room for at least `connections` connections at once."""
    global _client, _ssl
    held = _client
    wanted = max(POOL, connections)
    if held is not None and held[0] == os.getpid() and held[1] >= wanted:
        return held[2]
    with _client_lock:
        held = _client
        if held is not None and held[0] == os.getpid() and held[1] >= wanted:
            return held[2]
        import httpx

        if _ssl is None:
            _ssl = httpx.create_ssl_context()
        limits = httpx.Limits(max_connections=wanted, max_keepalive_connections=wanted)
        client = httpx.Client(limits=limits, headers=HEADERS, follow_redirects=True, verify=_ssl)
        _client = (os.getpid(), wanted, client)  # a smaller one before it: requests in flight on it finish
        return client


def _after_fork_in_child() -> None:
    global _client_lock
    _client_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class HttpBody:
    """A streamed httpx response as a readable body: `readinto` copies from its raw chunks (as they
    come off the socket), `close` gives the connection back (the body was read to its end) or drops it."""

    def __init__(self, response):
        self.response = response
        self._chunks = response.iter_raw()
        self._pending = memoryview(b"")

    def readinto(self, buffer) -> int:
        pending = self._pending
        if not pending:
            for chunk in self._chunks:
                if chunk:
                    pending = memoryview(chunk)
                    break
            else:
                return 0
        n = min(len(buffer), len(pending))
        buffer[:n] = pending[:n]
        self._pending = pending[n:]
        return n

    readinto1 = readinto  # one read of the connection at most, as `readinto` already is

    def close(self) -> None:
        response = self.response
        length = response.headers.get("Content-Length")
        if not self._pending and length is not None and response.num_bytes_downloaded >= int(length):
            for _ in self._chunks:  # the end of the message (no more bytes): the pool keeps the connection
                pass
        response.close()


def _send(url: str, start: int, stop: int | None, timeout: float, via: "HttpGetScheme"):
    """One GET of the object `url` from `start` (to `stop`, exclusive), `timeout` seconds per connect
    and read: (status, HttpBody, headers). `via` is the scheme that reaches it: `locate(url)` gives the
    request's URL and headers, `explain` words a permanent error, `arrived` sees where redirects led,
    `stale` says whether a permanent error of a remembered location is to be located again (then a
    transient error: the retry asks `locate` anew)."""
    target, extra = via.locate(url)
    wanted = range_header(start, stop)
    headers = dict(extra)
    if wanted:
        headers["Range"] = wanted
    client = http_client()
    request = client.build_request("GET", target, headers=headers, timeout=timeout)
    response = client.send(request, stream=True)
    status = response.status_code
    if status in PERMANENT:
        body = _short_body(response)
        response.close()
        if via.stale(url, target):
            raise ConnectionError(f"HTTP {status} from a remembered location: located again")
        raise ShardError(url, via.explain(status, response.headers, body))
    if status >= 400:
        response.close()
        raise ConnectionError(f"HTTP {status} {response.reason_phrase}")  # transient: retried
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # its bytes and offsets are not the object's own: never decoded here
        response.close()
        raise ShardError(url, f"the server sent it with Content-Encoding: {encoding} although identity was asked "
                              "for; serve it as it is stored (uncompressed by the server)")
    if response.history:
        via.arrived(url, target, str(response.url))
    return status, HttpBody(response), response.headers


def _short_body(response, limit: int = 4096) -> bytes:
    """The first bytes of an error's body (what a store says went wrong), never more."""
    data = b""
    try:
        for chunk in response.iter_raw():
            data += chunk
            if len(data) >= limit:
                break
    except Exception:  # noqa: BLE001 -- a body that cannot be read explains nothing
        pass
    return data[:limit]


def _total(headers, start: int) -> int | None:
    content_range = headers.get("Content-Range")
    if content_range and "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    length = headers.get("Content-Length")
    return start + int(length) if length is not None else None


def http_open_at(url: str, end: int | None = None, *, timeout: float | None = None, via: "HttpGetScheme | None" = None):
    """`open_at(offset)` for `ResumingStream`: one GET (with `Range` past 0, or up to `end`
    exclusive when it is given) -> (body, total, etag); `timeout` per connect and read (default:
    the environment's now, `ReadOptions`); `via`: the scheme that reaches the object (default
    `http(s)://`: the URL itself; gs://, az://, hf:// give their own, `HttpGetScheme`)."""
    timeout = ReadOptions.from_environment().timeout if timeout is None else timeout
    via = SCHEME if via is None else via

    def open_at(offset: int):
        status, body, headers = _send(url, offset, end, timeout, via)
        etag = headers.get("ETag")
        if offset and status != 206:
            # the server ignored Range: read past what we already have (still no disk, bounded by offset)
            _discard(body, offset, url)
            length = headers.get("Content-Length")
            return body, int(length) if length is not None else None, etag
        return body, _total(headers, offset), etag

    return open_at


def _discard(body, count: int, url: str) -> None:
    scratch = bytearray(min(max(count, 1), BUFFER))
    while count > 0:
        n = body.readinto(memoryview(scratch)[: min(count, len(scratch))])
        if not n:
            raise ConnectionError(f"{url}: body ended while skipping to byte {count}")
        count -= n


class HttpGetScheme(ResumingScheme):
    """A scheme whose bytes are plain ranged HTTP GETs over this process's pooled client (so it
    shares the read-ahead, retries and rate floor of every remote read). Its defaults are plain
    http(s)'s; a store reached another way (gs://, az://, hf://) gives `locate(url) -> (request URL,
    headers)` and `explain(status, headers, body) -> message`, and may remember where redirects led
    (`arrived`) as long as it forgets a remembered location that fails (`stale`)."""

    def open_at(self, url: str, end: int | None = None):
        return http_open_at(url, end, timeout=self.options.timeout, via=self)

    def connect(self, connections: int) -> None:
        http_client(connections)

    def locate(self, url: str) -> tuple[str, dict]:
        return url, {}

    def explain(self, status: int, headers, body: bytes) -> str:
        return f"HTTP {status} {PERMANENT[status]}"

    def arrived(self, url: str, target: str, final: str) -> None:
        """The request for `url` sent to `target` was redirected to `final`. Default: nothing kept."""

    def stale(self, url: str, target: str) -> bool:
        """Whether a permanent error of `target` means only that a remembered location expired (it is
        then forgotten, and the request located again). Default: no (nothing is remembered)."""
        return False


class HttpScheme(HttpGetScheme):
    webdataset = True
    example = "https://HOST/PATH"


SCHEME = HttpScheme()
