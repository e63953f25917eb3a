"""Small helpers for local files and streams that every store, scheme and the shard writer share:
hashing, removing, filling a buffer from a stream, and turning a failed write into one `OutputError`
line."""
from __future__ import annotations

import errno
import hashlib
import os

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
