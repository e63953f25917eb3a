"""One exception hierarchy: every message names the input (file, URL, key) and the rule broken.

    WdsprepError
    ├── InputError        native input missing or malformed
    ├── OutputError       output not writable: full disk, permissions, directory in use
    ├── ConversionError   units failed (each failure named), no manifest written
    ├── FormatError       a shard, member or manifest breaks wdsprep/1
    │   ├── ShardError
    │   └── ManifestError
    └── ConfigError       invalid conversion or reader configuration
"""
from __future__ import annotations


class WdsprepError(Exception):
    """Base class of every error wdsprep raises on purpose."""


class InputError(WdsprepError):
    """Native input is missing or malformed (names the file and the problem)."""


class OutputError(WdsprepError):
    """The output cannot be written: a full disk, no permission, or a directory in use by another run."""


class ConversionError(WdsprepError):
    """Some units of a conversion failed; the message names each failure and no manifest was written."""


class FormatError(WdsprepError):
    """A shard, member or manifest breaks the wdsprep/1 format."""


class ShardError(FormatError):
    """A shard is unreadable, truncated or does not match its manifest row."""

    def __init__(self, url: str, message: str):
        self.url = url
        super().__init__(f"{url}: {message}")


class ManifestError(FormatError):
    """A manifest is missing, of an unknown version, or inconsistent."""


class ConfigError(WdsprepError):
    """A conversion or reader configuration is invalid."""
