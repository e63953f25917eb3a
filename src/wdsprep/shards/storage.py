"""Where a conversion's output lives: a local directory, or (with the s3 extra) an object store.

A store writes each shard through a local temporary file (the shard being written is the only local
staging) and publishes it atomically: `os.replace` locally, a completed (multipart) upload remotely.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Protocol

from ..errors import ConfigError


class Store(Protocol):
    url: str

    def staging_dir(self) -> str: ...
    def publish(self, local_path: str, name: str) -> None: ...
    def stat(self, name: str) -> int | None: ...
    def sha256(self, name: str) -> str | None: ...
    def read_bytes(self, name: str) -> bytes | None: ...
    def write_bytes(self, name: str, data: bytes) -> None: ...
    def delete(self, name: str) -> None: ...


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class LocalStore:
    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.url = self.directory
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"{directory}: cannot create output directory ({error.strerror})") from None
        if not os.access(self.directory, os.W_OK):
            raise ConfigError(f"{directory}: output directory is not writable")

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def staging_dir(self) -> str:
        return self.directory  # writer's `.tmp` + rename is already atomic here

    def publish(self, local_path: str, name: str) -> None:
        if os.path.abspath(local_path) != self.path(name):
            os.replace(local_path, self.path(name))

    def stat(self, name: str) -> int | None:
        try:
            return os.stat(self.path(name)).st_size
        except FileNotFoundError:
            return None

    def sha256(self, name: str) -> str | None:
        return file_sha256(self.path(name)) if self.stat(name) is not None else None

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with open(self.path(name), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path(name))

    def append_bytes(self, name: str, data: bytes) -> None:
        with open(self.path(name), "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass

    def list_names(self) -> list[str]:
        return sorted(os.listdir(self.directory))

    def clean_temporaries(self) -> None:
        for entry in os.listdir(self.directory):
            if entry.endswith(".tmp"):
                os.unlink(self.path(entry))


STORES: dict[str, type] = {}  # scheme -> store class, e.g. "s3" registered by wdsprep.stream.s3


def open_store(url: str) -> Store:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("", "file"):
        return LocalStore(url[len("file://") :] if scheme == "file" else url)
    if scheme not in STORES and scheme == "s3":
        from ..stream import s3  # noqa: F401  (registers the s3 store)
    if scheme not in STORES:
        raise ConfigError(f"{url}: cannot write to {scheme}:// (supported: local paths, file://, s3://)")
    return STORES[scheme](url)
