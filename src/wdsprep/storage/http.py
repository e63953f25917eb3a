"""`http://` and `https://` URLs, read over one pooled, kept-alive `urllib3.PoolManager` per process: whole
objects and bounded byte ranges through a `ResumingStream` (`open_at(url, end)`: Range requests
on dropped connections, for `open_from`, and for the ranges of `read_range` / `read_into` that
`wdsprep show` and the read-ahead of stream/reading/readahead.py ask for). Not writable (a server is published to with `wdsprep upload` to a store it serves, or with webdataset's
own `http` writer).

Connections. Every request of a process goes through `http_client()`: HTTP/1.1 keep-alive, at most
`max(POOL, the largest max_connections asked for)` connections at once to a host (a request waits
for one to be free, at most its timeout), an idle one reused before a new one is opened, so a worker
that reads many shards (or many ranges of one) opens a handful of TCP (and TLS) connections, not one
per request. A body read to its end gives its connection back; a
body closed early (a piece that ends mid-shard on the sequential path) closes it. The client is
made per process (a DataLoader worker forked from a process that has one makes its own: sockets
are never shared across a fork), from one SSL context (certifi's roots, as httpx has them) that forked
workers inherit. Redirects are followed (at most `REDIRECTS`; credentials are not sent on to another
host), and the environment's proxies (`HTTP(S)_PROXY`, `NO_PROXY`) are honoured.
Why urllib3 and not httpx: a body read through httpx (h11) costs about twice the CPU per byte of
urllib3's (http.client: the socket read straight into the response), measured by BENCHMARKS.md
*stores*; S3's bytes already came through urllib3 (botocore).
`Accept-Encoding: identity`: byte offsets are the object's own, so a response that comes with any
other `Content-Encoding` (a server that gzips whatever it sends) is refused with a `ShardError` naming
the encoding, never read as the object's bytes (a manifest would read as "not valid JSON").
"""
from __future__ import annotations

import os
import threading
from urllib.parse import urljoin

from ..errors import ShardError
from ..readoptions import ReadOptions
from .files import BUFFER
from .resuming import ResumingScheme, range_header

POOL = 32  # connections per process at least; raised by `http_client(connections)`
PERMANENT = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 410: "Gone", 416: "Range Not Satisfiable"}
HEADERS = {"User-Agent": "wdsprep", "Accept-Encoding": "identity"}

REDIRECTS = 10
READ_AT_ONCE = 1 << 20  # the most one `readinto` takes off the connection

_client = None  # (pid, pool size, {proxy URL or None: urllib3 PoolManager or ProxyManager})
_client_lock = threading.Lock()
_ssl = None  # the SSL context, made once: forked workers inherit it (100 ms a client otherwise)


def _ssl_context():
    import ssl

    try:
        import certifi
    except ImportError:  # the system's roots
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def http_client(connections: int = 0, target: str | None = None):
    """This process's pool of connections (a proxy's, when the environment gives one for `target`),
    with room for at least `connections` connections to a host at once."""
    global _client, _ssl
    held = _client
    wanted = max(POOL, connections)
    proxy = _proxy(target) if target is not None else None
    if held is None or held[0] != os.getpid() or held[1] < wanted:
        with _client_lock:
            held = _client
            if held is None or held[0] != os.getpid() or held[1] < wanted:
                if _ssl is None:
                    _ssl = _ssl_context()
                held = _client = (os.getpid(), wanted, {})  # one before it: requests in flight on it finish
    managers = held[2]
    manager = managers.get(proxy)
    if manager is None:
        with _client_lock:
            manager = managers.get(proxy)
            if manager is None:
                import urllib3

                options = dict(num_pools=POOL, maxsize=held[1], block=True, ssl_context=_ssl, retries=False)
                manager = managers[proxy] = (urllib3.ProxyManager(proxy, **options) if proxy else
                                             urllib3.PoolManager(**options))
    return manager


def _proxy(target: str) -> str | None:
    """The proxy the environment names for `target` (HTTP_PROXY / HTTPS_PROXY, less NO_PROXY), or None."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies_environment, proxy_bypass_environment

    parts = urlsplit(target)
    proxy = getproxies_environment().get(parts.scheme)
    if not proxy or proxy_bypass_environment(parts.hostname or ""):
        return None
    return proxy


def _after_fork_in_child() -> None:
    global _client_lock
    _client_lock = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class HttpBody:
    """A streamed urllib3 response (ours, or botocore's under an S3 body) as a readable body of
    `length` bytes (None: to its end): `readinto` takes what one read of the connection gives, `close`
    gives the connection back to its pool, kept alive when the body was read to its end, else closed."""

    def __init__(self, response, length: int | None):
        self.response = response
        self.left = length
        self.ended = length == 0

    def readinto(self, buffer) -> int:
        if self.ended:
            return 0
        wanted = len(buffer) if self.left is None else min(len(buffer), self.left)
        data = self.response.read1(min(wanted, READ_AT_ONCE))  # what one read gives (`readinto` waits to fill)
        n = len(data)
        buffer[:n] = data
        if self.left is not None:
            self.left -= n
        self.ended = n == 0 or self.left == 0
        return n

    readinto1 = readinto  # one read of the connection at most, as `readinto` already is

    def close(self) -> None:
        if not self.ended:  # bytes left on the connection: it cannot be used again
            _drop(self.response)
        else:
            self.response.release_conn()


def _drop(response) -> None:
    """An answer not read to its end (a body closed early, an error's, a refused one's): its
    connection closed, and given back to its pool as closed (the pool's place for it is not lost)."""
    response.close()
    response.release_conn()


def _send(url: str, start: int, stop: int | None, timeout: float, via: "HttpGetScheme"):
    """One GET of the object `url` from `start` (to `stop`, exclusive), `timeout` seconds per connect
    and read: (status, HttpBody, headers). `via` is the scheme that reaches it: `locate(url)` gives the
    request's URL and headers, `explain` words a permanent error, `arrived` sees where redirects led,
    `stale` says whether a permanent error of a remembered location is to be located again (then a
    transient error: the retry asks `locate` anew)."""
    import urllib3

    target, extra = via.locate(url)
    headers = {**HEADERS, **extra}
    wanted = range_header(start, stop)
    if wanted:
        headers["Range"] = wanted
    retries = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=REDIRECTS,
                            raise_on_redirect=True, raise_on_status=False)
    response = http_client(target=target).urlopen(
        "GET", target, headers=headers, retries=retries, redirect=True, preload_content=False, decode_content=False,
        timeout=urllib3.Timeout(connect=timeout, read=timeout), pool_timeout=timeout)
    status = response.status
    if status in PERMANENT:
        body = _short_body(response)
        if via.stale(url, target):
            raise ConnectionError(f"HTTP {status} from a remembered location: located again")
        raise ShardError(url, via.explain(status, response.headers, body))
    if status >= 400:
        _drop(response)
        raise ConnectionError(f"HTTP {status} {response.reason}")  # transient: retried
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # its bytes and offsets are not the object's own: never decoded here
        _drop(response)
        raise ShardError(url, f"the server sent it with Content-Encoding: {encoding} although identity was asked "
                              "for; serve it as it is stored (uncompressed by the server)")
    if response.retries is not None and response.retries.history:  # the last step's URL and where it led
        last = response.retries.history[-1]
        via.arrived(url, target, urljoin(last.url, last.redirect_location))
    length = response.headers.get("Content-Length")
    return status, HttpBody(response, int(length) if length is not None else None), response.headers


def _short_body(response, limit: int = 4096) -> bytes:
    """The first bytes of an error's body (what a store says went wrong), never more; its connection
    given back."""
    try:
        data = response.read(limit)
    except Exception:  # noqa: BLE001 -- a body that cannot be read explains nothing
        data = b""
    _drop(response)
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
