"""An optional local shard cache for repeated epochs, bounded in bytes (LRU), off by default.

`wdsprep.dataset(..., cache_dir="/scratch/wds", cache_bytes=50e9)` keeps shards read from remote URLs
in `cache_dir`. Unlike webdataset's `FileCache`, a miss does not download the whole shard before the
first sample: the stream is read as usual and teed into a temporary file, which becomes a cache entry
only if the read reached the end and the bytes match the manifest's size and sha256 (a reader that
stops early leaves nothing behind). Entries are named by the shard's sha256 (so same-named shards under
different prefixes never collide, and a re-converted shard is never served stale). Least recently
used entries are evicted (by mtime, touched on every hit) until the total fits in `cache_bytes`;
several DataLoader workers or processes may share one directory (writes are atomic renames, and
eviction tolerates entries vanishing under it). Local files are read in place, never cached.

Only a read of the whole shard from byte 0 is teed. A DataLoader worker that owns the tail of a
shard split between two workers seeks past the samples it skips: on a miss that seek abandons the
tee (its partial copy is dropped) and goes on as the plain remote stream, by Range request, so it
never downloads the head that the neighbouring worker reads. Each split shard is then fetched once
per epoch (plus at most `DRAIN_BYTES` drained by a head piece that tries to complete its entry).

Random access (`wdsprep.MapDataset`, stream/reading/access.py) asks for a shard's entry with `fetch`: on a
miss the whole shard is read through the same tee (one request) before its first sample, then the
entry is read in place.

An entry is checked as it is read, like any shard (its index against the row, every member against
its digest: stream/reading/read.py), not hashed whole on every hit. One that fails (a disk error, a file
altered or put under its name since it was admitted) is the cache's fault, not the server's: the
reader drops it (`drop`: removed, with one warning line naming the cached file and what failed) and
reads the rest of the shard from its URL, through the cache again; only if that copy fails too is
it the shard's error, naming the URL (the dataset: `ShardReader`; random access: `ShardAccess`).
An entry is only ever a regular file (storage/files.py's rule): one that is a symlink, FIFO,
device or directory is refused in one line naming it, never followed or waited on.
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import BinaryIO

from ...checks import size
from ...errors import ConfigError, OutputError, ShardError
from ...storage import BUFFER, local_path, open_url
from ...storage.files import open_regular
from ...storage.resuming import wrong_size
from .read import wrong_sha256

SUFFIX = ".tar"
DRAIN_BYTES = 1 << 20  # on close, read at most this much more to complete an entry (the tar end blocks)


class ShardCache:
    """The cache in `directory`, bounded by `max_bytes`; misses are read with `options` (the
    dataset's `ReadOptions`; None: the environment's when a shard is opened)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int | float, options=None):
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_bytes = size(max_bytes, "cache_bytes", 1, "the shard cache's bound")
        self.options = options
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"{directory}: cannot create cache directory ({error.strerror})") from None
        self.hits = 0
        self.misses = 0

    def entry_name(self, url: str, sha256: str | None) -> str:
        return (sha256 or "url-" + hashlib.sha256(url.encode()).hexdigest()) + SUFFIX

    def open(self, url: str, sha256: str | None = None, size: int | None = None) -> BinaryIO:
        """A stream over the shard: from the cache on a hit, else from `url`, teed into the cache."""
        return self.open_entry(url, sha256, size)[0]

    def open_entry(self, url: str, sha256: str | None = None, size: int | None = None) -> tuple[BinaryIO, Entry | None]:
        """(`open`'s stream, the cache entry it reads on a hit, else None): a reader whose check of
        the entry fails hands it to `drop`."""
        if local_path(url) is not None:
            return open_url(url, self.options), None
        path = os.path.join(self.directory, self.entry_name(url, sha256))
        try:
            fd = open_regular(path, os.O_RDONLY)  # a symlink, FIFO or device there: refused, never waited on
        except FileNotFoundError:
            fd = None
        except OutputError as error:
            raise ConfigError(f"cache_dir {self.directory}: {error}") from None
        if fd is not None:
            status = os.fstat(fd)
            if size is None or status.st_size == size:
                os.utime(fd)  # most recently used
                self.hits += 1
                return open(fd, "rb", buffering=BUFFER), Entry(path, status.st_dev, status.st_ino)
            os.close(fd)
        self.misses += 1
        if size is not None and size > self.max_bytes:
            return open_url(url, self.options), None  # would never fit: stream it without caching
        # not wrapped in another BufferedReader: `open_url` is buffered already, and an outer buffer
        # would be dropped and refilled on every seek of a piece that skips members (a tail piece)
        return _TeeStream(open_url(url, self.options), self, path, sha256, size), None

    def drop(self, entry: Entry, url: str, error: ShardError) -> None:
        """Remove `entry`, whose check failed as it was read (`error`), with one warning line naming
        it: the shard is read from `url` again. Only the file that was read is removed (one admitted
        since under its name stays), and said once."""
        if entry.dropped:
            return
        entry.dropped = True
        try:
            status = os.lstat(entry.path)
            if (status.st_dev, status.st_ino) == (entry.device, entry.inode):
                os.unlink(entry.path)
        except FileNotFoundError:
            pass
        warnings.warn(f"{entry.path}: cached copy of {url} failed its check ({error.reason}); "
                      f"dropped it, reading the shard from {url} again", UserWarning)

    def fetch(self, url: str, sha256: str | None, size: int | None) -> tuple[str | None, bool]:
        """(the path of the shard's entry, whether it was downloaded now) for random access
        (`wdsprep.MapDataset`): on a miss the whole shard is read into it (one request, admitted only
        once its size and sha256 match). The path is None for a local shard, one larger than the
        cache, or an entry evicted at once. A shard that does not match its row is a `ShardError`."""
        if local_path(url) is not None or (size is not None and size > self.max_bytes):
            return None, False
        path = os.path.join(self.directory, self.entry_name(url, sha256))
        stream, _ = self.open_entry(url, sha256, size)
        with stream:
            downloaded = isinstance(stream, _TeeStream)
            if downloaded:  # a miss: read it all (a hit is a file, read in place)
                while stream.read(BUFFER):
                    pass
                if stream.count != size and size is not None:
                    raise wrong_size(url, stream.count, size)
                if sha256 is not None and stream.digest.hexdigest() != sha256:
                    raise wrong_sha256(url)
        return (path if os.path.exists(path) else None), downloaded

    # -- bookkeeping
    def entries(self) -> list[tuple[float, int, str]]:
        found = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((stat.st_mtime, stat.st_size, entry.path))
        return sorted(found)

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, keep: str | None = None) -> None:
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:  # oldest first
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size

    def _admit(self, temporary: str, path: str) -> None:
        os.replace(temporary, path)
        self.evict(keep=path)


@dataclass
class Entry:
    """A cache entry a reader opened: its path, and the file it was (device, inode) when opened."""

    path: str
    device: int
    inode: int
    dropped: bool = False


class _TeeStream(io.RawIOBase):
    """Reads through the buffered `inner` (so `readinto` fills its buffer like a buffered reader's),
    copying into a temporary file that is admitted to the cache on a
    complete, verified read and deleted otherwise."""

    def __init__(self, inner: BinaryIO, cache: ShardCache, path: str, sha256: str | None, size: int | None):
        self.inner = inner
        self.cache = cache
        self.path = path
        self.sha256 = sha256
        self.size = size
        fd, self.temporary = tempfile.mkstemp(dir=cache.directory, prefix=".", suffix=".part")
        self.file = os.fdopen(fd, "wb")
        self.digest = hashlib.sha256()
        self.count = 0
        self.eof = False
        self.teeing = True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        try:
            return self.inner.seekable()
        except Exception:
            return False

    def tell(self) -> int:
        return self.count if self.teeing else self.inner.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.teeing:
            if (whence == io.SEEK_SET and offset == self.count) or (whence == io.SEEK_CUR and offset == 0):
                return self.count
            self._stop_teeing()  # not a whole read from byte 0: no cache entry, read by Range
        return self.inner.seek(offset, whence)

    def _stop_teeing(self) -> None:
        self.teeing = False
        self.file.close()
        try:
            os.unlink(self.temporary)
        except FileNotFoundError:
            pass

    def readinto(self, buffer) -> int:
        n = self.inner.readinto(buffer)
        if not self.teeing:
            return n
        if n:
            view = memoryview(buffer)[:n]
            self.file.write(view)
            self.digest.update(view)
            self.count += n
        else:
            self.eof = True
        return n

    def readall(self) -> bytes:
        chunks = []
        while True:
            block = self.read(BUFFER)
            if not block:
                return b"".join(chunks)
            chunks.append(block)

    def _drain(self) -> None:
        budget = DRAIN_BYTES
        block = bytearray(1 << 16)
        while not self.eof and budget > 0:
            if self.readinto(block) == 0:
                break
            budget -= len(block)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.teeing:
                return
            try:
                self._drain()
            except Exception:
                self.eof = False
            self.file.close()
            complete = self.eof and (self.size is None or self.count == self.size) and (
                self.sha256 is None or self.digest.hexdigest() == self.sha256
            )
            if complete:
                self.cache._admit(self.temporary, self.path)
            else:
                os.unlink(self.temporary)
        finally:
            try:
                self.inner.close()
            finally:
                super().close()
