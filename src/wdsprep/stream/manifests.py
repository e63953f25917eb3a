"""Loading manifests and shard URLs from any location.

A manifest of version 2 keeps its shard rows in one shard table per split (shards/shardtable.py),
read here with it: a local table is mapped (`mmap`), so every process of a node shares one copy
through the page cache; a remote one (http(s)://, s3://) is fetched once per process, or not at
all when `ReadOptions.table_cache_dir` (`WDSPREP_TABLE_CACHE_DIR`) holds it: the cache keeps each
table under its sha256 (the one the manifest records, so a table that changed is a new name and
no request needs to ask whether it did), fetched by one process of the node while the others wait
on a lock file beside it (`<sha256>.shards.lock`), written atomically, then mapped like a local
one by every process. Every table is checked against its record (size, sha256) before use.
"""
from __future__ import annotations

import fcntl
import functools
import os

from ..errors import ManifestError, ShardError
from ..shards import shardtable
from ..shards.manifest import MANIFEST_NAME, Manifest, join_url
from ..storage import local_path, pin, read_url, scheme_of


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
    if not os.path.exists(cached):
        try:
            os.makedirs(cache_dir, exist_ok=True)
            lock = os.open(f"{cached}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            raise ManifestError(f"table_cache_dir {cache_dir}: cannot use it ({error.strerror or error})") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's processes: one fetches, the others wait and map it
            if not os.path.exists(cached):
                data = _fetch(url, options)
                shardtable.checked_bytes(data, record, url)
                _cache(cache_dir, cached, data)
                del data
        finally:
            os.close(lock)  # releases the lock
    return shardtable.map_file(cached, record, f"{url} (cached as {cached})")


def _fetch(url: str, options) -> bytes:
    try:
        return read_url(url, options)
    except ShardError as error:
        raise ManifestError(f"{url}: cannot read shard table ({error})") from None


def _cache(cache_dir: str, path: str, data: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)  # atomic: a process mapping it sees the whole table or none
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise ManifestError(f"table_cache_dir {cache_dir}: cannot write {path} ({error.strerror or error})") from None


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
