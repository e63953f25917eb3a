"""Where a conversion's output lives: a local directory, or (with the s3 extra) an object store.

A store writes each shard through a local temporary file (the shard being written is the only local
staging) and publishes it atomically: `os.replace` locally, a completed (multipart) upload remotely.

A local store is used by one conversion at a time: `lock()` takes an exclusive `flock` on
`.wdsprep.lock` in the directory, which the kernel releases when the process exits, even on kill -9.
Files are created with mode 0666 less the umask (0644 by default), like any ordinary file; a write
that fails (a full disk) removes its temporary file and raises `OutputError` naming the file.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
from typing import Protocol

from ..errors import ConfigError, OutputError

LOCK_NAME = ".wdsprep.lock"


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
        tmp = self.path(f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            # not mkstemp: it creates 0600, and a manifest must be as readable as its shards
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path(name))
        except OSError as error:
            remove_quietly(tmp)
            raise output_error(self.path(name), error) from None

    def append_bytes(self, name: str, data: bytes) -> None:
        try:
            with open(self.path(name), "ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            raise output_error(self.path(name), error) from None

    def lock(self) -> "DirectoryLock":
        return DirectoryLock(self.path(LOCK_NAME))

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
                remove_quietly(self.path(entry))


class DirectoryLock:
    """An exclusive, non-blocking `flock` on a lock file; the kernel drops it when the process dies."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise output_error(path, error) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 100, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            raise OutputError(
                f"{os.path.dirname(path)}: output directory in use by another wdsprep convert ({holder}); "
                "wait for it to finish or choose another output"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()}".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def output_error(path: str, error: OSError) -> OutputError:
    """One line for a failed write; a full disk says so plainly."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"{path}: no space left on the output device ({error.strerror})")
    return OutputError(f"{path}: cannot write ({error.strerror or error})")


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
