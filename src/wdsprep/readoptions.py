"""The read side's settings: `ReadOptions`, the one home of their defaults, their environment
variables and their rules.

`ReadOptions` is a frozen dataclass: the dataset's read-ahead (`prefetch_bytes`, `max_connections`),
every remote read (`retries`, `timeout`, the rate floor `min_rate` over `rate_window`,
`skip_by_reading`), the part sizes of S3 uploads (`s3_multipart_bytes`, `s3_part_bytes`), the
dataset's local shard cache (`cache_dir`, `cache_bytes`), how far apart two samples of a remote
shard may lie for `MapDataset` to read them by one request (`gap_bytes`) and the node-local cache of
remote shard tables (`table_cache_dir`: stream/manifests.py). Every field but the shard cache's and
`gap_bytes` has an environment variable (`VARIABLES`); docs/objectstore.md#settings is their one
table. Every reader takes them the same way (`ReadOptions.given`): `read_options=` (a
`ReadOptions`; None: the environment's) and the fields as keywords, each overriding it.

When they are read. Never at import. `ReadOptions.from_environment(**keywords)` reads the
environment when it is called: once when a dataset is made (`wdsprep.dataset`, whose keywords
override the environment; the options then travel with the dataset into its DataLoader workers and
are handed down to the reader, the read-ahead and the URL schemes), and at the point of use where
storage is used outside a dataset (`wdsprep.urls`, manifest fetches, `inspect`, `verify`, `show`,
`upload`: `storage.resuming.ResumingScheme.options`, `storage.s3.S3Store`). So a value set with
`os.environ` after `import wdsprep` counts, and a bad value fails only what reads it (a local
`convert` reads none of them).

Checked in one place. Every value, a variable's text or a keyword's value, is checked here by its
field's rule (`SETTINGS`), and a bad one is one `ConfigError` line naming the variable or keyword,
the value and the rule: `WDSPREP_RETRIES='abc': must be a whole number >= 0 (retries of a failed
remote read; default 5)`. A variable set to the empty string is a bad value, not an unset one. The
checkers are the ground floor's (wdsprep/checks.py), which the stream's own options, the Ray
executor's `WDSPREP_RAY_RETRIES` and the command line use too.

Invariants of a `ReadOptions` (its `__post_init__` checks them, so no unchecked one exists):
`prefetch_bytes` is 0 (no read-ahead) or at least two requests of `MIN_RANGE`; `max_connections`
None (the worker's share of a rank's, stream/reading/readahead.py) or 1..`MAX_CONNECTIONS` (each request at once
is a thread of the read-ahead: 10^6 of them would start 10^6 threads); `retries` >= 0; `timeout` and
`rate_window` finite and > 0; `min_rate` finite and >= 0 (0: no floor); `skip_by_reading` >= 0;
`s3_multipart_bytes` >= 1; `s3_part_bytes` >= `MIN_S3_PART_BYTES` (S3's smallest part);
`cache_bytes` > 0; `gap_bytes` >= 0. Every time and size has a maximum too, far above any useful value and below what
would overflow or stand for "forever" (`WDSPREP_TIMEOUT=1e23`): `timeout` and `rate_window` at most
`MAX_SECONDS` (an hour), `min_rate` at most `MAX_RATE` (100 GB/s), `prefetch_bytes` and
`skip_by_reading` at most `MAX_READ_BYTES` (64 GiB: memory or bytes read through per worker),
`s3_multipart_bytes` and `s3_part_bytes` at most `MAX_S3_PART_BYTES` (S3's largest part and single
PUT, 5 GiB), `cache_bytes` at most `MAX_CACHE_BYTES` (1 PiB), `gap_bytes` at most `MAX_READ_BYTES`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .checks import number, refuse, size, whole_number

MIB = 1 << 20
MAX_CONNECTIONS = 256  # Range requests at once per worker: each is a thread of the read-ahead (stream/reading/readahead.py)
MIN_RANGE = 64 << 10  # the read-ahead's smallest Range request (stream/reading/readahead.py)
MIN_S3_PART_BYTES = 5 * MIB  # S3's minimum for every part of a multipart upload but the last
DEFAULT_CACHE_BYTES = 10 * 10**9
GAP_BYTES = 256 << 10  # the read-ahead's first range, whose transfer costs about what one more round trip does
# the maxima (module docstring): a value above is a mistake, never a setting that means something
MAX_SECONDS = 3600.0
MAX_RATE = 1e11
MAX_READ_BYTES = 64 << 30
MAX_S3_PART_BYTES = 5 << 30  # S3's largest part, and its largest single PUT
MAX_CACHE_BYTES = 1 << 50


@dataclass(frozen=True)
class Setting:
    """One field's environment variable (None: keyword only) and its check."""

    variable: str | None
    check: Callable[[Any, str], Any]  # (value, the name to give in an error) -> the checked value


SETTINGS: dict[str, Setting] = {
    "prefetch_bytes": Setting("WDSPREP_PREFETCH_BYTES", lambda value, name: size(
        value, name, 2 * MIN_RANGE, "bytes each worker fetches ahead of its reader; default 64MiB", zero="no read-ahead",
        maximum=MAX_READ_BYTES)),
    "max_connections": Setting("WDSPREP_MAX_CONNECTIONS", lambda value, name: whole_number(
        value, name, 1, "Range requests at once per worker, each a thread; default: 32 per rank shared by its "
        "workers, at least 8 each", maximum=MAX_CONNECTIONS)),
    "retries": Setting("WDSPREP_RETRIES", lambda value, name: whole_number(
        value, name, 0, "retries of a failed remote read; default 5")),
    "timeout": Setting("WDSPREP_TIMEOUT", lambda value, name: number(
        value, name, 0, "seconds per connect and per read of a remote request; default 30", above=True,
        maximum=MAX_SECONDS)),
    "min_rate": Setting("WDSPREP_MIN_RATE", lambda value, name: number(
        value, name, 0, "bytes/s a remote body must arrive at, 0: no floor; default 1024", maximum=MAX_RATE)),
    "rate_window": Setting("WDSPREP_RATE_WINDOW", lambda value, name: number(
        value, name, 0, "seconds of waiting over which the rate floor is judged; default 30", above=True,
        maximum=MAX_SECONDS)),
    "skip_by_reading": Setting("WDSPREP_SKIP_BY_READING", lambda value, name: size(
        value, name, 0, "forward seeks on a remote stream up to this are read through; default 1MiB",
        maximum=MAX_READ_BYTES)),
    "s3_multipart_bytes": Setting("WDSPREP_S3_MULTIPART_BYTES", lambda value, name: size(
        value, name, 1, "S3 uploads above this are multipart; default 64MiB", maximum=MAX_S3_PART_BYTES)),
    "s3_part_bytes": Setting("WDSPREP_S3_PART_BYTES", lambda value, name: size(
        value, name, MIN_S3_PART_BYTES, "the part size of S3 multipart uploads, S3's smallest is 5MiB; default 16MiB",
        maximum=MAX_S3_PART_BYTES)),
    "cache_dir": Setting(None, lambda value, name: _directory(value, name)),
    "table_cache_dir": Setting("WDSPREP_TABLE_CACHE_DIR", lambda value, name: _directory(
        value, name, "the node-local cache of remote shard tables, by sha256; default: none, kept in memory")),
    "cache_bytes": Setting(None, lambda value, name: size(value, name, 1, "the shard cache's bound; default 10GB",
                                                          maximum=MAX_CACHE_BYTES)),
    "gap_bytes": Setting(None, lambda value, name: size(
        value, name, 0, "MapDataset: samples of one remote shard at most this far apart are read by one request; "
                        "default 256KiB", maximum=MAX_READ_BYTES)),
}

VARIABLES: dict[str, str] = {field: setting.variable for field, setting in SETTINGS.items() if setting.variable}


def _directory(value: Any, name: str, meaning: str = "the local shard cache") -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return os.fspath(value)
    raise refuse(value, name, "must be a directory path", meaning)


@dataclass(frozen=True)
class ReadOptions:
    """The read side's settings with their defaults (see the module docstring); checked when made."""

    prefetch_bytes: int = 64 * MIB
    max_connections: int | None = None  # None: the worker's share of a rank's (stream/reading/readahead.py)
    retries: int = 5
    timeout: float = 30.0
    min_rate: float = 1024.0
    rate_window: float = 30.0
    skip_by_reading: int = 1 * MIB
    s3_multipart_bytes: int = 64 * MIB
    s3_part_bytes: int = 16 * MIB
    cache_dir: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    gap_bytes: int = GAP_BYTES  # MapDataset: samples of a remote shard this close are one Range request
    table_cache_dir: str | None = None  # remote shard tables kept here by sha256, mapped by every process

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.default is None:
                continue
            object.__setattr__(self, field.name, SETTINGS[field.name].check(value, field.name))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, **keywords: Any) -> "ReadOptions":
        """The options the environment sets now (`os.environ` by default), each variable checked
        under its own name, with `keywords` (field names; None: not given) overriding them (a
        variable a keyword overrides is not read)."""
        if environ is None and not keywords:  # storage's point of use: once per distinct environment
            texts = tuple(os.environ.get(variable) for variable in VARIABLES.values())
            options = _FROM_ENVIRONMENT.get(texts)
            if options is None:
                if len(_FROM_ENVIRONMENT) >= 16:
                    _FROM_ENVIRONMENT.clear()
                options = _FROM_ENVIRONMENT[texts] = cls.from_environment(dict(zip(VARIABLES.values(), texts)))
            return options
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, variable in VARIABLES.items():
            text = environ.get(variable)
            if text is not None and keywords.get(field) is None:
                values[field] = SETTINGS[field].check(text, variable)
        for name, value in keywords.items():
            if name not in SETTINGS:
                raise TypeError(f"unexpected keyword argument {name!r} (read options: {', '.join(SETTINGS)})")
            if value is not None:
                values[name] = value
        return cls(**values)

    @classmethod
    def given(cls, read_options: "ReadOptions | None" = None, **keywords: Any) -> "ReadOptions":
        """What a reader that takes `read_options=` and the read keywords reads with (`wdsprep.dataset`,
        `wdsprep.mix`, `wdsprep.MapDataset`): `read_options`, else the environment's (read now), each
        keyword given (not None) overriding it."""
        if read_options is None:
            return cls.from_environment(**keywords)
        if not isinstance(read_options, ReadOptions):
            raise refuse(read_options, "read_options", "must be a wdsprep.ReadOptions (or None: the environment's)")
        return read_options.replace(**{name: value for name, value in keywords.items() if value is not None})

    def replace(self, **changes: Any) -> "ReadOptions":
        unknown = set(changes) - set(SETTINGS)
        if unknown:
            raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r} (read options: {', '.join(SETTINGS)})")
        return dataclasses.replace(self, **changes)


_FROM_ENVIRONMENT: dict[tuple, ReadOptions] = {}  # the variables' texts -> their checked options
