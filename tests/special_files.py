"""Output paths that are not wdsprep's to replace, made the way a stranger would leave them: a FIFO,
a device node (/dev/null's numbers; the test is skipped where making one is not permitted) or a
symlink to a file elsewhere. Used by tests/core/test_output_paths.py and tests/show/test_show_out.py."""
from __future__ import annotations

import os
import pathlib
import stat

import pytest

KIND_TEXT = {"fifo": "a FIFO", "device": "a character device", "symlink": "a symbolic link"}
NOT_OURS = b"a file that is not wdsprep's\n"


def make_special(path: pathlib.Path, kind: str, elsewhere: pathlib.Path, content: bytes = NOT_OURS):
    """Put a FIFO, a device node (/dev/null's numbers) or a symlink to `elsewhere` (holding
    `content`) at `path`; returns a check that it is still exactly that (and `elsewhere` unchanged)."""
    elsewhere.write_bytes(content)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node is not permitted here")
    else:
        os.symlink(elsewhere, path)
    before = os.lstat(path)

    def unchanged() -> bool:
        now = os.lstat(path)
        same = (now.st_ino, now.st_mode, now.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
        return same and elsewhere.read_bytes() == content
    return unchanged
