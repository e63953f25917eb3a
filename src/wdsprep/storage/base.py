"""The two extension points of `wdsprep.storage`: a `Scheme` (how one kind of URL is read, and
opened for writing) and a `Store` (a "directory" of named objects a conversion or an upload writes).

A new URL scheme is one module: a `Scheme` subclass (and a `Store` subclass if it can be written),
entered in `wdsprep.storage.SCHEMES` (or through `register_scheme`). The core never asks a store
what it is or whether it has a method: every method below exists on every store, and what a store
cannot do is declared by its capability flags, with a documented default that is always safe:

    supports_lock      `lock()` excludes a second conversion into the same store (default: a lock
                       that excludes nothing: object stores have no such lock)
    supports_append    `append_bytes` appends (default: it raises; the caller rewrites instead)
    supports_listing   `list_names` lists the store's objects (default: it raises; stale shards
                       of an earlier conversion are then left in place)

Required of every store: `publish`, `stat`, `read_bytes`, `write_bytes`, `delete`. Each write is
atomic: an object is either absent or complete under its final name. `ObjectStore` is what the
object stores (S3, GCS, Azure) share: keys under a prefix, publish-by-upload, sha256 metadata.
"""
from __future__ import annotations

import hashlib
import multiprocessing.util
import os
import secrets
import shutil
import tempfile
import threading
from typing import BinaryIO, Callable

from ..errors import ShardError
from .files import BUFFER, fill, output_error, remove_quietly


class NoLock:
    """What `Store.lock()` returns for a store that cannot be locked: releasing it does nothing."""

    def release(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_clients: dict = {}  # (pid, what, ...) -> a client (credentials, SDK client) of this process
_clients_lock = threading.RLock()  # reentrant: one make() may need another client (a client its credentials)


def per_process(key: tuple, make: Callable[[], object]):
    """`make()` once per process and `key` (what the client depends on: the environment's endpoint and
    credentials): a forked DataLoader worker never uses its parent's sockets or tokens, it makes its own."""
    key = (os.getpid(), *key)
    held = _clients.get(key)
    if held is None:
        with _clients_lock:
            held = _clients.get(key)
            if held is None:
                held = _clients[key] = make()
    return held


def _after_fork_in_child() -> None:
    global _clients_lock
    _clients_lock = threading.RLock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)

_staging: dict[int, str] = {}
_staging_lock = threading.Lock()


def process_staging_dir() -> str:
    """One temporary directory per process, removed at exit (it holds at most the shards being written)."""
    pid = os.getpid()
    with _staging_lock:
        path = _staging.get(pid)
        if path is None or not os.path.isdir(path):
            path = tempfile.mkdtemp(prefix="wdsprep-staging-")
            _staging[pid] = path
            # a multiprocessing finalizer runs at exit in the main process and in pool workers alike
            # (pool workers leave without running atexit handlers)
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(path, True), exitpriority=0)
    return path


class Store:
    """A "directory" `url` of named objects: a conversion's output, an upload's destination.

    Shards are written to a local file in `staging_dir()` and handed to `publish`, so the shard being
    written is the only local staging a remote store needs.
    """

    supports_lock = False
    supports_append = False
    supports_listing = False

    def __init__(self, url: str):
        self.url = url

    def name_url(self, name: str) -> str:
        """The URL of one object, as readers open it."""
        return f"{self.url.rstrip('/')}/{name}"

    # -- required
    def publish(self, local_path: str, name: str) -> None:
        """Make the finished local file `local_path` the object `name`, atomically; the local file is
        consumed (moved or removed)."""
        raise NotImplementedError

    def stat(self, name: str) -> int | None:
        """The object's size in bytes, or None if it is absent."""
        raise NotImplementedError

    def read_bytes(self, name: str) -> bytes | None:
        """The whole object, or None if it is absent."""
        raise NotImplementedError

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace the object `name` by `data`, atomically."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove the object if it is there (an absent object is not an error)."""
        raise NotImplementedError

    # -- documented defaults
    def staging_dir(self) -> str:
        """Where shards are written before `publish`: by default a temporary directory per process."""
        return process_staging_dir()

    def upload_file(self, local_path: str, name: str, sha256: str | None = None) -> None:
        """Copy a local file (kept) to the object `name`, atomically. `sha256` is the file's digest
        when the caller knows it (a store may record it). Default: a copy in `staging_dir()`, published."""
        temporary = os.path.join(self.staging_dir(), f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            # not mkstemp: it creates 0600, and a shard must be as readable as any ordinary file
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as source:
                shutil.copyfileobj(source, out, BUFFER)
                out.flush()
                os.fsync(out.fileno())
            self.publish(temporary, name)
        except OSError as error:
            remove_quietly(temporary)
            raise output_error(self.name_url(name), error) from None
        except BaseException:
            remove_quietly(temporary)
            raise

    def content_sha256(self, name: str) -> str | None:
        """The sha256 of the bytes really stored (None if absent). Default: read the object and hash it."""
        data = self.read_bytes(name)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def sha256(self, name: str) -> str | None:
        """The object's sha256, where a store may answer from what it recorded at upload (cheaper,
        trusting the upload's own check). Default: `content_sha256`."""
        return self.content_sha256(name)

    def lock(self, holder: str = "wdsprep convert"):
        """An exclusive lock for one run that writes the store (`release()` frees it); `holder` names
        the command, for the refusal another run gets. Default: `NoLock`."""
        return NoLock()

    def sync(self) -> None:
        """Make every object written so far durable, at once (a conversion, whose shards are written
        without one fsync each, calls it before its manifest). Default: nothing (an object store's
        writes are durable once answered)."""

    def append_bytes(self, name: str, data: bytes) -> None:
        """Append to the object `name` (only where `supports_append`)."""
        raise NotImplementedError(f"{self.url}: this store cannot append (supports_append is False)")

    def list_names(self) -> list[str]:
        """Sorted names of the objects directly in the store (only where `supports_listing`)."""
        raise NotImplementedError(f"{self.url}: this store cannot list (supports_listing is False)")

    def clean_temporaries(self, names: set[str] | None = None) -> None:
        """Remove what an interrupted writer left (temporary files, incomplete uploads): all of it, or
        only what belongs to `names`. Default: nothing to remove."""

    def check_replaceable(self, owned: Callable[[str], bool]) -> None:
        """Refuse (`OutputError`, one line), before any work, an existing entry whose name `owned`
        accepts and that a write must not replace: locally a symlink, FIFO, device, socket or
        directory (`files.refuse_special_entries`). Default: nothing to refuse (an object store
        holds only objects)."""


class ObjectStore(Store):
    """A "directory" `SCHEME://BUCKET/PREFIX` of an object store (S3, GCS, Azure): what they share.
    A shard is uploaded from its staging file by `publish`, which then removes the file; every object
    carries its sha256 as metadata, which `sha256` answers from (`recorded`); `content_sha256`
    re-reads the object through `reader`, the scheme that reads the store's URLs. A subclass gives
    `recorded(name)` and the writes (`upload_file`, `write_bytes`, `read_bytes`, `delete`, `list_names`)."""

    supports_listing = True
    reader: "Scheme"

    def __init__(self, root: str, prefix: str):
        self.root, self.prefix = root.rstrip("/"), prefix.strip("/")
        super().__init__(f"{self.root}/{self.prefix}" if self.prefix else self.root)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def name_url(self, name: str) -> str:
        return f"{self.root}/{self.key(name)}"

    def recorded(self, name: str) -> tuple[int, str | None] | None:
        """(size, the sha256 recorded at upload or None) of the object, or None if it is absent."""
        raise NotImplementedError

    def publish(self, local_path: str, name: str) -> None:
        """Upload a finished local shard under `name`, then remove the local file."""
        try:
            self.upload_file(local_path, name)
        finally:
            remove_quietly(local_path)

    def stat(self, name: str) -> int | None:
        found = self.recorded(name)
        return None if found is None else found[0]

    def sha256(self, name: str) -> str | None:
        """The sha256 recorded at upload; an object without one is hashed."""
        found = self.recorded(name)
        if found is None:
            return None
        return found[1] or self.content_sha256(name)

    def content_sha256(self, name: str) -> str | None:
        """Re-read the object and hash what is really there (None if it is absent)."""
        if self.stat(name) is None:
            return None
        digest = hashlib.sha256()
        with self.reader.open(self.name_url(name)) as stream:
            while block := stream.read(BUFFER):
                digest.update(block)
        return digest.hexdigest()


class Scheme:
    """How URLs of one scheme are read, and (when `writable`) opened as a `Store`.

    `open` is the one method a readable scheme must have. `webdataset = True` makes `import wdsprep`
    route webdataset's `gopen` for this scheme through `open` (and `open_write` for `wb`).
    `supports_ranges = True` declares that `read_into` is one bounded request over connections the
    scheme keeps alive, safe to run from several threads at once (storage/resuming.py): the dataset
    then reads ahead with parallel ranges (stream/reading/readahead.py); other schemes are read as one
    sequential stream per piece.
    """

    writable = False
    webdataset = False
    supports_ranges = False
    example = "SCHEME://..."  # how a URL of this scheme looks, for help texts and messages

    def open(self, url: str) -> BinaryIO:
        """A buffered binary stream over the object at `url`; errors are `ShardError`s naming it."""
        raise NotImplementedError

    def open_from(self, url: str, offset: int) -> BinaryIO:
        """The object from byte `offset` on. Default: `open`, then seek (or read up to it where the
        stream cannot seek). Remote schemes ask for the range in their first request instead."""
        stream = self.open(url)
        if stream.seekable():
            stream.seek(offset)
            return stream
        while offset and (skipped := len(stream.read(min(offset, BUFFER)))):
            offset -= skipped
        return stream

    def read_into(self, url: str, offset: int, view, check=None) -> int:
        """Fill `view` with the object's bytes from `offset` (fewer only where it ends sooner); how
        many came. The one bounded read of every scheme. Default: `open_from`, then read. Schemes
        with `supports_ranges` ask for exactly that range and resume within it; `check` (a
        `storage.resuming.ObjectCheck`, shared by several reads of one object) is what each of
        their responses must agree on (size, ETag)."""
        with self.open_from(url, offset) as stream:
            return fill(stream, view)

    def read_range(self, url: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes of the object from byte `offset` (fewer only where it ends sooner):
        `read_into` a new buffer. Remote schemes ask for exactly that range, so a picked sample
        costs its own bytes and no more (`wdsprep show`)."""
        data = bytearray(max(length, 0))
        return bytes(data[: self.read_into(url, offset, memoryview(data))])

    def local_path(self, url: str) -> str | None:
        """The local file behind `url`, for random access (mmap, map-style datasets), or None."""
        return None

    def pin(self, url: str) -> str:
        """The URL naming what `url` names now, however the store moves on (a Hub revision resolved
        to its commit): what a run reads and records. Default: `url` itself (a shard is held to its
        manifest row's size and digest instead)."""
        return url

    def unpinned(self, url: str) -> str:
        """`url` without what `pin` fixed (its revision): two URLs with one unpinned form name one
        location at two moments. Default: `url` itself."""
        return url

    def configured(self, options) -> "Scheme":
        """This scheme reading with `options` (a `wdsprep.readoptions.ReadOptions`: retries,
        timeouts, the rate floor; a dataset's), or None: as it is. Default: the scheme itself, a
        scheme with no such settings (`ResumingScheme` gives a copy that keeps them)."""
        return self

    def connect(self, connections: int) -> None:
        """Make this process's client (connection pool) now, with room for `connections` requests at
        once, so that the first read does not pay for it. Default: nothing to make."""

    def exists(self, url: str) -> bool:
        try:
            with self.open(url):
                return True
        except ShardError:
            return False

    def store(self, url: str, **options) -> Store:
        """The store at `url` (only where `writable`); `options` a store does not use are ignored."""
        raise NotImplementedError

    def open_write(self, url: str) -> BinaryIO | None:
        """A stream writing the object `url`, for webdataset's `gopen(url, "wb")`; None leaves the
        writing to webdataset's own handler."""
        return None


class FunctionScheme(Scheme):
    """A read-only scheme from one function `url -> binary stream` (`register_opener`'s form)."""

    def __init__(self, opener):
        self.opener = opener

    def open(self, url: str) -> BinaryIO:
        return self.opener(url)
