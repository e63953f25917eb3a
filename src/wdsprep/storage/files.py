"""Small helpers for local files that every store and the shard writer share: hashing, removing,
and turning a failed write into one `OutputError` line."""
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
