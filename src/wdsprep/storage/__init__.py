"""Every URL scheme wdsprep reads and writes, behind one table: `SCHEMES`, scheme name -> `Scheme`.

    ""      local.py   a plain path                 read, write (`LocalStore`, locked, appends)
    file    file.py    file://PATH                  read, write (the same `LocalStore`)
    http(s) http.py    http(s)://HOST/PATH          read (Range-resuming; byte ranges, pooled connections)
    s3      s3.py      s3://BUCKET/KEY              read (Range-resuming; byte ranges), write (`S3Store`)
    gs      gcs.py     gs://BUCKET/KEY              read (ranged GETs over http.py's client), write (`GCSStore`)
    az      azure.py   az://CONTAINER/BLOB          read (ranged GETs over http.py's client), write (`AzureStore`)
    hf      hf.py      hf://datasets/ORG/NAME@REV/P read (ranged GETs of the Hub's resolve URLs; `pin`: revision -> commit)
    pipe    pipe.py    pipe:COMMAND                 read (a shell command's standard output)

Reading (`open_url`, `open_from`, `read_range`, `read_url`, `local_path`, `exists`: shards, manifests, the cache)
and writing (`open_store`: conversion output, upload destination) look the scheme up in the same
table, in one line each. A new scheme is one module with a `Scheme` (and, if it is writable, a
`Store`; both in `storage/base.py`), entered with `register_scheme` or in the table below.
Importing wdsprep routes webdataset's `gopen` through the schemes marked `webdataset` (see
`storage/gopen.py`), so plain `wds.WebDataset("s3://...")` works too. Reading a URL streams:
nothing is copied to local disk unless a cache is asked for. `read_range` (and a scheme's
`read_into`, which fills a buffer) is the one bounded read: remotely one Range request for exactly
those bytes, resumed within them (storage/resuming.py); schemes with `supports_ranges` run several
at once over their pooled connections for the dataset's read-ahead (stream/reading/readahead.py).
Remote schemes read with a `ReadOptions` (retries, timeouts, rate floor: wdsprep/readoptions.py):
a dataset's, handed down with `Scheme.configured(options)` or `open_url(url, options)`, else the
environment's at the moment of use (never at import).
"""
from __future__ import annotations

from typing import BinaryIO, Callable

from ..errors import ConfigError, ShardError
from . import azure, file, gcs, hf, http, local, pipe, s3
from .base import FunctionScheme, Scheme, Store
from .files import BUFFER, file_sha256

SCHEMES: dict[str, Scheme] = {
    "": local.SCHEME,
    "file": file.SCHEME,
    "http": http.SCHEME,
    "https": http.SCHEME,
    "s3": s3.SCHEME,
    "gs": gcs.SCHEME,
    "az": azure.SCHEME,
    "hf": hf.SCHEME,
    "pipe": pipe.SCHEME,
}


def register_scheme(name: str, scheme: Scheme) -> None:
    """Read (and, if `scheme.writable`, write) `name://` URLs through `scheme`."""
    SCHEMES[name.lower()] = scheme


def register_opener(name: str, opener: Callable[[str], BinaryIO]) -> None:
    """Read `name://` URLs with `opener(url) -> binary stream` (a read-only scheme)."""
    register_scheme(name, FunctionScheme(opener))


def scheme_of(url: str) -> str:
    if url.startswith("pipe:"):
        return "pipe"
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _spelled(name: str) -> str:
    return {"": "paths", "pipe": "pipe:"}.get(name, f"{name}://")


def describe(*, writable: bool = False) -> str:
    """The schemes of the table as a user writes them (`DIR, file://DIR, s3://BUCKET/PREFIX`)."""
    examples = dict.fromkeys(scheme.example for scheme in SCHEMES.values() if scheme.writable or not writable)
    return ", ".join(examples)


def scheme_for(url: str) -> Scheme:
    scheme = SCHEMES.get(scheme_of(url))
    if scheme is None:
        supported = ", ".join(_spelled(name) for name in SCHEMES)
        raise ShardError(url, f"no opener for {scheme_of(url)}:// URLs (supported: {supported})")
    return scheme


def open_url(url: str, options=None) -> BinaryIO:
    """A buffered binary stream over a shard or manifest URL; errors name the URL. `options` (a
    `ReadOptions`, a dataset's): what a remote read retries, waits and floors by; None: the
    environment's when the stream opens."""
    return scheme_for(url).configured(options).open(url)


def open_from(url: str, offset: int) -> BinaryIO:
    """The object at `url` from byte `offset` on (one Range request remotely)."""
    return scheme_for(url).open_from(url, offset)


def read_range(url: str, offset: int, length: int) -> bytes:
    """Up to `length` bytes of `url` from `offset`: one bounded read (a Range request remotely)."""
    return scheme_for(url).read_range(url, offset, length)


def read_url(url: str, options=None) -> bytes:
    with open_url(url, options) as stream:
        return stream.read()


def pin(url: str) -> str:
    """`url` pinned to what it names now (`Scheme.pin`: a Hub revision resolved to its commit)."""
    return scheme_for(url).pin(url)


def unpinned(url: str) -> str:
    """`url` without what `pin` fixed (`Scheme.unpinned`)."""
    scheme = SCHEMES.get(scheme_of(url))
    return url if scheme is None else scheme.unpinned(url)


def local_path(url: str) -> str | None:
    """The local file behind `url`, or None for remote URLs (and unknown schemes)."""
    scheme = SCHEMES.get(scheme_of(url))
    return None if scheme is None else scheme.local_path(url)


def exists(url: str) -> bool:
    scheme = SCHEMES.get(scheme_of(url))
    return scheme is not None and scheme.exists(url)


def check_url(url: str, *, writable: bool = False) -> Scheme:
    """The scheme that reads `url` (and writes it, with `writable`); else one ConfigError line naming
    the schemes that do (what a command judges of a location before any work)."""
    name = scheme_of(url)
    scheme = SCHEMES.get(name)
    if scheme is None or (writable and not scheme.writable):
        verb = "write to" if writable else "read"
        raise ConfigError(f"{url}: cannot {verb} {_spelled(name)} (supported: {describe(writable=writable)})")
    return scheme


def open_store(url: str, **options) -> Store:
    """The store at `url`, for conversion output or as an upload destination; `options` are transfer
    settings (`multipart_bytes`, `part_bytes`) a store uses where they apply."""
    return check_url(url, writable=True).store(url, **options)


__all__ = [
    "SCHEMES",
    "Scheme",
    "Store",
    "BUFFER",
    "check_url",
    "describe",
    "exists",
    "file_sha256",
    "local_path",
    "open_from",
    "open_store",
    "open_url",
    "pin",
    "unpinned",
    "read_range",
    "read_url",
    "register_opener",
    "register_scheme",
    "scheme_for",
    "scheme_of",
]
