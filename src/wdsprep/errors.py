"""One exception hierarchy: every message names the input (file, URL, key) and the rule broken.

Every exception class wdsprep defines lives here and is exported from `wdsprep` (a test scans the
package for classes defined elsewhere). A class that is also a builtin error keeps that base, so
`except ValueError` around it still works.

    WdsprepError
    ├── InputError            native input missing or malformed
    ├── OutputError           output not writable: full disk, permissions, directory in use
    ├── ConversionError       units failed (each failure named), no manifest written
    ├── UnitFailedError       a unit failed on every attempt on Ray (`cause`, `attempts`)
    ├── FormatError           a shard, member or manifest breaks the wdsprep format
    │   ├── ShardError
    │   └── ManifestError
    ├── ConfigError           invalid conversion or reader configuration
    ├── UploadError           a shard could not be uploaded and verified
    ├── FetchError            a RawNIND fetch cannot go on at all (server, destination, index)
    ├── DownloadError         one file of a fetch failed this attempt (`transient`: a retry may help)
    └── DeepRegSamplingError  (also a ValueError) DeepReg's sampling rules refuse the configuration
"""
from __future__ import annotations


def _rebuilt(cls: type, args: tuple, state: dict) -> "WdsprepError":
    """An error as it was pickled: its arguments and attributes, without calling its `__init__`."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class WdsprepError(Exception):
    """Base class of every error wdsprep raises on purpose. Each pickles as it is (a process pool, Ray
    or a spawned worker hands it back with its class, message and attributes)."""

    def __reduce__(self):
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


class InputError(WdsprepError):
    """Native input is missing or malformed (names the file and the problem)."""


class OutputError(WdsprepError):
    """The output cannot be written: a full disk, no permission, or a directory in use by another run."""


class ConversionError(WdsprepError):
    """Some units of a conversion failed; the message names each failure and no manifest was written."""


class UnitFailedError(WdsprepError):
    """A unit that failed on every attempt; `cause` is the last exception raised by the task."""

    def __init__(self, cause: BaseException, attempts: int, traceback_text: str = ""):
        self.cause = cause
        self.attempts = attempts
        self.traceback_text = traceback_text
        times = "once" if attempts == 1 else f"{attempts} times"
        super().__init__(f"{type(cause).__name__}: {cause} (failed {times} on Ray)")


class FormatError(WdsprepError):
    """A shard, member or manifest breaks the wdsprep format."""


class ShardError(FormatError):
    """A shard is unreadable, truncated or does not match its manifest row."""

    def __init__(self, url: str, message: str | None = None):
        if message is None:  # one argument, the whole text: how torch's DataLoader raises a worker's error again
            url, message = url.split(": ", 1) if ": " in url and "\n" not in url else ("", url)
        self.url, self.reason = url, message
        super().__init__(f"{url}: {message}" if url else message)


class ManifestError(FormatError):
    """A manifest is missing, of an unknown version, or inconsistent."""


class ConfigError(WdsprepError):
    """A conversion or reader configuration is invalid."""


class UploadError(WdsprepError):
    """A shard could not be uploaded and verified (names the shard and the destination)."""


class FetchError(WdsprepError):
    """A configuration problem that stops the fetch at once (server, destination, index)."""


class DownloadError(WdsprepError):
    """One file's download attempt failed (names the URL); `transient` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool):
        self.transient = transient
        super().__init__(message)


class DeepRegSamplingError(WdsprepError, ValueError):
    """DeepReg's ValueError for a sampling configuration that cannot work (same message)."""


def raised_in_worker(error: WdsprepError) -> WdsprepError:
    """A DataLoader worker's error as it was raised there, one line. torch raises it again in the main
    process by calling its class with the worker's whole traceback ("Caught ShardError in DataLoader
    worker process 0.\nOriginal Traceback ... wdsprep.errors.ShardError: <line>"); an error of one line
    is returned as it is. The error given loses its traceback: its frames hold torch's iterator in a
    cycle, which a later DataLoader's forked workers would collect (and fail to shut down)."""
    text = str(error)
    if "\n" not in text:
        return error
    last = text.rstrip().splitlines()[-1]
    name = f"{type(error).__name__}: "
    if name not in last:
        return error
    error.with_traceback(None)
    return type(error)(last.split(name, 1)[1])
