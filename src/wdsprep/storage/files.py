"""Small helpers for local files and streams that every store, scheme and the shard writer share:
hashing, removing, filling a buffer from a stream, turning a failed write into one `OutputError`
line, the one rule for what a write may replace, and the one atomic write of a whole small file.

Writes replace only what is ours: a local output path (a shard, a manifest, the units record, the
lock file, a temporary name, `wdsprep show --out`, an entry of the node-local table cache and its
lock) that exists and is not a regular file (a symlink, even to a regular file; a FIFO, a device
node, a socket, a directory) is refused with one line naming it, never followed, written into,
waited on or renamed over (`refuse_unless_regular`, `refuse_special_entries` before any work,
`open_regular` for a file opened in place, or read where wdsprep also writes it: a cache entry).

A whole file written at once (a manifest, the units record, the `wdsprep show` page) is written
atomically (`write_atomically`): to a temporary name beside it, `.NAME.XXXX.tmp` (what
`LocalStore.clean_temporaries` removes), synced, then renamed over it; a reader sees the old file or
the new one, never a part, and a failure leaves no temporary behind.

A small file a user names to be read (a key file) is read by `read_regular`: a regular file only (a
FIFO or device is refused without being waited on: `open_to_read`, which a local shard table is
mapped through too) and no more of it than its caller takes.
"""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from typing import Callable

from ..errors import OutputError

BUFFER = 1 << 20  # read size for local files and the buffer of local and pipe streams


def file_sha256(path: str, chunk: int = BUFFER) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fill(stream, buffer) -> int:
    """Read from `stream` into `buffer` until it is full or the stream ends; how many bytes came."""
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        n = stream.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled


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


KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def kind_of(mode: int) -> str:
    """What a file of `mode` (an `lstat` or `fstat` st_mode) is, in words: "a FIFO", "a symbolic link"."""
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def _not_regular(path: str, mode: int) -> OutputError:
    kind = kind_of(mode)
    return OutputError(f"{path}: exists and is {kind}, not a regular file; wdsprep replaces only regular files "
                       "(remove it or choose another output)")


def refuse_unless_regular(path: str) -> None:
    """`OutputError` when `path` exists and is not a regular file (symlinks are not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise output_error(path, error) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)


def refuse_special_entries(directory: str, owned: Callable[[str], bool]) -> None:
    """`OutputError` for the first entry of `directory` whose name `owned` accepts and that is not a
    regular file: the check a command makes before any work on the names it may write or remove."""
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return
    for entry in entries:
        if owned(entry.name) and not entry.is_file(follow_symlinks=False):
            raise _not_regular(entry.path, entry.stat(follow_symlinks=False).st_mode)


def open_regular(path: str, flags: int, mode: int = 0o666) -> int:
    """A file descriptor of `path` opened with `flags` (`O_CREAT` and the like, or `O_RDONLY` for a
    file wdsprep also writes: a cache entry), refused unless it is (or becomes) a regular file: a
    symlink is not followed (O_NOFOLLOW: nothing is created through it either) and a FIFO or device
    is never waited on (O_NONBLOCK, checked with fstat before anything is read or written). Without
    `O_CREAT`, a path that does not exist is `FileNotFoundError` (the caller's to handle)."""
    refuse_unless_regular(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):  # a symlink or a FIFO that appeared since the check
            refuse_unless_regular(path)
        if not flags & os.O_CREAT:
            if error.errno == errno.ENOENT:
                raise
            if not flags & (os.O_WRONLY | os.O_RDWR):
                raise OutputError(f"{path}: cannot read ({error.strerror or error})") from None
        raise output_error(path, error) from None
    status = os.fstat(fd).st_mode
    if not stat.S_ISREG(status):
        os.close(fd)
        raise _not_regular(path, status)
    os.set_blocking(fd, True)
    return fd


def open_to_read(path: str) -> int:
    """A read-only descriptor of the regular file `path` (a symlink to one is followed: a file the
    user names, a dataset's own table). Anything else (a FIFO, a device, a socket, a directory) is an
    `OSError` whose strerror names its kind, raised before it is read or waited on (stat first;
    opened O_NONBLOCK and checked again with fstat)."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        mode = os.fstat(fd).st_mode  # replaced since the stat: checked again before any read
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)  # O_NONBLOCK was for the open only (a regular file's reads ignore it)
            return fd
        os.close(fd)
    raise OSError(errno.EINVAL, f"{kind_of(mode)}, not a regular file", path)


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of the regular file `path` (`open_to_read`), at most `limit + 1` of them, so the
    caller sees when it holds more than it takes."""
    fd = open_to_read(path)
    try:
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, BUFFER))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """`path` holds `data` whole, or is left as it was: written to a temporary name beside it (mode
    0666 less the umask, like any ordinary file: not mkstemp's 0600), synced, and renamed over it.
    A `path` that exists and is not a regular file is refused (`refuse_unless_regular`) before the
    write and again before the rename; a failure removes the temporary and is one `OutputError`."""
    directory, name = os.path.split(path)
    refuse_unless_regular(path)
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        refuse_unless_regular(path)  # again: a rename replaces whatever is there now
        os.replace(temporary, path)
    except OutputError:
        remove_quietly(temporary)
        raise
    except OSError as error:
        remove_quietly(temporary)
        raise output_error(path, error) from None
