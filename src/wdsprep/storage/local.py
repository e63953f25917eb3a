"""Local paths (`/data/shards`, `shards/train-00000-00.tar`): read with `open`, written by `LocalStore`.

A shard read must be a regular file (a symlink to one is followed): a FIFO, device, socket or
directory under its name is one line naming it, never waited on or read (`files.open_to_read`, as the
manifest and tables are read; the names a store writes are refused before a command's work when they
are not regular files).

A local store writes shards in place (the shard writer's `.tmp` + rename is already atomic there) and
is used by one run at a time (a `convert` or a `reindex`): `lock(holder)` takes an exclusive `flock` on
`.wdsprep.lock` in the directory, which the kernel releases when the process exits, even on kill -9,
and writes the holding command and its pid there, so a second run's refusal names what holds it. Files are created with
mode 0666 less the umask (0644 by default), like any ordinary file; a write that fails (a full disk)
removes its temporary file and raises `OutputError` naming the file. A name that exists and is not a
regular file (a symlink, FIFO, device, socket, directory) is never written through, renamed over,
appended to or removed: one `OutputError` line (`files.refuse_unless_regular`); `check_replaceable`
refuses such entries before a command's work begins.
"""
from __future__ import annotations

import fcntl
import os
from typing import BinaryIO

from ..errors import ConfigError, OutputError, ShardError
from .base import Scheme, Store
from .files import (BUFFER, file_sha256, open_regular, open_to_read, output_error, refuse_special_entries,
                    refuse_unless_regular, remove_quietly, write_atomically)

LOCK_NAME = ".wdsprep.lock"


def open_local(path: str) -> BinaryIO:
    try:
        return os.fdopen(open_to_read(path), "rb", buffering=BUFFER)
    except FileNotFoundError:
        raise ShardError(path, "no such file") from None
    except OSError as error:
        raise ShardError(path, f"cannot open ({error.strerror})") from None


class LocalStore(Store):
    supports_lock = True
    supports_append = True
    supports_listing = True

    def __init__(self, directory: str, **options):  # transfer options (part sizes) mean nothing here
        self.directory = os.path.abspath(directory)
        super().__init__(self.directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"{directory}: cannot create output directory ({error.strerror})") from None
        if not os.access(self.directory, os.W_OK):
            raise ConfigError(f"{directory}: output directory is not writable")

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def name_url(self, name: str) -> str:
        return self.path(name)

    def staging_dir(self) -> str:
        return self.directory  # writer's `.tmp` + rename is already atomic here

    def publish(self, local_path: str, name: str) -> None:
        if os.path.abspath(local_path) != self.path(name):
            refuse_unless_regular(self.path(name))
            os.replace(local_path, self.path(name))

    def stat(self, name: str) -> int | None:
        try:
            return os.stat(self.path(name)).st_size
        except FileNotFoundError:
            return None

    def content_sha256(self, name: str) -> str | None:
        return file_sha256(self.path(name)) if self.stat(name) is not None else None

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with open(self.path(name), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        write_atomically(self.path(name), data)

    def sync(self) -> None:
        os.sync()  # one flush of what was written, where an fsync per tiny shard waited on the disk each time

    def append_bytes(self, name: str, data: bytes) -> None:
        fd = open_regular(self.path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            with os.fdopen(fd, "ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            raise output_error(self.path(name), error) from None

    def lock(self, holder: str = "wdsprep convert") -> "DirectoryLock":
        return DirectoryLock(self.path(LOCK_NAME), holder)

    def delete(self, name: str) -> None:
        refuse_unless_regular(self.path(name))
        remove_quietly(self.path(name))

    def list_names(self) -> list[str]:
        return sorted(os.listdir(self.directory))

    def clean_temporaries(self, names: set[str] | None = None) -> None:
        """Temporary files end in `.tmp`: `NAME.tmp` (shard writer), `.NAME.XXXX.tmp` (writes, uploads).
        Only regular files are ours to remove (`check_replaceable` refuses anything else up front)."""
        for entry in os.scandir(self.directory):
            ours = entry.name.endswith(".tmp") and entry.is_file(follow_symlinks=False)
            if ours and (names is None or _temporary_of(entry.name) in names):
                remove_quietly(entry.path)

    def check_replaceable(self, owned) -> None:
        refuse_special_entries(self.directory, owned)


def _temporary_of(entry: str) -> str:
    """The object name a temporary file was written for."""
    if entry.startswith("."):
        return entry[1:].rsplit(".", 2)[0]
    return entry[: -len(".tmp")]


class DirectoryLock:
    """An exclusive, non-blocking `flock` on a lock file; the kernel drops it when the process dies.
    The file records who holds it (`holder`, e.g. "wdsprep reindex", and the pid), so another run's
    refusal names the command that holds the directory."""

    def __init__(self, path: str, holder: str = "wdsprep convert"):
        self.path = path
        self.fd = open_regular(path, os.O_RDWR | os.O_CREAT)  # never a symlink's target truncated below
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            recorded = os.pread(self.fd, 200, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise OutputError(
                f"{os.path.dirname(path)}: output directory in use by another {_holder_of(recorded)}; "
                "wait for it to finish or choose another output"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{holder}\npid {os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder_of(recorded: str) -> str:
    """Who holds a lock, from what its file records, for the refusal: `wdsprep reindex (pid 12)`
    (an older wdsprep recorded only `pid 12`)."""
    lines = recorded.splitlines()
    if len(lines) == 2 and lines[1].startswith("pid "):
        return f"{lines[0]} ({lines[1]})"
    return f"wdsprep run ({recorded})" if recorded.startswith("pid ") else "process"


class LocalScheme(Scheme):
    """A plain path (no scheme)."""

    writable = True
    example = "DIR"

    def open(self, url: str) -> BinaryIO:
        return open_local(url)

    def local_path(self, url: str) -> str | None:
        return url

    def exists(self, url: str) -> bool:
        return os.path.exists(url)

    def store(self, url: str, **options) -> LocalStore:
        return LocalStore(url, **options)


SCHEME = LocalScheme()
