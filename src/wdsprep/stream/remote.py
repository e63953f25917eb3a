"""HTTP(S) and S3 streams that survive dropped connections by resuming at the byte offset.

A `ResumingStream` reads a remote object sequentially. When the connection drops or a transient
error occurs mid-body, it re-requests the object with `Range: bytes=<offset>-` and carries on, up to
`retries` times in a row with exponential backoff; every request has connect/read timeouts. A resumed
request must describe the same object (same total size, and same ETag where the server gives one),
so a shard replaced mid-read is an error rather than a silent splice. Nothing is written to disk. A
missing object (404 / NoSuchKey) fails at once with an error naming the URL.

`register_webdataset_schemes()` (called by `import wdsprep`) makes webdataset's `gopen` use these
streams for `s3://` (which webdataset lacks) and `http(s)://` (instead of a `curl` pipe), so plain
`wds.WebDataset("s3://bucket/train-{00000..00009}-00.tar")` works and resumes too.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import io
import sys
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from ..errors import ShardError
from .opener import BUFFER, register_opener

RETRIES = int(os.environ.get("WDSPREP_RETRIES", "5"))
TIMEOUT = float(os.environ.get("WDSPREP_TIMEOUT", "30"))
MAX_DELAY = 5.0
SKIP_BY_READING = int(os.environ.get("WDSPREP_SKIP_BY_READING", 1 << 20))  # shorter forward seeks read through
REMOTE_BUFFER = 256 << 10  # read-ahead of remote streams: small enough that skipping a large member skips its bytes


class ResumingStream(io.RawIOBase):
    """`open_at(offset)` returns (a readable body, total size or None, etag or None) — or the legacy
    pair (body, total size); it raises `ShardError` on permanent errors, anything else is transient.

    When the total size is known the stream is seekable: a forward seek of at most `SKIP_BY_READING`
    bytes reads and discards from the open body; a longer one (or a backward one) closes it and asks
    for the object again from the new offset with `Range`, so skipping large members (resume inside a
    shard, a worker starting mid-shard) does not transfer them. Seeking costs nothing until the next read.
    """

    def __init__(self, url: str, open_at: Callable[[int], tuple], retries: int = RETRIES, start: int = 0):
        self.url = url
        self._open_at = open_at
        self.retries = retries
        self.offset = start  # the logical position (what tell() says)
        self._body_pos = 0  # where the open body's next byte lies
        self.resumes = 0  # how many times the stream re-requested after a failure (for tests and logs)
        self.seeks = 0  # how many times a seek was served by a new Range request
        self.etag: str | None = None
        self.size: int | None = None
        self._body, self.size, self.etag = self._request(start)

    def _request(self, offset: int):
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                result = self._open_at(offset)
                body, total = result[0], result[1]
                etag = result[2] if len(result) > 2 else None
                if offset:
                    self._check_same_object(body, total, etag)
                self._body_pos = offset
                return body, total, etag
            except ShardError:
                raise
            except Exception as error:  # transient: connection refused/reset, timeouts, 5xx
                if attempt == self.retries:
                    raise ShardError(self.url, f"giving up after {self.retries + 1} attempts: {error}") from None
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY)
        raise AssertionError("unreachable")

    def _check_same_object(self, body, total, etag) -> None:
        if (self.size is not None and total is not None and total != self.size) or (
            self.etag and etag and etag != self.etag
        ):
            _close_quietly(body)
            raise ShardError(self.url, f"object changed while reading (size {self.size} -> {total}, etag {self.etag} -> {etag})")

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
        if 0 < gap <= SKIP_BY_READING:
            target, self.offset = self.offset, self._body_pos
            scratch = bytearray(min(gap, 1 << 16))
            while self.offset < target:
                view = memoryview(scratch)[: min(len(scratch), target - self.offset)]
                if self._readinto_body(view) == 0:
                    break
            self.offset = target
            return
        _close_quietly(self._body)
        self.seeks += 1
        self._body, _, _ = self._request(self.offset)

    def readinto(self, buffer) -> int:
        if self.size is not None and self.offset >= self.size:
            return 0
        self._catch_up()
        return self._readinto_body(buffer)

    def _readinto_body(self, buffer) -> int:
        failures = 0
        while True:
            try:
                n = self._body.readinto(buffer) if hasattr(self._body, "readinto") else self._read_fallback(buffer)
            except ShardError:
                raise
            except Exception as error:
                n, last_error = -1, error
            else:
                if n or self.size is None or self.offset >= self.size:
                    self.offset += n
                    self._body_pos += n
                    return n
                last_error = EOFError(f"connection closed at byte {self.offset} of {self.size}")
            failures += 1
            if failures > self.retries:
                raise ShardError(self.url, f"stream failed at byte {self.offset}: {last_error}")
            _close_quietly(self._body)
            self.resumes += 1
            time.sleep(min(0.05 * 2**failures, MAX_DELAY))
            self._body, _, _ = self._request(self.offset)

    def _read_fallback(self, buffer) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            _close_quietly(self._body)
        super().close()


def _close_quietly(body) -> None:
    try:
        body.close()
    except Exception:
        pass


# ------------------------------------------------------------------------------------------ http
def _http_open_at(url: str):
    def open_at(offset: int):
        request = urllib.request.Request(url, headers={"User-Agent": "wdsprep"})
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = urllib.request.urlopen(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as error:
            _close_quietly(error)  # its body holds the connection: close it before retrying (no socket per retry)
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


def open_http(url: str):
    return io.BufferedReader(ResumingStream(url, _http_open_at(url)), REMOTE_BUFFER)


def open_from(url: str, offset: int):
    """An http(s):// or s3:// object from byte `offset` on: the first request already asks for that range."""
    open_at = _s3_open_at(url) if url.startswith("s3://") else _http_open_at(url)
    return io.BufferedReader(ResumingStream(url, open_at, start=offset), REMOTE_BUFFER)


# -------------------------------------------------------------------------------------------- s3
_clients: dict = {}
_clients_lock = threading.Lock()


def _client_key() -> tuple:
    env = os.environ
    return (
        os.getpid(),
        env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_PROFILE"),
        env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"),
    )


def s3_client():
    """A boto3 S3 client per process and environment; endpoint from AWS_ENDPOINT_URL(_S3) like the
    AWS CLI. Custom endpoints (MinIO, Ceph, moto) get path-style addressing unless
    `AWS_S3_ADDRESSING_STYLE` says otherwise."""
    key = _client_key()
    client = _clients.get(key)
    if client is not None:
        return client
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ShardError("s3://", "s3:// URLs need boto3: pip install 'wdsprep[s3]'") from None
    endpoint = key[1]
    style = os.environ.get("AWS_S3_ADDRESSING_STYLE") or ("path" if endpoint else "auto")
    config = Config(
        connect_timeout=TIMEOUT,
        read_timeout=TIMEOUT,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": style},
        max_pool_connections=32,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            # a Session per client: boto3's default session is not thread-safe to create clients from
            client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)
            _clients[key] = client
    return client


def split_s3(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ShardError(url, "an s3:// URL needs a bucket: s3://BUCKET/KEY")
    return bucket, key


def s3_error_code(error: Exception) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


PERMANENT_S3 = {"NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403", "InvalidRange", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "PreconditionFailed", "412"}


def _s3_open_at(url: str):
    bucket, key = split_s3(url)
    state: dict = {}

    def open_at(offset: int):
        client = s3_client()
        kwargs = {"Bucket": bucket, "Key": key}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
            if state.get("etag"):
                kwargs["IfMatch"] = state["etag"]  # the same object, or a clear error
        try:
            response = client.get_object(**kwargs)
        except Exception as error:
            code = s3_error_code(error)
            if code in ("NoSuchKey", "404"):
                raise ShardError(url, "no such object") from None
            if code == "NoSuchBucket":
                raise ShardError(url, "no such bucket") from None
            if code in ("PreconditionFailed", "412"):
                raise ShardError(url, "object changed while reading (ETag no longer matches)") from None
            if code in PERMANENT_S3:
                raise ShardError(url, f"S3 error {code}") from None
            raise
        etag = response.get("ETag")
        state.setdefault("etag", etag)
        total = offset + int(response["ContentLength"])
        content_range = response.get("ContentRange")
        if content_range and "/" in content_range:
            total = int(content_range.rsplit("/", 1)[1])
        body = response["Body"]
        return getattr(body, "_raw_stream", body), total, etag

    return open_at


def open_s3(url: str):
    return io.BufferedReader(ResumingStream(url, _s3_open_at(url)), REMOTE_BUFFER)


register_opener("http", open_http)
register_opener("https", open_http)
register_opener("s3", open_s3)


# ------------------------------------------------------------------------------- webdataset gopen
_registered = False


def register_webdataset_schemes() -> None:
    """Make `webdataset.gopen` read `s3://` and `http(s)://` through these resuming streams.

    Writing (`mode="wb"`) to `s3://` streams a multipart upload from memory (no local file);
    writing to `http(s)://` keeps webdataset's own handler. Idempotent."""
    global _registered
    if _registered:
        return
    wds_gopen = sys.modules.get("webdataset.gopen")  # the module (the package exports a function)
    if wds_gopen is None:
        # importing webdataset pulls in torch (seconds): register when webdataset itself is imported
        if not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _RegisterOnImport())
        return
    schemes = wds_gopen.gopen_schemes
    previous_http = schemes.get("http")
    previous_https = schemes.get("https")

    def gopen_s3(url, mode="rb", bufsize=8192, **kw):
        if mode == "rb":
            return open_s3(url)
        if mode == "wb":
            from .s3 import S3StreamWriter

            return S3StreamWriter(url)
        raise ValueError(f"{url}: unsupported mode {mode!r}")

    def make_http(previous):
        def gopen_http(url, mode="rb", bufsize=8192, **kw):
            if mode == "rb":
                return open_http(url)
            if previous is None:
                raise ValueError(f"{url}: cannot write to http(s)")
            return previous(url, mode, bufsize, **kw)

        return gopen_http

    schemes["s3"] = gopen_s3
    schemes["http"] = make_http(previous_http)
    schemes["https"] = make_http(previous_https)
    _registered = True


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Runs `register_webdataset_schemes` right after `webdataset.gopen` is first imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "webdataset.gopen":
            return None
        sys.meta_path.remove(self)  # find the real module with the other finders
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterOnImport)]
            register_webdataset_schemes()

        loader.exec_module = exec_module
        return spec
