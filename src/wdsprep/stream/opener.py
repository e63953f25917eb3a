"""Opening shard URLs as sequential binary streams, without copying anything to local disk.

Schemes: local paths, `file://`, `http(s)://` (Range-resuming on dropped connections), `s3://`
(boto3; endpoint from `AWS_ENDPOINT_URL`), `pipe:CMD`. Importing wdsprep registers `s3` (and our
resuming `http`) with webdataset's `gopen`, so plain `wds.WebDataset("s3://...")` works too.
"""
from __future__ import annotations

import io
import os
import subprocess
from typing import BinaryIO, Callable

from ..errors import ShardError

BUFFER = 1 << 20
OPENERS: dict[str, Callable[[str], BinaryIO]] = {}


def register_opener(scheme: str, opener: Callable[[str], BinaryIO]) -> None:
    OPENERS[scheme] = opener


def _open_local(path: str) -> BinaryIO:
    try:
        return open(path, "rb", buffering=BUFFER)
    except FileNotFoundError:
        raise ShardError(path, "no such file") from None
    except OSError as error:
        raise ShardError(path, f"cannot open ({error.strerror})") from None


class _PipeStream(io.RawIOBase):
    def __init__(self, command: str, url: str):
        self.url = url
        self.process = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, bufsize=BUFFER)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.process.stdout.readinto(buffer)
        if n == 0:
            status = self.process.wait()
            if status not in (0, 141):  # 141: SIGPIPE when the reader stops early
                raise ShardError(self.url, f"pipe command exited with status {status}")
        return n

    def close(self) -> None:
        if not self.closed:
            self.process.stdout.close()
            if self.process.poll() is None:
                self.process.terminate()
            self.process.wait()
        super().close()


def scheme_of(url: str) -> str:
    if url.startswith("pipe:"):
        return "pipe"
    return url.split("://", 1)[0].lower() if "://" in url else ""


def open_url(url: str) -> BinaryIO:
    """A buffered binary stream over a shard or manifest URL; errors name the URL."""
    scheme = scheme_of(url)
    if scheme == "":
        return _open_local(url)
    if scheme == "file":
        return _open_local(url[len("file://") :])
    if scheme == "pipe":
        return io.BufferedReader(_PipeStream(url[len("pipe:") :], url), BUFFER)
    if scheme not in OPENERS and scheme in ("http", "https", "s3"):
        from . import remote  # noqa: F401  (registers http, https, s3)
    opener = OPENERS.get(scheme)
    if opener is None:
        raise ShardError(url, f"no opener for {scheme}:// URLs (supported: paths, file, http, https, s3, pipe)")
    return opener(url)


def read_url(url: str) -> bytes:
    with open_url(url) as stream:
        return stream.read()


def local_path(url: str) -> str | None:
    scheme = scheme_of(url)
    if scheme == "":
        return url
    if scheme == "file":
        return url[len("file://") :]
    return None


def exists(url: str) -> bool:
    path = local_path(url)
    if path is not None:
        return os.path.exists(path)
    try:
        with open_url(url):
            return True
    except ShardError:
        return False
