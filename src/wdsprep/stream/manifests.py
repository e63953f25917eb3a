"""Loading manifests and shard URLs from any location.

A manifest of version 2 keeps its shard rows in one shard table per split (shards/shardtable.py),
read here with it: a local table is mapped (`mmap`), so every process of a node shares one copy
through the page cache; a remote one (http(s)://, s3://) is fetched once per process, or not at
all when `ReadOptions.table_cache_dir` (`WDSPREP_TABLE_CACHE_DIR`) holds it: the cache keeps each
table under its sha256 (the one the manifest records, so a table that changed is a new name and
no request needs to ask whether it did), fetched by one process of the node while the others wait
on a lock file beside it (`<sha256>.shards.lock`), written atomically, then mapped like a local
one by every process. Every table is checked against its record (size, sha256) before use.

The cache's directory is not trusted (another user or a crash may have left anything there):
- its names are only ever regular files (storage/files.py's rule, `open_regular`): an entry or a lock
  file that is a symlink, FIFO, device, socket or directory is refused with one line naming it, never
  followed, created through, waited on (opened O_NOFOLLOW | O_NONBLOCK, checked with fstat) or
  renamed over;
- an entry is written to an unpredictable temporary name created O_EXCL (`files.write_atomically`:
  `.<sha256>.shards.<random>.tmp`, never through a link planted there), then renamed;
- an entry whose size or sha256 differs from the record (cut, altered, or another file put under its
  name) is dropped and fetched again by the process holding the lock, with one warning line naming
  it: a bad entry costs one fetch, never every later run.
"""
from __future__ import annotations

import fcntl
import functools
import os
import warnings

from ..errors import ManifestError, OutputError, ShardError
from ..shards import shardtable
from ..shards.manifest import MANIFEST_NAME, Manifest, join_url
from ..storage import local_path, pin, read_url, scheme_of
from ..storage.files import open_regular, remove_quietly, write_atomically


def manifest_location(url: str) -> str:
    """Accept the manifest URL itself or the directory/prefix holding it."""
    if url.endswith(".json"):
        return url
    return f"{url.rstrip('/')}/{MANIFEST_NAME}"


def load_manifest(url: str, options=None) -> Manifest:
    """The manifest at `url` (or in the directory/prefix `url`), read with `options` (a dataset's
    `ReadOptions`; None: the environment's, now), from its pinned URL (`storage.pin`), which is
    the manifest's `url` from then on."""
    asked = location = manifest_location(str(url))
    try:
        location = pin(location)  # a Hub revision resolved to its commit, once: every shard URL names it
        text = read_url(location, options)
    except ShardError as error:
        raise ManifestError(f"{asked}: cannot read manifest ({error})") from None
    if scheme_of(location) == "file":
        location = location[len("file://") :]
    return Manifest.loads(text, location, tables=functools.partial(_split_table, location, options))


def _split_table(location: str, options, split: str, record: dict) -> shardtable.ShardTable:
    return shard_table(location, record, options)


def table_cache_path(cache_dir: str, record: dict) -> str:
    """Where the node-local cache keeps a shard table: named by its sha256 (its content)."""
    return os.path.join(cache_dir, f"{record['sha256']}{shardtable.SUFFIX}")


def shard_table(manifest_url: str, record: dict, options=None) -> shardtable.ShardTable:
    """The shard table a manifest at `manifest_url` records (see the module docstring)."""
    base = manifest_url.rsplit("/", 1)[0] if "/" in manifest_url else "."
    url = join_url(base, record["file"])
    path = local_path(url)
    if path is not None:
        return shardtable.map_file(path, record, url)
    cache_dir = None if options is None else options.table_cache_dir
    if cache_dir is None:
        return shardtable.from_bytes(_fetch(url, options), record, url)
    cached = table_cache_path(cache_dir, record)
    table = _cached_table(cache_dir, cached, record, url)  # the common case: there and whole, no lock
    if table is None:
        try:
            os.makedirs(cache_dir, exist_ok=True)
        except OSError as error:
            raise ManifestError(f"table_cache_dir {cache_dir}: cannot use it ({error.strerror or error})") from None
        lock = _in_cache(cache_dir, open_regular, f"{cached}.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's processes: one fetches, the others wait and map it
            table = _cached_table(cache_dir, cached, record, url, drop=True)
            if table is None:
                data = _fetch(url, options)
                shardtable.checked_bytes(data, record, url)
                _in_cache(cache_dir, write_atomically, cached, data)
                table = _cached_table(cache_dir, cached, record, url)  # mapped: one copy for the node
                if table is None:  # replaced since it was written: the bytes fetched (checked) serve
                    table = shardtable.ShardTable(data, url)
                del data
        finally:
            os.close(lock)  # releases the lock
    return table


def _in_cache(cache_dir: str, action, *arguments):
    """`action(*arguments)` on a name of the cache, its `OutputError` (a name that is not a regular
    file, a failed write) one `ManifestError` line naming the cache."""
    try:
        return action(*arguments)
    except OutputError as error:
        raise ManifestError(f"table_cache_dir {cache_dir}: {error}") from None


def _cached_table(cache_dir: str, path: str, record: dict, url: str, drop: bool = False) -> shardtable.ShardTable | None:
    """The cache's entry at `path` of the table at `url`, mapped and checked against its record; None
    when there is none or it does not match (with `drop`, under the lock: removed, with a warning
    line saying so)."""
    where = f"{url} (cached as {path})"
    try:
        fd = _in_cache(cache_dir, open_regular, path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        buffer = shardtable.map_descriptor(fd)
    except OSError as error:
        raise ManifestError(f"{where}: cannot read shard table ({error.strerror or error})") from None
    finally:
        os.close(fd)
    problem = shardtable.table_problem(buffer, record)
    if problem is None:
        return shardtable.ShardTable(buffer, where, path, record)
    if drop:
        remove_quietly(path)
        warnings.warn(f"{path}: cache entry of {url} does not match the manifest ({problem}); "
                      "removed it, fetching the table again", UserWarning)
    return None


def _fetch(url: str, options) -> bytes:
    try:
        return read_url(url, options)
    except ShardError as error:
        raise ManifestError(f"{url}: cannot read shard table ({error})") from None


def urls(manifest_url: str, split: str = "train") -> list[str]:
    """Plain shard URLs of a split, for `wds.WebDataset(urls, ...)`."""
    return load_manifest(manifest_url).shard_urls(split)


def shard_row(url: str, manifests: dict | None = None) -> dict:
    """The manifest row of the shard at `url`, from the `manifest.json` beside it (a conversion writes
    its shards next to their manifest), for a reader that holds a shard's URL but not its row. A
    shard no manifest there lists is a `ShardError`: nothing could check its samples. `manifests`
    (a dict) keeps the manifests loaded, by directory, for the next call."""
    url = str(url)
    base, _, name = url.rpartition("/")
    base = base or "."
    manifest = None if manifests is None else manifests.get(base)
    if manifest is None:
        try:
            manifest = load_manifest(base)
        except ManifestError as error:
            raise ShardError(url, f"no manifest beside it lists it, so its samples cannot be checked ({error})") from None
        if manifests is not None:
            manifests[base] = manifest
    for rows in manifest.splits.values():
        for shard in range(len(rows)):
            if (rows.name(shard) if isinstance(rows, shardtable.ShardTable) else rows[shard]["name"]) == name:
                return rows[shard]
    raise ShardError(url, f"{manifest.url} does not list it, so its samples cannot be checked")
