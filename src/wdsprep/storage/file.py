"""`file://PATH` URLs: a local path spelled as a URL; everything else is `local`'s."""
from __future__ import annotations

from typing import BinaryIO

from .local import LocalScheme, LocalStore

PREFIX = "file://"


class FileScheme(LocalScheme):
    example = "file://DIR"

    def local_path(self, url: str) -> str | None:
        return url[len(PREFIX) :]

    def open(self, url: str) -> BinaryIO:
        return super().open(self.local_path(url))

    def exists(self, url: str) -> bool:
        return super().exists(self.local_path(url))

    def store(self, url: str, **options) -> LocalStore:
        return super().store(self.local_path(url), **options)


SCHEME = FileScheme()
