"""HTTP(S) and S3 streams that survive dropped connections by resuming at the byte offset.

A `ResumingStream` reads a remote object sequentially. When the connection drops or a transient
error occurs mid-body, it re-requests the object with `Range: bytes=<offset>-` and carries on, up to
`retries` times with exponential backoff; every request has connect/read timeouts. Nothing is
written to disk. A missing object (404 / NoSuchKey) fails at once with an error naming the URL.
"""
from __future__ import annotations

import io
import os
import time
import urllib.error
import urllib.request
from typing import Callable

from ..errors import ShardError
from .opener import BUFFER, register_opener

RETRIES = int(os.environ.get("WDSPREP_RETRIES", "5"))
TIMEOUT = float(os.environ.get("WDSPREP_TIMEOUT", "30"))


class ResumingStream(io.RawIOBase):
    """`open_at(offset)` returns (a readable body, total size or None); raises on permanent errors."""

    def __init__(self, url: str, open_at: Callable[[int], tuple], retries: int = RETRIES):
        self.url = url
        self._open_at = open_at
        self.retries = retries
        self.offset = 0
        self.resumes = 0  # how many times the stream re-requested with Range (for tests and logs)
        self._body, self.size = self._request(0)

    def _request(self, offset: int):
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                return self._open_at(offset)
            except ShardError:
                raise
            except Exception as error:  # transient: connection refused/reset, timeouts, 5xx
                if attempt == self.retries:
                    raise ShardError(self.url, f"giving up after {self.retries + 1} attempts: {error}") from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
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
                    return n
                last_error = EOFError(f"connection closed at byte {self.offset} of {self.size}")
            failures += 1
            if failures > self.retries:
                raise ShardError(self.url, f"stream failed at byte {self.offset}: {last_error}")
            self._close_body()
            self.resumes += 1
            self._body, _ = self._request(self.offset)

    def _read_fallback(self, buffer) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _close_body(self) -> None:
        try:
            self._body.close()
        except Exception:
            pass

    def close(self) -> None:
        if not self.closed:
            self._close_body()
        super().close()


# ------------------------------------------------------------------------------------------ http
def _http_open_at(url: str):
    def open_at(offset: int):
        request = urllib.request.Request(url)
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = urllib.request.urlopen(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as error:
            if error.code in (404, 410, 403, 401):
                raise ShardError(url, f"HTTP {error.code} {error.reason}") from None
            raise
        if offset and response.status != 206:
            response.close()
            raise ShardError(url, f"server ignored the Range request (HTTP {response.status})")
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        return response, total

    return open_at


def open_http(url: str):
    return io.BufferedReader(ResumingStream(url, _http_open_at(url)), BUFFER)


# -------------------------------------------------------------------------------------------- s3
_clients: dict = {}


def s3_client():
    """A boto3 S3 client per process; endpoint from AWS_ENDPOINT_URL(_S3) like the AWS CLI."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ShardError("s3://", "s3:// URLs need boto3: pip install 'wdsprep[s3]'") from None
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        config = Config(connect_timeout=TIMEOUT, read_timeout=TIMEOUT, retries={"max_attempts": 3, "mode": "standard"})
        client = boto3.client("s3", endpoint_url=endpoint, config=config)
        _clients[pid] = client
    return client


def split_s3(url: str) -> tuple[str, str]:
    rest = url[len("s3://") :]
    bucket, _, key = rest.partition("/")
    return bucket, key


def _s3_open_at(url: str):
    bucket, key = split_s3(url)

    def open_at(offset: int):
        client = s3_client()
        kwargs = {"Bucket": bucket, "Key": key}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
        try:
            response = client.get_object(**kwargs)
        except client.exceptions.NoSuchKey:
            raise ShardError(url, "no such object") from None
        except client.exceptions.NoSuchBucket:
            raise ShardError(url, "no such bucket") from None
        except Exception as error:
            code = getattr(error, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NoSuchBucket", "AccessDenied", "403", "InvalidRange"):
                raise ShardError(url, f"S3 error {code}") from None
            raise
        total = offset + int(response["ContentLength"])
        return response["Body"]._raw_stream if hasattr(response["Body"], "_raw_stream") else response["Body"], total

    return open_at


def open_s3(url: str):
    return io.BufferedReader(ResumingStream(url, _s3_open_at(url)), BUFFER)


register_opener("http", open_http)
register_opener("https", open_http)
register_opener("s3", open_s3)
