"""`pipe:COMMAND` URLs: the standard output of a shell command, read as a stream (webdataset's form).

A reader that stops early closes the pipe; the command's SIGPIPE exit (status 141) is then not an
error, any other non-zero status is, naming the URL. A pipe cannot seek: `open_from` reads through.
"""
from __future__ import annotations

import io
import subprocess
from typing import BinaryIO

from ..errors import ShardError
from .base import Scheme
from .files import BUFFER

PREFIX = "pipe:"


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


class PipeScheme(Scheme):
    example = "pipe:COMMAND"

    def open(self, url: str) -> BinaryIO:
        return io.BufferedReader(_PipeStream(url[len(PREFIX) :], url), BUFFER)


SCHEME = PipeScheme()
